"""The bench's machine-speed figure (diskless/bench/machine_speed.py): fixed work, the quickest
round, before the run and in every second of it (each phase's median)."""

from __future__ import annotations

from diskless.bench import machine_speed
from diskless.bench.collect import Sampler, Snapshot
from diskless.bench.report import _cpu_wait_note, _machine_speed


def test_the_workload_is_the_same_work_every_time() -> None:
    one = machine_speed.measure(rounds=2, units=300)
    two = machine_speed.measure(rounds=2, units=300)
    # The same result of the work (it cannot be skipped), timed in CPU ms, wall time no less.
    assert one["check"] == two["check"]
    assert one["python_ms"] > 0 and one["wall_to_cpu"] >= 0.9
    assert machine_speed.measure(rounds=1, units=301)["check"] != one["check"]


def test_a_probe_and_a_full_measurement_are_on_one_scale() -> None:
    # Both give the CPU ms of UNITS_PER_ROUND units, whatever they ran (6.7x fewer for a probe).
    full = machine_speed.measure(rounds=3)["python_ms"]
    probe = machine_speed.probe()
    assert full / 3 < probe < full * 3, (full, probe)


def test_a_phase_gets_the_median_speed_of_its_seconds() -> None:
    sampler = Sampler(brokers=[])
    for at, speed in ((9.0, 50.0), (10.0, 8.0), (11.0, 12.0), (12.0, None), (13.0, 9.0), (15.0, 70.0)):
        sampler.snapshots.append(Snapshot(at, {}, speed_ms=speed))
    assert sampler.speed_between(10.0, 14.0) == 9.0  # 8, 9, 12: not the seconds outside
    assert sampler.speed_between(20.0, 30.0) is None


def test_the_report_names_the_figures_and_omits_them_for_older_results() -> None:
    assert "Machine speed: 8.5 ms of CPU" in _machine_speed({"machine_speed": {"python_ms": 8.5}})
    assert _machine_speed({}) == ""
    timings = {"loop_wait_ms_per_s": 300.0, "loop_cpu_ms_per_s": 320.0}
    note = _cpu_wait_note({"broker_timings": timings, "machine_speed_ms": 9.1})
    assert note.endswith(", machine speed 9.1 ms"), note
    assert "machine speed" not in _cpu_wait_note({"broker_timings": timings})

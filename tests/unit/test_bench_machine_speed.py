"""The bench's machine-speed figure (diskless/bench/machine_speed.py): fixed work, the quickest round."""

from __future__ import annotations

from diskless.bench import machine_speed
from diskless.bench.report import _machine_speed


def test_the_workload_is_the_same_work_every_time() -> None:
    one = machine_speed.measure(rounds=2, units=300)
    two = machine_speed.measure(rounds=2, units=300)
    # The same result of the work (it cannot be skipped), timed in CPU ms, wall time no less.
    assert one["check"] == two["check"]
    assert one["python_ms"] > 0 and one["wall_to_cpu"] >= 0.9
    assert machine_speed.measure(rounds=1, units=301)["check"] != one["check"]


def test_more_units_take_more_cpu() -> None:
    small = machine_speed.measure(rounds=3, units=200)["python_ms"]
    large = machine_speed.measure(rounds=3, units=4000)["python_ms"]
    assert large > small


def test_the_report_names_the_figure_and_omits_it_for_older_results() -> None:
    assert "Machine speed: 8.5 ms of CPU" in _machine_speed({"machine_speed": {"python_ms": 8.5}})
    assert _machine_speed({}) == ""

"""Counter arithmetic of ``diskless bench``: windows combined, requests per broker by API, quantiles
of histograms, and the time processes waited for a CPU."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from diskless.bench.collect import (
    Snapshot,
    WindowDelta,
    combined,
    histogram_quantile,
    requests_per_broker_per_s,
    schedule_figures,
    waits_between,
)


def test_windows_combine_by_summing_seconds_cpu_and_counters() -> None:
    a = WindowDelta(10.0, {1: 2.0}, {1: {'diskless_requests_total{api="0"}': 100.0}})
    b = WindowDelta(5.0, {1: 1.0, 2: 4.0}, {1: {'diskless_requests_total{api="0"}': 50.0}, 2: {"x": 1.0}})
    both = combined([a, b])
    assert both.seconds == 15.0 and both.cpu_s == {1: 3.0, 2: 4.0}
    assert both.metrics == {1: {'diskless_requests_total{api="0"}': 150.0}, 2: {"x": 1.0}}


def test_requests_are_per_broker_per_second_with_replica_fetches_apart() -> None:
    delta = WindowDelta(
        10.0,
        {},
        {
            1: {'diskless_requests_total{api="0"}': 300.0, 'diskless_requests_total{api="1"}': 100.0},
            2: {
                'diskless_requests_total{api="1"}': 100.0,
                'diskless_replica_fetches_total{kind="incremental"}': 60.0,
            },
        },
    )
    assert requests_per_broker_per_s(delta) == {"Produce": 15.0, "Fetch (consumers)": 7.0, "Fetch (replicas)": 3.0}

    # Replica fetches in the compact form are counted once, as ReplicaFetch (the handler counts
    # them among its replica fetches too).
    delta.metrics[1]['diskless_requests_total{api="32006"}'] = 40.0
    delta.metrics[2]['diskless_replica_fetches_total{kind="incremental"}'] = 100.0
    assert requests_per_broker_per_s(delta) == {
        "Produce": 15.0,
        "Fetch (consumers)": 7.0,
        "ReplicaFetch": 2.0,
        "Fetch (replicas)": 3.0,
    }


def _buckets(stage: str, counts: dict[str, float]) -> dict[str, float]:
    return {f'diskless_produce_stage_seconds_bucket{{le="{le}",stage="{stage}"}}': n for le, n in counts.items()}


def test_histogram_quantiles_interpolate_within_the_bucket_over_brokers() -> None:
    # 100 batches over two brokers: 90 within 25 ms, 8 more within 50 ms, 2 within 100 ms.
    one = _buckets("commit", {"0.025": 50.0, "0.05": 54.0, "0.1": 55.0, "+Inf": 55.0})
    two = _buckets("commit", {"0.025": 40.0, "0.05": 44.0, "0.1": 45.0, "+Inf": 45.0})
    other = _buckets("upload", {"0.025": 0.0, "0.05": 0.0, "0.1": 100.0, "+Inf": 100.0})
    delta = WindowDelta(10.0, {}, {1: {**one, **other}, 2: two})
    name = "diskless_produce_stage_seconds"
    assert histogram_quantile(delta, name, 0.5, stage="commit") == pytest.approx(0.025 * 50 / 90)
    assert histogram_quantile(delta, name, 0.99, stage="commit") == pytest.approx(0.05 + 0.05 * 0.5)
    assert histogram_quantile(delta, name, 0.99, stage="upload") == pytest.approx(0.05 + 0.05 * 0.99)
    assert histogram_quantile(delta, name, 0.99, stage="linger") is None


def test_a_quantile_beyond_the_last_bound_is_that_bound() -> None:
    delta = WindowDelta(1.0, {}, {1: _buckets("total", {"0.1": 1.0, "10.0": 1.0, "+Inf": 10.0})})
    assert histogram_quantile(delta, "diskless_produce_stage_seconds", 0.99, stage="total") == 10.0


def test_a_phase_is_measured_between_snapshots_inside_its_window() -> None:
    """A snapshot taken while the brokers are saturated finishes seconds after it starts: bracketing
    a phase with the first one at or after its end reached into the next phase (a low-rate phase
    then counted ~1.5 s of the maximum-rate phase's records: 3x its payload, so a third of its
    CPU and PUTs per MB)."""
    from diskless.bench.collect import Sampler, Snapshot

    sampler = Sampler(brokers=[])
    for at, until in ((9.0, 9.2), (10.1, 10.3), (19.5, 19.9), (20.2, 21.7)):
        sampler.snapshots.append(Snapshot(at, {}, until=until))
    a, b = sampler.bracket(10.0, 20.0)
    assert (a.at, b.until) == (10.1, 19.9)
    # Fewer than two snapshots inside: the nearest ones around it.
    a, b = sampler.bracket(19.0, 20.0)
    assert (a.at, b.at) == (10.1, 20.2)


def test_every_metric_the_bench_reads_is_scraped() -> None:
    """A snapshot asks the brokers for ``SCRAPED`` alone: a name read anywhere in the bench but
    left out of it would read as zero, silently. Every ``diskless_*`` metric named in the bench's
    sources must be scraped (a histogram by its bucket, sum and count samples)."""
    import re
    from pathlib import Path

    import diskless.bench
    from diskless.bench.collect import HISTOGRAMS, SCRAPED

    named: set[str] = set()
    for source in Path(diskless.bench.__file__).parent.glob("*.py"):
        named |= set(re.findall(r"""["'](diskless_[a-z_]+)["']""", source.read_text()))
    assert named, "the pattern finds the bench's metric names"
    missing = {name for name in named if name not in SCRAPED and name not in HISTOGRAMS}
    assert not missing
    for histogram in HISTOGRAMS:
        assert {f"{histogram}_bucket", f"{histogram}_sum", f"{histogram}_count"} <= set(SCRAPED)


def test_a_restricted_scrape_skips_the_per_partition_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's scrape (Prometheus ``name[]``) must not run the per-partition tiering gauges'
    collector, whose cost at 1,000 partitions was the point of restricting it; a full scrape does."""
    from prometheus_client import REGISTRY, generate_latest

    from diskless.bench.collect import SCRAPED
    from diskless.broker import tier_rpcs

    calls = []
    original = tier_rpcs._COLLECTOR.collect

    def counting() -> object:
        calls.append(1)
        return original()

    monkeypatch.setattr(tier_rpcs._COLLECTOR, "collect", counting)
    restricted = generate_latest(REGISTRY.restricted_registry(SCRAPED)).decode()
    assert calls == []
    assert "diskless_requests_total" in restricted or "diskless_flush_seconds_count" in restricted
    generate_latest(REGISTRY)
    assert calls == [1]


def test_waits_are_per_second_means_over_brokers_and_the_s3_servers_threads_added_up() -> None:
    a = Snapshot(
        100.0,
        {
            1: {"loop_run_s": 1.0, "loop_wait_s": 0.5, "loop_runs": 100},
            2: {"loop_run_s": 2.0, "loop_wait_s": 1.0, "loop_runs": 50},
        },
        {"threads_wait_s": 3.0},
        until=100.5,
    )
    b = Snapshot(
        110.0,
        {
            1: {"loop_run_s": 4.0, "loop_wait_s": 1.5, "loop_runs": 400},  # ran 3 s, waited 1 s, woken 300 times
            2: {"loop_run_s": 5.0, "loop_wait_s": 0.8, "loop_runs": 250},  # a wait that fell counts as none
        },
        {"threads_wait_s": 5.0},
        until=110.0,
    )
    assert waits_between(a, b) == {
        "loop_cpu_ms_per_s": 300.0,
        "loop_wait_ms_per_s": 50.0,
        "loop_wait_per_wakeup_ms": 2.0,  # 1 s of waits over 500 wake-ups
        "s3_server_wait_ms_per_s": 200.0,
    }
    # A kernel without schedstat: the figures are unknown, not zero.
    bare = Snapshot(100.0, {1: {"cpu_s": 1.0}}, {"cpu_s": 1.0}, until=100.0)
    later = Snapshot(110.0, {1: {"cpu_s": 2.0}}, {"cpu_s": 2.0}, until=110.0)
    assert set(waits_between(bare, later).values()) == {None}


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="the kernel keeps no schedstat")
def test_schedule_figures_count_this_process_running() -> None:
    before = schedule_figures(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    after = schedule_figures(os.getpid())
    assert after["loop_run_s"] - before["loop_run_s"] >= 0.04
    assert after["threads_wait_s"] >= after["loop_wait_s"] >= 0.0  # the main thread's is among them
    assert after["loop_runs"] >= before["loop_runs"] > 0
    assert schedule_figures(2**22 + 7) == {}  # no such process


def test_a_produce_target_says_how_long_the_brokers_waited_for_a_cpu() -> None:
    from diskless.bench.report import _cpu_wait_note

    figures = {
        "machine_cpu_busy": 0.83,
        "broker_timings": {"loop_cpu_ms_per_s": 324.0, "loop_wait_ms_per_s": 311.1, "loop_wait_per_wakeup_ms": 0.43},
    }
    assert _cpu_wait_note(figures) == (
        "; each broker's loop ran 324 and waited 311 ms/s for a CPU (0.43 ms per wake-up), machine busy 0.83"
    )
    assert _cpu_wait_note({"broker_timings": {"flush_mean_ms": 30.0}}) == ""  # results from before the figures

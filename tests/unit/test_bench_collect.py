"""Counter arithmetic of ``diskless bench``: windows combined, requests per broker by API, quantiles
of histograms."""

from __future__ import annotations

import pytest

from diskless.bench.collect import WindowDelta, combined, histogram_quantile, requests_per_broker_per_s


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

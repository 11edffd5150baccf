"""Counter arithmetic of ``diskless bench``: windows combined, requests per broker by API."""

from __future__ import annotations

from diskless.bench.collect import WindowDelta, combined, requests_per_broker_per_s


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

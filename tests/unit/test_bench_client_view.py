"""The bench's summary of producers' librdkafka statistics per phase (stats.client_view)."""

from __future__ import annotations

import numpy as np

from diskless.bench.loadgen import CLIENT_STATS_COLUMNS
from diskless.bench.stats import ProducerSamples, Window, client_view


def rows(*values: tuple[float, ...]) -> np.ndarray:
    assert all(len(v) == len(CLIENT_STATS_COLUMNS) for v in values)
    return np.array(values, dtype=np.float64)


def test_rows_inside_the_phase_are_weighted_by_requests() -> None:
    # at, queue avg, queue p99, rtt avg, rtt p99, in flight, requests
    stats = rows(
        (9.5, 99, 99, 99, 99, 9, 50),  # before the phase
        (10.5, 10, 20, 100, 200, 5, 30),
        (11.0, 30, 40, 200, 400, 1, 10),
        (12.5, 99, 99, 99, 99, 9, 50),  # after it
    )
    produced = ProducerSamples(np.zeros(0), np.zeros(0), 0, stats)
    view = client_view(produced, Window("low", 10.0, 12.0))
    assert view == {
        "queue_avg_ms": 15.0,
        "queue_p99_ms": 25.0,
        "rtt_avg_ms": 125.0,
        "rtt_p99_ms": 250.0,
        "in_flight": 4.0,
    }


def test_no_statistics_no_view() -> None:
    assert client_view(ProducerSamples(np.zeros(0), np.zeros(0)), Window("low", 0.0, 1.0)) is None
    joined = ProducerSamples.join(
        [ProducerSamples(np.zeros(0), np.zeros(0)), ProducerSamples(np.zeros(0), np.zeros(0))]
    )
    assert client_view(joined, Window("low", 0.0, 1.0)) is None

"""Per-phase figures from raw samples (sans-IO: arrays and numbers in, dictionaries out).

Latencies are attributed to the phase in which the record was *sent*; throughput counts records
*acknowledged* inside the phase's window, so a backlog draining after the burst is not credited to
the burst. Percentiles are nearest-rank on the sorted samples (``numpy.percentile``'s "higher"),
so a p99 is always a latency some record really had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .loadgen import CLIENT_STATS_COLUMNS

QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99.9": 99.9}


def percentiles(values: Iterable[float] | np.ndarray) -> dict[str, float | int | None]:
    data = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
    if data.size == 0:
        return {"count": 0, **dict.fromkeys(QUANTILES), "mean": None, "max": None}
    out: dict[str, float | int | None] = {"count": int(data.size)}
    for name, q in QUANTILES.items():
        out[name] = round(float(np.percentile(data, q, method="higher")), 3)
    out["mean"] = round(float(data.mean()), 3)
    out["max"] = round(float(data.max()), 3)
    return out


@dataclass(frozen=True)
class Window:
    name: str
    start: float  # wall-clock seconds
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class ProducerSamples:
    sent_at: np.ndarray  # wall seconds, one per acknowledged record
    latency: np.ndarray  # seconds
    errors: int = 0
    # librdkafka's statistics: rows of loadgen.CLIENT_STATS_COLUMNS.
    client_stats: np.ndarray = field(default_factory=lambda: np.zeros((0, len(CLIENT_STATS_COLUMNS))))

    @classmethod
    def join(cls, parts: Sequence[ProducerSamples]) -> ProducerSamples:
        if not parts:
            return cls(np.zeros(0), np.zeros(0), 0)
        return cls(
            np.concatenate([p.sent_at for p in parts]),
            np.concatenate([p.latency for p in parts]),
            sum(p.errors for p in parts),
            np.concatenate([p.client_stats for p in parts]),
        )


def client_view(produced: ProducerSamples, window: Window) -> dict[str, float] | None:
    """The producers' librdkafka statistics over a phase, weighted by requests: how long records
    waited in the client's queue, how long a request took to be answered, and how many requests
    were awaiting answers. None without statistics (an older load generator)."""
    rows = produced.client_stats
    if rows.size == 0:
        return None
    col = {name: i for i, name in enumerate(CLIENT_STATS_COLUMNS)}
    inside = rows[(rows[:, col["at"]] > window.start) & (rows[:, col["at"]] <= window.end)]
    weights = inside[:, col["requests"]] if len(inside) else np.zeros(0)
    if weights.sum() <= 0:
        return None

    def mean(name: str) -> float:
        return round(float(np.average(inside[:, col[name]], weights=weights)), 1)

    return {
        "queue_avg_ms": mean("queue_avg_ms"),
        "queue_p99_ms": mean("queue_p99_ms"),
        "rtt_avg_ms": mean("rtt_avg_ms"),
        "rtt_p99_ms": mean("rtt_p99_ms"),
        "in_flight": mean("in_flight"),
    }


@dataclass
class ConsumerSamples:
    sent_at: np.ndarray
    received_at: np.ndarray

    @classmethod
    def join(cls, parts: Sequence[ConsumerSamples]) -> ConsumerSamples:
        if not parts:
            return cls(np.zeros(0), np.zeros(0))
        return cls(np.concatenate([p.sent_at for p in parts]), np.concatenate([p.received_at for p in parts]))


def _seen_in(window: Window, consumed: ConsumerSamples) -> tuple[np.ndarray, np.ndarray]:
    """Send times and end-to-end latencies (ms) of the records sent within ``window`` that
    ``consumed`` saw."""
    seen = (consumed.sent_at >= window.start) & (consumed.sent_at < window.end)
    sent = consumed.sent_at[seen]
    return sent, (consumed.received_at[seen] - sent) * 1000


def e2e_ms(window: Window, consumed: ConsumerSamples) -> np.ndarray:
    """End-to-end latencies (ms) of the records sent within ``window`` that ``consumed`` saw."""
    return _seen_in(window, consumed)[1]


def phase_figures(
    window: Window, produced: ProducerSamples, consumed: ConsumerSamples, record_size: int, consumers: int
) -> dict[str, Any]:
    """Latency percentiles, throughput and how completely consumers saw the phase's records."""
    sent = (produced.sent_at >= window.start) & (produced.sent_at < window.end)
    acked_at = produced.sent_at + produced.latency
    acked_in = (acked_at >= window.start) & (acked_at < window.end)
    records_per_s = float(acked_in.sum()) / window.seconds
    e2e = e2e_ms(window, consumed)
    sent_count = int(sent.sum())
    return {
        "window_s": round(window.seconds, 3),
        "records_sent_and_acked": sent_count,
        "records_per_s": round(records_per_s, 1),
        "mb_per_s": round(records_per_s * record_size / 1e6, 3),
        "payload_bytes": sent_count * record_size,
        "produce_latency_ms": percentiles(produced.latency[sent] * 1000),
        "end_to_end_latency_ms": percentiles(e2e),
        # Each consumer reads every record: below 1.0 some were not seen before the consumers stopped.
        "consumed_fraction": round(e2e.size / (sent_count * consumers), 4) if sent_count else None,
    }


def throughput_series(produced: ProducerSamples, start: float, end: float, record_size: int) -> dict[str, list[float]]:
    """Acknowledged MB/s per second of the run (for the throughput plot)."""
    acked_at = produced.sent_at + produced.latency
    edges = np.arange(start, end + 1.0, 1.0)
    if edges.size < 2:
        return {"t": [], "mb_per_s": []}
    counts, _ = np.histogram(acked_at, bins=edges)
    return {
        "t": [round(float(t - start), 3) for t in edges[:-1]],
        "mb_per_s": [round(float(c) * record_size / 1e6, 4) for c in counts],
    }


def size_distribution(sizes: Sequence[int]) -> dict[str, Any]:
    """WAL object sizes: percentiles plus counts per power-of-4 bucket from 16 KiB."""
    out: dict[str, Any] = {"objects": len(sizes), "bytes": int(sum(sizes))}
    out.update({k: v for k, v in percentiles([float(s) for s in sizes]).items() if k != "count"})
    bounds = [16 * 1024 * 4**i for i in range(7)]  # 16 KiB .. 64 MiB
    buckets: dict[str, int] = {}
    for size in sizes:
        label = next((f"<={b // 1024}KiB" for b in bounds if size <= b), f">{bounds[-1] // 1024}KiB")
        buckets[label] = buckets.get(label, 0) + 1
    out["buckets"] = {f"<={b // 1024}KiB": buckets.get(f"<={b // 1024}KiB", 0) for b in bounds if buckets}
    if buckets.get(f">{bounds[-1] // 1024}KiB"):
        out["buckets"][f">{bounds[-1] // 1024}KiB"] = buckets[f">{bounds[-1] // 1024}KiB"]
    return out


def e2e_blocks_ms(window: Window, consumed: ConsumerSamples, seconds: float = 1.0) -> list[np.ndarray]:
    """``e2e_ms`` of ``window`` cut into blocks of ``seconds`` by send time (empty blocks left out)."""
    sent, latency = _seen_in(window, consumed)
    block = np.floor((sent - window.start) / seconds).astype(np.int64)
    order = np.argsort(block, kind="stable")
    block, latency = block[order], latency[order]
    bounds = np.flatnonzero(np.diff(block)) + 1
    return [part for part in np.split(latency, bounds) if part.size]


def p99_rise_interval(
    with_blocks: Sequence[np.ndarray],
    without_blocks: Sequence[np.ndarray],
    rounds: int = 400,
    level: float = 0.9,
    seed: int = 0,
) -> tuple[float, float] | None:
    """How sure a rise of the p99 is: the central ``level`` interval of ``p99(with) / p99(without)
    - 1`` over ``rounds`` block-bootstrap resamples of both sides (None if a side has no samples).

    Blocks, not records, are resampled: one stall delays every record of its second alike, so the
    records of a block are not independent draws, and resampling them one by one would give an
    interval far narrower than the spread between runs. The seed is fixed: the same samples give
    the same interval."""
    if not with_blocks or not without_blocks:
        return None
    rng = np.random.default_rng(seed)

    def p99s(blocks: Sequence[np.ndarray]) -> np.ndarray:
        out = np.empty(rounds)
        for i, picks in enumerate(rng.integers(0, len(blocks), size=(rounds, len(blocks)))):
            out[i] = np.percentile(np.concatenate([blocks[j] for j in picks]), 99.0, method="higher")
        return out

    rises = p99s(with_blocks) / p99s(without_blocks) - 1
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(rises, [tail, 100 - tail])
    return round(float(low), 3), round(float(high), 3)

"""When to hedge an object storage request, sans-IO: a second, identical request for one still
unanswered. Used for WAL object PUTs (the representative) and whole-object tail GETs (the WAL
reader's prefetches), one policy each.

Why. A diskless produce is answered only after its WAL object's PUT, and a consumer in another AZ
reads a batch only after its broker's GET of the object, so the store's tail is the produce's
and the consumer's tail. Object stores have long tails that do not follow the request: a request
can sit behind a slow disk, a busy front end or a garbage collection while the same request sent
again is served at the median. AWS's S3 guidance for latency-sensitive work is to track
latencies and resend the slow requests; this is "The Tail at Scale"'s hedged request (Dean and
Barroso, 2013): once a request has been out longer than the q-quantile of recent ones, send it
again and take whichever answer comes first.

Why it is safe. A GET reads. Both PUTs carry the same bytes to the same key, and a WAL object's
key is unique to its flush (``wal_format.wal_object_key``: time, AZ, broker, UUID): whichever is
stored last, the object is the same, and nothing points to it before one PUT has succeeded
(safety rule 1). The loser is cancelled, which closes its connection, so it cannot land much
later (say after the WAL manager deleted the object); one that the server had already taken in
full is stored within the same moment as the winner, with the same bytes.

What it costs. Each hedge is one more request (billed; a PUT counts in the PUTs per broker). Two
bounds keep that small, also when the store is slow for everyone (then hedging only adds load):
only requests slower than the ``quantile`` of the recent ones are hedged, which is a
``1 - quantile`` share while latencies are steady, and a ``max_ratio`` budget caps the hedged
share of the last ``window`` requests whatever the latencies do.

Which latencies. A request's latency grows with its size (a 2 MiB WAL object at full speed takes
ten times a 32 KiB one at a low rate), so latencies are kept per size class (sizes within a
factor of 4) and a request is measured against its own class: with one window for all, the large
objects of a burst kept the quantile so high that no PUT of the quiet minutes after it was ever
hedged. A GET's size is known only from its answer, so it is measured against the class of the
last answer (consecutive WAL objects are of a size). Each finished attempt reports its own
duration. A primary cancelled because its hedge won reports how long it had been out: a lower
bound, but one that keeps the slow requests in the window (dropping them would let the quantile
fall and hedging grow until the budget stops it).

The policy holds no clock and does no I/O: ``delay_ms`` before a request, ``started`` when a
hedge goes out, ``finished`` with latencies and sizes; ``ObjectStore`` runs it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class HedgePolicy:
    """Hedging decisions for one stream of PUTs (one representative's WAL objects)."""

    quantile: float = 0.95  # hedge a PUT out longer than this quantile of recent latencies; 0: never
    max_ratio: float = 0.05  # at most this share of the last ``window`` PUTs get a hedge
    window: int = 200  # recent PUTs considered, for the budget and for each size class's quantile
    min_samples: int = 20  # no hedging in a size class before this many of its latencies are known
    min_delay_ms: float = 0.0  # never hedge sooner than this
    _latencies: dict[int, deque[float]] = field(init=False, repr=False)  # size class -> recent latencies
    _hedged: deque[bool] = field(init=False, repr=False)  # per PUT started: was it hedged
    _hedges_in_window: int = field(default=0, init=False, repr=False)
    _last_class: int = field(default=-1, init=False, repr=False)  # of the last latency filed

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1): {self.quantile}")
        if not 0.0 <= self.max_ratio <= 1.0:
            raise ValueError(f"max_ratio must be in [0, 1]: {self.max_ratio}")
        if self.window < 1 or self.min_samples < 0 or self.min_delay_ms < 0:
            raise ValueError("window must be >= 1, min_samples and min_delay_ms >= 0")
        self._latencies = {}
        self._hedged = deque()

    @property
    def enabled(self) -> bool:
        return self.quantile > 0.0 and self.max_ratio > 0.0

    def delay_ms(self, size: int | None) -> float | None:
        """For a request of ``size`` bytes about to start (None: not known before its answer, as
        for a GET; then the size of the last one answered): how long to wait for it before sending
        its hedge, or None (no hedge: disabled, too few latencies of its size known, budget spent)."""
        self._record_start(False)
        known = self._latencies.get(self._last_class if size is None else size_class(size))
        if not self.enabled or known is None or len(known) < max(self.min_samples, 1):
            return None
        if self._hedges_in_window + 1 > self.max_ratio * len(self._hedged):
            return None
        ordered = sorted(known)
        rank = min(len(ordered) - 1, max(0, math.ceil(self.quantile * len(ordered)) - 1))
        return max(self.min_delay_ms, ordered[rank])

    def started(self) -> None:
        """The PUT that ``delay_ms`` was last asked for got its hedge."""
        if self._hedged and not self._hedged[-1]:
            self._hedged[-1] = True
            self._hedges_in_window += 1

    def finished(self, latency_ms: float, size: int) -> None:
        """An attempt of a PUT of ``size`` bytes ended after ``latency_ms`` (succeeded, or cancelled
        because the other won)."""
        if latency_ms >= 0 and math.isfinite(latency_ms):
            self._last_class = size_class(size)
            known = self._latencies.get(self._last_class)
            if known is None:
                known = self._latencies[self._last_class] = deque(maxlen=self.window)
            known.append(latency_ms)

    @property
    def hedged_share(self) -> float:
        """The share of the last ``window`` PUTs that got a hedge."""
        return self._hedges_in_window / len(self._hedged) if self._hedged else 0.0

    def _record_start(self, hedged: bool) -> None:
        self._hedged.append(hedged)
        if len(self._hedged) > self.window and self._hedged.popleft():
            self._hedges_in_window -= 1


def size_class(size: int) -> int:
    """Sizes within a factor of 4 share a class: [2, 8), [8, 32), ... [32 KiB, 128 KiB), ..."""
    return max(size, 1).bit_length() // 2

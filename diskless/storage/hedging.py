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

The policy holds no clock and does no I/O: ``delay_ms`` before a request, ``try_hedge`` when its
delay has passed, ``finished`` with latencies and sizes; ``ObjectStore`` runs it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class HedgePolicy:
    """Hedging decisions for one stream of requests (one representative's WAL PUTs, or one reader's
    tail GETs). Requests may overlap: a hedge is counted when it is sent (``try_hedge``), not
    attributed to the request that asked for a delay last."""

    quantile: float = 0.95  # hedge a request out longer than this quantile of recent latencies; 0: never
    max_ratio: float = 0.05  # at most this many hedges per request among the last ``window`` requests
    window: int = 200  # recent requests considered, for the budget and for each size class's quantile
    min_samples: int = 20  # no hedging in a size class before this many of its latencies are known
    min_delay_ms: float = 0.0  # never hedge sooner than this
    _latencies: dict[int, deque[float]] = field(init=False, repr=False)  # size class -> recent latencies
    _starts: int = field(default=0, init=False, repr=False)  # requests started (``delay_ms`` calls)
    _hedges_at: deque[int] = field(init=False, repr=False)  # ``_starts`` when each recent hedge was sent
    _last_class: int = field(default=-1, init=False, repr=False)  # of the last latency filed

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1): {self.quantile}")
        if not 0.0 <= self.max_ratio <= 1.0:
            raise ValueError(f"max_ratio must be in [0, 1]: {self.max_ratio}")
        if self.window < 1 or self.min_samples < 0 or self.min_delay_ms < 0:
            raise ValueError("window must be >= 1, min_samples and min_delay_ms >= 0")
        self._latencies = {}
        self._hedges_at = deque()

    @property
    def enabled(self) -> bool:
        return self.quantile > 0.0 and self.max_ratio > 0.0

    def delay_ms(self, size: int | None) -> float | None:
        """For a request of ``size`` bytes about to start (None: not known before its answer, as
        for a GET; then the size of the last one answered): how long to wait for it before trying
        a hedge, or None (no hedge: disabled, too few latencies of its size known, budget spent)."""
        self._starts += 1
        self._forget_old_hedges()
        known = self._latencies.get(self._last_class if size is None else size_class(size))
        if not self.enabled or known is None or len(known) < max(self.min_samples, 1) or not self._room():
            return None
        ordered = sorted(known)
        rank = min(len(ordered) - 1, max(0, math.ceil(self.quantile * len(ordered)) - 1))
        return max(self.min_delay_ms, ordered[rank])

    def try_hedge(self) -> bool:
        """A request's delay has passed and it is still out: whether to send its hedge now (and
        count it). Checked again here because overlapping requests may all have been given a delay
        while the budget had room for one."""
        self._forget_old_hedges()
        if not self.enabled or not self._room():
            return False
        self._hedges_at.append(self._starts)
        return True

    def finished(self, latency_ms: float, size: int) -> None:
        """An attempt of a request of ``size`` bytes ended after ``latency_ms`` (succeeded, or
        cancelled because the other won)."""
        if latency_ms >= 0 and math.isfinite(latency_ms):
            self._last_class = size_class(size)
            known = self._latencies.get(self._last_class)
            if known is None:
                known = self._latencies[self._last_class] = deque(maxlen=self.window)
            known.append(latency_ms)

    @property
    def hedged_share(self) -> float:
        """Hedges sent per request started, over the last ``window`` requests."""
        self._forget_old_hedges()
        return len(self._hedges_at) / min(self._starts, self.window) if self._starts else 0.0

    def _room(self) -> bool:
        return len(self._hedges_at) + 1 <= self.max_ratio * min(self._starts, self.window)

    def _forget_old_hedges(self) -> None:
        while self._hedges_at and self._hedges_at[0] <= self._starts - self.window:
            self._hedges_at.popleft()


def size_class(size: int) -> int:
    """Sizes within a factor of 4 share a class: [2, 8), [8, 32), ... [32 KiB, 128 KiB), ..."""
    return max(size, 1).bit_length() // 2

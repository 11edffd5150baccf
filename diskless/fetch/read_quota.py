"""A broker-wide byte-rate quota on reads that miss the WAL cache, sans-IO (time is passed in).

Consumers far behind the tail are served by ranged GETs of old WAL objects and by tiered segment
blocks: work the tail's consumers never cause (GETs, the S3 server's and the broker's CPU, bytes
copied into responses). Without a bound, one reader catching up at full speed takes that work
from the tail's consumers and producers on the same machines. This is Kafka's quota on reads from
tiered storage (KIP-956, ``remote.log.manager.fetch.max.bytes.per.second``) applied to diskless
reads that miss the cache: ``diskless.fetch.lagging.max.bytes.per.second``.

The quota is a token bucket holding at most ``BURST_S`` of the rate. A read may start while the
bucket is not in debt, and may take ``allowance`` bytes: what the bucket holds, but at least
``QUANTUM_S`` of the rate, so a reader kept at the quota reads in steps of that size rather than
in slivers. The bytes a read took are charged at once, possibly into debt; the next read waits
until the debt is paid back. Over any interval the bytes read stay within the rate plus one burst
plus one allowance. A small burst matters: a reader starting on a full bucket of a second's worth
read 16 MiB in one response, hundreds of ranged GETs of small WAL objects at once, and the tail's
consumers waited up to 2.7 s behind them.
"""

from __future__ import annotations

UNLIMITED = 2**63 - 1  # Kafka's Long.MAX_VALUE default: no quota
BURST_S = 0.5
QUANTUM_S = 0.1


class ReadQuota:
    def __init__(self, bytes_per_second: int, now_ms: float) -> None:
        if bytes_per_second <= 0:
            raise ValueError("the quota must be positive")
        self.rate = float(bytes_per_second)
        self.limited = bytes_per_second < UNLIMITED
        self.capacity = self.rate * BURST_S
        self.quantum = self.rate * QUANTUM_S
        self._tokens = self.capacity  # a full bucket
        self._at_ms = now_ms

    def _refill(self, now_ms: float) -> None:
        if now_ms > self._at_ms:
            self._tokens = min(self.capacity, self._tokens + self.rate * (now_ms - self._at_ms) / 1000.0)
            self._at_ms = now_ms

    def wait_ms(self, now_ms: float) -> float:
        """How long a read must wait before it may start (0: now)."""
        if not self.limited:
            return 0.0
        self._refill(now_ms)
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate * 1000.0

    def allowance(self, now_ms: float) -> int:
        """Bytes a read starting now may take (0 while in debt)."""
        if not self.limited:
            return UNLIMITED
        self._refill(now_ms)
        return 0 if self._tokens < 0 else int(max(self._tokens, self.quantum))

    def record(self, nbytes: int, now_ms: float) -> None:
        """Bytes a read let through took from the object store."""
        if self.limited:
            self._refill(now_ms)
            self._tokens -= nbytes

"""Replication throttle (Kafka's ``leader.replication.throttled.rate``), sans-IO.

A leader serves the replicas that join a partition through a reassignment (its ``adding``
replicas, the ones kafka-reassign-partitions --throttle names) at most ``rate`` bytes per second,
shared by all of them, so that moving a large classic partition does not starve producers,
consumers and in-sync followers. A token bucket holding at most one second of bytes: a fetch is
given what the bucket holds (nothing: the partition is left out of that answer, and the follower
asks again), and what it was served is taken out, possibly into debt when one batch is larger
than the allowance (whole batches only), which later refills repay first.
"""

from __future__ import annotations


class ThrottleBucket:
    def __init__(self) -> None:
        self.tokens = 0.0
        self.rate = 0.0
        self._last_s: float | None = None

    def allowance(self, rate: float, now_s: float) -> int:
        """Bytes a throttled fetch may be served now at ``rate`` bytes per second."""
        if rate != self.rate or self._last_s is None:
            # A new rate starts from one second's worth (a new throttle's first fetch goes at once).
            self.rate = rate
            self.tokens = max(self.tokens, 0.0) if self._last_s is not None else rate
            self._last_s = now_s
        elapsed = max(0.0, now_s - self._last_s)
        self._last_s = now_s
        self.tokens = min(rate, self.tokens + elapsed * rate)
        return max(0, int(self.tokens))

    def consume(self, size: int) -> None:
        self.tokens -= size

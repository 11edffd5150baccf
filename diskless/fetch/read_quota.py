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

import heapq
from collections.abc import Callable, Sequence
from typing import TypeVar

Entry = TypeVar("Entry")

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


def prefixes_in_object_order(
    groups: Sequence[Sequence[Entry]],
    allowance: int,
    cost: Callable[[Entry], int],
    place: Callable[[Entry], tuple[str, int]],
) -> list[int]:
    """How many leading entries of each group (a partition's batches, in offset order) a read
    within ``allowance`` bytes takes, when entries are taken in the order of where their bytes
    lie: ``place`` (object key, byte offset). Entries that cost nothing to read (cached, inline)
    come with their group's prefix. At least one entry is taken if any costs something.

    Why this order: a WAL object holds every partition's batches of one flush, partition after
    partition, and keys sort by creation time. An even split of the allowance over the partitions
    (the first version) took a slice of every partition's run in an object, so the coalesced GET
    read the gaps between the slices as well and the next read fetched the same span again: about
    twice the bytes and GETs of the data served. Taken in place order, a read takes one span of an
    object from its start, the next read the span after it, and partitions still move on together
    through the objects."""
    taken = [0] * len(groups)
    heap: list[tuple[tuple[str, int], int]] = []

    def advance(g: int) -> None:
        entries, n = groups[g], taken[g]
        while n < len(entries) and cost(entries[n]) == 0:
            n += 1
        taken[g] = n
        if n < len(entries):
            heapq.heappush(heap, (place(entries[n]), g))

    for g in range(len(groups)):
        advance(g)
    spent = 0
    while heap and (spent < allowance or spent == 0):
        _, g = heapq.heappop(heap)
        spent += cost(groups[g][taken[g]])
        taken[g] += 1
        advance(g)
    return taken

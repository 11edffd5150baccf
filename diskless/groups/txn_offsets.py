"""Which committed-offset record counts, with transactional offset commits in the log (KIP-98).

Kafka's rule (GroupMetadata.completePendingTxnOffsetCommit, and the same on load): of the records
for one group's partition, the one appended last counts; a transactional one (TxnOffsetCommit)
only from its transaction's COMMIT marker on, and then only if no record of the same partition
appended after it already counts. A plain commit appended after a transactional one therefore
wins whatever the marker says, and of two transactions the later-appended one wins whichever
commits first. Until its marker a transactional offset is pending: OffsetFetch with
``require_stable`` answers UNSTABLE_OFFSET_COMMIT for it (KIP-447).

One instance per ``__consumer_offsets`` partition, fed in log order with the log offsets of the
records: live as the coordinator appends, and the same way when a new coordinator replays the
log, so the two agree. Sans-IO; the key and value types are the caller's.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TxnOffsetOrder(Generic[K, V]):
    def __init__(self) -> None:
        self._counts_from: dict[K, int] = {}  # key -> log offset of the record that counts
        self.pending: dict[int, dict[K, tuple[V, int]]] = {}  # producer id -> key -> (value, offset)

    def plain(self, key: K, offset: int) -> None:
        """A plain record (commit or tombstone) of ``key`` appended at ``offset``: it counts."""
        self._counts_from[key] = offset

    def transactional(self, producer_id: int, key: K, value: V, offset: int) -> None:
        """A record of ``producer_id``'s open transaction appended at ``offset``."""
        self.pending.setdefault(producer_id, {})[key] = (value, offset)

    def ended(self, producer_id: int, committed: bool) -> dict[K, V]:
        """The producer's transaction ended: the values that count now (none when aborted)."""
        pending = self.pending.pop(producer_id, {})
        counting: dict[K, V] = {}
        for key, (value, offset) in pending.items() if committed else ():
            if offset > self._counts_from.get(key, -1):
                self._counts_from[key] = offset
                counting[key] = value
        return counting

    def pending_keys(self) -> set[K]:
        return {key for records in self.pending.values() for key in records}

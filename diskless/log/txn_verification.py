"""Transaction verification of one partition's leader (KIP-890 part 1, for diskless commits).

A diskless transactional batch is accepted by a representative and committed to the leader later,
after its WAL object is uploaded: possibly after its transaction ended (the client gave up on the
request and aborted). The partition alone cannot tell such a late batch from the first batch of
the producer's next transaction at the same epoch; the transaction coordinator can. So when a
representative accepts a transactional batch, the leader checks with the coordinator that the
partition is in the producer's ongoing transaction and hands back a *guard*; the commit carries
it, and the leader appends a transactional batch only while its guard is current. A transaction
marker for the producer (commit or abort) ends the guard, so a commit from an ended transaction is
refused (INVALID_TXN_STATE) and never opens or joins a transaction.

Rules, all decided here (no I/O, no clock):
- ``begin`` is called before the coordinator is asked: the guard exists from then on, so a
  marker written while the question is on its way ends it too, and ``confirm`` (the coordinator's
  yes) then fails. A confirmed guard is reused for the producer's later batches at the same
  producer epoch and leader term (cached: no coordinator round trip) until a marker ends it.
- A guard is bound to the leader term that issued it (leader epoch and this object's random
  incarnation, fresh for every log opened): another term never knew it, so a commit carrying it
  is answered NOT_ENOUGH_REPLICAS (retriable, as Kafka answers produce requests whose
  verification could not be done): the producer retries and is verified anew by this leader.
- A transactional commit without a guard, with an unknown or ended guard, or at another producer
  epoch than its guard's is refused with INVALID_TXN_STATE.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class TxnGuard:
    """What a commit carries to prove its batch was verified in an ongoing transaction."""

    leader_epoch: int
    incarnation: int
    serial: int

    def to_wire(self) -> list[int]:
        return [self.leader_epoch, self.incarnation, self.serial]

    @classmethod
    def from_wire(cls, value: Any) -> TxnGuard | None:
        """None for anything that is not a guard (absent or malformed: refused like no guard)."""
        if isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(v, int) for v in value):
            return cls(value[0], value[1], value[2])
        return None


@dataclass(slots=True)
class _Entry:
    producer_epoch: int
    guard: TxnGuard
    verified: bool = False


class TxnVerifier:
    """Guards of the producers with a transaction being verified or verified on this partition."""

    def __init__(self, incarnation: int | None = None) -> None:
        self.incarnation = secrets.randbits(62) if incarnation is None else incarnation
        self._serial = 0
        self._entries: dict[int, _Entry] = {}

    def begin(self, producer_id: int, producer_epoch: int, leader_epoch: int) -> tuple[TxnGuard, bool] | ErrorCode:
        """The guard for a batch of (producer id, epoch), and whether it is already verified (the
        coordinator need not be asked). An older producer epoch than the one being verified or
        verified here is fenced: INVALID_PRODUCER_EPOCH."""
        entry = self._entries.get(producer_id)
        if entry is not None and entry.guard.leader_epoch == leader_epoch:
            if entry.producer_epoch == producer_epoch:
                return entry.guard, entry.verified
            if entry.producer_epoch > producer_epoch:
                return ErrorCode.invalid_producer_epoch
        self._serial += 1
        guard = TxnGuard(leader_epoch, self.incarnation, self._serial)
        self._entries[producer_id] = _Entry(producer_epoch, guard)
        return guard, False

    def confirm(self, producer_id: int, guard: TxnGuard) -> bool:
        """The coordinator answered that the partition is in the ongoing transaction: the guard is
        good for commits, unless a marker (or a newer epoch) ended it while the question was out."""
        entry = self._entries.get(producer_id)
        if entry is None or entry.guard != guard:
            return False
        entry.verified = True
        return True

    def forget(self, producer_id: int, guard: TxnGuard) -> None:
        """The coordinator said no (or could not be asked): the next batch asks again."""
        entry = self._entries.get(producer_id)
        if entry is not None and entry.guard == guard and not entry.verified:
            del self._entries[producer_id]

    def check(
        self, producer_id: int, producer_epoch: int, guard: TxnGuard | None, leader_epoch: int
    ) -> ErrorCode | None:
        """Why a transactional commit carrying ``guard`` must not be appended now, or None."""
        if guard is not None and (guard.leader_epoch != leader_epoch or guard.incarnation != self.incarnation):
            return ErrorCode.not_enough_replicas
        entry = self._entries.get(producer_id)
        if (
            guard is None
            or entry is None
            or entry.guard != guard
            or not entry.verified
            or entry.producer_epoch != producer_epoch
        ):
            return ErrorCode.invalid_txn_state
        return None

    def end(self, producer_id: int) -> None:
        """A marker ended the producer's transaction on this partition: its guard is no longer good."""
        self._entries.pop(producer_id, None)

    def guarded(self) -> dict[int, tuple[int, bool]]:
        """Producer id -> (producer epoch, verified), for inspection and tests."""
        return {pid: (e.producer_epoch, e.verified) for pid, e in self._entries.items()}

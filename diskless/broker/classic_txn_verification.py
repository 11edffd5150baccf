"""Transaction verification of classic produce, the asyncio side (KIP-890 part 1,
``transaction.partition.verification.enable``), as Kafka's ReplicaManager.handleProduceAppend.

A transactional batch of a producer with no transaction ongoing here at its epoch (the first
batch of its transaction at this partition, or a late one from a transaction that already ended)
is appended only once the transaction coordinator confirmed that the partition is in the
producer's ongoing transaction (``TxnVerificationRpcs.verify_leader``, the code the diskless path
uses; AddPartitionsToTxn verifyOnly). Otherwise it is answered as Kafka answers
(``produce_error``): INVALID_TXN_STATE for a partition not in the transaction,
INVALID_PRODUCER_EPOCH for a fenced producer, NOT_ENOUGH_REPLICAS (which every client retries,
with no metadata refresh) when the coordinator could not be asked. The log checks the verified
guard again when it appends (``PartitionLog.append_as_leader``), so a marker written while the
coordinator was asked makes the append fail instead of opening a transaction nobody will end. A
batch of a producer whose transaction is ongoing here at its epoch (every batch after the first)
is appended at once: one dict lookup, no round trip.

Order while a batch waits for its verification: later batches of the same producer to the same
partition wait behind it (``log/txn_verification_order.py``), each transactional one verified
meanwhile (concurrent questions share one coordinator round trip), and take their turns in arrival
order as their verifications end; other producers' batches are not held up. Kafka instead lets a
later batch overtake (it verifies, then appends in a callback) and relies on idempotent producers
retrying the OUT_OF_ORDER_SEQUENCE_NUMBER that follows; the lines keep produce's ordering note
(``produce_apis``) true without that retry, as the representative's lines do for diskless
partitions. A batch's turn (leader looked up again, appended or refused) is ``produce_apis``'s
``take_turn``; its request's answer waits for the future ``hold`` hands back.

The lines are keyed by the log the batch was accepted for: a turn taken after leadership moved or
the topic was re-created finds another log (or none) and refuses the batch. A request that ends
(timed out, connection closed) leaves its batch in its line: it still takes its turn, as Kafka's
verification callback still appends, and the producer's retry, in line behind it, is then a
duplicate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.log.partition_log import PartitionLog
from diskless.log.txn_verification import TxnGuard
from diskless.log.txn_verification_order import VerificationLines
from diskless.protocol import records
from diskless.replication.partition import Partition

log = structlog.get_logger(__name__)

# What a classic partition's produce comes to: its response entry, the replica it was appended to
# (None: refused) and the last offset appended.
Appended = tuple[dict[str, Any], Partition | None, int]

# TxnVerificationRpcs.verify_leader: (topic, partition, log, leader epoch, transactional id,
# producer id, producer epoch) -> a verified guard or the produce error.
VerifyLeader = Callable[[str, int, PartitionLog, int, str, int, int], Awaitable[TxnGuard | ErrorCode]]


@dataclass
class WaitingBatch:
    """A classic batch appended only after the batches of its producer ahead of it (and, if it is
    transactional with no transaction ongoing, its own verification)."""

    topic: str
    partition: int
    batches: list[memoryview]
    acks: int
    future: asyncio.Future[Appended]
    verifying: bool = False
    verified: TxnGuard | ErrorCode | None = None  # a transactional batch's verification outcome


# A waiting batch's turn, on the log it waited on: appended or refused, never raising for a refusal.
TakeTurn = Callable[[PartitionLog, WaitingBatch], Appended]


class ClassicTxnVerification:
    """The classic batches waiting for a verification, per (log, producer id)."""

    def __init__(self, verify_leader: VerifyLeader, take_turn: TakeTurn) -> None:
        self._verify_leader = verify_leader
        self._take_turn = take_turn
        self._lines: VerificationLines[tuple[PartitionLog, int], WaitingBatch] = VerificationLines()
        self._tasks: set[asyncio.Task[None]] = set()

    def __bool__(self) -> bool:
        """Whether any batch waits (for tests and inspection)."""
        return bool(self._lines)

    def hold(
        self,
        plog: PartitionLog,
        leader_epoch: int,
        topic: str,
        partition: int,
        batches: list[memoryview],
        acks: int,
        transactional_id: str | None,
        verify: bool,
    ) -> asyncio.Future[Appended] | None:
        """None: append the batch now. Else the future of its turn: it must be verified first
        (``verify``: verification is enabled), or a batch of its producer waits here before it."""
        if not self._lines and (transactional_id is None or not verify):
            return None
        header = records.parse_header(batches[0])
        key = (plog, header.producer_id)
        unverified = (
            verify
            and transactional_id is not None
            and header.is_transactional
            and not plog.in_ongoing_txn(header.producer_id, header.producer_epoch)
        )
        if not unverified and not self._lines.has_line(key):
            return None
        item = WaitingBatch(topic, partition, batches, acks, asyncio.get_running_loop().create_future())
        item.verifying = unverified
        self._lines.join(key, item)
        if unverified:
            assert transactional_id is not None
            self._spawn(self._verify(key, item, transactional_id, header, leader_epoch))
        return item.future

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _verify(
        self,
        key: tuple[PartitionLog, int],
        item: WaitingBatch,
        transactional_id: str,
        header: records.BatchHeader,
        leader_epoch: int,
    ) -> None:
        try:
            item.verified = await self._verify_leader(
                item.topic,
                item.partition,
                key[0],
                leader_epoch,
                transactional_id,
                header.producer_id,
                header.producer_epoch,
            )
        except Exception as exc:
            log.info("transaction verification failed", error=repr(exc))
            item.verified = ErrorCode.not_enough_replicas
        finally:
            if item.verified is None:  # cancelled (the broker stops): never appended unverified
                item.verified = ErrorCode.not_enough_replicas
            item.verifying = False
            self._release(key)

    def _release(self, key: tuple[PartitionLog, int]) -> None:
        """The turns of a producer's batches from the front of its line, in arrival order, up to
        the first one still being verified. Synchronous: no marker or other batch of the producer
        comes between a batch's turn and its append."""
        while (item := self._lines.next_turn(key)) is not None:
            try:
                outcome = self._take_turn(key[0], item)
            except Exception as exc:
                # As on the direct path, the request fails (answered by the connection layer); the
                # batches behind it still get their turn: one raising must not strand them.
                if not item.future.done():
                    item.future.set_exception(exc)
                else:
                    log.warning("withdrawn produce failed", topic=item.topic, partition=item.partition, error=repr(exc))
                continue
            if not item.future.done():
                item.future.set_result(outcome)

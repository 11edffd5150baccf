"""Transaction verification, the asyncio side (KIP-890 part 1): diskless commits and classic produce.

Two internal RPCs, and the leader's check they share with classic produce:

- VerifyTxnPartition (representative -> partition leader), sent when a representative accepts a
  transactional batch, before the batch is buffered: the leader answers with a guard that the
  batch's commit carries (``log/txn_verification.py`` holds the rules). A guard already verified
  for the producer's epoch is answered at once; otherwise the leader asks the transaction
  coordinator first, so only the first batch of a partition per transaction pays that round trip.
- ``verify_leader`` is the leader's part of VerifyTxnPartition, also called by the classic produce
  path (``produce_apis``) for a transactional batch of a producer with no transaction ongoing at
  the partition: one implementation of the rules for both kinds of partitions.
- VerifyTxn (leader -> transaction coordinator): Kafka's AddPartitionsToTxn verifyOnly, answered by
  ``TransactionCoordinatorCore.verify_partitions``.

Errors reach the producer as Kafka's produce path reports verification failures: INVALID_TXN_STATE
(the partition is not in an ongoing transaction of the producer), INVALID_PRODUCER_EPOCH (fenced),
and NOT_ENOUGH_REPLICAS for anything retriable (coordinator moving or loading, a transaction
being ended, the coordinator unreachable), which every client retries.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.log.partition_log import PartitionLog
from diskless.log.txn_verification import TxnGuard
from diskless.protocol import internal

from .api_base import ApiFamily

log = structlog.get_logger(__name__)

COORDINATOR_TIMEOUT_S = 10.0


def produce_error(code: ErrorCode) -> ErrorCode:
    """A coordinator's verification answer as a produce error (what Kafka's leader answers)."""
    if code in (ErrorCode.none, ErrorCode.invalid_txn_state, ErrorCode.invalid_producer_epoch):
        return code
    if code is ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    if code in (ErrorCode.invalid_producer_id_mapping, ErrorCode.transaction_abortable):
        # TRANSACTION_ABORTABLE is for produce v11+ (KIP-890); Kafka's AddPartitionsToTxnManager
        # answers older versions (all this broker serves) INVALID_TXN_STATE instead.
        return ErrorCode.invalid_txn_state
    return ErrorCode.not_enough_replicas


class TxnVerificationRpcs(ApiFamily):
    """Leader side of VerifyTxnPartition and coordinator side of VerifyTxn."""

    def __init__(self, broker: Any) -> None:
        super().__init__(broker)
        # One coordinator question per pending guard, however many batches wait for it.
        self._asking: dict[tuple[int, int, TxnGuard], asyncio.Future[ErrorCode]] = {}

    async def verify_partition(self, body: dict[str, Any]) -> dict[str, Any]:
        """VerifyTxnPartition: {transactional_id, producer_id, producer_epoch, topic, topic_id,
        partition, deadline_ms} -> {error_code, guard}. ``deadline_ms`` is when the producer's
        request times out: a question that arrives later than that (its sender stalled) is not
        answered with a guard, since the transaction it was asked for may have ended since."""
        topic, partition = str(body["topic"]), int(body["partition"])
        stale = self.broker.apis.diskless._incarnation_error(topic, partition, body.get("topic_id"))
        if stale is not None:
            return {"error_code": int(stale)}
        if self.broker.now_ms() > int(body["deadline_ms"]):
            return {"error_code": int(ErrorCode.request_timed_out)}
        code, plog, replica = self._leader_log(topic, partition)
        if plog is None or replica is None:
            return {"error_code": int(code)}
        verified = await self.verify_leader(
            topic,
            partition,
            plog,
            replica.leader_epoch,
            str(body["transactional_id"]),
            int(body["producer_id"]),
            int(body["producer_epoch"]),
        )
        if isinstance(verified, ErrorCode):
            return {"error_code": int(verified)}
        return {"error_code": 0, "guard": verified.to_wire()}

    async def verify_leader(
        self,
        topic: str,
        partition: int,
        plog: PartitionLog,
        leader_epoch: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
    ) -> TxnGuard | ErrorCode:
        """The leader's side of a verification, for diskless commits (``verify_partition``) and
        classic produce (``produce_apis``) alike: a verified guard for (producer id, epoch) on
        ``plog`` in the term ``leader_epoch``, asking the coordinator only if the guard is not
        verified yet; or the produce error to answer (``produce_error``)."""
        began = plog.txn_verifier.begin(producer_id, producer_epoch, leader_epoch)
        if isinstance(began, ErrorCode):
            return began
        guard, verified = began
        if verified:
            return guard
        question = {
            "transactional_id": transactional_id,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "topic": topic,
            "partition": partition,
        }
        answer = await self._coordinator_answer(plog, question, guard)
        if answer is not ErrorCode.none:
            plog.txn_verifier.forget(producer_id, guard)
            return produce_error(answer)
        _, now_log, now_replica = self._leader_log(topic, partition)
        if now_log is not plog or now_replica is None or now_replica.leader_epoch != leader_epoch:
            plog.txn_verifier.forget(producer_id, guard)
            return ErrorCode.not_leader_or_follower
        if not plog.txn_verifier.confirm(producer_id, guard):
            # A marker ended the transaction while the coordinator was being asked.
            return ErrorCode.invalid_txn_state
        return guard

    async def _coordinator_answer(self, plog: PartitionLog, body: dict[str, Any], guard: TxnGuard) -> ErrorCode:
        key = (id(plog), int(body["producer_id"]), guard)
        asking = self._asking.get(key)
        if asking is None:
            asking = asyncio.ensure_future(self._ask_coordinator(body))
            self._asking[key] = asking
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(asking)

    async def _ask_coordinator(self, body: dict[str, Any]) -> ErrorCode:
        txn_id = str(body["transactional_id"])
        question = {
            "transactional_id": txn_id,
            "producer_id": int(body["producer_id"]),
            "producer_epoch": int(body["producer_epoch"]),
            "partitions": [[str(body["topic"]), int(body["partition"])]],
        }
        node = self.broker.txns.coordinator_node(txn_id)
        if node < 0:
            return ErrorCode.coordinator_not_available
        try:
            if node == self.broker.node_id:
                answer = await self.verify_txn(question)
            else:
                conn = await asyncio.wait_for(self.broker.peers.get(node), COORDINATOR_TIMEOUT_S)
                future = conn.send_internal(internal.INTERNAL_VERIFY_TXN, question)
                answer = await conn.wait(future, timeout=COORDINATOR_TIMEOUT_S)
            return ErrorCode(int(answer["errors"][0]))
        except Exception as exc:
            log.info("transaction verification failed", coordinator=node, error=repr(exc))
            return ErrorCode.coordinator_not_available

    async def verify_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        """VerifyTxn on the coordinator: {transactional_id, producer_id, producer_epoch,
        partitions: [[topic, partition]]} -> {errors: [code per partition]}."""
        txn_id = str(body["transactional_id"])
        partitions = [(str(t), int(p)) for t, p in body["partitions"]]
        core = self.broker.txns.coordinator(txn_id)
        if isinstance(core, ErrorCode):
            return {"errors": [int(core)] * len(partitions)}
        results = core.verify_partitions(txn_id, int(body["producer_id"]), int(body["producer_epoch"]), partitions)
        return {"errors": [int(results[tp]) for tp in partitions]}

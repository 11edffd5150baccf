"""The leader's VerifyTxnPartition shell: the coordinator is asked once per producer epoch and
transaction (later batches are answered from the verified guard), concurrent batches share one
question, a marker makes the next batch ask again, a marker written while the question is out
makes the answer INVALID_TXN_STATE, and a coordinator that moved away (or cannot be reached) is
NOT_ENOUGH_REPLICAS, which producers retry. Real partition log and coordinator core; the broker
around them is a stand-in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from loghelpers import T0, open_log

from diskless.broker.txn_verification_rpcs import TxnVerificationRpcs, produce_error
from diskless.log.partition_log import PartitionLog
from diskless.transactions.coordinator import TransactionCoordinatorCore, Transit

PID = 6000
TXN = "txn"
TOPIC = "t"
TOPIC_ID = "00000000-0000-0000-0000-000000000001"


class FakeTxns:
    def __init__(self, core: TransactionCoordinatorCore) -> None:
        self.core: TransactionCoordinatorCore | ErrorCode = core
        self.questions = 0
        self.gate: asyncio.Event | None = None

    def coordinator_node(self, txn_id: str) -> int:
        return 1  # this broker

    def coordinator(self, txn_id: str) -> TransactionCoordinatorCore | ErrorCode:
        self.questions += 1
        return self.core


class Replica:
    leader_epoch = 4
    leader_state = object()


class Broker:
    node_id = 1

    def __init__(self, core: TransactionCoordinatorCore) -> None:
        self.txns = FakeTxns(core)
        self.apis = type("Apis", (), {"diskless": type("D", (), {"_incarnation_error": lambda *a: None})()})()

    @staticmethod
    def now_ms() -> int:
        return T0


class Rpcs(TxnVerificationRpcs):
    def __init__(self, broker: Broker, log: PartitionLog) -> None:
        super().__init__(broker)
        self.log = log
        self.replica = Replica()

    def _leader_log(self, topic: str, partition: int, *args: Any, **kwargs: Any) -> Any:
        return ErrorCode.none, self.log, self.replica

    async def verify_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        gate = self.broker.txns.gate
        if gate is not None:
            await gate.wait()
        return await super().verify_txn(body)


def ongoing(core: TransactionCoordinatorCore) -> int:
    init = core.init_producer_id(TXN, 60_000, None, 0, new_producer_id=PID)
    assert isinstance(init, Transit)
    core.complete_transit(init, ErrorCode.none, 0)
    add = core.add_partitions(TXN, PID, init.target.producer_epoch, {(TOPIC, 0)}, 1)
    assert isinstance(add, Transit)
    core.complete_transit(add, ErrorCode.none, 1)
    return init.target.producer_epoch


def body(epoch: int) -> dict[str, Any]:
    return {
        "transactional_id": TXN,
        "producer_id": PID,
        "producer_epoch": epoch,
        "topic": TOPIC,
        "topic_id": TOPIC_ID,
        "partition": 0,
        "deadline_ms": T0 + 30_000,
    }


async def test_the_coordinator_is_asked_once_per_transaction(tmp_path: Path) -> None:
    core = TransactionCoordinatorCore()
    epoch = ongoing(core)
    log = open_log(tmp_path)
    broker = Broker(core)
    rpcs = Rpcs(broker, log)
    broker.txns.gate = asyncio.Event()
    concurrent = [asyncio.ensure_future(rpcs.verify_partition(body(epoch))) for _ in range(3)]
    await asyncio.sleep(0.01)
    broker.txns.gate.set()
    answers = await asyncio.gather(*concurrent)
    assert [a["error_code"] for a in answers] == [0, 0, 0]
    assert len({tuple(a["guard"]) for a in answers}) == 1, "one guard for one transaction"
    assert broker.txns.questions == 1, "concurrent batches share one question"
    later = await rpcs.verify_partition(body(epoch))
    assert later["guard"] == answers[0]["guard"] and broker.txns.questions == 1, "later batches are not asked about"
    log.append_marker_as_leader(PID, epoch, False, 0, Replica.leader_epoch, T0)
    # The client aborted; its next transaction must add the partition first.
    end = core.end_txn(TXN, PID, epoch, False, 2)
    assert isinstance(end, Transit)
    core.complete_transit(end, ErrorCode.none, 2)
    refused = await rpcs.verify_partition(body(epoch))
    assert refused == {"error_code": int(ErrorCode.not_enough_replicas)}, "markers still being written"
    assert broker.txns.questions == 2, "a marker makes the next batch ask again"


async def test_marker_while_the_question_is_out_answers_invalid_txn_state(tmp_path: Path) -> None:
    core = TransactionCoordinatorCore()
    epoch = ongoing(core)
    log = open_log(tmp_path)
    broker = Broker(core)
    rpcs = Rpcs(broker, log)
    broker.txns.gate = asyncio.Event()
    asking = asyncio.ensure_future(rpcs.verify_partition(body(epoch)))
    await asyncio.sleep(0.01)
    log.append_marker_as_leader(PID, epoch, False, 0, Replica.leader_epoch, T0)
    broker.txns.gate.set()
    assert await asking == {"error_code": int(ErrorCode.invalid_txn_state)}
    assert log.txn_verifier.guarded() == {}


async def test_coordinator_moved_is_retriable_and_asked_again(tmp_path: Path) -> None:
    core = TransactionCoordinatorCore()
    epoch = ongoing(core)
    log = open_log(tmp_path)
    broker = Broker(core)
    rpcs = Rpcs(broker, log)
    broker.txns.core = ErrorCode.not_coordinator
    assert await rpcs.verify_partition(body(epoch)) == {"error_code": int(ErrorCode.not_enough_replicas)}
    assert log.txn_verifier.guarded() == {}, "a failed question leaves no guard behind"
    broker.txns.core = core  # the new coordinator replayed the same state
    assert (await rpcs.verify_partition(body(epoch)))["error_code"] == 0
    assert await rpcs.verify_partition(body(epoch + 1)) == {"error_code": int(ErrorCode.invalid_producer_epoch)}


async def test_question_after_the_producers_request_timed_out_is_not_answered(tmp_path: Path) -> None:
    core = TransactionCoordinatorCore()
    epoch = ongoing(core)
    rpcs = Rpcs(Broker(core), open_log(tmp_path))
    late = {**body(epoch), "deadline_ms": T0 - 1}
    assert await rpcs.verify_partition(late) == {"error_code": int(ErrorCode.request_timed_out)}


def test_transaction_abortable_reaches_old_produce_versions_as_invalid_txn_state() -> None:
    """Kafka's AddPartitionsToTxnManager: TRANSACTION_ABORTABLE only for produce v11+ (KIP-890
    part 2 clients); older versions (this broker serves v3-9) get INVALID_TXN_STATE, not a retry."""
    assert produce_error(ErrorCode.transaction_abortable) == ErrorCode.invalid_txn_state
    assert produce_error(ErrorCode.producer_fenced) == ErrorCode.invalid_producer_epoch
    assert produce_error(ErrorCode.concurrent_transactions) == ErrorCode.not_enough_replicas

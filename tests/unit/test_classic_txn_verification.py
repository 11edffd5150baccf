"""Transaction verification of classic partitions (KIP-890 part 1), as Kafka's
ReplicaManager.handleProduceAppend: a transactional batch of a producer with no transaction ongoing
at the partition is appended only if the coordinator lists the partition in the producer's ongoing
transaction; later batches of the transaction skip the question; pipelined batches of the producer
stay in order while the first one is verified; with ``transaction.partition.verification.enable``
off nothing is asked.

The real ProduceApis handler over a real ReplicaManager (``FencedBroker``, as
test_produce_refusals_as_kafka.py), the real TxnVerificationRpcs leader side and a real coordinator
core; the coordinator is reached in-process, through a gate the tests open.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from batches import make_batch
from kio.schema.errors import ErrorCode
from test_produce_refusals_as_kafka import Broker as ProduceBroker

from diskless.broker.api_base import CloseConnection
from diskless.broker.produce_apis import ProduceApis
from diskless.broker.txn_verification_rpcs import TxnVerificationRpcs
from diskless.log.partition_log import PartitionLog
from diskless.protocol import messages as m
from diskless.transactions.coordinator import TransactionCoordinatorCore, Transit

PID = 7000
OTHER_PID = 7001
TXN = "txn"


class Txns:
    """The broker's transaction coordinators, as TxnVerificationRpcs uses them: here, one core."""

    def __init__(self, core: TransactionCoordinatorCore) -> None:
        self.core: TransactionCoordinatorCore | ErrorCode = core
        self.questions = 0

    def coordinator_node(self, txn_id: str) -> int:
        return 0  # this broker (fenced_broker.NODE)

    def coordinator(self, txn_id: str) -> TransactionCoordinatorCore | ErrorCode:
        self.questions += 1
        return self.core


class GatedVerification(TxnVerificationRpcs):
    """Holds every coordinator question until ``gate`` is set; ``asked`` tells it is out."""

    def __init__(self, broker: Any) -> None:
        super().__init__(broker)
        self.gate = asyncio.Event()
        self.gate.set()
        self.asked = asyncio.Event()

    async def verify_txn(self, body: dict[str, Any]) -> dict[str, Any]:
        self.asked.set()
        await self.gate.wait()
        return await super().verify_txn(body)


class Broker(ProduceBroker):
    node_id = 0

    def __init__(self, log_dir: Path, core: TransactionCoordinatorCore) -> None:
        super().__init__(log_dir)
        self.txns = Txns(core)
        self.apis = SimpleNamespace(txn_verification=GatedVerification(self))


class Setup:
    def __init__(self, tmp_path: Path, partitions: set[tuple[str, int]]) -> None:
        self.core = TransactionCoordinatorCore()
        for _ in range(2):  # twice: the producer has an older epoch to be fenced at
            init = self.core.init_producer_id(TXN, 60_000, None, 0, new_producer_id=PID)
            assert isinstance(init, Transit)
            self.core.complete_transit(init, ErrorCode.none, 0)
        self.epoch = init.target.producer_epoch
        assert self.epoch > 0
        if partitions:
            add = self.core.add_partitions(TXN, PID, self.epoch, partitions, 1)
            assert isinstance(add, Transit)
            self.core.complete_transit(add, ErrorCode.none, 1)
        self.broker = Broker(tmp_path / "logs", self.core)
        self.broker.host("t")
        self.apis = ProduceApis(self.broker)  # type: ignore[arg-type]
        self.verification: GatedVerification = self.broker.apis.txn_verification

    @property
    def log(self) -> PartitionLog:
        replica = self.broker.replicas.hosted("t", 0, self.broker.metadata.topics["t"].topic_id)
        assert replica is not None
        return replica.log

    def batch(self, sequence: int, producer_id: int = PID, transactional: bool = True, epoch: int = -1) -> bytes:
        return make_batch(
            [b"v%d" % sequence],
            producer_id=producer_id,
            producer_epoch=self.epoch if epoch < 0 else epoch,
            base_sequence=sequence,
            transactional=transactional,
        )

    def send(self, batch: bytes, transactional_id: str | None = TXN, acks: int = 1) -> Any:
        """The handler's immediate result: a body (appended synchronously) or an awaitable."""
        request = SimpleNamespace(
            acks=acks,
            timeout=5000,
            transactional_id=transactional_id,
            topic_data=[SimpleNamespace(name="t", partition_data=[SimpleNamespace(index=0, records=batch)])],
        )
        return self.apis.produce(m.RequestHeader(m.API_PRODUCE, 9, 1, "c"), request)

    async def produce(self, batch: bytes, transactional_id: str | None = TXN) -> tuple[ErrorCode, int]:
        result = self.send(batch, transactional_id)
        return answer(result if isinstance(result, dict) else await result)


def answer(body: dict[str, Any]) -> tuple[ErrorCode, int]:
    part = body["responses"][0]["partition_responses"][0]
    return ErrorCode(part["error_code"]), part["base_offset"]


async def test_partition_not_in_the_transaction_is_refused_and_not_appended(tmp_path: Path) -> None:
    """A batch sent before AddPartitionsToTxn completed (or by a client that never sent it):
    Kafka answers INVALID_TXN_STATE ("Partition was not added to the transaction") and appends
    nothing, so no transaction the coordinator does not know holds the last stable offset."""
    setup = Setup(tmp_path, {("other", 0)})
    assert await setup.produce(setup.batch(0)) == (ErrorCode.invalid_txn_state, -1)
    assert setup.log.log_end_offset == 0
    assert PID not in setup.log.txns.ongoing
    assert setup.log.txn_verifier.guarded() == {}, "a refused verification leaves no guard behind"


async def test_partition_in_the_transaction_is_appended_and_later_batches_skip_the_question(
    tmp_path: Path,
) -> None:
    setup = Setup(tmp_path, {("t", 0)})
    first = setup.send(setup.batch(0))
    assert not isinstance(first, dict), "the first batch of the transaction here waits for the coordinator"
    assert answer(await first) == (ErrorCode.none, 0)
    assert setup.broker.txns.questions == 1
    # The common case: the transaction is ongoing here, appended before the handler returns.
    second = setup.send(setup.batch(1))
    assert isinstance(second, dict) and answer(second) == (ErrorCode.none, 1)
    assert setup.broker.txns.questions == 1, "a batch of an ongoing transaction is not verified"


async def test_late_batch_after_the_abort_is_refused(tmp_path: Path) -> None:
    """The hanging transaction KIP-890 closes: a retry that arrives after its transaction was
    aborted (markers written) must not open a new transaction here that no coordinator will end."""
    setup = Setup(tmp_path, {("t", 0)})
    assert await setup.produce(setup.batch(0)) == (ErrorCode.none, 0)
    end = setup.core.end_txn(TXN, PID, setup.epoch, False, 2)
    assert isinstance(end, Transit)
    setup.core.complete_transit(end, ErrorCode.none, 2)
    replica_epoch = setup.broker.metadata.topics["t"].partitions[0].leader_epoch
    setup.log.append_marker_as_leader(PID, setup.epoch, False, 0, replica_epoch, 3)
    end_offset = setup.log.log_end_offset
    # Markers still being written elsewhere: CONCURRENT_TRANSACTIONS, which the producer retries.
    assert await setup.produce(setup.batch(1)) == (ErrorCode.not_enough_replicas, -1)
    work = setup.core.begin_markers(TXN)
    assert work is not None
    complete = setup.core.markers_written(work, dict.fromkeys(work.partitions, ErrorCode.none), 4)
    assert complete is not None
    setup.core.complete_transit(complete, ErrorCode.none, 4)
    assert await setup.produce(setup.batch(1)) == (ErrorCode.invalid_txn_state, -1)
    assert setup.log.log_end_offset == end_offset
    assert PID not in setup.log.txns.ongoing


async def test_marker_written_while_the_question_is_out_refuses_the_batch(tmp_path: Path) -> None:
    """Kafka's VerificationGuard: the coordinator's yes answers for the transaction that was
    ongoing when it was asked; a marker that ended it meanwhile makes the append fail."""
    setup = Setup(tmp_path, {("t", 0)})
    setup.verification.gate.clear()
    waiting = setup.send(setup.batch(0))
    assert not isinstance(waiting, dict), "appended without asking the coordinator"
    await setup.verification.asked.wait()
    setup.log.append_marker_as_leader(PID, setup.epoch, False, 0, 0, 3)
    end_offset = setup.log.log_end_offset
    setup.verification.gate.set()
    assert answer(await waiting) == (ErrorCode.invalid_txn_state, -1)
    assert setup.log.log_end_offset == end_offset


async def test_pipelined_batches_of_the_producer_stay_in_order(tmp_path: Path) -> None:
    """While the first batch of the transaction is verified, the producer's next batches wait
    behind it (no OUT_OF_ORDER_SEQUENCE_NUMBER for the client to retry); other producers' batches
    are not held up; one coordinator question serves them all."""
    setup = Setup(tmp_path, {("t", 0)})
    setup.verification.gate.clear()
    first = setup.send(setup.batch(0))
    second = setup.send(setup.batch(1))
    third = setup.send(setup.batch(2))
    assert not any(isinstance(r, dict) for r in (first, second, third))
    other = setup.send(setup.batch(0, producer_id=OTHER_PID, transactional=False), transactional_id=None)
    assert isinstance(other, dict) and answer(other) == (ErrorCode.none, 0), "another producer is not held up"
    assert setup.log.log_end_offset == 1, "the waiting producer's batches are not appended yet"
    setup.verification.gate.set()
    answers = [answer(await r) for r in (first, second, third)]
    assert answers == [(ErrorCode.none, 1), (ErrorCode.none, 2), (ErrorCode.none, 3)]
    assert setup.broker.txns.questions == 1
    assert not setup.apis._txn_verification, "no batch left waiting"


async def test_fenced_producer_is_invalid_producer_epoch(tmp_path: Path) -> None:
    """The coordinator's PRODUCER_FENCED reaches the producer as INVALID_PRODUCER_EPOCH, the code
    Kafka's AddPartitionsToTxnManager answers produce with."""
    setup = Setup(tmp_path, {("t", 0)})
    assert await setup.produce(setup.batch(0, epoch=setup.epoch - 1)) == (ErrorCode.invalid_producer_epoch, -1)
    assert setup.log.log_end_offset == 0


async def test_coordinator_not_reachable_is_retriable_not_enough_replicas(tmp_path: Path) -> None:
    """Kafka: CONCURRENT_TRANSACTIONS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, ... become
    NOT_ENOUGH_REPLICAS, which produce v3-9 clients retry without refreshing metadata."""
    setup = Setup(tmp_path, {("t", 0)})
    setup.broker.txns.core = ErrorCode.not_coordinator
    assert await setup.produce(setup.batch(0)) == (ErrorCode.not_enough_replicas, -1)
    setup.broker.txns.core = setup.core
    assert await setup.produce(setup.batch(0)) == (ErrorCode.none, 0), "the retry is verified and appended"


async def test_acks_0_refusal_closes_the_connection(tmp_path: Path) -> None:
    setup = Setup(tmp_path, set())
    result = setup.send(setup.batch(0), acks=0)
    with pytest.raises(CloseConnection):
        await result
    assert setup.log.log_end_offset == 0


async def test_verification_off_appends_without_asking(tmp_path: Path) -> None:
    setup = Setup(tmp_path, set())
    setup.broker.config = dataclasses.replace(setup.broker.config, transaction_partition_verification_enable=False)
    result = setup.send(setup.batch(0))
    assert isinstance(result, dict) and answer(result) == (ErrorCode.none, 0)
    assert setup.broker.txns.questions == 0


async def test_batch_refused_while_fenced_after_its_verification_makes_a_gap_of_ours(tmp_path: Path) -> None:
    """A leader whose etcd lease may have lapsed while a batch waited for the coordinator refuses
    it NOT_LEADER_OR_FOLLOWER, as it refuses a batch that arrives while fenced: the producer's
    state must know the gap is of the leader's making (ProducerStateManager.note_refused), so the
    producer's next batch, arriving once the lease is refreshed, is refused alike instead of
    OUT_OF_ORDER_SEQUENCE_NUMBER (which aborts a librdkafka transaction; test_fenced_produce.py)."""
    from fenced_broker import TTL_MS

    setup = Setup(tmp_path, {("t", 0)})
    assert await setup.produce(setup.batch(0)) == (ErrorCode.none, 0)
    setup.log.append_marker_as_leader(PID, setup.epoch, False, 0, 0, 3)  # the next batch is verified again
    setup.verification.gate.clear()
    waiting = setup.send(setup.batch(1))
    assert not isinstance(waiting, dict)
    await setup.verification.asked.wait()
    setup.broker.clock = TTL_MS  # fenced while the question is out
    setup.verification.gate.set()
    assert answer(await waiting) == (ErrorCode.not_leader_or_follower, -1)
    setup.broker.fence.on_refreshed(TTL_MS)  # leading again, same epoch
    assert await setup.produce(setup.batch(2)) == (ErrorCode.not_leader_or_follower, -1)
    assert await setup.produce(setup.batch(1)) == (ErrorCode.none, 2)  # resent from the refused batch
    assert await setup.produce(setup.batch(2)) == (ErrorCode.none, 3)


async def test_append_failing_unexpectedly_leaves_no_batch_of_the_producer_stuck(tmp_path: Path) -> None:
    """An append that raises something the log does not answer with an error code (a disk
    failure) fails its own request, as on the direct path; the producer's batches queued behind it
    still get their turn, and its later batches are not queued behind a turn that never comes."""
    setup = Setup(tmp_path, {("t", 0)})
    real_append = setup.log.append_as_leader
    calls = 0

    def append_as_leader(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("disk failed")
        return real_append(*args, **kwargs)

    setup.log.append_as_leader = append_as_leader  # type: ignore[method-assign]
    setup.verification.gate.clear()
    first = setup.send(setup.batch(0))
    # Queued behind it with no verification of its own to end (not transactional).
    second = setup.send(setup.batch(0, transactional=False))
    setup.verification.gate.set()
    with pytest.raises(OSError, match="disk failed"):
        await asyncio.wait_for(first, 2)
    assert answer(await asyncio.wait_for(second, 2)) == (ErrorCode.none, 0)
    assert not setup.apis._txn_verification, "no batch left waiting"
    assert await asyncio.wait_for(setup.produce(setup.batch(1)), 2) == (ErrorCode.none, 1)


async def test_topic_recreated_while_the_batch_waits_appends_to_neither_log(tmp_path: Path) -> None:
    """The queue belongs to the log the batch was accepted for: once the name leads to another
    incarnation's log, the waiting batches of the old one are refused (retriable) and appended to
    neither log, as when leadership moves while they wait."""
    setup = Setup(tmp_path, {("t", 0)})
    old_log = setup.log
    setup.verification.gate.clear()
    first = setup.send(setup.batch(0))
    second = setup.send(setup.batch(1))
    await setup.verification.asked.wait()
    setup.broker.host("t")  # deleted and re-created under the same name, led here
    assert setup.log is not old_log
    setup.verification.gate.set()
    assert [answer(await r) for r in (first, second)] == [(ErrorCode.not_leader_or_follower, -1)] * 2
    assert old_log.log_end_offset == 0 and setup.log.log_end_offset == 0
    assert not setup.apis._txn_verification, "no batch left waiting"

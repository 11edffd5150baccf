"""The representative's reset after a bug, with a commit of the old pipeline still on its way to a
remote leader.

A reset (an unexpected exception in the commit pump) fails every batch the representative holds
and starts a fresh ``CommitPipeline`` that knows nothing of the old one's in-flight commits: their
answers are ignored, and the fresh pipeline may send a later commit of the same partition before
the old one is applied. Each test here drives one interleaving of that, with leaders that hold
every request in a per-connection queue until the test lets them apply it (as a real leader
starts the requests of one connection in order) and hold every answer until the test releases it.

Why no interleaving breaks per-partition order or an idempotent producer (what the tests pin):

- The fresh commit goes on the *same connection* (leader and epoch unchanged): the leader applies
  the old commit first. An idempotent producer's retry of the old batch is a duplicate, answered
  with the first append's offset.
- It goes to *another leader or epoch*: every entry carries the epoch it was routed at, and a
  leader refuses an entry of any epoch but its current one (a deposed leader that has not learnt
  it yet stops at its etcd lease, and whatever it appended at the old epoch after its successor
  took over is truncated by KIP-320 divergence). So the old commit is refused, truncated, or was
  replicated before the new epoch began, i.e. before the fresh commit.
- It goes on *another connection to the same leader and epoch*: that exists only once the old
  connection closed, the case of a lost answer that the pipeline handles without any reset (R3,
  R6): the leader may still apply the old commit late. An idempotent producer's sequence makes it
  a duplicate; a producer without idempotence may see its batch twice (at least once, as after a
  Kafka request that timed out at the client while the leader appended it).
- Late answers carry batch ids (the representative's tokens) that no later batch ever gets, so the
  fresh pipeline ignores them.

What the producer of a batch whose commit was started is told at the reset: REQUEST_TIMED_OUT
(retriable, "possibly persisted", the Kafka client's view of a request that timed out at it), never
KAFKA_STORAGE_ERROR, which tells it the batch was not written (librdkafka's NOT_PERSISTED status:
an application may resend it expecting no duplicate).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from batches import values_batch
from kio.schema.errors import ErrorCode
from test_representative_order import PRODUCER_ID, TOPIC, TOPIC_ID, FakeStore

from diskless.config import BrokerConfig
from diskless.produce.host import RepresentativeHost
from diskless.produce.representative import Representative
from diskless.protocol import internal, records

OOSS = int(ErrorCode.out_of_order_sequence_number)
NOT_LEADER = int(ErrorCode.not_leader_or_follower)
FENCED = int(ErrorCode.fenced_leader_epoch)
TIMED_OUT = int(ErrorCode.request_timed_out)
STORAGE_ERROR = int(ErrorCode.kafka_storage_error)
RETRIABLE = {int(code) for code in ErrorCode if code.retriable}


@dataclass
class Partition:
    """Partition 0's leadership and log, applying entries as ``diskless_rpcs`` does: the stamped
    epoch must be the current one, an idempotent producer's sequences are checked as Kafka does
    (a duplicate gets the first append's offset), and a batch without idempotence is appended."""

    leader: int
    epoch: int = 0
    log: list[str] = field(default_factory=list)  # the names of the appended batches, by offset
    names: dict[int, str] = field(default_factory=dict)  # batch CRC -> name
    offset_of_seq: dict[int, int] = field(default_factory=dict)
    next_seq: int = 0

    def apply(self, node: int, entry: dict[str, Any]) -> dict[str, Any]:
        if node != self.leader:
            return {"error_code": NOT_LEADER}
        if entry["leader_epoch"] != self.epoch:
            return {"error_code": FENCED}
        header = records.parse_header(entry["header"])
        if header.producer_id >= 0:
            if header.base_sequence < self.next_seq:
                return self._ok(self.offset_of_seq[header.base_sequence])
            if header.base_sequence > self.next_seq:
                return {"error_code": OOSS}
            self.offset_of_seq[header.base_sequence] = len(self.log)
            self.next_seq = header.base_sequence + header.record_count
        self.log.append(self.names[header.crc])
        return self._ok(len(self.log) - 1)

    def _ok(self, offset: int) -> dict[str, Any]:
        return {
            "error_code": 0,
            "base_offset": offset,
            "last_offset": offset,
            "leader_epoch": self.epoch,
            "log_append_time": -1,
            "log_start_offset": 0,
        }


class QueuedConn:
    """One connection to a leader: requests wait in arrival order until the test applies them."""

    def __init__(self, node: int) -> None:
        self.node = node
        self.connected = True
        self.queue: deque[tuple[dict[str, Any], asyncio.Future[Any]]] = deque()

    def send_internal(self, api_key: int, body: dict[str, Any]) -> asyncio.Future[Any]:
        assert api_key == internal.INTERNAL_COMMIT_BATCHES  # acks=1 only: no AwaitReplicated
        if not self.connected:
            raise ConnectionResetError("not connected")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queue.append((body, future))
        return future

    async def wait(self, future: asyncio.Future[Any], timeout: float = 30.0) -> Any:
        return await asyncio.wait_for(asyncio.shield(future), timeout)

    def drop(self) -> None:
        """The connection breaks. The leader still holds what it read before (``queue``) and
        may apply it; its answers go nowhere."""
        self.connected = False
        for _, future in self.queue:
            if not future.done():
                future.set_exception(ConnectionResetError("injected: connection lost"))


class Peers:
    def __init__(self) -> None:
        self.conns: dict[int, QueuedConn] = {}

    def connected(self, node_id: int) -> QueuedConn | None:
        conn = self.conns.get(node_id)
        return conn if conn is not None and conn.connected else None

    async def get(self, node_id: int) -> QueuedConn:
        conn = self.connected(node_id)
        if conn is None:
            conn = self.conns[node_id] = QueuedConn(node_id)
        return conn

    async def connect_all(self, node_ids: list[int]) -> None:
        return None


class Metadata:
    def __init__(self, partition: Partition) -> None:
        self.part = partition
        self.brokers = {0: object(), 1: object(), 2: object()}
        self.wal_manager = None

    def partition_by_id(self, topic_id: str, partition: int) -> Any:
        if topic_id != TOPIC_ID or partition != 0:
            return None
        return type("State", (), {"leader": self.part.leader, "leader_epoch": self.part.epoch, "isr": [0, 1, 2]})()


class LocalLeader:
    def __init__(self, partition: Partition) -> None:
        self.part = partition

    def commit_batches_now(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"results": [self.part.apply(0, entry) for entry in body["entries"]]}


@dataclass
class Setup:
    rep: Representative
    part: Partition
    peers: Peers

    def submit(self, name: str, seq: int | None) -> asyncio.Future[dict[str, Any]]:
        """A batch named ``name``: of the idempotent producer at ``seq``, or without idempotence (None)."""
        if seq is None:
            data = values_batch(1, tag=name)
        else:
            data = values_batch(1, tag=name, producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq)
        self.part.names[records.parse_header(data).crc] = name
        return self.rep.submit(TOPIC, TOPIC_ID, 0, data, acks=1)

    def reset(self) -> None:
        """A bug in the commit pump: the representative fails what it holds and starts afresh."""

        def bug(*args: object) -> None:
            raise AssertionError("injected: a bug in the commit pump")

        self.rep.pipeline.next_sends = bug  # type: ignore[method-assign]
        self.rep._pump()

    def apply_next(self, node: int) -> tuple[asyncio.Future[Any], dict[str, Any]]:
        """The leader ``node`` applies the oldest request it holds on its current (or last) connection."""
        conn = self.peers.conns[node]
        body, future = conn.queue.popleft()
        return future, {"results": [self.part.apply(node, entry) for entry in body["entries"]]}

    async def close(self) -> None:
        """Break every connection first: ``close`` waits for the tasks awaiting answers."""
        for conn in self.peers.conns.values():
            conn.drop()
        await self.rep.close()

    def apply_stale(self, conn: QueuedConn) -> dict[str, Any]:
        """The leader applies a request it read from a connection that broke since."""
        body, _ = conn.queue.popleft()
        return {"results": [self.part.apply(conn.node, entry) for entry in body["entries"]]}


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def make_setup(leader: int = 1) -> Setup:
    part = Partition(leader=leader)
    peers = Peers()
    config = BrokerConfig(
        node_id=0,
        broker_rack="az-0",
        diskless_wal_linger_ms=1,
        diskless_wal_max_bytes=4096,
        diskless_produce_buffer_max_bytes=32 * 1024 * 1024,
    )
    host = RepresentativeHost(config, Metadata(part), peers, LocalLeader(part), None)  # type: ignore[arg-type]
    rep = Representative(host, FakeStore(set(), [0]), lambda key, data: None)  # type: ignore[arg-type]
    peers.conns[leader] = QueuedConn(leader)
    return Setup(rep, part, peers)


async def old_commit_in_flight(setup: Setup, seq: int | None) -> tuple[QueuedConn, asyncio.Future[dict[str, Any]]]:
    """Batch "a" committed to broker 1 (its request held there, not applied yet), then a reset."""
    conn = setup.peers.conns[1]
    first = setup.submit("a", seq)
    await until(lambda: len(conn.queue) == 1)
    setup.reset()
    await until(first.done)
    return conn, first


@pytest.mark.parametrize("old_answer_first", [True, False])
def test_on_one_connection_the_old_commit_is_applied_first_and_its_late_answer_completes_nothing(
    old_answer_first: bool,
) -> None:
    """Idempotent producer. Seq 0's commit is on broker 1's connection when the reset fails it; the
    producer resends seq 0 with seq 1, and the fresh pipeline sends them on the same connection
    before the old commit's answer came. The leader applies the old commit first (seq 0 appended),
    then the resend (a duplicate: the same offset) and seq 1. The old commit's answer, whenever it
    comes, completes nothing of the fresh pipeline."""

    async def scenario() -> None:
        setup = make_setup()
        conn, first = await old_commit_in_flight(setup, 0)
        assert first.result()["error_code"] in RETRIABLE
        again, second = setup.submit("a", 0), setup.submit("b", 1)
        await until(lambda: len(conn.queue) == 2)  # sent without waiting for the old commit's answer
        old = setup.apply_next(1)
        new = setup.apply_next(1)
        assert setup.part.log == ["a", "b"]
        for future, answer in [old, new] if old_answer_first else [new, old]:
            future.set_result(answer)
            await asyncio.sleep(0.01)
            if future is old[0]:
                # Batch ids never repeat: the old answer's ids name nothing in the fresh pipeline.
                assert again.done() is (not old_answer_first) and second.done() is (not old_answer_first)
        assert again.result() == {"error_code": 0, "base_offset": 0, "log_append_time": -1, "log_start_offset": 0}
        assert second.result()["base_offset"] == 1
        assert setup.rep.pipeline.pending == 0
        await setup.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("resent", [True, False])
def test_a_leader_change_fences_the_old_commit_whatever_overtakes_it(resent: bool) -> None:
    """Idempotent producer. Seq 0's commit waits at broker 1 when the reset fails it, then
    leadership moves to broker 2 (epoch 1). The fresh pipeline sends the producer's next commit to
    broker 2 at once, while the old one is still unapplied at broker 1: either the resend of seq 0
    with seq 1 (appended), or seq 1 alone, sent before the producer read seq 0's failure (out of
    order there: answered as seq 0's failure, retriable). Broker 1 then refuses the old commit, stamped
    with epoch 0: nothing is appended twice, and the producer never sees a fatal answer."""

    async def scenario() -> None:
        setup = make_setup()
        _, first = await old_commit_in_flight(setup, 0)
        setup.part.leader, setup.part.epoch = 2, 1
        setup.peers.conns[2] = QueuedConn(2)
        setup.rep.leaders_changed()
        later = [setup.submit("a", 0), setup.submit("b", 1)] if resent else [setup.submit("b", 1)]
        await until(lambda: len(setup.peers.conns[2].queue) == 1)
        assert len(setup.peers.conns[1].queue) == 1  # the old commit, not applied yet
        future, answer = setup.apply_next(2)
        future.set_result(answer)
        await until(lambda: all(f.done() for f in later))
        future, answer = setup.apply_next(1)
        assert answer["results"] == [{"error_code": NOT_LEADER}]
        future.set_result(answer)
        await asyncio.sleep(0.01)
        if resent:
            assert setup.part.log == ["a", "b"]
            assert [f.result()["base_offset"] for f in later] == [0, 1]
        else:
            assert setup.part.log == []
            assert later[0].result() == {"error_code": first.result()["error_code"]}
            assert later[0].result()["error_code"] in RETRIABLE
        await setup.close()

    asyncio.run(scenario())


def test_an_old_commit_applied_after_the_resend_on_a_new_connection_is_a_duplicate() -> None:
    """Idempotent producer. Seq 0's commit was read by broker 1 when the reset failed it; then the
    connection broke. The producer resends seq 0 with seq 1 on a new connection, and the leader
    applies those before the old request it still held: the old one is then a duplicate. Each
    sequence is in the log once, and the producer saw only successes after the retriable failure."""

    async def scenario() -> None:
        setup = make_setup()
        conn, first = await old_commit_in_flight(setup, 0)
        conn.drop()
        again, second = setup.submit("a", 0), setup.submit("b", 1)
        await until(lambda: setup.peers.conns[1] is not conn and len(setup.peers.conns[1].queue) == 1)
        future, answer = setup.apply_next(1)
        future.set_result(answer)
        await until(lambda: again.done() and second.done())
        stale = setup.apply_stale(conn)
        assert stale["results"][0]["base_offset"] == 0  # recognised: the first append's offset
        assert setup.part.log == ["a", "b"]
        assert first.result()["error_code"] in RETRIABLE
        assert again.result()["base_offset"] == 0 and second.result()["base_offset"] == 1
        await setup.close()

    asyncio.run(scenario())


def test_without_idempotence_a_commit_cut_off_by_the_reset_is_answered_possibly_persisted() -> None:
    """A producer without idempotence. Its batch's commit was read by broker 1 when the reset failed
    it, then the connection broke; the producer resends the batch on a new connection, and the
    leader applies the resend before the old request: the batch is in the log twice. That is at
    least once, as in Kafka when a request times out at the client while the leader appended it,
    provided the producer was told what a Kafka client knows then: REQUEST_TIMED_OUT (possibly
    persisted), not KAFKA_STORAGE_ERROR (not written, so resending cannot duplicate it)."""

    async def scenario() -> None:
        setup = make_setup()
        conn, first = await old_commit_in_flight(setup, None)
        assert first.result() == {"error_code": TIMED_OUT}
        conn.drop()
        again = setup.submit("a", None)
        await until(lambda: setup.peers.conns[1] is not conn and len(setup.peers.conns[1].queue) == 1)
        future, answer = setup.apply_next(1)
        future.set_result(answer)
        await until(again.done)
        setup.apply_stale(conn)
        assert setup.part.log == ["a", "a"]
        await setup.close()

    asyncio.run(scenario())


def test_a_batch_never_sent_is_answered_not_persisted_at_the_reset() -> None:
    """Only a batch whose commit was started may have reached a leader: one still buffered (or
    uploading) when the reset fails it is answered KAFKA_STORAGE_ERROR, as before."""

    async def scenario() -> None:
        setup = make_setup()
        conn = setup.peers.conns[1]
        sent = setup.submit("a", 0)
        await until(lambda: len(conn.queue) == 1)
        buffered = setup.submit("b", 1)  # in the buffer: its flush waits for the linger
        setup.reset()
        assert sent.result() == {"error_code": TIMED_OUT}
        assert buffered.result() == {"error_code": STORAGE_ERROR}
        await setup.close()

    asyncio.run(scenario())


def test_an_answer_that_cannot_be_handled_is_answered_possibly_persisted() -> None:
    """A bug while handling a leader's answer: the leader did answer, so the batch may be appended;
    its producer is told REQUEST_TIMED_OUT, not KAFKA_STORAGE_ERROR (not written)."""

    async def scenario() -> None:
        setup = make_setup()
        conn = setup.peers.conns[1]
        sent = setup.submit("a", None)
        await until(lambda: len(conn.queue) == 1)

        def bug(*args: object) -> None:
            raise AssertionError("injected: a bug handling the answer")

        setup.rep._on_answer = bug  # type: ignore[method-assign]
        future, answer = setup.apply_next(1)
        future.set_result(answer)
        await until(sent.done)
        assert setup.part.log == ["a"]
        assert sent.result()["error_code"] == TIMED_OUT
        await setup.close()

    asyncio.run(scenario())

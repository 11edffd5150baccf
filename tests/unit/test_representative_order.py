"""The representative's asyncio shell driven by idempotent producers with 5 requests in flight,
while leaders move between brokers, PUTs fail and every step of a flush can raise.

Everything around the ``Representative`` is an in-memory fake: an object store whose PUTs fail on
chosen calls, leaders that apply commits at send time (as a real leader starts the requests of
one connection in order) and answer after a delay, and a partition log that checks producer
sequences exactly as Kafka does (OUT_OF_ORDER_SEQUENCE on a gap, the earlier answer for a
duplicate). The producer model behaves as librdkafka's idempotent producer: at most 5 batches in
flight per partition, answers taken in send order, and after a retriable error it waits for every
in-flight batch of the partition and resends from the first unacknowledged one.

Properties: the producer never sees OUT_OF_ORDER_SEQUENCE or a gap (an acknowledgement after an
unacknowledged earlier batch); every batch is finally acknowledged; each partition's log holds
every sequence exactly once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from batches import values_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.config import BrokerConfig
from diskless.produce import representative as rep_module
from diskless.produce.representative import Representative
from diskless.protocol import internal, records

TOPIC = "t"
TOPIC_ID = str(uuid.UUID(int=7))
PRODUCER_ID = 4242
OOSS = int(ErrorCode.out_of_order_sequence_number)
NOT_LEADER = int(ErrorCode.not_leader_or_follower)
RETRIABLE = {int(code) for code in ErrorCode if code.retriable}
BROKERS = (0, 1, 2)  # broker 0 is the representative itself


@dataclass
class FakeLog:
    """One partition's log on whichever broker leads it: sequences checked as Kafka does."""

    leader: int
    epoch: int = 0
    seqs: list[int] = field(default_factory=list)  # base sequence of each appended batch, by offset
    next_seq: int = 0

    def append(self, node: int, header: bytes) -> dict[str, Any]:
        if node != self.leader:
            return {"error_code": NOT_LEADER}
        h = records.parse_header(header)
        if h.base_sequence < self.next_seq:
            offset = self.seqs.index(h.base_sequence)  # a duplicate: the earlier answer
            return self._ok(offset)
        if h.base_sequence > self.next_seq:
            return {"error_code": OOSS}
        self.seqs.append(h.base_sequence)
        self.next_seq = h.base_sequence + h.record_count
        return self._ok(len(self.seqs) - 1)

    def _ok(self, offset: int) -> dict[str, Any]:
        return {
            "error_code": 0,
            "base_offset": offset,
            "last_offset": offset,
            "log_append_time": -1,
            "log_start_offset": 0,
            "leader_epoch": self.epoch,
            "committed": True,
        }


class FakeCluster:
    """Leaders of every partition, leader moves after chosen commit requests, answer delays."""

    def __init__(self, partitions: int, moves: list[tuple[int, int]], delays: list[int], raise_on: set[int]) -> None:
        self.logs = {p: FakeLog(leader=p % len(BROKERS)) for p in range(partitions)}
        self.moves = moves  # (after this many commit requests, move this partition's leader)
        self.delays = itertools.cycle(delays or [0])
        self.raise_on = raise_on  # commit requests (by count) whose sending raises
        self.requests = 0
        self.changed = asyncio.Event()

    def commit(self, node: int, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        if self.requests in self.raise_on:
            raise OSError("injected: commit send failed")
        results = [self.logs[e["partition"]].append(node, e["header"]) for e in body["entries"]]
        for after, partition in self.moves:
            if after == self.requests:
                log = self.logs[partition]
                log.leader = (log.leader + 1) % len(BROKERS)
                log.epoch += 1
                self.changed.set()
        return {"results": results}

    def delay(self) -> float:
        return next(self.delays) / 1000


class FakeConn:
    def __init__(self, cluster: FakeCluster, node: int) -> None:
        self.cluster = cluster
        self.node = node
        self.connected = True

    def send_internal(self, api_key: int, body: dict[str, Any]) -> asyncio.Future[Any]:
        assert api_key == internal.INTERNAL_COMMIT_BATCHES
        answer = self.cluster.commit(self.node, body)  # applied at send time, in send order
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(self.cluster.delay(), future.set_result, answer)
        return future

    async def wait(self, future: asyncio.Future[Any], timeout: float = 30.0) -> Any:
        return await asyncio.wait_for(asyncio.shield(future), timeout)


class FakePeers:
    def __init__(self, cluster: FakeCluster) -> None:
        self.conns = {n: FakeConn(cluster, n) for n in BROKERS}

    def connected(self, node_id: int) -> FakeConn | None:
        return self.conns.get(node_id)

    async def get(self, node_id: int) -> FakeConn:
        return self.conns[node_id]

    async def connect_all(self, node_ids: list[int]) -> None:
        return None


class FakeMetadata:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.brokers = {n: object() for n in BROKERS}
        self.wal_manager = None

    def partition(self, topic: str, partition: int) -> Any:
        log = self.cluster.logs.get(partition)
        if topic != TOPIC or log is None:
            return None
        return type("State", (), {"leader": log.leader, "leader_epoch": log.epoch, "isr": list(BROKERS)})()

    def partition_by_id(self, topic_id: str, partition: int) -> Any:
        return self.partition(TOPIC, partition) if topic_id == TOPIC_ID else None


class FakeLocalRpcs:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def commit_batches_now(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.cluster.commit(0, body)


class FakeBroker:
    def __init__(self, cluster: FakeCluster, buffer_max_bytes: int, wal_max_bytes: int) -> None:
        self.cluster = cluster
        self.node_id = 0
        self.config = BrokerConfig(
            node_id=0,
            broker_rack="az-0",
            diskless_wal_linger_ms=1,
            diskless_wal_max_bytes=wal_max_bytes,
            diskless_produce_buffer_max_bytes=buffer_max_bytes,
        )
        self.metadata = FakeMetadata(cluster)
        self.peers = FakePeers(cluster)
        self.apis = type("Apis", (), {"diskless": FakeLocalRpcs(cluster)})()

    async def metadata_changed(self, timeout: float) -> None:
        self.cluster.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.cluster.changed.wait(), timeout)


class FakeStore:
    def __init__(self, failures: set[int], delays: list[int]) -> None:
        self.failures = failures
        self.delays = itertools.cycle(delays or [0])
        self.puts = 0

    async def put(self, key: str, data: bytes) -> None:
        self.puts += 1
        index = self.puts
        await asyncio.sleep(next(self.delays) / 1000)  # uploads finish out of order
        if index in self.failures:
            raise OSError("injected: PUT failed")


def batch_bytes(partition: int, seq: int) -> bytes:
    return values_batch(1, tag=f"p{partition}-s{seq}", producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq)


async def produce_partition(rep: Representative, partition: int, count: int, problems: list[str]) -> None:
    """librdkafka's idempotent producer for one partition, max.in.flight=5."""
    acked = 0
    next_to_send = 0
    inflight: dict[int, asyncio.Future[dict[str, Any]]] = {}
    draining = False
    attempts = 0
    while acked < count:
        while not draining and next_to_send < count and len(inflight) < 5:
            inflight[next_to_send] = rep.submit(TOPIC, TOPIC_ID, partition, batch_bytes(partition, next_to_send), 1)
            next_to_send += 1
        head = min(inflight)
        answer = await inflight.pop(head)  # answers in send order, as on one Kafka connection
        code = answer["error_code"]
        if code == 0:
            if head != acked:
                problems.append(f"gap: p{partition} seq {head} acknowledged before seq {acked}")
                return
            acked += 1
        elif code in RETRIABLE:
            draining = True
        else:
            problems.append(f"p{partition} seq {head}: non-retriable {ErrorCode(code).name}")
            return
        if draining and not inflight:
            draining = False
            next_to_send = acked
            attempts += 1
            if attempts > 200:
                problems.append(f"p{partition}: no progress after 200 retries")
                return


async def run_scenario(
    partitions: int,
    count: int,
    put_failures: set[int],
    moves: list[tuple[int, int]],
    delays: list[int],
    raise_on: set[int],
    wal_max_bytes: int = 100,
    buffer_max_bytes: int = 32 * 1024 * 1024,
) -> tuple[FakeCluster, list[str]]:
    cluster = FakeCluster(partitions, moves, delays, raise_on)
    broker = FakeBroker(cluster, buffer_max_bytes, wal_max_bytes)
    rep = Representative(broker, FakeStore(put_failures, delays), lambda key, data: None)  # type: ignore[arg-type]
    problems: list[str] = []
    try:
        await asyncio.wait_for(
            asyncio.gather(*(produce_partition(rep, p, count, problems) for p in range(partitions))), 20
        )
    finally:
        await rep.close()
    return cluster, problems


@settings(max_examples=40)
@given(
    partitions=st.integers(1, 3),
    count=st.integers(3, 12),
    put_failures=st.sets(st.integers(1, 30), max_size=8),
    moves=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 2)), max_size=6),
    delays=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    wal_max_bytes=st.sampled_from([100, 300, 4096]),
)
def test_idempotent_producer_with_five_in_flight_never_sees_a_gap(
    partitions: int,
    count: int,
    put_failures: set[int],
    moves: list[tuple[int, int]],
    delays: list[int],
    wal_max_bytes: int,
) -> None:
    moves = [(after, p % partitions) for after, p in moves]
    cluster, problems = asyncio.run(
        run_scenario(partitions, count, put_failures, moves, delays, set(), wal_max_bytes=wal_max_bytes)
    )
    assert problems == []
    for p, log in cluster.logs.items():
        assert log.seqs == list(range(count)), f"partition {p}"


def test_failed_put_then_later_batch_of_same_partition() -> None:
    """The shortest failing case on the old code: flush 1's PUT fails, flush 2 holds seq 1."""
    cluster, problems = asyncio.run(run_scenario(1, 6, {1}, [], [3, 0], set()))
    assert problems == []
    assert cluster.logs[0].seqs == list(range(6))


@pytest.fixture(autouse=True)
def _short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rep_module, "LEADERSHIP_RETRY_S", 5.0, raising=False)

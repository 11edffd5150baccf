"""A connection's memo of idle partitions (broker/idle_fetches.py) never changes a Fetch answer.

The property: after any sequence of changes to the replicas, the metadata, the clock and the
consumer's positions, a sessionless consumer Fetch answered through the connection's memo is the
answer the full serving decision gives with no memo at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from batches import values_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from loghelpers import produce
from test_topic_identity import CONFIG, FetchingBroker

from diskless.broker.idle_fetches import CURRENT_IDLE_FETCHES, IdleFetchMemo
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.log.partition_log import PartitionLog
from diskless.metrics import UNWATCHED_CHANGES
from diskless.protocol import messages as m
from diskless.replication.partition import VERIFY_MS, Partition

VERSION = 12
PARTITIONS = 2
HERE, OTHER = 0, 1
START_MS = 1_800_000_000_000
TOPIC_ID = str(uuid.uuid4())


class NoPeers:
    async def get(self, node: int) -> Any:
        raise OSError("no peers in this test")


class ClockedBroker(FetchingBroker):
    """The Fetch handler's broker, with a clock the test moves."""

    def __init__(self, log_dir: Path, diskless: bool) -> None:
        super().__init__(log_dir, HERE)
        self.clock = START_MS
        self.diskless = diskless
        self.peers = NoPeers()

    def now_ms(self) -> int:
        return self.clock

    def is_diskless(self, meta: TopicMetadata) -> bool:
        return self.diskless


class Scenario:
    def __init__(self, broker: ClockedBroker) -> None:
        self.broker = broker
        self.topic_id = uuid.uuid4()
        # Even partitions led here, odd ones followed here.
        self.states = [
            PartitionState(
                replicas=[HERE, OTHER], leader=HERE if i % 2 == 0 else OTHER, leader_epoch=5, isr=[HERE, OTHER]
            )
            for i in range(PARTITIONS)
        ]
        self.asked_epochs = [5] * PARTITIONS
        self.apply_metadata()
        # Each partition starts with records, all committed, and a consumer at its end.
        for i, replica in enumerate(self.replicas):
            replica.heard_from_leader_ms = broker.clock
            for _ in range(3):
                self.step("append" if replica.leader_state is not None else "follower_append", i, 0)
            replica.log.high_watermark = replica.log.log_end_offset
        self.offsets = [replica.log.high_watermark for replica in self.replicas]

    @property
    def replicas(self) -> list[Any]:
        return [self.broker.replicas.partitions[("t", i)] for i in range(PARTITIONS)]

    def apply_metadata(self) -> None:
        meta = TopicMetadata("t", str(self.topic_id), list(self.states), {})
        self.broker.metadata.topics["t"] = meta
        self.broker.metadata.generation += 1  # as every applied change does
        for i in range(PARTITIONS):
            self.broker.replicas.apply(meta, i, CONFIG, self.broker.clock)

    def request(self) -> Any:
        cls = m._request_type(m.API_FETCH, VERSION)
        module = sys.modules[cls.__module__]
        partitions = tuple(
            module.FetchPartition(
                partition=i,
                current_leader_epoch=self.asked_epochs[i],
                fetch_offset=self.offsets[i],
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
            for i in range(PARTITIONS)
        )
        return cls(
            replica_id=-1,
            max_wait=0,
            min_bytes=1,
            max_bytes=50 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(module.FetchTopic(topic="t", partitions=partitions),),
            forgotten_topics_data=(),
            rack_id="",
        )

    async def fetch(self, memo: IdleFetchMemo | None) -> Any:
        header = m.RequestHeader(m.API_FETCH, VERSION, 1, "consumer")
        token = CURRENT_IDLE_FETCHES.set(memo)
        try:
            return await self.broker.fetch_apis.fetch(header, self.request())
        finally:
            CURRENT_IDLE_FETCHES.reset(token)

    def step(self, op: str, i: int, value: int) -> None:
        replica = self.replicas[i]
        log = replica.log
        if op == "append" and replica.leader_state is not None:
            log.append_as_leader([memoryview(values_batch(1 + value % 3))], replica.leader_epoch, self.broker.clock)
        elif op == "commit":
            log.high_watermark = max(log.high_watermark, min(log.log_end_offset, log.high_watermark + value))
        elif op == "follower_append" and replica.leader_state is None:
            batch = bytearray(values_batch(1))
            batch[0:8] = log.log_end_offset.to_bytes(8, "big")
            log.append_as_follower(bytes(batch), self.broker.clock)
        elif op == "tick":
            self.broker.clock += value * 250
        elif op == "heard":
            replica.heard_from_leader_ms = self.broker.clock - value * 500
        elif op == "leader_start":
            replica.leader_log_start_offset = min(value, log.high_watermark)
        elif op == "read":
            self.offsets[i] = log.high_watermark
        elif op == "seek":
            self.offsets[i] = value % (log.log_end_offset + 2)
        elif op == "ask_epoch":
            epoch = self.states[i].leader_epoch
            self.asked_epochs[i] = (-1, epoch, epoch - 1, epoch + 1)[value % 4]
        elif op == "move_leader":
            state = self.states[i]
            leader = OTHER if state.leader == HERE else HERE
            self.states[i] = dataclasses.replace(state, leader=leader, leader_epoch=state.leader_epoch + 1)
            self.apply_metadata()
        elif op == "isr":
            state = self.states[i]
            isr = [OTHER] if HERE in state.isr and state.leader == OTHER else [HERE, OTHER]
            self.states[i] = dataclasses.replace(state, isr=isr)
            self.apply_metadata()
        elif op == "delete_records":
            log.delete_records_before(log.high_watermark)


OPS = st.sampled_from(
    [
        "append",
        "commit",
        "follower_append",
        "tick",
        "heard",
        "leader_start",
        "read",
        "seek",
        "ask_epoch",
        "move_leader",
        "isr",
        "delete_records",
    ]
)


def answers(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**p, "records": bytes(p["records"] or b"")} for t in response["responses"] for p in t["partitions"]]


def follower_reads() -> dict[str, float]:
    """``diskless_follower_reads_total`` by outcome, as it stands."""
    from diskless.metrics import DISKLESS_FOLLOWER_READS
    from diskless.replication.follower_reads import FORWARD, OUT_OF_RANGE, SERVE

    return {o: DISKLESS_FOLLOWER_READS.labels(o)._value.get() for o in (SERVE, FORWARD, OUT_OF_RANGE)}


def idle_partitions() -> dict[str, float]:
    """``diskless_fetch_idle_partitions_total`` by answer, as it stands."""
    from diskless.metrics import FETCH_IDLE_PARTITIONS

    return {a: FETCH_IDLE_PARTITIONS.labels(a)._value.get() for a in ("reused", "decided")}


async def answered_and_counted(scenario: Scenario, memo: IdleFetchMemo | None) -> tuple[Any, dict[str, float]]:
    """A Fetch's partition answers, and what it added to the follower-read decisions counted."""
    before = follower_reads()
    got = answers(await scenario.fetch(memo))
    return got, {o: n - before[o] for o, n in follower_reads().items()}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    diskless=st.booleans(),
    steps=st.lists(st.tuples(OPS, st.integers(0, PARTITIONS - 1), st.integers(0, 12)), min_size=4, max_size=30),
)
def test_an_answer_through_the_memo_is_the_full_decisions_answer(diskless: bool, steps: list[Any]) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            scenario = Scenario(ClockedBroker(Path(tmp), diskless))
            memo = IdleFetchMemo()
            try:
                assert await answered_and_counted(scenario, memo) == await answered_and_counted(scenario, None)
                for op, i, value in steps:
                    scenario.step(op, i, value)
                    # Twice through the memo: the second pass reuses what the first kept. The
                    # follower-read decisions are counted alike either way.
                    for _ in range(2):
                        through_memo = await answered_and_counted(scenario, memo)
                        assert through_memo == await answered_and_counted(scenario, None), (op, i)
            finally:
                await scenario.broker.replicas.close()

    asyncio.run(run())


async def test_idle_partitions_are_answered_from_the_memo_and_a_moved_one_afresh(tmp_path: Path) -> None:
    """Not a no-op: a tail consumer's second Fetch takes every idle partition from the memo, and
    after one partition's high watermark moves, that one is decided afresh (and has data)."""
    scenario = Scenario(ClockedBroker(tmp_path, diskless=False))
    memo = IdleFetchMemo()
    try:
        counted = idle_partitions()
        first = answers(await scenario.fetch(memo))
        assert len(memo) == PARTITIONS and all(p["error_code"] == ErrorCode.none for p in first)
        assert idle_partitions() == {"reused": counted["reused"], "decided": counted["decided"] + PARTITIONS}
        counted = idle_partitions()
        await scenario.fetch(memo)
        assert idle_partitions() == {"reused": counted["reused"] + PARTITIONS, "decided": counted["decided"]}
        led = scenario.replicas[0]
        led.log.append_as_leader([memoryview(values_batch(2))], led.leader_epoch, scenario.broker.clock)
        led.log.high_watermark = led.log.log_end_offset
        counted = idle_partitions()
        moved = answers(await scenario.fetch(memo))
        assert idle_partitions() == {"reused": counted["reused"] + PARTITIONS - 1, "decided": counted["decided"] + 1}
        assert moved[0]["records"] and moved[0]["high_watermark"] == led.log.log_end_offset
    finally:
        await scenario.broker.replicas.close()


def _replica(tmp_path: Path, leads: bool) -> Partition:
    """A real replica (its changes fire watches) with 5 records, HW 3, led here or by broker 2."""
    replica = Partition("t", 0, PartitionLog(str(tmp_path / f"t-0-{leads}"), CONFIG, START_MS), 1, TOPIC_ID)
    replica.apply_state(PartitionState(replicas=[1, 2], leader=1 if leads else 2, leader_epoch=5, isr=[1, 2]), 0)
    produce(replica.log, 5, epoch=5, commit=False)
    replica.log.high_watermark = 3
    replica.heard_from_leader_ms = START_MS
    replica.leader_log_start_offset = 0
    return replica


def _reuse(memo: IdleFetchMemo, key: tuple[str, int], offset: int, epoch: int, now_ms: int, staleness_ms: int) -> Any:
    """The memo's answer for one partition of a Fetch request (Fetch v9+ entries carry the epoch)."""
    from types import SimpleNamespace

    asked = SimpleNamespace(partition=key[1], fetch_offset=offset, current_leader_epoch=epoch)
    return memo.reuse_topic(key[0], [asked], now_ms, staleness_ms)[0]


def _restate(replica: Partition, **changes: Any) -> None:
    state = PartitionState(replicas=[1, 2], leader=replica.leader_id, leader_epoch=replica.leader_epoch, isr=[1, 2])
    replica.apply_state(dataclasses.replace(state, **changes), 0)


CHANGES = {
    "high watermark": lambda r: setattr(r.log, "high_watermark", 4),
    "log end (a transaction marker moves the last stable offset)": lambda r: produce(r.log, 1, epoch=5, commit=False),
    "log start": lambda r: r.log.delete_records_before(1),
    "role": lambda r: _restate(r, replicas=[], leader=-1, leader_epoch=r.leader_epoch + 1),  # dropped
    "leader epoch": lambda r: _restate(r, leader_epoch=6),
    "leadership": lambda r: _restate(r, leader=2 if r.leader_state is not None else 1, leader_epoch=6),
    "heard from the leader too long ago": lambda r: setattr(r, "heard_from_leader_ms", START_MS - 60_000),
    "leader's log start": lambda r: setattr(r, "leader_log_start_offset", 4),
}


@pytest.mark.parametrize("leads", [True, False])
@pytest.mark.parametrize("change", list(CHANGES))
def test_every_input_of_an_idle_answer_is_checked_at_reuse(tmp_path: Path, change: str, leads: bool) -> None:
    """Each input the memo keeps, changed alone (even by a path that left the metadata generation
    where it was), makes the partition decided afresh; unchanged, the answer is reused."""
    key, answer = ("t", 0), {"partition_index": 0, "high_watermark": 10}
    replica = _replica(tmp_path, leads)
    memo = IdleFetchMemo()
    memo.begin(("context",), START_MS)
    memo.keep(key, 10, 5, replica, answer)
    reused = _reuse(memo, key, 10, 5, START_MS + 100, 2_000)
    assert reused is not None and reused.answer == answer and not reused.follower_read
    assert _reuse(memo, key, 11, 5, START_MS + 100, 2_000) is None  # another offset
    assert _reuse(memo, key, 10, 4, START_MS + 100, 2_000) is None  # another asked epoch
    CHANGES[change](replica)
    leader_only_input = change in ("heard from the leader too long ago", "leader's log start")
    kept = leads and leader_only_input  # a leader's reads need no word from a leader
    assert (_reuse(memo, key, 10, 5, START_MS + 100, 2_000) is not None) == kept
    memo.begin(("another context",), START_MS)
    assert len(memo) == 0


def test_a_change_behind_the_watches_is_caught_by_the_next_full_comparison(tmp_path: Path) -> None:
    key = ("t", 0)
    replica = _replica(tmp_path, True)
    memo = IdleFetchMemo()
    memo.begin(("context",), START_MS)
    memo.keep(key, 10, 5, replica, {"partition_index": 0})
    replica.log._high_watermark = 4  # no watch fires
    memo.begin(("context",), START_MS + 1)
    assert _reuse(memo, key, 10, 5, START_MS + 1, 2_000) is not None  # not compared yet
    misses = UNWATCHED_CHANGES.labels("consumer-fetch-memo")._value.get()
    memo.begin(("context",), START_MS + VERIFY_MS)
    assert _reuse(memo, key, 10, 5, START_MS + VERIFY_MS, 2_000) is None
    assert UNWATCHED_CHANGES.labels("consumer-fetch-memo")._value.get() == misses + 1


def test_a_closed_memo_leaves_no_watch_behind(tmp_path: Path) -> None:
    """A connection's memo watches the replicas it read; closed with the connection, it must not
    stay reachable from them (its answers with it) until each changes, nor keep anything a handler
    of the closed connection still decides."""
    replica = _replica(tmp_path, True)
    memo = IdleFetchMemo()
    memo.begin(("context",), START_MS)
    memo.keep(("t", 0), 10, 5, replica, {"partition_index": 0})
    assert replica._watches
    memo.close()
    assert not replica._watches and len(memo) == 0
    memo.keep(("t", 0), 10, 5, replica, {"partition_index": 0})
    assert not replica._watches and len(memo) == 0


def test_each_connection_has_its_own_memo_shared_by_its_requests() -> None:
    """The glue in ``server.Connection``: every handler of one connection sees that connection's
    memo (a consumer's next Fetch reuses its previous one's answers), and no two connections share
    one (their consumers read different partitions at different offsets)."""
    import socket
    import struct

    from integration.rawclient import build_batch, encode_request, produce_request

    from diskless.broker.server import KafkaServer
    from diskless.cluster.client_az import AzSource
    from diskless.config import BrokerConfig

    seen: list[tuple[int, IdleFetchMemo | None]] = []

    class RecordingApis:
        def __init__(self) -> None:
            config = BrokerConfig()
            self.broker = type("B", (), {"config": config})()
            self.zone_policy = config.zone_policy()
            self.local_az = "none"

        def decide_zone(self, zone: Any, client_id: str | None) -> tuple[str, AzSource]:
            return "none", AzSource.RECEIVING_BROKER

        async def handle(self, header: Any, request: Any) -> dict[str, Any]:
            seen.append((header.correlation_id, CURRENT_IDLE_FETCHES.get()))
            partition = {"index": 0, "error_code": 0, "base_offset": 0}
            return {"responses": [{"name": "t", "partition_responses": [partition]}], "throttle_time": 0}

    async def run() -> None:
        server = KafkaServer(RecordingApis(), max_frame_bytes=1 << 20)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            batch = build_batch([(None, b"v")])
            for n, client in enumerate(clients):
                client.setblocking(False)
                frames = [encode_request(produce_request("t", 0, batch, acks=1, version=8), 10 * n + i) for i in (0, 1)]
                await loop.sock_sendall(client, b"".join(frames))
                answered, frames_read = b"", 0
                while frames_read < 2:  # both answers, whole
                    chunk = await asyncio.wait_for(loop.sock_recv(client, 1 << 16), 30)
                    assert chunk, "connection closed"
                    answered += chunk
                    while len(answered) >= 4 and len(answered) >= 4 + struct.unpack_from(">i", answered)[0]:
                        answered = answered[4 + struct.unpack_from(">i", answered)[0] :]
                        frames_read += 1
        finally:
            for client in clients:
                client.close()
            await server.stop()

    asyncio.run(run())
    memos = dict(seen)
    assert sorted(memos) == [0, 1, 10, 11]
    assert all(isinstance(memo, IdleFetchMemo) for memo in memos.values())
    assert memos[0] is memos[1] and memos[10] is memos[11] and memos[0] is not memos[10]


def test_a_kept_answer_is_read_only_and_independent_of_the_decisions_dict(tmp_path: Path) -> None:
    """Reused answers are shared by every pass that reuses them, not copied: a change to one would
    change every later answer, so the memo hands out a read-only view (a change raises), and what
    it keeps does not follow later changes to the dict the full decision built."""
    key, answer = ("t", 0), {"partition_index": 0, "high_watermark": 10}
    replica = _replica(tmp_path, True)
    memo = IdleFetchMemo()
    memo.begin(("context",), START_MS)
    memo.keep(key, 10, 5, replica, answer)
    answer["high_watermark"] = 99
    reused = _reuse(memo, key, 10, 5, START_MS, 2_000)
    assert reused is not None
    assert reused.answer["high_watermark"] == 10
    with pytest.raises(TypeError):
        reused.answer["high_watermark"] = 11  # type: ignore[index]

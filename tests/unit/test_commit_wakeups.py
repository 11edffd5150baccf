"""How soon the leader's waiters resume once the high watermark passes their entries (issue 10).

A CommitBatches answer held for acks=all replication, an AwaitReplicated poll and a produce's
``wait_for_commit`` all resume when a follower's fetch moves the high watermark, and a parked
replica fetch resumes when a leader appends. On a busy 2-core machine each event-loop turn
between that moment and the answer is a chance for other work (and other processes) to run
first, so the wake-up paths are measured here in loop turns: a waiter must be done within two
turns of the event that decides it, however many partitions it waits for.

Driven without sockets: a real ``ReplicaManager`` over a temporary directory and the leader-side
RPC handlers over an in-memory broker stand-in (as tests/unit/test_topic_identity.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from batches import values_batch
from loop_turns import turns_until_done

from diskless.broker.diskless_rpcs import DisklessRpcs
from diskless.broker.replica_manager import ReplicaManager
from diskless.cluster.metadata import ClusterMetadata, PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.log.config import LogConfig
from diskless.replication.partition import Partition

NODE = 0
FOLLOWERS = (1, 2)
CONFIG = LogConfig(diskless_enabled=True)
MAX_TURNS = 2  # the decided waiter's own resumption, and one turn of slack


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class FakeBroker:
    """What the leader-side RPC handlers use of a broker: metadata, replicas, config and a clock."""

    def __init__(self, log_dir: Path) -> None:
        self.config = BrokerConfig()
        self.metadata = ClusterMetadata("wakeup-test")
        self.replicas = ReplicaManager(str(log_dir), NODE, self.metadata.brokers.get)

    @staticmethod
    def now_ms() -> int:
        return now_ms()

    def on_leader_append(self, partition: Partition) -> None:
        self.replicas.on_leader_append(partition)

    def prefetch_objects(self, keys: set[str]) -> None:
        pass

    def host(self, partitions: int) -> tuple[TopicMetadata, list[Partition]]:
        """A topic led here with two in-sync followers (nothing commits until both fetch)."""
        states = [
            PartitionState(replicas=[NODE, *FOLLOWERS], leader=NODE, leader_epoch=0, isr=[NODE, *FOLLOWERS])
            for _ in range(partitions)
        ]
        meta = TopicMetadata("t", str(uuid.uuid4()), states, {"diskless.enabled": "true"})
        self.metadata.topics[meta.name] = meta
        hosted = [self.replicas.apply(meta, i, CONFIG, now_ms()) for i in range(partitions)]
        assert all(p is not None for p in hosted)
        return meta, [p for p in hosted if p is not None]


def commit_body(meta: TopicMetadata, partitions: int, wait_ms: int) -> dict[str, Any]:
    return {
        "key": "wal/obj-1.wal",
        "created_ms": now_ms(),
        "replication_wait_ms": wait_ms,
        "entries": [
            {
                "topic": meta.name,
                "topic_id": meta.topic_id,
                "partition": index,
                "header": values_batch(2, tag=f"p{index}")[:61],
                "position": 0,
                "acks": -1,
                "leader_epoch": 0,
            }
            for index in range(partitions)
        ],
    }


def followers_catch_up(replicas: list[Partition]) -> None:
    """Both followers fetch at the leader's log end, as their next replica fetch tells it."""
    for replica in replicas:
        for follower in FOLLOWERS:
            replica.on_follower_fetch(follower, replica.log.log_end_offset, now_ms())


async def test_a_held_commit_answer_resumes_within_two_turns_of_replication(tmp_path: Path) -> None:
    broker = FakeBroker(tmp_path)
    meta, replicas = broker.host(3)
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    task = asyncio.ensure_future(rpcs.commit_batches_rpc(commit_body(meta, 3, wait_ms=5_000)))
    await turns_until_done(task, 5)  # let it append and park
    assert not task.done()
    assert [r.log.high_watermark for r in replicas] == [0, 0, 0]

    followers_catch_up(replicas)
    turns = await turns_until_done(task)

    assert turns <= MAX_TURNS, f"the commit answer took {turns} loop turns after the last follower's fetch"
    assert [r["committed"] for r in task.result()["results"]] == [True, True, True]


async def test_a_held_commit_answer_still_ends_at_its_wait(tmp_path: Path) -> None:
    broker = FakeBroker(tmp_path)
    meta, replicas = broker.host(2)
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]
    started = time.monotonic()

    answer = await asyncio.wait_for(rpcs.commit_batches_rpc(commit_body(meta, 2, wait_ms=50)), 5)

    assert 0.04 <= time.monotonic() - started < 2
    assert [r["error_code"] for r in answer["results"]] == [0, 0]
    assert [r["committed"] for r in answer["results"]] == [False, False]
    # Nothing is left waiting on the partitions once the answer went out.
    followers_catch_up(replicas)
    assert all(r.pending_commit_waiters() == 0 for r in replicas)


async def test_await_replicated_resumes_within_two_turns_of_the_first_decision(tmp_path: Path) -> None:
    broker = FakeBroker(tmp_path)
    meta, replicas = broker.host(2)
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]
    appended = rpcs.commit_batches_now(commit_body(meta, 2, wait_ms=0))["results"]
    body = {
        "max_wait_ms": 5_000,
        "entries": [
            {
                "topic": meta.name,
                "topic_id": meta.topic_id,
                "partition": index,
                "offset": result["last_offset"],
                "leader_epoch": 0,
            }
            for index, result in enumerate(appended)
        ],
    }

    task = asyncio.ensure_future(rpcs.await_replicated(body))
    await turns_until_done(task, 5)
    assert not task.done()

    followers_catch_up(replicas[:1])  # only partition 0 replicates: the answer must not wait for 1
    turns = await turns_until_done(task)

    assert turns <= MAX_TURNS, f"AwaitReplicated took {turns} loop turns after the decision"
    assert task.result()["results"] == [{"error_code": 0, "done": True}, {"error_code": 0, "done": False}]
    assert all(r.pending_commit_waiters() == 0 for r in replicas)


async def test_wait_for_commit_resumes_within_two_turns_and_times_out(tmp_path: Path) -> None:
    broker = FakeBroker(tmp_path)
    meta, (replica,) = broker.host(1)
    DisklessRpcs(broker).commit_batches_now(commit_body(meta, 1, wait_ms=0))  # type: ignore[arg-type]
    last = replica.log.log_end_offset - 1

    task = asyncio.ensure_future(replica.wait_for_commit(last, replica.leader_epoch, 5.0))
    await turns_until_done(task, 5)
    followers_catch_up([replica])
    turns = await turns_until_done(task)

    assert turns <= MAX_TURNS, f"wait_for_commit took {turns} loop turns"
    assert task.result() is True
    DisklessRpcs(broker).commit_batches_now(commit_body(meta, 1, wait_ms=0))  # type: ignore[arg-type]
    unreplicated = replica.log.log_end_offset - 1
    assert await replica.wait_for_commit(unreplicated, replica.leader_epoch, 0.02) is False  # timed out
    assert replica.pending_commit_waiters() == 0


async def test_a_parked_replica_fetch_wakes_within_two_turns_of_an_append(tmp_path: Path) -> None:
    replicas = ReplicaManager(str(tmp_path), NODE, lambda node: None)
    waiting = [asyncio.ensure_future(replicas.wait_for_append(5.0)) for _ in range(3)]
    await turns_until_done(waiting[0], 5)
    assert not any(w.done() for w in waiting)

    replicas.notify_append()
    turns = await turns_until_done(asyncio.gather(*waiting))

    assert turns <= MAX_TURNS + 1, f"parked fetches woke after {turns} loop turns"  # +1: gather's own turn
    started = time.monotonic()
    await replicas.wait_for_append(0.02)  # nothing appended: the wait ends at its timeout
    assert time.monotonic() - started >= 0.015


async def test_the_periodic_high_watermark_checkpoint_does_not_block_the_loop(tmp_path: Path, monkeypatch: Any) -> None:
    """The checkpoint fsyncs a file and its directory (~20 ms each on this machine's disk, more
    under load): done on the event loop every 5 s, it delayed every commit and fetch behind it."""
    from diskless.broker import replica_manager as rm

    broker = FakeBroker(tmp_path)
    _meta, (replica,) = broker.host(1)
    real_fsync = rm.os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.1)
        real_fsync(fd)

    monkeypatch.setattr(rm.os, "fsync", slow_fsync)
    replica.log.high_watermark = 0
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    ticking = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.02)
    started = time.monotonic()
    await broker.replicas.checkpoint_high_watermarks_async()
    took = time.monotonic() - started
    await asyncio.sleep(0.02)  # the ticker's next tick closes the last gap
    ticking.cancel()

    assert took >= 0.2  # both fsyncs happened
    during = [b - a for a, b in itertools.pairwise(ticks) if b > started]
    assert during and max(during) < 0.08, f"the loop stalled {max(during):.3f} s during the checkpoint"
    lines = (tmp_path / rm.HW_CHECKPOINT_FILE).read_text().splitlines()
    assert lines[:2] == ["1", "1"] and lines[2].split()[:3] == ["t", "0", "0"]
    # Unchanged high watermarks: nothing written, no thread started.
    monkeypatch.setattr(rm.os, "fsync", lambda fd: pytest.fail("rewrote an unchanged checkpoint"))
    await broker.replicas.checkpoint_high_watermarks_async()


async def test_a_parked_consumer_fetch_sleeps_through_log_end_moves_and_wakes_on_readable_ones(
    tmp_path: Path,
) -> None:
    """A leader's append its followers have yet to copy concerns parked replica fetches only: a
    consumer reads up to the high watermark, and a sessionless consumer's wake-up is a pass over
    every partition it names."""
    replicas = ReplicaManager(str(tmp_path), NODE, lambda node: None)
    consumer = asyncio.ensure_future(replicas.wait_for_append(5.0, readable_only=True))
    follower = asyncio.ensure_future(replicas.wait_for_append(5.0))
    await turns_until_done(consumer, 5)

    replicas.notify_log_end()
    await turns_until_done(follower)
    assert follower.done() and not consumer.done()

    replicas.notify_append()
    turns = await turns_until_done(consumer)
    assert turns <= MAX_TURNS, f"the parked consumer fetch woke after {turns} loop turns"


async def test_a_leader_append_wakes_consumers_only_when_it_moves_what_they_read(tmp_path: Path) -> None:
    replicas = ReplicaManager(str(tmp_path), NODE, lambda node: None)
    replica = leader_replica(replicas, isr=[NODE, NODE + 1])  # a follower must copy it first
    consumer = asyncio.ensure_future(replicas.wait_for_append(5.0, readable_only=True))
    follower = asyncio.ensure_future(replicas.wait_for_append(5.0))
    await turns_until_done(consumer, 5)
    replica.log.append_as_leader([memoryview(values_batch(2))], 0, now_ms(), check_sequence=False)
    replicas.on_leader_append(replica)
    await turns_until_done(follower)
    assert follower.done() and not consumer.done()

    alone = leader_replica(replicas, isr=[NODE], topic="alone")  # committed at once
    alone.log.append_as_leader([memoryview(values_batch(2))], 0, now_ms(), check_sequence=False)
    replicas.on_leader_append(alone)
    await turns_until_done(consumer)
    assert consumer.done() and alone.log.high_watermark == 2
    consumer.cancel()


def leader_replica(replicas: ReplicaManager, isr: list[int], topic: str = "t") -> Partition:
    """A classic partition led here with in-sync replicas ``isr``."""
    state = PartitionState(replicas=sorted(set(isr)), leader=NODE, leader_epoch=0, isr=sorted(set(isr)))
    meta = TopicMetadata(topic, str(uuid.uuid4()), [state], {})
    replica = replicas.apply(meta, 0, LogConfig(), now_ms())
    assert replica is not None and replica.leader_state is not None
    return replica


async def test_an_isr_shrink_that_commits_wakes_parked_consumers(tmp_path: Path) -> None:
    replicas = ReplicaManager(str(tmp_path), NODE, lambda node: None)
    replica = leader_replica(replicas, isr=[NODE, NODE + 1])
    replica.log.append_as_leader([memoryview(values_batch(2))], 0, now_ms(), check_sequence=False)
    replicas.on_leader_append(replica)
    assert replica.log.high_watermark == 0  # the follower has not copied it
    consumer = asyncio.ensure_future(replicas.wait_for_append(5.0, readable_only=True))
    await turns_until_done(consumer, 5)
    assert not consumer.done()

    # The follower drops out of the ISR (same leader epoch): what the leader holds is committed.
    meta = TopicMetadata(
        "t", replica.topic_id, [PartitionState(replicas=[NODE, NODE + 1], leader=NODE, leader_epoch=0, isr=[NODE])], {}
    )
    replicas.apply(meta, 0, LogConfig(), now_ms())
    await turns_until_done(consumer)
    assert replica.log.high_watermark == 2 and consumer.done()

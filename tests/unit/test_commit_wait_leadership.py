"""An acks=all wait that begins after its replica stopped leading is refused at once.

A produce appends, then begins its wait a loop turn or more later (the handler gathers every
partition's wait). Leadership that moves away in between fails the waiters present then; a wait
registered afterwards waited out the request's whole timeout before its producer heard
NOT_LEADER_OR_FOLLOWER (kafka-python stalled 30 s in
``test_reassign_every_partition_onto_a_new_broker_under_load[classic]``, 1-3 runs in 30 under load).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from batches import values_batch

from diskless.cluster.metadata import PartitionState
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.replication.partition import Partition

TOPIC_ID = "00000000-0000-0000-0000-000000000001"


def leading_replica(tmp_path: Path) -> tuple[Partition, int]:
    """A leader of a two-replica partition holding one appended, not yet replicated batch."""
    replica = Partition("t", 0, PartitionLog(str(tmp_path / "t-0"), LogConfig(), 0), 0, TOPIC_ID)
    replica.apply_state(PartitionState(replicas=[0, 1], leader=0, leader_epoch=1, isr=[0, 1]), 0)
    result = replica.log.append_as_leader([memoryview(values_batch(3))], replica.leader_epoch, 0)
    return replica, result.last_offset


@pytest.mark.parametrize(
    "moved",
    [
        PartitionState(replicas=[0, 1], leader=1, leader_epoch=2, isr=[0, 1]),  # leadership moved
        PartitionState(replicas=[], leader=-1, leader_epoch=2),  # the replica was dropped here
    ],
    ids=["follower", "dropped"],
)
def test_a_wait_begun_after_leadership_moved_is_refused_at_once(tmp_path: Path, moved: PartitionState) -> None:
    replica, last = leading_replica(tmp_path)
    replica.apply_state(moved, 0)  # between the append and the wait
    started = time.monotonic()
    assert asyncio.run(replica.wait_for_commit(last, 1, 5.0)) is False
    assert time.monotonic() - started < 1.0  # not the request's timeout


def test_a_wait_begun_while_leading_is_still_failed_when_leadership_moves(tmp_path: Path) -> None:
    replica, last = leading_replica(tmp_path)

    async def wait_then_move() -> bool:
        waiting = asyncio.ensure_future(replica.wait_for_commit(last, 1, 5.0))
        await asyncio.sleep(0)  # the wait begins while we lead
        replica.apply_state(PartitionState(replicas=[0, 1], leader=1, leader_epoch=2, isr=[0, 1]), 0)
        return await waiting

    started = time.monotonic()
    assert asyncio.run(wait_then_move()) is False
    assert time.monotonic() - started < 1.0


def wait_then_replicate(replica: Partition, last: int, follower_offset: int) -> bool:
    """Begin the wait for the append at epoch 1 ending at ``last``, then let the follower fetch at
    ``follower_offset`` (moving the high watermark there): what the wait answers."""

    async def run() -> bool:
        waiting = asyncio.ensure_future(replica.wait_for_commit(last, 1, 5.0))
        await asyncio.sleep(0)  # the wait begins
        replica.on_follower_fetch(1, follower_offset, 0)
        return await waiting

    return asyncio.run(run())


def test_a_wait_begun_while_leading_resumes_when_replicated(tmp_path: Path) -> None:
    replica, last = leading_replica(tmp_path)
    assert wait_then_replicate(replica, last, last + 1) is True


# Leadership lost and regained between the append and the wait: the wait registers on the new
# leadership, so the question is whether the record at the offset is still this append.


def regain_after_follower_truncation(replica: Partition, last: int) -> None:
    """Leadership moves away (epoch 2); as a follower the replica truncates to the new leader's
    log, which never had the batch, and takes the new leader's records at those offsets; then it
    leads again (epoch 3). All before the produce's wait begins."""
    replica.apply_state(PartitionState(replicas=[0, 1], leader=1, leader_epoch=2, isr=[0, 1]), 0)
    replica.log.truncate_to(0, 0)
    others = values_batch(5, tag="other", base_offset=0, partition_leader_epoch=2)
    replica.on_fetched(others, leader_hw=0, leader_log_start=0, now_ms=0)
    assert replica.log.log_end_offset > last  # the offset exists again, holding another record
    replica.apply_state(PartitionState(replicas=[0, 1], leader=0, leader_epoch=3, isr=[0, 1]), 0)


def test_a_wait_for_an_append_replaced_while_away_is_refused(tmp_path: Path) -> None:
    """Fails on the code before: the wait registered on the new leadership, and the high watermark
    passing the offset acknowledged a write that the truncation had removed."""
    replica, last = leading_replica(tmp_path)
    regain_after_follower_truncation(replica, last)

    started = time.monotonic()
    assert wait_then_replicate(replica, last, replica.log.log_end_offset) is False  # the other record commits
    assert time.monotonic() - started < 1.0
    assert not replica.holds_append(last, 1)


def test_a_wait_for_an_append_kept_while_away_commits_under_the_new_epoch(tmp_path: Path) -> None:
    """Away and back with no truncation (the other replica never led a write): the record is still
    this append, so its wait resumes when the new leadership's high watermark passes it."""
    replica, last = leading_replica(tmp_path)
    replica.apply_state(PartitionState(replicas=[0, 1], leader=1, leader_epoch=2, isr=[0, 1]), 0)
    replica.apply_state(PartitionState(replicas=[0, 1], leader=0, leader_epoch=3, isr=[0, 1]), 0)
    assert wait_then_replicate(replica, last, last + 1) is True

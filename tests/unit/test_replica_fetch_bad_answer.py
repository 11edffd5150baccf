"""A replica fetch answer a follower cannot apply leaves that partition where it was, and the
fetcher goes on: the others keep replicating, and the partition takes the next good answer.

Before, the exception (a compact pointer run whose crc32c does not check, say) escaped
``ReplicaFetcher._handle`` and ended the fetcher's task: replication from that leader stopped for
good, with nothing but a "Task exception was never retrieved" at garbage collection.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from pathlib import Path
from types import SimpleNamespace

from batches import values_batch
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import PartitionState
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.replication.fetcher import ReplicaFetcher
from diskless.replication.partition import Partition

FOLLOWER, LEADER = 1, 0
STATE = PartitionState(replicas=[LEADER, FOLLOWER], leader=LEADER, leader_epoch=0, isr=[LEADER, FOLLOWER])


def follower_replica(tmp_path: Path, index: int, topic_id: str) -> Partition:
    partition = Partition("t", index, PartitionLog(str(tmp_path / f"t-{index}"), LogConfig(), 0), FOLLOWER, topic_id)
    partition.apply_state(STATE, 0)
    return partition


def answer(index: int, records: bytes) -> SimpleNamespace:
    return SimpleNamespace(
        partition_index=index,
        error_code=ErrorCode.none,
        diverging_epoch=None,
        records=records,
        high_watermark=3,
        log_start_offset=0,
    )


def corrupt_pointer_run() -> bytes:
    """A compact pointer envelope (base offset -3) whose body decodes to nothing the crc names."""
    body = b"\x00\x00\x00\x00\x00" + b"\x07" * 20
    return struct.pack(">qi", -3, len(body)) + body


def test_an_answer_a_partition_cannot_apply_leaves_it_and_the_fetcher_goes_on(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, lambda node: None, 500, 1 << 20, lambda: None)
    broken, healthy = (follower_replica(tmp_path, i, str(topic_id)) for i in (0, 1))
    fetcher.add(broken)
    fetcher.add(healthy)
    fetcher._request()

    bad_round = SimpleNamespace(
        responses=[
            SimpleNamespace(
                topic_id=topic_id, partitions=[answer(0, corrupt_pointer_run()), answer(1, values_batch(3))]
            )
        ]
    )
    pause = fetcher._handle(bad_round)  # raised CorruptEntry before

    assert broken.log.log_end_offset == 0
    assert healthy.log.log_end_offset == 3
    assert 0 < pause <= 1.0  # the leader would answer the same ask at once: not a hot loop
    assert fetcher._handle(bad_round) > pause  # still failing: the pause grows

    fetcher._request()
    good_round = SimpleNamespace(
        responses=[SimpleNamespace(topic_id=topic_id, partitions=[answer(0, values_batch(3))])]
    )
    assert fetcher._handle(good_round) == 0
    assert broken.log.log_end_offset == 3


def test_a_failed_truncation_stays_with_its_partition(tmp_path: Path) -> None:
    """Not only decoding: a truncation that hits a disk error is that partition's failure, not the
    end of the fetcher (it raised out of ``_handle`` before)."""
    topic_id = uuid.uuid4()
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, lambda node: None, 500, 1 << 20, lambda: None)
    diverged, healthy = (follower_replica(tmp_path, i, str(topic_id)) for i in (0, 1))

    def disk_error(*args: object) -> None:
        raise OSError("No space left on device")

    diverged.truncate_on_divergence = disk_error  # type: ignore[method-assign]
    fetcher.add(diverged)
    fetcher.add(healthy)
    fetcher._request()
    truncate = answer(0, b"")
    truncate.diverging_epoch = SimpleNamespace(epoch=0, end_offset=0)

    pause = fetcher._handle(
        SimpleNamespace(
            responses=[SimpleNamespace(topic_id=topic_id, partitions=[truncate, answer(1, values_batch(3))])]
        )
    )

    assert pause > 0
    assert healthy.log.log_end_offset == 3


async def test_a_round_that_fails_unexpectedly_is_retried_not_the_end_of_the_fetcher() -> None:
    """Whatever escapes a round (a bug in building the request, an error outside one partition's
    answer) is logged and the next round runs: nothing restarts the task if it ends."""
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, lambda node: None, 500, 1 << 20, lambda: None)
    rounds: list[float] = []

    async def round_trip(backoff: float) -> float:
        rounds.append(backoff)
        if len(rounds) == 1:
            raise ValueError("badly formed hexadecimal UUID string")
        fetcher._stopping = len(rounds) == 3
        return 0.05

    fetcher._round_trip = round_trip  # type: ignore[method-assign]
    await asyncio.wait_for(fetcher._run(), 5)
    assert len(rounds) == 3
    assert rounds[1] > rounds[0]  # the failed round's pause doubled


def test_a_failed_prefetch_leaves_the_append_and_its_news(tmp_path: Path) -> None:
    """Prefetching the appended pointers' objects is best effort: when it fails the entries stay
    appended, the answer counts as applied, and readers still hear that the range moved."""
    from diskless.replication.partition import wrap_pointers
    from diskless.storage import pointer

    def failing_prefetch(entries: bytes) -> None:
        raise RuntimeError("prefetch bug")

    progress: list[bool] = []
    topic_id = uuid.uuid4()
    fetcher = ReplicaFetcher(
        FOLLOWER, LEADER, lambda node: None, 500, 1 << 20, lambda: progress.append(True), failing_prefetch
    )
    replica = follower_replica(tmp_path, 0, str(topic_id))
    fetcher.add(replica)
    fetcher._request()
    header = values_batch(3)[:61]
    entries = pointer.encode_pointer_entry(header, "wal/object.wal", 8, 12 + int.from_bytes(header[8:12]))

    pause = fetcher._handle(
        SimpleNamespace(responses=[SimpleNamespace(topic_id=topic_id, partitions=[answer(0, wrap_pointers(entries))])])
    )

    assert pause == 0
    assert replica.log.log_end_offset == 3 and replica.log.references("wal/object.wal")
    assert progress == [True]

"""A replica fetch answer is applied only to the position it was asked for (Kafka's fetcher checks
the fetch offset and the current leader epoch of the request against the partition's state).

Interleaving: the follower asks leader B for offset 10 at leader epoch 0. While the request is in
flight, leadership moves to C (epoch 1), the follower truncates to 5 (C's log diverged there), and
B leads again (epoch 2). Then B's answer to the old request arrives: records 10..12 of epoch 0,
which B itself has since truncated. Applied, they left a hole at 5..9 and records no leader has,
and the answer's high watermark let this broker's consumers read them.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from batches import make_batch
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import PartitionState
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.replication.fetcher import ReplicaFetcher
from diskless.replication.partition import Partition

FOLLOWER, B, C = 1, 0, 2
STATE = PartitionState(replicas=[B, FOLLOWER, C], leader=B, leader_epoch=0, isr=[B, FOLLOWER, C])


def batch(base: int, count: int, epoch: int) -> bytes:
    return make_batch([f"v{base + i}".encode() for i in range(count)], base_offset=base, partition_leader_epoch=epoch)


def answer(topic_id: uuid.UUID, records: bytes, high_watermark: int) -> SimpleNamespace:
    data = SimpleNamespace(
        partition_index=0,
        error_code=ErrorCode.none,
        diverging_epoch=None,
        records=records,
        high_watermark=high_watermark,
        log_start_offset=0,
    )
    return SimpleNamespace(responses=[SimpleNamespace(topic_id=topic_id, partitions=[data])])


def test_a_late_answer_from_before_two_leadership_moves_is_dropped(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    partition = Partition("t", 0, PartitionLog(str(tmp_path / "t-0"), LogConfig(), 0), FOLLOWER, str(topic_id))
    partition.apply_state(STATE, 0)
    partition.on_fetched(batch(0, 5, 0) + batch(5, 5, 0), 5, 0, 0)
    fetcher = ReplicaFetcher(FOLLOWER, B, lambda node: None, 500, 1 << 20, lambda: None)
    fetcher.add(partition)
    fetcher._request()  # asks B for offset 10 at epoch 0

    partition.apply_state(replace(STATE, leader=C, leader_epoch=1), 0)
    partition.log.truncate_to(5, 0)  # C's log diverged at 5
    partition.apply_state(replace(STATE, leader=B, leader_epoch=2), 0)

    fetcher._handle(answer(topic_id, batch(10, 3, 0), high_watermark=13))  # the old request's answer

    assert partition.log.log_end_offset == 5
    assert partition.log.high_watermark == 5

    fetcher._request()  # the next request asks from where the partition is now
    fetcher._handle(answer(topic_id, batch(5, 4, 2), high_watermark=9))
    assert (partition.log.log_end_offset, partition.log.high_watermark) == (9, 9)

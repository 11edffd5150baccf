"""The last stable offset waits for a transaction's end marker to be replicated.

The leader used to close a transaction as soon as it appended the marker, so its LSO jumped to the
high watermark while the marker was still above it. A new leader without the marker has the
transaction open (LSO back at its first offset): the LSO went backwards across a leader change,
and read_committed consumers had read past an undecided-on-this-replica transaction. Kafka keeps
such transactions unstable until the high watermark passes the marker
(ProducerStateManager.unreplicatedTxns).
"""

from __future__ import annotations

from pathlib import Path

from batches import values_batch
from loghelpers import T0, open_log

from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.protocol import records

PID = 4000


def _txn_batch(count: int, seq: int = 0) -> bytes:
    return values_batch(
        count, tag="a", producer_id=PID, producer_epoch=0, base_sequence=seq, transactional=True, start_ts=T0
    )


def test_lso_stays_at_the_transaction_until_its_marker_is_replicated(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader([memoryview(_txn_batch(3))], 0, T0)  # offsets 0..2
    log.high_watermark = 3
    assert log.append_marker_as_leader(PID, 0, True, 0, 0, T0) == 3  # not replicated yet
    assert log.last_stable_offset == 0
    log.high_watermark = 4  # the followers have the marker
    assert log.last_stable_offset == 4


def test_lso_never_goes_back_across_a_leader_change(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    batch = _txn_batch(3)
    leader.append_as_leader([memoryview(batch)], 0, T0)
    replicated = bytearray(batch)
    records.assign_offset(replicated, 0, 0)
    follower.append_as_follower(bytes(replicated), T0)
    leader.high_watermark = follower.high_watermark = 3
    leader.append_marker_as_leader(PID, 0, True, 0, 0, T0)  # offset 3, lost with the leader
    assert follower.last_stable_offset >= leader.last_stable_offset


def test_a_reopened_log_counts_markers_below_the_high_watermark_as_replicated(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for round_ in range(3):
        log.append_as_leader([memoryview(_txn_batch(2, seq=2 * round_))], 0, T0)
        log.high_watermark = log.log_end_offset
        log.append_marker_as_leader(PID, 0, round_ % 2 == 0, 0, 0, T0)
        log.high_watermark = log.log_end_offset
    log.checkpoint_high_watermark()
    log.close()
    reopened = PartitionLog(str(tmp_path), LogConfig(), T0)
    assert reopened.high_watermark == 9
    assert reopened.txns.unreplicated == [] and reopened.last_stable_offset == 9
    assert [a.first_offset for a in reopened.txns.aborted] == [3]

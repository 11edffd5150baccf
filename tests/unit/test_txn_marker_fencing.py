"""A partition leader refuses what a deposed transaction coordinator or a fenced producer writes.

Kafka's rules (ProducerAppendInfo): an end-of-transaction marker at an older producer epoch than
the partition has seen is INVALID_PRODUCER_EPOCH; one from an older coordinator epoch is
TRANSACTION_COORDINATOR_FENCED; a coordinator-written batch for a producer (TxnOffsetCommit) at a
fenced epoch is INVALID_PRODUCER_EPOCH. Without them a late marker ends the producer's *current*
transaction: a late ABORT throws its records away, a late COMMIT shows them to read_committed
consumers before the producer has finished. The coordinator epoch survives a restart (snapshot and
replay) and a leader change (followers track it too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from batches import values_batch
from kio.schema.errors import ErrorCode
from loghelpers import T0, open_log

from diskless.log.partition_log import PartitionLog
from diskless.log.producer_state import ProducerStateManager
from diskless.protocol import records
from diskless.transactions.coordinator import MarkerWork, TransactionCoordinatorCore, TransactionMetadata, TxnState

PID = 4000


def txn_batch(epoch: int, seq: int, count: int, tag: str) -> bytes:
    return values_batch(
        count, tag=tag, producer_id=PID, producer_epoch=epoch, base_sequence=seq, transactional=True, start_ts=T0
    )


def refused(action: object) -> str:
    with pytest.raises(records.InvalidBatch) as caught:
        action()  # type: ignore[operator]
    return caught.value.error


def test_a_late_abort_at_an_older_producer_epoch_leaves_the_current_transaction_open(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader([memoryview(txn_batch(0, 0, 2, "t0"))], 0, T0)
    log.append_marker_as_leader(PID, 1, False, 0, 0, T0)  # the fence's ABORT, at the bumped epoch
    current = log.append_as_leader([memoryview(txn_batch(1, 0, 3, "t1"))], 0, T0)
    log.high_watermark = log.log_end_offset

    assert refused(lambda: log.append_marker_as_leader(PID, 0, False, 0, 0, T0)) == "invalid_producer_epoch"
    assert log.last_stable_offset == current.base_offset  # still open, nothing aborted
    assert [a.first_offset for a in log.txns.aborted] == [0]


def test_a_deposed_coordinators_late_commit_does_not_expose_the_next_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader([memoryview(txn_batch(0, 0, 2, "t1"))], 0, T0)
    log.append_marker_as_leader(PID, 0, True, 5, 0, T0)  # the new coordinator (epoch 5) commits T1
    t2 = log.append_as_leader([memoryview(txn_batch(0, 2, 2, "t2"))], 0, T0)  # T2, same producer epoch
    log.high_watermark = log.log_end_offset

    error = refused(lambda: log.append_marker_as_leader(PID, 0, True, 4, 0, T0))  # the old one's, late
    assert error == "transaction_coordinator_fenced"
    assert log.last_stable_offset == t2.base_offset
    # The current coordinator, and a newer one, still end T2.
    log.append_marker_as_leader(PID, 0, True, 5, 0, T0)
    log.high_watermark = log.log_end_offset
    assert log.last_stable_offset == log.log_end_offset


def test_a_fenced_producers_transactional_offsets_are_refused(tmp_path: Path) -> None:
    """GroupShell.persist appends TxnOffsetCommit with check_sequence=False; the epoch still counts."""
    log = open_log(tmp_path)

    def offsets(epoch: int) -> list[memoryview]:
        return [memoryview(records.build_batch([(b"k", b"v")], T0, PID, epoch, -1, records.TRANSACTIONAL_FLAG))]

    log.append_as_leader(offsets(0), 0, T0, check_sequence=False)
    log.append_marker_as_leader(PID, 1, False, 0, 0, T0)  # a new instance fenced epoch 0
    end = log.log_end_offset
    assert refused(lambda: log.append_as_leader(offsets(0), 0, T0, check_sequence=False)) == "invalid_producer_epoch"
    assert log.log_end_offset == end
    assert log.producer_state.producers[PID].epoch == 1  # not lowered
    log.append_as_leader(offsets(1), 0, T0, check_sequence=False)  # the new instance's go through


def test_the_leaders_own_abort_of_a_superseded_transaction_is_not_fenced(tmp_path: Path) -> None:
    """A late diskless batch's transaction is closed by the leader (coordinator epoch -1) even
    after coordinators with real epochs wrote markers."""
    log = open_log(tmp_path)
    log.append_as_leader([memoryview(txn_batch(0, 0, 1, "a"))], 0, T0)
    log.append_marker_as_leader(PID, 0, False, 7, 0, T0)
    log.append_as_leader([memoryview(txn_batch(0, 1, 1, "late"))], 0, T0)  # arrives after its marker
    log.append_as_leader([memoryview(txn_batch(1, 0, 1, "next"))], 0, T0)  # closes "late" first
    assert len(log.txns.aborted) == 2
    assert log.producer_state.producers[PID].coordinator_epoch == 7


def test_the_coordinator_epoch_survives_a_restart_and_reaches_followers(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    leader.append_as_leader([memoryview(txn_batch(0, 0, 1, "a"))], 0, T0)
    leader.append_marker_as_leader(PID, 0, True, 9, 0, T0)
    leader.append_as_leader([memoryview(txn_batch(0, 1, 1, "b"))], 0, T0)
    leader.high_watermark = leader.log_end_offset

    follower = open_log(tmp_path / "follower")
    follower.append_as_follower(leader.read(0, 1 << 20).records, T0)
    assert refused(lambda: follower.append_marker_as_leader(PID, 0, True, 8, 1, T0)) == "transaction_coordinator_fenced"

    leader.close()
    reopened = PartitionLog(str(tmp_path / "leader"), leader.config, T0)  # replays the log tail
    assert refused(lambda: reopened.append_marker_as_leader(PID, 0, True, 8, 0, T0)) == "transaction_coordinator_fenced"

    state = ProducerStateManager.from_bytes(reopened.producer_state.to_bytes())
    assert state.producers[PID].coordinator_epoch == 9


def test_a_snapshot_without_coordinator_epochs_still_loads() -> None:
    import msgpack

    state = ProducerStateManager.from_bytes(msgpack.packb({PID: [3, [[0, 1, 0, 1, T0]]]}))
    assert (state.producers[PID].epoch, state.producers[PID].coordinator_epoch) == (3, -1)


# --- the coordinator's side -------------------------------------------------------------------------


def prepared(core: TransactionCoordinatorCore) -> MarkerWork:
    """A transaction of producer 'app' in PrepareCommit with one partition, its markers claimed."""
    meta = TransactionMetadata(
        transactional_id="app",
        producer_id=PID,
        last_producer_id=-1,
        producer_epoch=0,
        last_producer_epoch=-1,
        timeout_ms=60_000,
        state=TxnState.PREPARE_COMMIT,
        partitions=frozenset({("t", 0), ("t", 1)}),
        txn_start_ms=T0,
        last_update_ms=T0,
    )
    core.load(meta)
    work = core.begin_markers("app")
    assert work is not None
    return work


def test_markers_carry_the_coordinator_epoch_and_a_fenced_answer_stops_the_sending() -> None:
    core = TransactionCoordinatorCore(partition=3, coordinator_epoch=12)
    work = prepared(core)
    assert work.coordinator_epoch == 12

    results = {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.transaction_coordinator_fenced}
    assert core.markers_written(work, results, T0) is None
    # Deposed: no retry is offered, however long one waits (a newer coordinator finishes it).
    assert core.pending_completions(T0 + 3_600_000) == []

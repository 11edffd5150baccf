"""Transactional batches that reach the leader after their transaction ended.

A diskless batch is committed when the representative's flush reaches the leader, which can be
after the client gave up on it, aborted, and the coordinator wrote the ABORT marker. Such a
batch must not leave a transaction open forever (the last stable offset stuck) nor be counted
as part of the producer's next transaction. Two cases are decidable by the partition alone:

- the coordinator fenced the producer (transaction timeout, or InitProducerId on an ongoing
  transaction): the ABORT marker carries the bumped epoch, so the late batch's epoch is stale
  and it is refused with INVALID_PRODUCER_EPOCH, as Kafka's leader does;
- the client aborted, then bumped its epoch (KIP-360, which librdkafka and the Java client do
  after a timed-out request) and wrote its next transaction: the coordinator completes a
  transaction only once every marker is written and bumps epochs only then, so a transaction
  still open at an older epoch when a newer epoch's batch arrives has ended; the leader closes it
  with an ABORT marker of its own before appending the new batch.

Both append paths (pointers for diskless, record batches for classic) follow the same rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from batches import make_batch, values_batch
from loghelpers import T0, open_log

from diskless.log.partition_log import AppendResult, PartitionLog
from diskless.protocol import records

PID = 4000
KINDS = ["pointers", "records"]


def txn_batch(epoch: int, seq: int, count: int, tag: str) -> bytes:
    return values_batch(
        count, tag=tag, producer_id=PID, producer_epoch=epoch, base_sequence=seq, transactional=True, start_ts=T0
    )


def append(log: PartitionLog, kind: str, batch: bytes) -> AppendResult:
    """Append as the leader (a diskless commit or a classic produce) and advance the HW."""
    if kind == "pointers":
        result = log.append_pointer_as_leader(batch[: records.HEADER_SIZE], "wal/obj", 0, 0, T0)
    else:
        result = log.append_as_leader([memoryview(batch)], 0, T0)
    log.high_watermark = log.log_end_offset
    return result


def marker(log: PartitionLog, epoch: int, commit: bool) -> int:
    offset = log.append_marker_as_leader(PID, epoch, commit, 0, 0, T0)
    log.high_watermark = log.log_end_offset
    return offset


def committed_offsets(log: PartitionLog, appended: dict[str, AppendResult]) -> set[str]:
    """Which appended batches a read_committed consumer delivers: below the LSO and not inside an
    aborted transaction of their producer (first offset .. abort marker), as the client filters."""
    aborted = log.txns.aborted_between(log.log_start_offset, log.last_stable_offset)
    visible = set()
    for name, result in appended.items():
        if result.last_offset >= log.last_stable_offset:
            continue
        if any(a.producer_id == PID and a.first_offset <= result.base_offset <= a.last_offset for a in aborted):
            continue
        visible.add(name)
    return visible


@pytest.mark.parametrize("kind", KINDS)
def test_late_batch_after_a_fencing_abort_is_refused(tmp_path: Path, kind: str) -> None:
    """The coordinator timed the transaction out: it bumped the epoch and wrote ABORT with it."""
    log = open_log(tmp_path)
    append(log, kind, txn_batch(0, 0, 5, "a"))
    marker(log, 1, commit=False)
    end = log.log_end_offset
    with pytest.raises(records.InvalidBatch) as refused:
        append(log, kind, txn_batch(0, 5, 3, "late"))
    assert refused.value.error == "invalid_producer_epoch"
    assert log.log_end_offset == end and log.last_stable_offset == log.high_watermark == end
    assert log.txns.ongoing == {}


@pytest.mark.parametrize("kind", KINDS)
def test_late_batch_after_a_client_abort_is_aborted_not_joined_to_the_next_transaction(
    tmp_path: Path, kind: str
) -> None:
    """Client timed out, aborted (marker at its epoch), bumped its epoch (KIP-360) and committed a
    next transaction; the late batch landed between the ABORT marker and that transaction."""
    log = open_log(tmp_path)
    appended = {"first": append(log, kind, txn_batch(0, 0, 5, "a"))}
    marker(log, 0, commit=False)
    appended["late"] = append(log, kind, txn_batch(0, 5, 3, "late"))  # same epoch, next sequence
    appended["next"] = append(log, kind, txn_batch(1, 0, 4, "n"))
    marker(log, 1, commit=True)
    assert log.last_stable_offset == log.high_watermark == log.log_end_offset, "a transaction is left open"
    assert log.txns.ongoing == {}
    assert committed_offsets(log, appended) == {"next"}
    assert [a.first_offset for a in log.txns.aborted] == [0, appended["late"].base_offset]
    # The leader's own marker is in the log: a restarted leader and a follower see the same.
    state = (log.last_stable_offset, list(log.txns.aborted))
    log.close()
    reopened = open_log(tmp_path)
    assert (reopened.last_stable_offset, list(reopened.txns.aborted)) == state
    follower = open_log(tmp_path / "follower")
    data = reopened.read(0, 1 << 20, max_offset=reopened.log_end_offset)
    if kind == "pointers":
        follower.append_pointers_as_follower(data.records, T0)
    else:
        follower.append_as_follower(data.records, T0)
    follower.high_watermark = follower.log_end_offset
    assert (follower.last_stable_offset, list(follower.txns.aborted)) == state


@pytest.mark.parametrize("kind", KINDS)
def test_epoch_bump_with_no_transaction_open_writes_no_marker(tmp_path: Path, kind: str) -> None:
    """The usual flow: commit at epoch 0, the producer restarts (epoch 1): nothing to close."""
    log = open_log(tmp_path)
    append(log, kind, txn_batch(0, 0, 2, "a"))
    marker(log, 0, commit=True)
    end = log.log_end_offset
    result = append(log, kind, txn_batch(1, 0, 2, "b"))
    assert result.base_offset == end, "no marker written before the new epoch's first batch"
    assert log.txns.ongoing == {PID: end}


@pytest.mark.parametrize("kind", KINDS)
def test_transactions_at_one_epoch_follow_each_other(tmp_path: Path, kind: str) -> None:
    """Without KIP-890 clients keep their epoch across transactions: a batch after a marker at the
    same epoch starts the next transaction (the partition cannot tell it from a late one)."""
    log = open_log(tmp_path)
    append(log, kind, txn_batch(0, 0, 2, "a"))
    marker(log, 0, commit=False)
    second = append(log, kind, txn_batch(0, 2, 2, "b"))
    assert log.txns.ongoing == {PID: second.base_offset}
    marker(log, 0, commit=True)
    assert log.last_stable_offset == log.log_end_offset


def test_non_transactional_batches_are_unaffected(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    batch = make_batch([b"x"], producer_id=PID + 1, producer_epoch=0, base_sequence=0)
    append(log, "pointers", batch)
    assert log.last_stable_offset == log.log_end_offset == 1

"""Transaction verification of diskless commits (KIP-890 part 1 style), sans-IO.

The leader hands out a guard when a representative accepts a transactional batch (after the
coordinator confirmed the partition is in the producer's ongoing transaction); the commit carries
it; a marker ends it. Interleavings: the late commit after an abort, after a commit, after the
producer's next transaction added the partition, a marker while the coordinator is being asked,
the coordinator answering no or moving (its state replayed elsewhere), the leader moving between
verification and commit, and a hypothesis model of arbitrary orders of these steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from batches import values_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from loghelpers import T0, open_log

from diskless.log.partition_log import AppendResult, PartitionLog
from diskless.log.txn_verification import TxnGuard, TxnVerifier
from diskless.protocol import records
from diskless.transactions.coordinator import TransactionCoordinatorCore, TxnState
from diskless.transactions.records import encode, replay

PID = 5000
LEADER_EPOCH = 3


def header(epoch: int, seq: int, tag: str, count: int = 1, transactional: bool = True) -> bytes:
    batch = values_batch(
        count,
        tag=tag,
        producer_id=PID,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=transactional,
        start_ts=T0,
    )
    return batch[: records.HEADER_SIZE]


def verified(log: PartitionLog, epoch: int = 0, leader_epoch: int = LEADER_EPOCH) -> TxnGuard:
    """The leader's side of one verification the coordinator answers yes to."""
    began = log.txn_verifier.begin(PID, epoch, leader_epoch)
    assert not isinstance(began, ErrorCode)
    guard, _ = began
    assert log.txn_verifier.confirm(PID, guard)
    return guard


def commit(log: PartitionLog, head: bytes, guard: TxnGuard | None, leader_epoch: int = LEADER_EPOCH) -> AppendResult:
    result = log.append_pointer_as_leader(head, "wal/obj", 0, leader_epoch, T0, txn_guard=guard, verify_txn=True)
    log.high_watermark = log.log_end_offset
    return result


def marker(log: PartitionLog, commit: bool, epoch: int = 0) -> int:
    offset = log.append_marker_as_leader(PID, epoch, commit, 0, LEADER_EPOCH, T0)
    log.high_watermark = log.log_end_offset
    return offset


def refused(log: PartitionLog, head: bytes, guard: TxnGuard | None, leader_epoch: int = LEADER_EPOCH) -> str:
    end = log.log_end_offset
    with pytest.raises(records.InvalidBatch) as error:
        commit(log, head, guard, leader_epoch)
    assert log.log_end_offset == end, "a refused commit appended something"
    return error.value.error


@pytest.mark.parametrize("outcome", ["abort", "commit"])
def test_late_commit_after_the_transaction_ended_is_refused(tmp_path: Path, outcome: str) -> None:
    log = open_log(tmp_path)
    guard = verified(log)
    commit(log, header(0, 0, "first"), guard)
    # The second batch was verified in the same transaction (cached guard), then its flush stalled.
    again = log.txn_verifier.begin(PID, 0, LEADER_EPOCH)
    assert again == (guard, True), "a verified transaction is not asked about again"
    marker(log, commit=outcome == "commit")
    assert refused(log, header(0, 1, "late"), guard) == "invalid_txn_state"
    assert log.txns.ongoing == {}, "the late commit opened a transaction"
    assert log.last_stable_offset == log.high_watermark


def test_late_commit_never_joins_the_next_transaction_at_the_same_epoch(tmp_path: Path) -> None:
    """aiokafka keeps its epoch: the next transaction added the partition and was verified anew."""
    log = open_log(tmp_path)
    first = verified(log)
    commit(log, header(0, 0, "a"), first)
    marker(log, commit=False)
    began = log.txn_verifier.begin(PID, 0, LEADER_EPOCH)
    assert not isinstance(began, ErrorCode)
    second, cached = began
    assert not cached and second != first, "a marker ends the cached verification"
    assert refused(log, header(0, 1, "late"), first) == "invalid_txn_state"  # before the new one is confirmed
    assert log.txn_verifier.confirm(PID, second)
    assert refused(log, header(0, 1, "late"), first) == "invalid_txn_state"  # and after
    next_txn = commit(log, header(0, 1, "next"), second)
    assert log.txns.ongoing == {PID: next_txn.base_offset}
    marker(log, commit=True)
    assert log.last_stable_offset == log.log_end_offset


def test_marker_while_the_coordinator_is_asked_ends_the_guard(tmp_path: Path) -> None:
    """The coordinator said yes, but its answer arrived after the transaction's marker."""
    log = open_log(tmp_path)
    began = log.txn_verifier.begin(PID, 0, LEADER_EPOCH)
    assert not isinstance(began, ErrorCode)
    guard, _ = began
    marker(log, commit=False)
    assert not log.txn_verifier.confirm(PID, guard)
    assert refused(log, header(0, 0, "late"), guard) == "invalid_txn_state"
    assert log.txns.ongoing == {}


def test_unconfirmed_or_missing_guard_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    began = log.txn_verifier.begin(PID, 0, LEADER_EPOCH)
    assert not isinstance(began, ErrorCode)
    guard, _ = began
    assert refused(log, header(0, 0, "x"), guard) == "invalid_txn_state", "not confirmed yet"
    log.txn_verifier.forget(PID, guard)  # the coordinator said no
    assert log.txn_verifier.begin(PID, 0, LEADER_EPOCH) != (guard, False), "the next batch asks again"
    assert refused(log, header(0, 0, "x"), None) == "invalid_txn_state"


def test_leader_moved_between_verification_and_commit_is_retriable(tmp_path: Path) -> None:
    """A guard of another leader term (epoch, or the same epoch on another log object: a restart)
    is NOT_ENOUGH_REPLICAS, which producers retry and are verified anew."""
    log = open_log(tmp_path)
    guard = verified(log)
    assert refused(log, header(0, 0, "x"), guard, leader_epoch=LEADER_EPOCH + 1) == "not_enough_replicas"
    other = TxnVerifier()
    foreign = TxnGuard(LEADER_EPOCH, other.incarnation, guard.serial)
    assert refused(log, header(0, 0, "x"), foreign) == "not_enough_replicas"
    # Leadership came back at a new epoch: the old entry is not reused, a new guard is verified.
    renewed = verified(log, leader_epoch=LEADER_EPOCH + 1)
    assert renewed != guard
    commit(log, header(0, 0, "x"), renewed, leader_epoch=LEADER_EPOCH + 1)


def test_retry_of_an_appended_batch_is_a_duplicate_even_after_the_marker(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    guard = verified(log)
    first = commit(log, header(0, 0, "a"), guard)
    marker(log, commit=True)
    again = commit(log, header(0, 0, "a"), guard)
    assert again.duplicate and again.base_offset == first.base_offset


def test_older_epoch_is_fenced_and_newer_epoch_verifies_anew(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    guard = verified(log, epoch=1)
    assert log.txn_verifier.begin(PID, 0, LEADER_EPOCH) == ErrorCode.invalid_producer_epoch
    began = log.txn_verifier.begin(PID, 2, LEADER_EPOCH)
    assert not isinstance(began, ErrorCode) and began[0] != guard and not began[1]
    assert refused(log, header(1, 0, "old"), guard) == "invalid_txn_state"


def test_non_transactional_batches_and_verification_off_are_unaffected(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    commit(log, header(0, 0, "plain", transactional=False), None)
    off = log.append_pointer_as_leader(header(0, 1, "txn"), "wal/obj", 0, LEADER_EPOCH, T0)
    assert log.txns.ongoing == {PID: off.base_offset}


# --- the coordinator's side ----------------------------------------------------------------------

TXN = "txn-1"
TP = ("topic", 0)
OTHER = ("topic", 1)


def ongoing_core() -> tuple[TransactionCoordinatorCore, int]:
    core = TransactionCoordinatorCore()
    outcome = core.init_producer_id(TXN, 60_000, None, 0, new_producer_id=PID)
    assert not isinstance(outcome, ErrorCode | type(None)) and hasattr(outcome, "target")
    core.complete_transit(outcome, ErrorCode.none, 0)
    epoch = outcome.target.producer_epoch
    add = core.add_partitions(TXN, PID, epoch, {TP}, 1)
    assert not isinstance(add, ErrorCode)
    core.complete_transit(add, ErrorCode.none, 1)
    return core, epoch


def test_coordinator_verifies_partitions_of_the_ongoing_transaction() -> None:
    core, epoch = ongoing_core()
    assert core.verify_partitions(TXN, PID, epoch, [TP, OTHER]) == {
        TP: ErrorCode.none,
        OTHER: ErrorCode.invalid_txn_state,
    }
    assert core.verify_partitions(TXN, PID, epoch + 1, [TP]) == {TP: ErrorCode.producer_fenced}
    assert core.verify_partitions(TXN, PID + 1, epoch, [TP]) == {TP: ErrorCode.invalid_producer_id_mapping}
    assert core.verify_partitions("unknown", PID, epoch, [TP]) == {TP: ErrorCode.invalid_producer_id_mapping}
    # Adding another partition while a batch of the first is verified: the first still counts.
    add = core.add_partitions(TXN, PID, epoch, {OTHER}, 2)
    assert not isinstance(add, ErrorCode)
    assert core.verify_partitions(TXN, PID, epoch, [TP, OTHER]) == {
        TP: ErrorCode.none,
        OTHER: ErrorCode.invalid_txn_state,
    }
    core.complete_transit(add, ErrorCode.none, 2)
    # EndTxn being persisted, then markers in flight: the transaction is ending.
    end = core.end_txn(TXN, PID, epoch, False, 3)
    assert not isinstance(end, ErrorCode)
    assert core.verify_partitions(TXN, PID, epoch, [TP]) == {TP: ErrorCode.concurrent_transactions}
    core.complete_transit(end, ErrorCode.none, 3)
    assert core.get(TXN).state is TxnState.PREPARE_ABORT  # type: ignore[union-attr]
    assert core.verify_partitions(TXN, PID, epoch, [TP]) == {TP: ErrorCode.concurrent_transactions}
    work = core.begin_markers(TXN)
    assert work is not None
    complete = core.markers_written(work, dict.fromkeys(work.partitions, ErrorCode.none), 4)
    assert complete is not None
    core.complete_transit(complete, ErrorCode.none, 4)
    # Complete: the partition is in no ongoing transaction (a late batch's question).
    assert core.verify_partitions(TXN, PID, epoch, [TP]) == {TP: ErrorCode.invalid_txn_state}


def test_coordinator_moved_answers_the_same_after_replay() -> None:
    core, epoch = ongoing_core()
    moved = TransactionCoordinatorCore()
    meta = core.get(TXN)
    assert meta is not None
    replay(moved, [encode(meta)])
    assert moved.verify_partitions(TXN, PID, epoch, [TP, OTHER]) == core.verify_partitions(TXN, PID, epoch, [TP, OTHER])


# --- arbitrary interleavings -----------------------------------------------------------------------

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("verify"), st.booleans()),  # (verify a new batch, a marker races the answer)
        st.tuples(st.just("commit"), st.integers(0, 20)),  # commit the n-th verified batch (if any)
        st.tuples(st.just("marker"), st.booleans()),  # commit or abort the producer's transaction
        st.tuples(st.just("move"), st.just(False)),  # leadership moves (new leader epoch)
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(steps=STEPS)
def test_a_commit_is_appended_only_in_the_transaction_it_was_verified_in(tmp_path_factory, steps) -> None:
    """Model: transactions are numbered by the markers written; a batch belongs to the
    transaction current when its verification began. A commit is appended iff no marker and no
    leader move happened since its verification began and the coordinator's answer was in time;
    then it is in the open transaction, which the next marker closes."""
    log = open_log(tmp_path_factory.mktemp("log"))
    leader_epoch = LEADER_EPOCH
    txn_number = 0
    batches: list[tuple[TxnGuard, int, int, bool]] = []  # guard, txn number, leader epoch, confirmed
    seq = 0
    for kind, arg in steps:
        if kind == "verify":
            began = log.txn_verifier.begin(PID, 0, leader_epoch)
            assert not isinstance(began, ErrorCode)
            guard, _ = began
            if arg:
                marker(log, commit=False)
                txn_number += 1
            batches.append((guard, txn_number - int(arg), leader_epoch, log.txn_verifier.confirm(PID, guard)))
        elif kind == "commit" and batches:
            guard, number, epoch, confirmed = batches[arg % len(batches)]
            good = confirmed and number == txn_number and epoch == leader_epoch
            head = header(0, seq, f"b{seq}")
            if good:
                result = commit(log, head, guard, leader_epoch)
                seq += 1
                assert log.txns.ongoing.get(PID, -1) <= result.base_offset
            else:
                expected = "not_enough_replicas" if epoch != leader_epoch else "invalid_txn_state"
                assert refused(log, head, guard, leader_epoch) == expected
        elif kind == "marker":
            marker(log, commit=arg)
            txn_number += 1
            assert PID not in log.txns.ongoing
        elif kind == "move":
            leader_epoch += 1
    marker(log, commit=False)
    assert log.txns.ongoing == {} and log.last_stable_offset == log.log_end_offset

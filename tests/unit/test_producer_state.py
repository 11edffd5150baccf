"""Idempotent producer rules (Kafka's ProducerStateManager) and their use by PartitionLog."""

from __future__ import annotations

from pathlib import Path

import pytest
from batches import make_batch
from hypothesis import given
from hypothesis import strategies as st
from loghelpers import T0, open_log, produce, read_records

from diskless.log import producer_state as ps
from diskless.protocol.records import HEADER_SIZE, BatchHeader, InvalidBatch, parse_header, set_log_append_time

PID = 4242
INT32_MAX = 2**31 - 1


def header(seq: int, count: int = 1, epoch: int = 0, pid: int = PID) -> BatchHeader:
    return parse_header(
        make_batch([b"x"] * count, producer_id=pid, producer_epoch=epoch, base_sequence=seq, base_offset=0)
    )


class Appender:
    """Drives a ProducerStateManager the way a leader does: check, then record at the log end."""

    def __init__(self) -> None:
        self.state = ps.ProducerStateManager()
        self.next_offset = 0

    def append(self, h: BatchHeader) -> tuple[int, int, bool]:
        dup = self.state.check(h)
        if dup is not None:
            return dup.first_offset, dup.last_offset, True
        first = self.next_offset
        self.state.record(h, first, T0)
        self.next_offset += h.record_count
        return first, first + h.record_count - 1, False


def _error(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidBatch) as exc:
        fn(*args)
    return exc.value.error


def test_non_idempotent_batches_are_not_tracked() -> None:
    state = ps.ProducerStateManager()
    h = parse_header(make_batch([b"x"]))
    assert state.check(h) is None
    state.record(h, 0, T0)
    assert state.producers == {}


def test_unknown_producer_accepts_any_sequence() -> None:
    a = Appender()
    assert a.append(header(17, 3)) == (0, 2, False)
    assert a.append(header(20)) == (3, 3, False)


@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=15), data=st.data())
def test_duplicates_of_any_of_the_last_five_batches(counts: list[int], data: st.DataObject) -> None:
    a = Appender()
    seq = 0
    sent: list[tuple[BatchHeader, tuple[int, int]]] = []
    for count in counts:
        h = header(seq, count)
        first, last, dup = a.append(h)
        assert not dup
        sent.append((h, (first, last)))
        seq += count
    end = a.next_offset
    recent = sent[-5:]
    h, offsets = data.draw(st.sampled_from(recent), label="retry")
    assert a.append(h) == (*offsets, True)
    assert a.next_offset == end
    # older batches are no longer cached: their retry is out of order
    for old, _ in sent[:-5]:
        assert _error(a.append, old) == "out_of_order_sequence_number"
    # a batch that only shares the first sequence of a cached one is not a duplicate
    h0, _ = recent[-1]
    if h0.record_count > 1:
        assert _error(a.append, header(h0.base_sequence, h0.record_count - 1)) == "out_of_order_sequence_number"
    assert a.append(header(seq, 2)) == (end, end + 1, False)


@pytest.mark.parametrize("seq", [3, 4, 100, 0, 1, -5])
def test_out_of_order_sequence(seq: int) -> None:
    a = Appender()
    a.append(header(0, 2))  # sequences 0-1
    if seq == 0:
        # the first batch again is a duplicate, but 0 with another count is out of order
        assert a.append(header(0, 2))[2]
        assert _error(a.append, header(0, 3)) == "out_of_order_sequence_number"
    else:
        assert _error(a.append, header(seq)) == "out_of_order_sequence_number"


def test_epochs() -> None:
    a = Appender()
    a.append(header(0, 2, epoch=3))
    assert _error(a.append, header(2, epoch=2)) == "invalid_producer_epoch"
    assert _error(a.append, header(0, 2, epoch=2)) == "invalid_producer_epoch"  # even a "duplicate"
    assert _error(a.append, header(2, epoch=4)) == "out_of_order_sequence_number"  # new epoch must start at 0
    assert a.append(header(0, 1, epoch=4)) == (2, 2, False)
    # the previous epoch's batches are forgotten and fenced
    assert _error(a.append, header(0, 2, epoch=3)) == "invalid_producer_epoch"
    assert a.append(header(1, epoch=4)) == (3, 3, False)
    assert a.append(header(0, epoch=4)) == (2, 2, True)


def test_sequence_wraps_around() -> None:
    a = Appender()
    a.append(header(INT32_MAX - 1, 2))  # INT32_MAX-1, INT32_MAX
    assert a.state.producers[PID].last_seq == INT32_MAX
    assert a.append(header(0, 3)) == (2, 4, False)
    wrapping = header(3, 1)
    assert a.append(wrapping) == (5, 5, False)
    b = Appender()
    b.append(header(INT32_MAX - 1, 4))  # wraps inside the batch: INT32_MAX-1 .. 1
    assert b.state.producers[PID].last_seq == 1
    assert b.append(header(INT32_MAX - 1, 4)) == (0, 3, True)
    assert b.append(header(2)) == (4, 4, False)


def test_producers_are_independent() -> None:
    a = Appender()
    a.append(header(0, pid=1))
    a.append(header(5, pid=2))
    assert a.append(header(1, pid=1)) == (2, 2, False)
    assert a.append(header(6, pid=2)) == (3, 3, False)
    assert _error(a.append, header(9, pid=1)) == "out_of_order_sequence_number"


@given(
    producers=st.dictionaries(
        st.integers(0, 2**62),
        st.tuples(st.integers(0, 2**15 - 1), st.lists(st.integers(1, 10), min_size=1, max_size=8)),
        max_size=5,
    )
)
def test_snapshot_round_trip(producers: dict[int, tuple[int, list[int]]]) -> None:
    state = ps.ProducerStateManager()
    offset = 0
    for pid, (epoch, counts) in producers.items():
        seq = 0
        for count in counts:
            state.record(header(seq, count, epoch=epoch, pid=pid), offset, T0 + offset)
            seq += count
            offset += count
    restored = ps.ProducerStateManager.from_bytes(state.to_bytes())
    assert restored.producers.keys() == state.producers.keys()
    for pid, entry in state.producers.items():
        assert restored.producers[pid].epoch == entry.epoch
        assert list(restored.producers[pid].batches) == list(entry.batches)
        assert restored.producers[pid].batches.maxlen == ps.MAX_CACHED_BATCHES


def test_snapshot_files(tmp_path: Path) -> None:
    directory = str(tmp_path)
    state = ps.ProducerStateManager()
    state.record(header(0, 3), 0, T0)
    for offset in (3, 10, 20):
        ps.write_snapshot(directory, offset, state)
    assert ps.list_snapshots(directory) == [10, 20]  # only the two newest are kept
    offset, loaded = ps.load_latest_snapshot(directory, 25)
    assert offset == 20 and loaded.producers[PID].last_seq == 2
    # snapshots past the end of the (truncated) log are deleted
    offset, _ = ps.load_latest_snapshot(directory, 15)
    assert offset == 10 and ps.list_snapshots(directory) == [10]
    with open(ps.snapshot_path(directory, 12), "wb") as f:
        f.write(b"\xc1 not msgpack")
    offset, _ = ps.load_latest_snapshot(directory, 15)
    assert offset == 10
    empty = tmp_path / "empty"
    empty.mkdir()
    offset, state = ps.load_latest_snapshot(str(empty), 5)
    assert offset == 0 and state.producers == {}


# --- through PartitionLog ------------------------------------------------------------------------


def test_duplicate_append_returns_original_offsets_and_appends_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    produce(log, 2, tag="a", producer_id=PID, producer_epoch=0, base_sequence=0)
    first = produce(log, 3, tag="b", producer_id=PID, producer_epoch=0, base_sequence=2, now_ms=T0 + 5)
    size, leo = log.size_bytes, log.log_end_offset
    retry = produce(log, 3, tag="b", producer_id=PID, producer_epoch=0, base_sequence=2, now_ms=T0 + 99)
    assert retry.duplicate
    assert (retry.base_offset, retry.last_offset) == (first.base_offset, first.last_offset) == (2, 4)
    assert log.size_bytes == size and log.log_end_offset == leo
    assert [r.value for r in read_records(log)] == [b"a-0", b"a-1", b"b-0", b"b-1", b"b-2"]


def test_duplicate_of_a_log_append_time_batch_answers_its_append_time(tmp_path: Path) -> None:
    """The producer reports the answer's log_append_time as its records' timestamp: a retry
    answered -1 made it report the create time, which no consumer sees (Kafka answers the
    cached batch's timestamp). CreateTime topics answer -1, as the first answer did."""
    log = open_log(tmp_path / "classic", message_timestamp_type="LogAppendTime")
    first = produce(log, 2, producer_id=PID, producer_epoch=0, base_sequence=0, now_ms=T0 + 5)
    retry = produce(log, 2, producer_id=PID, producer_epoch=0, base_sequence=0, now_ms=T0 + 99)
    assert retry.duplicate and first.log_append_time == retry.log_append_time == T0 + 5
    created = open_log(tmp_path / "create-time")
    produce(created, 2, producer_id=PID, producer_epoch=0, base_sequence=0)
    assert produce(created, 2, producer_id=PID, producer_epoch=0, base_sequence=0).log_append_time == -1

    pointers = open_log(tmp_path / "diskless")
    answers = []
    for stamped in (T0 + 5, T0 + 99):  # the representative stamps each (re)sent batch on arrival
        batch = bytearray(make_batch([b"x"] * 2, producer_id=PID, producer_epoch=0, base_sequence=0))
        set_log_append_time(batch, stamped)
        answers.append(pointers.append_pointer_as_leader(bytes(batch[:HEADER_SIZE]), "wal/a", 0, 0, stamped))
    assert answers[1].duplicate and answers[0].log_append_time == answers[1].log_append_time == T0 + 5


def test_partition_log_rejects_bad_sequences_without_appending(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    produce(log, 2, producer_id=PID, producer_epoch=1, base_sequence=0)
    for kwargs, code in [
        ({"producer_epoch": 1, "base_sequence": 5}, "out_of_order_sequence_number"),
        ({"producer_epoch": 0, "base_sequence": 2}, "invalid_producer_epoch"),
        ({"producer_epoch": 2, "base_sequence": 1}, "out_of_order_sequence_number"),
    ]:
        with pytest.raises(InvalidBatch) as exc:
            produce(log, 1, producer_id=PID, **kwargs)
        assert exc.value.error == code
    assert log.log_end_offset == 2


def test_non_transactional_batch_inside_an_open_transaction_is_refused(tmp_path: Path) -> None:
    """Kafka's appendDataBatch: INVALID_TXN_STATE, nothing appended; after the marker the
    producer's sequence goes on, on both the classic and the diskless commit path."""

    def batch(seq: int, transactional: bool) -> bytes:
        return make_batch([b"x"], producer_id=PID, producer_epoch=0, base_sequence=seq, transactional=transactional)

    for kind in ("classic", "diskless"):
        log = open_log(tmp_path / kind)

        def append(data: bytes, log=log, kind=kind):  # type: ignore[no-untyped-def]
            if kind == "classic":
                return log.append_as_leader([memoryview(data)], 0, T0)
            return log.append_pointer_as_leader(data[:HEADER_SIZE], "wal/a", 0, 0, T0)

        append(batch(0, True))
        assert _error(append, batch(1, False)) == "invalid_txn_state"
        assert _error(append, batch(5, False)) == "out_of_order_sequence_number"  # the sequence comes first
        assert log.log_end_offset == 1
        assert append(batch(1, True)).base_offset == 1
        log.append_marker_as_leader(PID, 0, True, 0, 0, T0)
        assert append(batch(2, False)).base_offset == 3


@pytest.mark.parametrize("clean", [True, False])
def test_producer_state_survives_reopen_and_roll(tmp_path: Path, clean: bool) -> None:
    log = open_log(tmp_path, segment_bytes=250)
    seq = 0
    results = []
    for i in range(12):
        results.append(produce(log, 2, tag=f"b{i}", producer_id=PID, producer_epoch=0, base_sequence=seq))
        seq += 2
    assert len(log.segments) > 2
    log.close(clean=clean)
    log = open_log(tmp_path, segment_bytes=250)
    for i in range(7, 12):
        retry = produce(log, 2, tag=f"b{i}", producer_id=PID, producer_epoch=0, base_sequence=2 * i)
        assert retry.duplicate and retry.base_offset == results[i].base_offset
    with pytest.raises(InvalidBatch):
        produce(log, 2, producer_id=PID, producer_epoch=0, base_sequence=2 * 6)
    assert not produce(log, 1, producer_id=PID, producer_epoch=0, base_sequence=seq).duplicate

"""PartitionLog on real files: appends, reads, rolling, retention, deletion, time lookups, truncation."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from batches import CODECS, LZ4, ZSTD, Record, crc_ok, decode_all, decode_batch, make_batch
from hypothesis import given
from hypothesis import strategies as st
from loghelpers import T0, batches_of, log_files, open_log, produce, read_records

from diskless.log.partition_log import OffsetOutOfRange, PartitionLog
from diskless.protocol.records import InvalidBatch


def _expected_values(sizes: list[int]) -> list[tuple[int, bytes]]:
    out = []
    offset = 0
    for i, n in enumerate(sizes):
        for j in range(n):
            out.append((offset, f"b{i}-{j}".encode()))
            offset += 1
    return out


def _fill(log: PartitionLog, sizes: list[int], now_ms: int = T0, **kwargs: object) -> None:
    for i, n in enumerate(sizes):
        result = produce(log, n, tag=f"b{i}", now_ms=now_ms, **kwargs)  # type: ignore[arg-type]
        assert result.last_offset - result.base_offset == n - 1


# --- append / read -----------------------------------------------------------------------------


def test_append_assigns_contiguous_offsets_and_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    a = produce(log, 3, epoch=4)
    b = produce(log, 2, epoch=4)
    assert (a.base_offset, a.last_offset, b.base_offset, b.last_offset) == (0, 2, 3, 4)
    assert a.log_append_time == -1 and not a.duplicate
    assert log.log_end_offset == 5 and log.high_watermark == 5
    batches = batches_of(log.read(0, 1 << 20).records)
    assert [decode_batch(b).partition_leader_epoch for b in batches] == [4, 4]
    assert all(crc_ok(b) for b in batches)
    assert log.epochs.latest_epoch == 4


def test_append_and_read_across_many_segments(tmp_path: Path) -> None:
    rng = random.Random(7)
    sizes = [rng.randint(1, 12) for _ in range(80)]
    log = open_log(tmp_path, segment_bytes=600, index_interval_bytes=100)
    _fill(log, sizes)
    assert len(log.segments) > 10
    assert len(log_files(tmp_path, ".log")) == len(log.segments)
    expected = _expected_values(sizes)
    assert log.log_end_offset == len(expected)
    assert [(r.offset, r.value) for r in read_records(log)] == expected
    # every single offset is readable on its own and the first batch returned holds it
    for offset, value in expected:
        data = log.read(offset, 1).records
        (batch,) = batches_of(data)
        decoded = decode_batch(batch)
        assert decoded.base_offset <= offset <= decoded.last_offset
        assert {r.offset: r.value for r in decoded.records}[offset] == value
    # segment files are named by base offset, which is the first offset they hold
    for segment in log.segments:
        first = decode_batch(batches_of(segment.read(segment.base_offset, 1, 2**62, True))[0])
        assert first.base_offset == segment.base_offset
        assert os.path.basename(segment.log_path) == f"{segment.base_offset:020d}.log"


@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=25), data=st.data())
def test_read_honours_max_bytes_with_whole_batches(tmp_path_factory: pytest.TempPathFactory, sizes, data) -> None:
    log = open_log(tmp_path_factory.mktemp("log"), segment_bytes=700)
    _fill(log, sizes)
    all_batches = [b for seg in log.segments for b in batches_of(seg.read(seg.base_offset, 1 << 30, 2**62, True))]
    offset = data.draw(st.integers(0, log.log_end_offset - 1), label="offset")
    max_bytes = data.draw(st.integers(0, 2000), label="max_bytes")
    start = next(i for i, b in enumerate(all_batches) if decode_batch(b).last_offset >= offset)
    segment_of = {}
    for seg in log.segments:
        for b in batches_of(seg.read(seg.base_offset, 1 << 30, 2**62, True)):
            segment_of[decode_batch(b).base_offset] = seg.base_offset

    got = batches_of(log.read(offset, max_bytes, min_one=True).records)
    assert got, "min_one returns at least one batch"
    assert got[0] == all_batches[start]
    assert got == all_batches[start : start + len(got)]
    if len(got) > 1:
        assert sum(map(len, got)) <= max_bytes
    # all batches come from the segment holding the first one (reads never span segments)
    assert {segment_of[decode_batch(b).base_offset] for b in got} == {segment_of[decode_batch(got[0]).base_offset]}

    strict = batches_of(log.read(offset, max_bytes, min_one=False).records)
    assert sum(map(len, strict)) <= max_bytes
    assert strict == all_batches[start : start + len(strict)]
    if len(all_batches[start]) > max_bytes:
        assert strict == []


def test_read_without_min_one_never_skips_to_the_next_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)  # one batch per segment: produce(..., roll=True)
    _fill(log, [5, 1, 1], roll=True)
    assert [s.base_offset for s in log.segments] == [0, 5, 6]
    big = len(log.read(0, 1 << 20).records)
    small = len(log.read(5, 1 << 20).records)
    assert small < big
    # The batch holding offset 2 does not fit and min_one is off (a later partition of a Fetch):
    # nothing may be returned. Returning the batch of offset 5 would make the consumer skip 2-4.
    assert log.read(2, big - 1, min_one=False).records == b""
    assert log.read(0, small, min_one=False).records == b""
    assert [r.offset for r in decode_all(log.read(2, big - 1, min_one=True).records)] == [0, 1, 2, 3, 4]
    assert [r.offset for r in decode_all(log.read(5, small, min_one=False).records)] == [5]


def test_read_stops_at_max_offset_and_high_watermark(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=400)
    _fill(log, [3, 3, 3, 3, 3, 3])
    for limit in (3, 6, 9, 12, 15, 18):
        recs = decode_all(log.read(0, 1 << 20, max_offset=limit).records)
        assert recs and recs[-1].offset < limit
        assert [r.offset for r in read_records_until(log, limit)] == list(range(limit))
    assert log.read(6, 1 << 20, max_offset=6).records == b""
    log.high_watermark = 9
    assert max(r.offset for r in decode_all(log.read(0, 1 << 20).records)) < 9
    assert log.read(9, 1 << 20).records == b""
    assert log.read(12, 1 << 20).records == b""  # at or above the HW but below the LEO: empty, no error


def read_records_until(log: PartitionLog, limit: int) -> list:
    out = []
    offset = 0
    while offset < limit:
        recs = decode_all(log.read(offset, 1 << 20, max_offset=limit).records)
        assert recs and all(r.offset < limit for r in recs)
        out.extend(r for r in recs if r.offset >= offset)
        offset = recs[-1].offset + 1
    return out


def test_read_out_of_range(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.read(0, 100).records == b""
    produce(log, 3)
    assert log.read(3, 100).records == b""
    with pytest.raises(OffsetOutOfRange):
        log.read(4, 100)
    log.delete_records_before(2)
    with pytest.raises(OffsetOutOfRange):
        log.read(1, 100)
    assert [r.offset for r in decode_all(log.read(2, 100).records)] == [0, 1, 2]  # whole batch, as Kafka


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_batches_round_trip(tmp_path: Path, codec: int) -> None:
    log = open_log(tmp_path)
    produce(log, 10, compression=codec)
    produce(log, 5, compression=codec, tag="w")
    assert [(r.offset, r.value) for r in read_records(log)] == [(i, f"v-{i}".encode()) for i in range(10)] + [
        (10 + i, f"w-{i}".encode()) for i in range(5)
    ]


def test_multiple_batches_in_one_leader_append(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    batches = [memoryview(make_batch([b"a", b"b"])), memoryview(make_batch([b"c"]))]
    result = log.append_as_leader(batches, 0, T0)
    log.high_watermark = log.log_end_offset
    assert (result.base_offset, result.last_offset) == (0, 2)
    assert [(r.offset, r.value) for r in read_records(log)] == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_invalid_batches_append_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_message_bytes=200)
    good = make_batch([b"ok"])
    corrupt = bytearray(make_batch([b"x"]))
    corrupt[-1] ^= 1
    for bad, code in [(bytes(corrupt), "corrupt_message"), (make_batch([b"y" * 300]), "message_too_large")]:
        with pytest.raises(InvalidBatch) as exc:
            log.append_as_leader([memoryview(good), memoryview(bad)], 0, T0)
        assert exc.value.error == code
    assert log.log_end_offset == 0 and log.size_bytes == 0


def test_create_time_bounds(tmp_path: Path) -> None:
    log = open_log(tmp_path, message_timestamp_after_max_ms=1000, message_timestamp_before_max_ms=5000)
    produce(log, 1, now_ms=T0, start_ts=T0 + 1000)
    produce(log, 1, now_ms=T0, start_ts=T0 - 5000)
    for ts in (T0 + 1001, T0 - 5001):
        with pytest.raises(InvalidBatch) as exc:
            produce(log, 1, now_ms=T0, start_ts=ts)
        assert exc.value.error == "invalid_timestamp"
    assert log.log_end_offset == 2


def test_log_append_time_overwrites_timestamps(tmp_path: Path) -> None:
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    now = T0 + 123_456
    result = produce(log, 4, now_ms=now, start_ts=T0 - 10**6, compression=ZSTD)
    assert result.log_append_time == now
    (batch,) = batches_of(log.read(0, 1 << 20).records)
    assert crc_ok(batch)
    decoded = decode_batch(batch)
    assert decoded.attributes & 0x08 and decoded.max_timestamp == now
    assert [r.timestamp for r in decoded.records] == [now] * 4
    assert log.offset_for_timestamp(T0) == (0, now)
    assert log.offset_for_timestamp(now + 1) is None
    assert log.offset_of_max_timestamp() == (0, now)


# --- rolling -----------------------------------------------------------------------------------


def test_roll_by_size(tmp_path: Path) -> None:
    one = len(make_batch([Record(b"b0-0")]))
    log = open_log(tmp_path, segment_bytes=2 * one)
    for i in range(5):
        produce(log, 1, tag=f"b{i}")
    assert [s.base_offset for s in log.segments] == [0, 2, 4]
    assert all(s.size <= 2 * one for s in log.segments)
    assert log_files(tmp_path, ".log") == [f"{b:020d}.log" for b in (0, 2, 4)]
    # a batch bigger than segment.bytes is refused, as Kafka's UnifiedLog.append does
    # (RECORD_LIST_TOO_LARGE); it used to go in, alone in a segment larger than segment.bytes
    with pytest.raises(InvalidBatch) as refused:
        produce(log, 20, tag="big")
    assert refused.value.error == "record_list_too_large"
    assert log.log_end_offset == 5
    assert [s.base_offset for s in log.segments] == [0, 2, 4]


def test_roll_by_segment_ms(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_ms=1000)
    produce(log, 1, now_ms=T0)
    produce(log, 1, now_ms=T0 + 1000)
    assert len(log.segments) == 1
    produce(log, 1, now_ms=T0 + 1001)
    assert [s.base_offset for s in log.segments] == [0, 2]
    produce(log, 1, now_ms=T0 + 1500)
    produce(log, 1, now_ms=T0 + 2002)
    assert [s.base_offset for s in log.segments] == [0, 2, 4]


def test_explicit_roll_of_empty_segment_is_a_no_op(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.roll(T0) is log.active_segment
    produce(log, 2)
    new = log.roll(T0)
    assert new.base_offset == 2 and len(log.segments) == 2
    assert log.roll(T0) is new


def test_roll_by_index_size(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_index_bytes=16, index_interval_bytes=0)
    for i in range(5):
        produce(log, 1, tag=f"b{i}")
    assert [s.base_offset for s in log.segments] == [0, 2, 4]


# --- retention and DeleteRecords --------------------------------------------------------------------


def test_retention_by_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, retention_ms=10_000, file_delete_delay_ms=0)  # one batch per segment: roll=True
    for i in range(5):
        produce(log, 2, tag=f"b{i}", now_ms=T0 + i * 5_000, roll=True)  # max timestamps T0+1 .. T0+20001
    assert len(log.segments) == 5
    now = T0 + 22_000
    deleted = log.apply_retention(now)
    # now - max_ts > 10000 holds for the first three segments (max_ts T0+1, +5001, +10001)
    assert deleted == 3
    assert log.log_start_offset == 6
    assert [s.base_offset for s in log.segments] == [6, 8]
    assert log_files(tmp_path, ".log") == [f"{b:020d}.log" for b in (6, 8)]
    assert not any(name.startswith(f"{0:020d}") for name in os.listdir(tmp_path))
    assert [r.value for r in read_records(log)] == [b"b3-0", b"b3-1", b"b4-0", b"b4-1"]
    with pytest.raises(OffsetOutOfRange):
        log.read(5, 100)
    # everything expires, the active segment included: the log keeps its end offset
    assert log.apply_retention(T0 + 10**7) == 2
    assert log.log_start_offset == log.log_end_offset == 10
    assert log.read(10, 100).records == b""
    produce(log, 1, now_ms=T0 + 10**7, roll=True)
    assert [r.offset for r in read_records(log)] == [10]


def test_retention_by_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(6):
        produce(log, 3, tag=f"b{i}", roll=True)
    seg_size = log.segments[0].size
    assert all(s.size == seg_size for s in log.segments)
    log.update_config(log.config.__class__(retention_bytes=2 * seg_size + seg_size // 2))
    assert log.apply_retention(T0) == 3
    assert log.size_bytes == 3 * seg_size
    assert log.log_start_offset == 9
    assert [r.value for r in read_records(log)][:1] == [b"b3-0"]
    assert log.apply_retention(T0) == 0  # nothing more to delete
    log.update_config(log.config.__class__(retention_bytes=0))
    assert log.apply_retention(T0) == 3
    assert log.log_start_offset == log.log_end_offset == 18


def test_retention_never_passes_the_high_watermark(tmp_path: Path) -> None:
    log = open_log(tmp_path, retention_ms=0)
    for i in range(4):
        produce(log, 2, tag=f"b{i}", roll=True)
    log.high_watermark = 5
    log.apply_retention(T0 + 10**6)
    assert log.log_start_offset == 4  # segments ending at 2 and 4 go; the one holding offset 5 stays


def test_delete_records_before(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(4):
        produce(log, 3, tag=f"b{i}", roll=True)
    assert log.delete_records_before(4) == 4
    assert [s.base_offset for s in log.segments] == [3, 6, 9]
    assert not os.path.exists(tmp_path / f"{0:020d}.log")
    with pytest.raises(OffsetOutOfRange):
        log.read(3, 100)
    assert [r.offset for r in read_records(log)] == list(range(4, 12))
    assert log.delete_records_before(2) == 4  # never moves backwards
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(13)
    log.close()
    log = open_log(tmp_path)
    assert log.log_start_offset == 4
    assert log.delete_records_before(12) == 12  # up to the end: every segment with data goes
    assert log.log_end_offset == 12
    assert all(s.size == 0 for s in log.segments)
    produce(log, 1, roll=True)
    assert [r.offset for r in read_records(log)] == [12]


# --- offsets by timestamp ------------------------------------------------------------------------


@given(
    batches=st.lists(
        st.lists(st.integers(0, 50), min_size=1, max_size=8),  # per-record timestamp offsets
        min_size=1,
        max_size=12,
    ),
    codec=st.sampled_from(CODECS),
    start=st.integers(0, 30),
    data=st.data(),
)
def test_offset_for_timestamp_finds_first_record_at_or_after(
    tmp_path_factory: pytest.TempPathFactory, batches, codec, start, data
) -> None:
    directory = tmp_path_factory.mktemp("log")
    log = open_log(directory, segment_bytes=300, index_interval_bytes=1)
    timeline: list[int] = []
    for i, ts_offsets in enumerate(batches):
        base_ts = T0 + 10 * i
        recs = [Record(f"{i}-{j}".encode() * 3, timestamp=base_ts + t) for j, t in enumerate(ts_offsets)]
        log.append_as_leader([memoryview(make_batch(recs, compression=codec))], 0, T0)
        log.high_watermark = log.log_end_offset
        timeline.extend(base_ts + t for t in ts_offsets)
    start = min(start, log.log_end_offset)
    log.delete_records_before(start)

    def expected(target: int) -> tuple[int, int] | None:
        for offset in range(log.log_start_offset, len(timeline)):
            if timeline[offset] >= target:
                return offset, timeline[offset]
        return None

    targets = [*data.draw(st.lists(st.integers(T0 - 5, T0 + 10 * len(batches) + 60), max_size=10)), T0 - 10**6]
    targets.append(max(timeline) + 1)
    for target in targets:
        assert log.offset_for_timestamp(target) == expected(target), target
    live = timeline[log.log_start_offset :]
    if live:
        top = max(live)
        first = log.log_start_offset + live.index(top)
        found = log.offset_of_max_timestamp()
        # the segment-level max can sit on a record below the log start offset (same batch)
        assert found == (first, top) or (found is None and max(timeline[: log.log_start_offset] or [0]) >= top)
    log.close()
    # the same answers after a clean reopen (indexes loaded from disk) and an unclean one (rebuilt)
    for clean in (True, False):
        log = open_log(directory, segment_bytes=300, index_interval_bytes=1)
        for target in targets:
            assert log.offset_for_timestamp(target) == expected(target), (clean, target)
        log.close(clean=clean)


def test_offset_for_timestamp_inside_compressed_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    produce(log, 3, start_ts=T0, ts_step=10)  # T0, T0+10, T0+20
    recs = [Record(b"a", timestamp=T0 + 100), Record(b"b", timestamp=T0 + 50), Record(b"c", timestamp=T0 + 70)]
    log.append_as_leader([memoryview(make_batch(recs, compression=LZ4))], 0, T0)
    log.high_watermark = log.log_end_offset
    assert log.offset_for_timestamp(T0 + 5) == (1, T0 + 10)
    assert log.offset_for_timestamp(T0 + 21) == (3, T0 + 100)
    assert log.offset_for_timestamp(T0 + 60) == (3, T0 + 100)
    assert log.offset_for_timestamp(T0 + 100) == (3, T0 + 100)
    assert log.offset_for_timestamp(T0 + 101) is None
    assert log.offset_of_max_timestamp() == (3, T0 + 100)
    log.high_watermark = 3
    assert log.offset_for_timestamp(T0 + 21) is None


def test_offset_of_max_timestamp_prefers_earliest_on_ties(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.offset_of_max_timestamp() is None
    produce(log, 3, start_ts=T0, ts_step=100, roll=True)  # max T0+200 at offset 2
    produce(log, 3, start_ts=T0 + 200, ts_step=0, roll=True)  # ties at offsets 3-5
    produce(log, 1, start_ts=T0 + 50, roll=True)
    assert len(log.segments) == 3
    assert log.offset_of_max_timestamp() == (2, T0 + 200)


# --- truncation ----------------------------------------------------------------------------------


def test_truncate_to_batch_boundaries(tmp_path: Path) -> None:
    log = open_log(tmp_path)  # one batch per segment: produce(..., roll=True)
    for i in range(5):
        produce(log, 2, tag=f"b{i}", epoch=i, roll=True)
    log.truncate_to(8, T0)
    assert log.log_end_offset == 8 and log.high_watermark == 8
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6]
    assert log.epochs.latest_epoch == 3
    log.truncate_to(6, T0)
    assert log.log_end_offset == 6 and log.high_watermark == 6
    assert [s.base_offset for s in log.segments] == [0, 2, 4]
    assert log.epochs.latest_epoch == 2
    assert [r.value for r in read_records(log)][-2:] == [b"b2-0", b"b2-1"]
    assert not os.path.exists(tmp_path / f"{6:020d}.log")
    log.truncate_to(2, T0)
    assert log.log_end_offset == 2 and [s.base_offset for s in log.segments] == [0]
    result = produce(log, 3, tag="new", epoch=9, roll=True)
    assert result.base_offset == 2
    assert [r.value for r in read_records(log)] == [b"b0-0", b"b0-1", b"new-0", b"new-1", b"new-2"]
    assert log.epochs.end_offset_for(0, log.log_end_offset) == (0, 2)
    log.truncate_to(0, T0)
    assert log.log_end_offset == 0 and log.size_bytes == 0
    log.truncate_to(10, T0)
    assert log.log_end_offset == 0


def test_truncate_to_inside_a_batch_removes_everything_at_or_after(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    produce(log, 3, tag="a")
    produce(log, 4, tag="b")  # offsets 3..6
    log.truncate_to(5, T0)
    assert log.log_end_offset <= 5
    assert all(r.offset < 5 for r in read_records(log))
    produce(log, 1, tag="c")
    recs = read_records(log)
    assert [r.offset for r in recs] == list(range(len(recs)))


def test_truncate_to_drops_producer_state_of_removed_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    produce(log, 2, producer_id=7, producer_epoch=0, base_sequence=0)
    produce(log, 2, producer_id=7, producer_epoch=0, base_sequence=2)
    log.truncate_to(2, T0)
    # the batch with sequence 2 is gone: a retry of it is appended again, not answered as a duplicate
    result = produce(log, 2, producer_id=7, producer_epoch=0, base_sequence=2)
    assert not result.duplicate and result.base_offset == 2


# --- follower appends ----------------------------------------------------------------------------------


def test_append_as_follower_keeps_leader_offsets(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader", segment_bytes=500)
    for i in range(10):
        produce(leader, 3, tag=f"b{i}", epoch=1 + i // 5)
    follower = open_log(tmp_path / "follower", segment_bytes=500)
    offset = 0
    while offset < leader.log_end_offset:
        data = leader.read(offset, 700).records
        assert data
        offset = follower.append_as_follower(data, T0)
    follower.high_watermark = follower.log_end_offset
    assert follower.log_end_offset == leader.log_end_offset == 30
    assert read_records(follower) == read_records(leader)
    assert follower.epochs.end_offset_for(1, 30) == (1, 15)
    # re-sending already appended batches is ignored
    assert follower.append_as_follower(leader.read(0, 1 << 20).records, T0) == 30
    assert follower.size_bytes == leader.size_bytes


def test_a_follower_restarted_inside_a_batch_keeps_that_batch(tmp_path: Path) -> None:
    # DeleteRecords cuts the leader's log start anywhere, so a follower that restarts its log at
    # the leader's start (11) is sent the whole batch holding it (10-14). Dropping that batch as
    # "already appended" left offsets 11-14 out of the follower's log: a consumer reading there
    # got 15 onwards (Kafka restarts the empty log at the batch's base, UnexpectedAppendOffset).
    leader = open_log(tmp_path / "leader")
    for i in range(4):
        produce(leader, 5, tag=f"b{i}")
    leader.delete_records_before(11)
    follower = open_log(tmp_path / "follower")
    follower.truncate_fully_and_start_at(leader.log_start_offset, T0)
    assert follower.append_as_follower(leader.read(11, 1 << 20).records, T0) == 20
    follower.high_watermark = follower.log_end_offset
    assert follower.log_start_offset == 11
    assert [r.offset for r in read_records(follower)] == list(range(11, 20))
    assert read_records(follower) == read_records(leader)


def test_old_create_times_do_not_roll_every_batch(tmp_path: Path) -> None:
    # Records replayed with day-old CreateTime timestamps: segment.ms is measured between record
    # timestamps (Kafka's LogSegment.timeWaitedForRoll), not from the wall clock to the first one.
    hour = 3_600_000
    log = open_log(tmp_path, segment_ms=hour)
    day_ago = T0 - 24 * hour
    for i in range(5):
        produce(log, 2, tag=f"b{i}", now_ms=T0 + i, start_ts=day_ago + i * 1000)
    assert len(log.segments) == 1
    produce(log, 1, tag="later", now_ms=T0 + 10, start_ts=day_ago + 1 + hour)  # first batch max ts + 1h: no roll
    assert len(log.segments) == 1
    produce(log, 1, tag="later", now_ms=T0 + 10, start_ts=day_ago + 2 + hour)
    assert [s.base_offset for s in log.segments] == [0, 11]


def test_roll_by_segment_ms_without_timestamps_uses_the_wall_clock(tmp_path: Path) -> None:
    log = open_log(tmp_path, now_ms=T0, segment_ms=1000)
    produce(log, 1, now_ms=T0 + 10, start_ts=-1, ts_step=0)
    produce(log, 1, now_ms=T0 + 1000, start_ts=-1, ts_step=0)
    assert len(log.segments) == 1
    produce(log, 1, now_ms=T0 + 1001, start_ts=-1, ts_step=0)
    assert [s.base_offset for s in log.segments] == [0, 2]


@pytest.mark.parametrize("start", [0, 3_000_000_000])
def test_batches_without_timestamps(tmp_path: Path, start: int) -> None:
    # NO_TIMESTAMP (-1) batches must not produce time index entries (Kafka indexes only timestamps
    # above the last entry, starting from -1); an entry (-1, offset -1) overflowed the relative
    # offset of a segment based above 2**31 and failed the append after the bytes were written.
    log = open_log(tmp_path)
    if start:
        log.truncate_fully_and_start_at(start, T0)
    produce(log, 2, tag="none", start_ts=-1, ts_step=0)
    produce(log, 2, tag="some", start_ts=T0 + 5)
    assert log.log_end_offset == start + 4
    assert [r.offset for r in read_records(log)] == [start + i for i in range(4)]
    assert log.offset_for_timestamp(0) == (start + 2, T0 + 5)
    assert log.offset_of_max_timestamp() == (start + 3, T0 + 6)
    for clean in (True, False):
        log.close(clean=clean)
        log = open_log(tmp_path)
        assert [r.value for r in read_records(log)] == [b"none-0", b"none-1", b"some-0", b"some-1"]
        assert log.offset_for_timestamp(0) == (start + 2, T0 + 5)
        assert log.offset_of_max_timestamp() == (start + 3, T0 + 6)


def test_truncate_to_inside_the_batch_holding_the_log_start(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    produce(log, 2, tag="a")
    produce(log, 5, tag="b")  # offsets 2..6
    log.delete_records_before(4)
    log.truncate_to(5, T0)
    # the batch 2..6 is cut whole; the log never ends below its start
    assert log.log_start_offset == log.log_end_offset == log.high_watermark == 4
    assert log.read(4, 100).records == b""
    assert produce(log, 1, tag="c").base_offset == 4
    assert [(r.offset, r.value) for r in read_records(log)] == [(4, b"c-0")]

"""Tiered segment objects: Kafka segment layout, per-batch offset index, deterministic keys, digest."""

from __future__ import annotations

import pytest
from batches import Record, make_batch
from hypothesis import given
from hypothesis import strategies as st

from diskless.protocol import records
from diskless.storage.segment_object import (
    CorruptSegment,
    SegmentIndex,
    SegmentInfo,
    SegmentWriter,
    check_segment,
    digest_update,
    iter_batches,
    parse_segment_key,
    segment_keys,
)

T0 = 1_700_000_000_000


def placed(base: int, count: int, epoch: int = 3, size: int = 10) -> bytes:
    recs = [Record(b"v" * size, timestamp=T0 + base + i) for i in range(count)]
    batch = bytearray(make_batch(recs, base_timestamp=T0))
    records.assign_offset(batch, base, epoch)
    return bytes(batch)


def test_keys_are_deterministic_and_parse_back() -> None:
    log_key, index_key = segment_keys("abc-id", 7, 100, 199)
    assert log_key == "segments/abc-id/7/00000000000000000100-00000000000000000199.log"
    assert index_key.endswith(".index")
    assert parse_segment_key(log_key) == ("abc-id", 7, 100, 199)
    assert parse_segment_key(index_key) == ("abc-id", 7, 100, 199)
    assert parse_segment_key("wal/2026/01/01/00/1-a-1-x.wal") is None
    assert parse_segment_key("segments/x/y/1-2.log") is None
    assert parse_segment_key("segments/x/1/1-2-a-b.log") is None


def test_each_job_run_writes_keys_of_its_own() -> None:
    """A rerun of a range must not put a key the WAL manager may be deleting as the failed first
    run's leftover: the tier it commits would point at a deleted object."""
    batch = placed(0, 2)
    first = SegmentWriter("tid", 3)
    first.add(batch)
    again = SegmentWriter("tid", 3)
    again.add(batch)
    *_, failed_run = first.finish(created_ms=1, run="a1")
    *_, rerun = again.finish(created_ms=2, run="b2")
    assert {failed_run.log_key, failed_run.index_key}.isdisjoint({rerun.log_key, rerun.index_key})
    assert rerun.log_key.endswith("-b2.log") and parse_segment_key(rerun.log_key) == ("tid", 3, 0, 1)
    assert failed_run == rerun  # the same tier: a commit of the rerun is recognised as a duplicate
    assert SegmentInfo.from_dict(rerun.to_dict()).log_key == rerun.log_key
    # A description from an older version (no run) keeps its keys.
    legacy = {k: v for k, v in rerun.to_dict().items() if k != "run"}
    assert SegmentInfo.from_dict(legacy).log_key == segment_keys("tid", 3, 0, 1)[0]


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3), st.integers(1, 300)), min_size=1, max_size=30))
def test_segment_round_trip_and_index_ranges(shape: list[tuple[int, int, int]]) -> None:
    writer = SegmentWriter("tid", 2)
    batches = []
    offset = 40
    for count, gap, size in shape:
        offset += gap  # offsets may jump (control batches elsewhere, compaction): never back
        batch = placed(offset, count, size=size)
        writer.add(batch)
        batches.append(batch)
        offset += count
    log_bytes, index_bytes, info = writer.finish()
    assert log_bytes == b"".join(batches)  # byte for byte as served
    assert [bytes(b) for b in iter_batches(log_bytes)] == batches
    assert info.base_offset == records.parse_header(batches[0]).base_offset
    assert info.last_offset == records.parse_header(batches[-1]).last_offset
    assert SegmentInfo.from_dict(info.to_dict()) == info
    check_segment(log_bytes, info)
    index = SegmentIndex(index_bytes, info.base_offset, info.size)
    for batch in batches:
        header = records.parse_header(batch)
        for target in (header.base_offset, header.last_offset):
            start, end = index.byte_range(target, 1)  # min_one: exactly the batch holding it
            assert log_bytes[start:end] == batch
        start, end = index.byte_range(header.base_offset, 1 << 30)
        assert log_bytes[start:end] == b"".join(batches[batches.index(batch) :])
    start, end = index.byte_range(info.base_offset, 1, min_one=False)
    assert start == end or end - start <= 1


def test_digest_is_what_a_leader_computes_from_headers() -> None:
    writer = SegmentWriter("tid", 0)
    digest = 0
    for base in (0, 3, 9):
        batch = placed(base, 3)
        writer.add(batch)
        digest = digest_update(digest, records.parse_header(batch))
    log_bytes, _, info = writer.finish()
    assert info.digest == digest
    other = bytearray(log_bytes)
    records.assign_offset(other, 1, 3)  # same bytes, another offset: another range
    with pytest.raises(CorruptSegment):
        check_segment(bytes(other), info)


def test_writer_refuses_going_back_and_bad_batches() -> None:
    writer = SegmentWriter("tid", 0)
    writer.add(placed(10, 2))
    with pytest.raises(CorruptSegment):
        writer.add(placed(11, 1))
    with pytest.raises(CorruptSegment):
        writer.add(placed(20, 1)[:-1])
    with pytest.raises(ValueError):
        SegmentWriter("tid", 0).finish()
    with pytest.raises(CorruptSegment):
        SegmentIndex(b"\x00" * 7, 0, 10)

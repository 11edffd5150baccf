"""``LogSegment.locate`` (the scan every fetch starts with, or the entries it remembers appending)
answers exactly what a walk over every entry answers, for records and pointers segments, any index
interval, offsets inside, between, before and past the entries (``diskless/log/segment.py``)."""

from __future__ import annotations

import tempfile

from batches import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from diskless.log.segment import POINTERS, RECORDS, BatchLocation, LogSegment
from diskless.storage import pointer

KEY = "wal/2026/11/22/17/1763830000000-az-1-1-0123456789abcdef0123456789abcdef.wal"


def _reference(segment: LogSegment, offset: int) -> BatchLocation | None:
    return next((b for b in segment.iter_batches() if b.last_offset >= offset), None)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from([RECORDS, POINTERS]),
    counts=st.lists(st.integers(1, 5), min_size=0, max_size=150),
    value_size=st.integers(1, 3000),
    interval=st.sampled_from([1, 200, 4096]),
    gap=st.integers(0, 3),
    base=st.integers(0, 1000),
)
def test_locate_agrees_with_a_walk_over_every_entry(
    kind: str, counts: list[int], value_size: int, interval: int, gap: int, base: int
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        segment = LogSegment(directory, base, interval, 0, kind=kind)
        offset = base
        for n in counts:
            batch = make_batch([b"v" * value_size] * n, base_offset=offset)
            entry = batch if kind == RECORDS else pointer.encode_pointer_entry(batch[:61], KEY, offset, len(batch))
            segment.append(entry, offset, offset + n - 1, 1_700_000_000_000)
            offset += n + gap  # gaps: offsets no entry holds (compaction, aborted ranges)
        # The same files opened afresh: nothing remembered from appending, every answer from the scan.
        reopened = LogSegment(directory, base, interval, 0, kind=kind)
        reopened.load(verify=False)
        try:
            for query in range(max(0, base - 2), offset + 3):
                expected = _reference(segment, query)
                assert segment.locate(query) == expected, query
                assert reopened.locate(query) == expected, query
        finally:
            segment.close()
            reopened.close()


def test_a_truncated_segment_forgets_the_entries_it_dropped() -> None:
    with tempfile.TemporaryDirectory() as directory:
        segment = LogSegment(directory, 0, 4096, 0, kind=RECORDS)
        try:
            for offset in range(0, 30, 3):
                segment.append(make_batch([b"a", b"b", b"c"], base_offset=offset), offset, offset + 2, 0)
            assert segment.truncate_to(12) > 0
            assert segment.locate(12) is None and segment.next_offset == 12
            segment.append(make_batch([b"new"] * 5, base_offset=12), 12, 16, 0)
            found = segment.locate(14)
            assert found is not None and (found.base_offset, found.last_offset) == (12, 16)
            assert found == _reference(segment, 14)
        finally:
            segment.close()

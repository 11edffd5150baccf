"""``LogSegment.locate`` (the scan every fetch starts with) answers exactly what a walk over every
entry answers, for records and pointers segments, any index interval, offsets inside, between,
before and past the entries (``diskless/log/segment.py``)."""

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
    counts=st.lists(st.integers(1, 5), min_size=0, max_size=40),
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
        try:
            for query in range(max(0, base - 2), offset + 3):
                assert segment.locate(query) == _reference(segment, query), query
        finally:
            segment.close()

"""The pointer log (diskless segments of a PartitionLog): WAL references and size accounting.

``references()`` is what a leader answers the WAL manager with, so it must drop a key exactly when
the last pointer into it at or after the log start goes (segment roll, truncation, retention,
DeleteRecords, reopening) and never before. Reads of pointer segments are bounded by the bytes of
the batches the entries point to (what the fetch will return), not by the entries' own size, and
``retention.bytes`` counts those batch bytes too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from batches import Record, make_batch
from hypothesis import given
from hypothesis import strategies as st
from loghelpers import T0, open_log

from diskless.log.config import LogConfig
from diskless.log.partition_log import AppendResult, PartitionLog
from diskless.log.segment import POINTERS
from diskless.protocol import records
from diskless.storage import pointer


def batch_of(value_bytes: int, count: int = 1, ts: int = T0) -> bytes:
    """A real v2 batch of ``count`` records, each with a ``value_bytes``-byte value."""
    return make_batch([Record(b"x" * value_bytes, timestamp=ts + i) for i in range(count)], base_timestamp=ts)


def commit(
    log: PartitionLog, key: str, value_bytes: int = 10, count: int = 1, now_ms: int = T0, hw: bool = True
) -> AppendResult:
    """Append a pointer to a batch at offset 0 of ``key`` as the leader (the batch itself stays in S3)."""
    batch = batch_of(value_bytes, count, now_ms)
    result = log.append_pointer_as_leader(batch[: records.HEADER_SIZE], key, 0, 0, now_ms)
    if hw:
        log.high_watermark = log.log_end_offset
    return result


def pointed_sizes(data: bytes) -> list[int]:
    """Sizes of the batches the entries of a pointer read point to (inline batches: their own size)."""
    sizes = []
    pos = 0
    while pos < len(data):
        entry, pos = pointer.decode_entry(data, pos)
        sizes.append(entry.size if isinstance(entry, pointer.PointerEntry) else len(entry.batch))
    return sizes


def refs(log: PartitionLog, keys: list[str]) -> set[str]:
    return {k for k in keys if log.references(k)}


# --- references() ----------------------------------------------------------------------------------


def test_references_across_segment_roll_and_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)  # about two pointer entries per segment
    keys = [f"wal/k{i}" for i in range(6)]
    for key in keys + keys[:2]:  # k0 and k1 are pointed to from two segments
        commit(log, key)
    assert len(log.segments) >= 3 and all(s.kind == POINTERS for s in log.segments)
    assert refs(log, [*keys, "wal/other"]) == set(keys)
    log.roll(T0)
    commit(log, "wal/k6")
    assert refs(log, [*keys, "wal/k6"]) == {*keys, "wal/k6"}
    log.close()
    log = open_log(tmp_path, segment_bytes=300, commit=False)
    assert refs(log, [*keys, "wal/k6"]) == {*keys, "wal/k6"}


def test_references_after_truncation(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    for key in ["wal/a", "wal/b", "wal/c", "wal/d", "wal/b", "wal/e"]:
        commit(log, key, hw=False)  # an uncommitted tail: a follower diverged from its new leader
    assert refs(log, ["wal/a", "wal/b", "wal/c", "wal/d", "wal/e"]) == {"wal/a", "wal/b", "wal/c", "wal/d", "wal/e"}
    log.truncate_to(3, T0)  # keeps a, b, c
    assert refs(log, ["wal/a", "wal/b", "wal/c", "wal/d", "wal/e"]) == {"wal/a", "wal/b", "wal/c"}
    commit(log, "wal/f")
    log.truncate_to(1, T0)  # inside the first segment
    assert refs(log, ["wal/a", "wal/b", "wal/c", "wal/f"]) == {"wal/a"}
    log.close()
    log = open_log(tmp_path, segment_bytes=300, commit=False)
    assert refs(log, ["wal/a", "wal/b", "wal/c", "wal/f"]) == {"wal/a"}


def test_references_after_retention(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1, retention_ms=1000)  # one entry per segment
    commit(log, "wal/old", now_ms=T0)
    commit(log, "wal/both", now_ms=T0)
    commit(log, "wal/new", now_ms=T0 + 5000)
    commit(log, "wal/both", now_ms=T0 + 5000)
    commit(log, "wal/last", now_ms=T0 + 5000)
    assert log.apply_retention(T0 + 5500) == 2
    assert log.log_start_offset == 2
    assert refs(log, ["wal/old", "wal/both", "wal/new", "wal/last"]) == {"wal/both", "wal/new", "wal/last"}
    assert log.apply_retention(T0 + 10_000) == 3  # the active segment too: rolled first
    assert refs(log, ["wal/old", "wal/both", "wal/new", "wal/last"]) == set()
    log.close()
    log = open_log(tmp_path, segment_bytes=1, commit=False)
    assert refs(log, ["wal/old", "wal/both", "wal/new", "wal/last"]) == set()


def test_references_after_delete_records_inside_a_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)  # everything in one segment
    commit(log, "wal/a", count=2)  # offsets 0-1
    commit(log, "wal/b", count=3)  # offsets 2-4
    commit(log, "wal/c", count=1)  # offset 5
    commit(log, "wal/a", count=1)  # offset 6
    log.delete_records_before(3)  # inside b's batch: b still serves offsets 3 and 4
    assert refs(log, ["wal/a", "wal/b", "wal/c"]) == {"wal/a", "wal/b", "wal/c"}
    log.delete_records_before(5)
    assert refs(log, ["wal/a", "wal/b", "wal/c"]) == {"wal/a", "wal/c"}
    log.delete_records_before(6)
    assert refs(log, ["wal/a", "wal/b", "wal/c"]) == {"wal/a"}
    log.close()
    log = open_log(tmp_path, commit=False)  # the floor survives a restart (log-start-offset file)
    assert refs(log, ["wal/a", "wal/b", "wal/c"]) == {"wal/a"}
    log.delete_records_before(7)
    assert refs(log, ["wal/a"]) == set()


def test_references_across_a_switch_to_records_and_back(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    commit(log, "wal/a")
    log.append_as_leader([memoryview(batch_of(5))], 0, T0)  # diskless switched off: a records segment
    commit(log, "wal/b")  # and on again
    log.high_watermark = log.log_end_offset
    assert [s.kind for s in log.segments] == [POINTERS, "records", POINTERS]
    assert refs(log, ["wal/a", "wal/b"]) == {"wal/a", "wal/b"}
    log.delete_records_before(2)
    assert refs(log, ["wal/a", "wal/b"]) == {"wal/b"}


# --- reads bounded by the data pointed to ----------------------------------------------------------


@given(
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=30),
    max_bytes=st.integers(0, 20_000),
    start=st.integers(0, 29),
    segment_bytes=st.sampled_from([1, 500, 1 << 20]),
)
def test_pointer_reads_are_capped_by_the_batches_they_point_to(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], max_bytes: int, start: int, segment_bytes: int
) -> None:
    log = open_log(tmp_path_factory.mktemp("plog"), segment_bytes=segment_bytes)
    batch_sizes = [commit(log, f"wal/k{i}", value_bytes=n) and len(batch_of(n)) for i, n in enumerate(sizes)]
    offset = start % len(sizes)
    data = log.read(offset, max_bytes, min_one=True).records
    got = pointed_sizes(data)
    assert got, "a read below the high watermark with min_one returns at least one batch"
    assert got == batch_sizes[offset : offset + len(got)]
    assert sum(got) <= max_bytes or len(got) == 1  # only the first batch may exceed the limit (KIP-74)
    following = offset + len(got)
    same_segment = any(s.base_offset <= offset and following < s.next_offset for s in log.segments)
    if following < len(sizes) and same_segment:
        assert sum(got) + batch_sizes[following] > max_bytes  # it stopped because of the limit
    without = pointed_sizes(log.read(offset, max_bytes, min_one=False).records)
    assert sum(without) <= max_bytes and without == got[: len(without)]


def test_pointer_read_counts_inline_markers_by_their_own_size(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    commit(log, "wal/a", value_bytes=100)
    log.append_marker_as_leader(7, 0, True, 0, 0, T0)  # a transaction marker, stored inline
    commit(log, "wal/b", value_bytes=100)
    log.high_watermark = log.log_end_offset
    first = len(batch_of(100))
    data = log.read(0, first + 200, min_one=True).records
    sizes = pointed_sizes(data)
    assert sizes[0] == first and len(sizes) == 2  # the marker fits (~80 bytes), the next batch does not


# --- retention.bytes ----------------------------------------------------------------------------


def test_retention_bytes_counts_the_batches_pointed_to(tmp_path: Path) -> None:
    """Each 10 kB batch is a ~130-byte pointer entry: the limit is about the data, not the entries."""
    log = open_log(tmp_path, segment_bytes=1)  # one entry per segment
    for i in range(6):
        commit(log, f"wal/k{i}", value_bytes=10_000)
    batch = len(batch_of(10_000))
    log.update_config(LogConfig(segment_bytes=1, retention_bytes=2 * batch + batch // 2))
    assert log.apply_retention(T0) == 3  # keeps three batches, as a classic log of the same data would
    assert log.data_bytes == 3 * batch and log.size_bytes < batch  # the entries themselves are small
    assert log.log_start_offset == 3
    assert refs(log, [f"wal/k{i}" for i in range(6)]) == {"wal/k3", "wal/k4", "wal/k5"}
    log.close()
    log = open_log(tmp_path, segment_bytes=1, retention_bytes=2 * batch + batch // 2)
    assert log.data_bytes == 3 * batch  # recomputed from the entries on reopening
    assert log.apply_retention(T0) == 0

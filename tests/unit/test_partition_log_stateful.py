"""PartitionLog against an in-memory model, driven by random sequences of operations."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile

import pytest
from batches import CODECS, Record, decode_all, decode_batch, make_batch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from loghelpers import T0, batches_of, open_log

from diskless.log.partition_log import PartitionLog
from diskless.protocol.records import InvalidBatch

CONFIG = {"segment_bytes": 400, "index_interval_bytes": 64}


class PartitionLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="plog-")
        self.log: PartitionLog = open_log(self.directory, **CONFIG)
        self.model: dict[int, bytes] = {}
        self.batch_bases: list[int] = []  # base offsets of batches still (partly) in the model
        self.log_start = 0
        self.leo = 0
        self.now = T0
        self.batch_id = 0

    @initialize()
    def start_empty(self) -> None:
        assert self.log.log_end_offset == 0 and self.log.log_start_offset == 0

    def teardown(self) -> None:
        try:
            self.log.close(clean=False)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _reopen(self) -> None:
        self.log = open_log(self.directory, commit=False, **CONFIG)
        assert self.log.high_watermark <= self.log.log_end_offset
        self.log.high_watermark = self.log.log_end_offset  # the sole leader commits its whole log

    # --- rules ---------------------------------------------------------------------------------

    @rule(
        sizes=st.lists(st.integers(0, 120), min_size=1, max_size=6),
        codec=st.sampled_from(CODECS),
        dt=st.integers(0, 50),
    )
    def append(self, sizes: list[int], codec: int, dt: int) -> None:
        self.now += dt
        self.batch_id += 1
        values = [f"{self.batch_id}-{j}:".encode() + bytes([j % 256]) * pad for j, pad in enumerate(sizes)]
        batch = make_batch(
            [Record(v, timestamp=self.now + j) for j, v in enumerate(values)], compression=codec, base_offset=0
        )
        if len(batch) > CONFIG["segment_bytes"]:
            # Larger than a segment: refused (RECORD_LIST_TOO_LARGE, Kafka's UnifiedLog.append).
            with pytest.raises(InvalidBatch) as refused:
                self.log.append_as_leader([memoryview(batch)], 0, self.now)
            assert refused.value.error == "record_list_too_large"
            assert self.log.log_end_offset == self.leo
            return
        result = self.log.append_as_leader([memoryview(batch)], 0, self.now)
        self.log.high_watermark = self.log.log_end_offset
        assert result.base_offset == self.leo
        assert result.last_offset == self.leo + len(values) - 1
        self.batch_bases.append(self.leo)
        for j, v in enumerate(values):
            self.model[self.leo + j] = v
        self.leo += len(values)

    @precondition(lambda self: self.leo > self.log_start)
    @rule(data=st.data(), max_bytes=st.integers(0, 1500), min_one=st.booleans())
    def read(self, data: st.DataObject, max_bytes: int, min_one: bool) -> None:
        offset = data.draw(st.integers(self.log_start, self.leo - 1), label="offset")
        raw = self.log.read(offset, max_bytes, min_one=min_one).records
        parts = batches_of(raw)
        if min_one:
            assert parts, "min_one must return the batch holding the offset"
        if len(parts) > 1 or not min_one:
            assert len(raw) <= max_bytes
        if parts:
            first = decode_batch(parts[0])
            assert first.base_offset <= offset <= first.last_offset
        recs = decode_all(raw)
        offsets = [r.offset for r in recs]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True
        for rec in recs:
            if rec.offset >= self.log_start:
                assert rec.value == self.model[rec.offset]

    @rule()
    def roll(self) -> None:
        before = len(self.log.segments)
        self.log.roll(self.now)
        assert len(self.log.segments) in (before, before + 1)
        assert self.log.active_segment.base_offset == self.leo or self.log.active_segment.size > 0

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        self.log.close(clean=clean)
        self._reopen()
        assert self.log.recovered_bytes_truncated == 0
        assert self.log.log_end_offset == self.leo
        assert self.log.log_start_offset == self.log_start

    @rule(fraction=st.floats(0, 1.2))
    def retention_by_bytes(self, fraction: float) -> None:
        limit = int(self.log.size_bytes * fraction)
        self.log.update_config(dataclasses.replace(self.log.config, retention_bytes=limit))
        sizes = [s.size for s in self.log.segments]
        # segments wholly below the log start (DeleteRecords) may go regardless of their size
        below_start = sum(1 for s in self.log.segments if s.next_offset <= self.log_start)
        deleted = self.log.apply_retention(self.now)
        self.log.update_config(dataclasses.replace(self.log.config, retention_bytes=-1))
        new_start = self.log.log_start_offset
        assert new_start >= self.log_start
        if deleted:
            assert new_start == self.log.segments[0].base_offset
            # Kafka's rule: delete oldest segments only while what remains is still >= retention.bytes
            assert deleted <= below_start or sum(sizes) - sum(sizes[:deleted]) >= limit
        # ... and as long as that holds
        first = self.log.segments[0]
        assert first.size == 0 or self.log.size_bytes - first.size < limit
        self._advance_start(new_start)

    @rule(retention_ms=st.integers(0, 400), wait=st.integers(0, 200))
    def retention_by_time(self, retention_ms: int, wait: int) -> None:
        self.now += wait
        before = [(s.next_offset, s.max_timestamp, s.size) for s in self.log.segments]
        self.log.update_config(dataclasses.replace(self.log.config, retention_ms=retention_ms))
        self.log.apply_retention(self.now)
        self.log.update_config(dataclasses.replace(self.log.config, retention_ms=604800000))
        new_start = self.log.log_start_offset
        for next_offset, max_ts, size in before:
            if next_offset <= new_start and next_offset > self.log_start and size:
                assert self.now - max_ts > retention_ms, "deleted a segment within retention.ms"
        # the oldest remaining segment with data is still within retention (or everything went)
        first = self.log.segments[0]
        assert first.size == 0 or first.next_offset <= self.log_start or self.now - first.max_timestamp <= retention_ms
        self._advance_start(new_start)

    @precondition(lambda self: self.leo > self.log_start)
    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.log_start, self.leo), label="target")
        assert self.log.delete_records_before(target) == target
        self._advance_start(target)

    @rule(data=st.data())
    def truncate_at_batch_boundary(self, data: st.DataObject) -> None:
        candidates = [b for b in self.batch_bases if b >= self.log_start] + [self.leo]
        target = data.draw(st.sampled_from(candidates), label="target")
        self.log.truncate_to(target, self.now)
        for offset in range(target, self.leo):
            del self.model[offset]
        self.batch_bases = [b for b in self.batch_bases if b < target]
        self.leo = target
        assert self.log.log_end_offset == target

    @precondition(lambda self: self.leo > self.log_start)
    @rule(data=st.data())
    def truncate_anywhere(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.log_start, self.leo - 1), label="target")
        holder = max(b for b in self.batch_bases if b <= target)
        cut = holder  # the batch holding the target goes whole, as Kafka's LogSegment.truncateTo
        if cut < self.log_start:
            cut = self.log_start  # ... but the log never ends below its start: it restarts empty there
            self.batch_bases = []
        self.log.truncate_to(target, self.now)
        for offset in range(cut, self.leo):
            self.model.pop(offset, None)
        self.batch_bases = [b for b in self.batch_bases if b < cut]
        self.leo = cut
        assert self.log.log_end_offset == cut

    def _advance_start(self, new_start: int) -> None:
        assert new_start >= self.log_start
        for offset in range(self.log_start, new_start):
            self.model.pop(offset, None)
        self.log_start = new_start

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def offsets_match_model(self) -> None:
        log = self.log
        assert log.log_start_offset == self.log_start
        assert log.log_end_offset == self.leo
        assert log.high_watermark == self.leo
        assert set(self.model) == set(range(self.log_start, self.leo))
        # every offset in [log start, log end) is readable, contiguous, and holds the model's bytes
        offset = self.log_start
        while offset < self.leo:
            recs = decode_all(log.read(offset, 1 << 20).records)
            assert recs, f"nothing read at {offset}"
            assert recs[0].offset <= offset
            previous = None
            for rec in recs:
                assert previous is None or rec.offset == previous + 1
                previous = rec.offset
                if rec.offset >= offset:
                    assert rec.value == self.model[rec.offset], rec.offset
            offset = recs[-1].offset + 1
        assert log.read(self.leo, 100).records == b""

    @invariant()
    def segments_are_ordered(self) -> None:
        bases = [s.base_offset for s in self.log.segments]
        assert bases == sorted(set(bases))
        for seg, nxt in zip(self.log.segments, self.log.segments[1:], strict=False):
            assert seg.next_offset == nxt.base_offset or seg.size == 0


PartitionLogMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestPartitionLogStateful = PartitionLogMachine.TestCase

"""The tier job's planning (no cluster): the --every policy, and cutting a range's pointer entries
into segments on batch boundaries, without trailing leader-written batches alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from batches import Record, make_batch
from kio.schema.errors import ErrorCode
from loghelpers import T0, open_log

from diskless.config import load_config
from diskless.log.partition_log import OffsetOutOfRange, PartitionLog
from diskless.log.segment import POINTERS
from diskless.protocol import internal, records
from diskless.spark.tier_job import Driver, Range, TierSettings, due
from diskless.storage import pointer


class LogDriver(Driver):
    """A driver whose leader is a local PartitionLog answering FetchPointers as tier_rpcs does."""

    def __init__(self, log: PartitionLog) -> None:
        super().__init__(TierSettings(bootstrap=(("127.0.0.1", 1),)))
        self.log = log

    async def _internal(self, broker: int, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
        assert api_key == internal.INTERNAL_FETCH_POINTERS and body["read_committed"]
        answer = {"log_start_offset": self.log.log_start_offset, "high_watermark": self.log.high_watermark}
        try:
            result = self.log.read(body["offset"], body["max_bytes"], max_offset=self.log.last_stable_offset)
        except OffsetOutOfRange:
            return {"error_code": int(ErrorCode.offset_out_of_range), **answer}
        return {"error_code": 0, "kind": result.kind, "data": result.records, **answer}


def filled_log(tmp_path: Path, batches: int, per_batch: int = 1) -> PartitionLog:
    log = open_log(tmp_path, diskless_enabled=True)
    for i in range(batches):
        batch = make_batch([Record(b"x" * 100, timestamp=T0 + i)] * per_batch, base_timestamp=T0 + i)
        log.append_pointer_as_leader(batch[: records.HEADER_SIZE], f"wal/{i}", 0, 0, T0)
    log.high_watermark = log.log_end_offset
    return log


def plan(log: PartitionLog, start: int, max_bytes: int) -> list[tuple[int, int, int]]:
    r = Range(0, "t", "tid", 0, 0, start, log.last_stable_offset, 0, -1)
    segments = asyncio.run(LogDriver(log).segments(r, max_bytes))
    return [(s.base, s.last, len(pointer.iter_entries(s.entries))) for s in segments]


def test_segments_cut_on_batch_boundaries(tmp_path: Path) -> None:
    log = filled_log(tmp_path, 10)
    size = records.parse_header(make_batch([Record(b"x" * 100)])).size
    assert plan(log, 0, 1 << 30) == [(0, 9, 10)]
    assert plan(log, 0, 3 * size) == [(0, 2, 3), (3, 5, 3), (6, 8, 3), (9, 9, 1)]
    assert plan(log, 4, 1 << 30) == [(4, 9, 6)]


def test_leader_batches_alone_are_not_a_segment(tmp_path: Path) -> None:
    log = filled_log(tmp_path, 3)
    log.append_marker_as_leader(77, 0, True, 0, 0, T0)  # an inline control batch at offset 3
    log.high_watermark = log.log_end_offset
    assert log.read(3, 100).kind == POINTERS
    assert plan(log, 0, 1 << 30) == [(0, 3, 4)]  # with data before it: part of the segment
    assert plan(log, 3, 1 << 30) == []  # alone: waits for the next range with data


def test_a_log_start_inside_a_batch_does_not_stop_tiering(tmp_path: Path) -> None:
    """DeleteRecords to an offset inside a batch of a partition with nothing tiered: the leader's
    next range starts at that batch (TierCommits must start on batch boundaries), below the log
    start, where FetchPointers answers OFFSET_OUT_OF_RANGE. The job planned nothing, at every
    run, so the partition's pointers and WAL objects were never tiered again."""
    log = filled_log(tmp_path, 4, per_batch=2)  # batches [0, 1], [2, 3], [4, 5], [6, 7]
    assert log.delete_records_before(3) == 3
    assert log.tier_end == 2
    assert plan(log, log.tier_end, 1 << 30) == [(2, 7, 3)]
    log.range_digest(2, 7)  # the leader takes a segment starting there


def test_every_policy() -> None:
    config = load_config(None, overrides={"diskless.tier.min.age.ms": "1000", "diskless.tier.min.bytes": "500"})
    young_small = Range(0, "t", "tid", 0, 0, 0, 10, 100, T0 - 10)
    assert not due(young_small, config, T0)
    assert due(Range(0, "t", "tid", 0, 0, 0, 10, 100, T0 - 5000), config, T0)  # old enough
    assert due(Range(0, "t", "tid", 0, 0, 0, 10, 600, T0 - 10), config, T0)  # big enough
    assert not due(Range(0, "t", "tid", 0, 0, 0, 10, 100, -1), config, T0)  # nothing untiered


def test_a_periodic_tier_job_outlives_a_failed_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """`diskless tier --every N`: an unexpected error in one pass (an executor's S3 failure
    surfaces as a Py4J error) is reported and the next pass runs; before, it ended the process and
    tiering stopped until someone restarted it."""
    import argparse

    from diskless.spark import session, tier_job

    passes: list[str] = []
    stopped: list[bool] = []

    def run_once(spark: object, settings: object, policy: bool) -> tier_job.TierReport:
        passes.append("pass")
        if len(passes) == 1:
            raise RuntimeError("An error occurred while calling o123.collect")
        if len(passes) == 3:
            raise KeyboardInterrupt  # the operator stops it
        return tier_job.TierReport()

    monkeypatch.setattr(tier_job, "settings_from_args", lambda *args: object())
    monkeypatch.setattr(tier_job, "run_once", run_once)
    monkeypatch.setattr(session, "build_session", lambda *args: SimpleNamespace(stop=lambda: stopped.append(True)))
    monkeypatch.setattr(tier_job.time, "sleep", lambda seconds: None)
    args = argparse.Namespace(override=[], bootstrap_servers="b:9092", config=None, dev_dir=None, master=None, every=60)

    with pytest.raises(KeyboardInterrupt):
        tier_job.main(args)
    assert passes == ["pass"] * 3
    assert stopped == [True]

"""Small helpers shared by the PartitionLog tests."""

from __future__ import annotations

import os
from typing import Any

from batches import DecodedRecord, decode_all, split, values_batch

from diskless.log.config import LogConfig
from diskless.log.partition_log import AppendResult, PartitionLog

T0 = 1_700_000_000_000


def open_log(
    directory: str | os.PathLike[str], now_ms: int = T0, *, commit: bool = True, **config: Any
) -> PartitionLog:
    """Open a log; with ``commit`` the high watermark is moved to the log end, as a sole leader does."""
    log = PartitionLog(str(directory), LogConfig(**config), now_ms)
    if commit:
        log.high_watermark = log.log_end_offset
    return log


def produce(
    log: PartitionLog,
    count: int,
    *,
    tag: str = "v",
    now_ms: int = T0,
    epoch: int = 0,
    commit: bool = True,
    roll: bool = False,
    **batch_kwargs: Any,
) -> AppendResult:
    """Append one batch of ``count`` records ``{tag}-{i}`` stamped ``now_ms + i`` unless told otherwise.

    With ``commit`` the high watermark follows the log end, as for a leader that is its own ISR.
    With ``roll`` the batch starts a segment of its own (the active one is rolled first unless it
    is empty): tests that want one batch per segment cannot set a tiny ``segment.bytes``, since
    the log refuses a batch larger than a segment, as Kafka does.
    """
    batch_kwargs.setdefault("start_ts", now_ms)
    batch = values_batch(count, tag=tag, **batch_kwargs)
    if roll:
        log.roll(now_ms)
    result = log.append_as_leader([memoryview(batch)], epoch, now_ms)
    if commit:
        log.high_watermark = log.log_end_offset
    return result


def read_records(log: PartitionLog, start: int | None = None, max_bytes: int = 1 << 30) -> list[DecodedRecord]:
    """Every record from ``start`` (default: log start) to the high watermark, following reads along."""
    offset = log.log_start_offset if start is None else start
    out: list[DecodedRecord] = []
    while offset < log.high_watermark:
        data = log.read(offset, max_bytes).records
        assert data, f"read at {offset} returned nothing below the high watermark {log.high_watermark}"
        recs = decode_all(data)
        out.extend(rec for rec in recs if rec.offset >= offset)
        offset = recs[-1].offset + 1
    return out


def batches_of(data: bytes) -> list[bytes]:
    parts = split(data)
    assert sum(len(p) for p in parts) == len(data), "read returned a partial batch"
    return parts


def log_files(directory: str | os.PathLike[str], suffix: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(suffix))

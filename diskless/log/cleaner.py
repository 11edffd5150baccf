"""Log compaction's IO side: one cleaning pass over one classic log, rewritten off the event loop and
installed on it.

The decisions are elsewhere: ``cleaning_plan.py`` says what may be cleaned and whether it is worth
it, ``compaction.py`` says what each batch becomes. This module moves bytes, in three steps:

1. ``prepare`` (event loop): the plan, plus a snapshot of what the pass needs from the live log:
   the cleanable segments with their paths and sizes, the aborted transactions, each active
   producer's last data batch, the time, and the log's ``layout_epoch``.
2. ``run`` (a worker thread): opens the snapshot's segment files through descriptors of its own,
   builds the key map over the dirty part, and writes each group of segments, cleaned, as one new
   segment (file and both indexes) into a scratch directory beside the log's, then fsyncs them.
   It touches no live object: the segments below the active one are never appended to, and a
   segment the log drops meanwhile keeps its open file (or, renamed, cannot be opened: the pass
   gives up).
3. ``install`` (event loop, no await inside): if the log still lists the very segments the pass
   read, unchanged, and its ``layout_epoch`` (bumped by truncation, close and delete) did not move,
   the new segments replace them; otherwise the output is thrown away and the next pass starts over.

Crash safety is Kafka's .cleaned/.swap protocol with a directory as the unit. The scratch
directory is only ever deleted on recovery. Renaming it into the log's directory as
``cleaned.swap`` is the commit point: it holds a manifest naming the bases of the segments it
replaces and of the ones it brings. Then the old segments are retired (renamed ``.deleted`` or
removed), the new files moved in, and the swap directory removed. A load that finds a swap
directory finishes that work (moving whatever is left, removing the replaced bases that are not
also new bases: the manifest, not the directory's remaining content, says which are new, so a
second interrupted recovery never removes a segment the first one moved in).

Readers are safe by construction: fetches read the segment objects they looked up, and retired
segments keep their descriptors for ``file.delete.delay.ms``; offsets that vanish are gaps, which
readers of a compacted topic skip (every read already asks for the first batch at or after an
offset).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diskless.files import fsync_directory, replace_durably
from diskless.protocol import records
from diskless.protocol.records import LOG_OVERHEAD

from .cleaning_plan import CleaningPlan, SegmentSummary, plan_cleaning
from .compaction import BatchCleaner, CleanStats, KeyMap, is_aborted
from .segment import RECORDS, LogSegment
from .txn_index import AbortedTxn

if TYPE_CHECKING:
    from .partition_log import PartitionLog

SCRATCH_DIR = "cleaner-scratch"  # beside the log directories: not a partition directory
SWAP_DIR = "cleaned.swap"  # inside a log's directory, between the commit point and the end of an install
MANIFEST = "manifest.json"
CHECKPOINT_FILE = "cleaner-offset-checkpoint"
_READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class SegmentSnapshot:
    segment: LogSegment
    path: str
    base_offset: int
    next_offset: int
    size: int


@dataclass(slots=True)
class CleaningJob:
    log: PartitionLog
    plan: CleaningPlan
    segments: list[SegmentSnapshot]  # the cleanable segments, oldest first
    layout_epoch: int
    aborted: list[AbortedTxn]
    last_batches: dict[int, int]  # producer id -> last offset of its last data batch
    # producer id -> epoch, for producers whose state holds no data batch (a marker bumped the epoch)
    marker_epochs: dict[int, int]
    now_ms: int
    delete_retention_ms: int
    index_interval_bytes: int
    # How far a batch body may decompress: as far as produce let it (key_check), whatever this
    # topic's max.message.bytes was when it was written (Kafka's cleaner has no bound at all).
    max_decompressed: int = records.DEFAULT_MAX_DECOMPRESSED_BYTES
    # Set by the event loop when the broker stops: the worker gives up at its next batch rather
    # than keep the process waiting for a pass nobody will install.
    cancelled: bool = False
    # log.cleaner.io.max.bytes.per.second, set by the broker: bytes read and written per second.
    io_max_bytes_per_second: float = float("inf")


class CleaningCancelled(Exception):
    pass


class KeyMapTooSmall(Exception):
    """The first dirty batch has more keys than the key map holds: the log cannot be cleaned with
    this map (Kafka fails the pass, and the log is left alone, rather than picked again at once)."""


class _Throttle:
    """Kafka's cleaner Throttler: the worker sleeps whenever it has moved bytes faster than the
    rate since it started (a pass over a large log must not take the disk from the brokers' appends)."""

    def __init__(self, job: CleaningJob) -> None:
        self.job = job
        self.rate = job.io_max_bytes_per_second
        self.started = time.monotonic()
        self.bytes = 0

    def account(self, size: int) -> None:
        if self.rate == float("inf") or self.rate <= 0:
            return
        self.bytes += size
        # In short naps: a stopping broker (its interpreter joins this thread) must not wait out
        # a long one, which a low rate makes of every batch.
        while (ahead := self.bytes / self.rate - (time.monotonic() - self.started)) > 0.01:
            if self.job.cancelled:
                raise CleaningCancelled
            time.sleep(min(ahead, 0.1))


@dataclass(slots=True)
class CleanedOutput:
    job: CleaningJob
    scratch: str
    segments: list[LogSegment]  # the new segments, still in ``scratch``
    replaced: int  # how many of the job's segments, from the first, they replace
    map_end: int  # where the next pass's dirty part starts
    stats: CleanStats = field(default_factory=CleanStats)
    # Aborted transactions whose markers the pass kept (data of theirs is still in the replaced
    # range): the replaced range's entries of the aborted-transaction index from now on.
    kept_aborted: list[AbortedTxn] = field(default_factory=list)

    @property
    def bytes_before(self) -> int:
        return sum(s.size for s in self.job.segments[: self.replaced])

    @property
    def bytes_after(self) -> int:
        return sum(s.size for s in self.segments)


# --- the checkpoint ---------------------------------------------------------------------------


def read_checkpoint(directory: str) -> int:
    """Where the last pass's key map ended (Kafka's cleaner-offset-checkpoint); 0 if unknown,
    which only makes the next pass map more."""
    try:
        with open(os.path.join(directory, CHECKPOINT_FILE)) as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_checkpoint(directory: str, offset: int) -> None:
    replace_durably(os.path.join(directory, CHECKPOINT_FILE), str(offset).encode())


# --- step 1: prepare (event loop) -------------------------------------------------------------


def summary(segment: LogSegment) -> SegmentSummary:
    return SegmentSummary(
        segment.base_offset,
        segment.next_offset,
        segment.size,
        segment.max_timestamp,
        segment.first_batch_timestamp,
        len(segment.offset_index),
    )


def cleanable(log: PartitionLog) -> bool:
    """A classic log whose policy compacts (a diskless log's segments hold pointers, never cleaned)."""
    return log.config.compact and not log.tiers and all(s.kind == RECORDS for s in log.segments)


def prepare(log: PartitionLog, now_ms: int) -> CleaningJob | None:
    """The pass to run on ``log`` now, or None when it needs none."""
    if not cleanable(log):
        return None
    config = log.config
    # A checkpoint past the log end (data lost since it was written) says nothing of what is
    # below it: everything is dirty again (Kafka's cleanableOffsets).
    checkpoint = log.cleaner_checkpoint if log.cleaner_checkpoint <= log.log_end_offset else 0
    plan = plan_cleaning(
        [summary(s) for s in log.segments],
        log_start_offset=log.log_start_offset,
        checkpoint=checkpoint,
        last_stable_offset=log.last_stable_offset,
        now_ms=now_ms,
        min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
        min_compaction_lag_ms=config.min_compaction_lag_ms,
        max_compaction_lag_ms=config.max_compaction_lag_ms,
        segment_bytes=config.segment_bytes,
        segment_index_bytes=config.segment_index_bytes,
    )
    if plan is None:
        return None
    segments = [
        SegmentSnapshot(s, s.log_path, s.base_offset, s.next_offset, s.size) for s in log.segments[: plan.cleanable]
    ]
    producers = log.producer_state.producers.items()
    last_batches = {producer_id: entry.batches[-1].last_offset for producer_id, entry in producers if entry.batches}
    marker_epochs = {producer_id: entry.epoch for producer_id, entry in producers if not entry.batches}
    return CleaningJob(
        log=log,
        plan=plan,
        segments=segments,
        layout_epoch=log.layout_epoch,
        aborted=list(log.txns.aborted),
        last_batches=last_batches,
        marker_epochs=marker_epochs,
        now_ms=now_ms,
        delete_retention_ms=config.delete_retention_ms,
        index_interval_bytes=config.index_interval_bytes,
        max_decompressed=max(
            records.DEFAULT_MAX_DECOMPRESSED_BYTES, records.max_decompressed_bytes(config.max_message_bytes)
        ),
    )


# --- step 2: run (worker thread) --------------------------------------------------------------


def scratch_path(log_directory: str) -> str:
    parent, name = os.path.split(os.path.abspath(log_directory))
    return os.path.join(parent, SCRATCH_DIR, name)


def _batches(fd: int, size: int) -> Iterator[bytes]:
    """The batches of the first ``size`` bytes of a segment file, read in large chunks."""
    position = 0
    buffer = b""
    while position < size or buffer:
        if position < size:
            chunk = os.pread(fd, min(_READ_CHUNK, size - position), position)
            if not chunk:
                break
            position += len(chunk)
            buffer = buffer + chunk if buffer else chunk
        at = 0
        while at + LOG_OVERHEAD <= len(buffer):
            batch_size = records.peek_offset_and_size(buffer, at)[1]
            if at + batch_size > len(buffer):
                break
            yield buffer[at : at + batch_size]
            at += batch_size
        buffer = buffer[at:]
        if position >= size:
            if buffer:
                raise ValueError(f"a torn batch of {len(buffer)} bytes at the end of a sealed segment")
            break


def run(job: CleaningJob, max_map_entries: int) -> CleanedOutput | None:
    """Build the key map and write the cleaned segments (see the module docstring); None when the
    log changed under the pass. Raises KeyMapTooSmall when not even the first dirty batch fits."""
    descriptors: list[int] = []
    try:
        try:
            for snapshot in job.segments:
                descriptors.append(os.open(snapshot.path, os.O_RDONLY))
        except FileNotFoundError:
            return None  # a segment was dropped (retention, truncation) since the snapshot
        key_map = KeyMap(max_map_entries, max_decompressed=job.max_decompressed)
        throttle = _Throttle(job)
        first_dirty = job.plan.first_dirty
        for snapshot, fd in zip(job.segments, descriptors, strict=True):
            if snapshot.next_offset <= first_dirty:
                continue
            if not _map_segment(key_map, fd, snapshot.size, first_dirty, job.aborted, throttle):
                break
            if job.cancelled:
                raise CleaningCancelled
        if key_map.end_offset < 0:
            # Every dirty segment holds a batch at or after first_dirty: the map took none of them.
            raise KeyMapTooSmall(
                f"a batch at or after offset {first_dirty} has more keys than the key map's {max_map_entries}: "
                "increase log.cleaner.dedupe.buffer.size"
            )
        groups = [g for g in job.plan.groups if job.segments[g[0]].base_offset < key_map.end_offset]
        # round_end_offset: the batch ending where the map ends stays (emptied if need be), as
        # Kafka keeps the cleaning round's last offset, so the next pass's dirty part starts at a
        # batch boundary the log still has.
        cleaner = BatchCleaner(
            key_map,
            job.aborted,
            job.last_batches,
            job.now_ms,
            job.delete_retention_ms,
            round_end_offset=key_map.end_offset,
            marker_epochs=job.marker_epochs,
            max_decompressed=job.max_decompressed,
        )
        scratch = scratch_path(job.log.directory)
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        cleaned: list[LogSegment] = []
        try:
            for group in groups:
                first = job.segments[group[0]]
                segment = LogSegment(scratch, first.base_offset, job.index_interval_bytes, job.now_ms)
                cleaned.append(segment)
                for i in group:
                    for batch in _batches(descriptors[i], job.segments[i].size):
                        if job.cancelled:
                            raise CleaningCancelled
                        kept = cleaner.clean(batch)
                        throttle.account(len(batch) + (len(kept) if kept is not None else 0))
                        if kept is not None:
                            header = records.parse_header(kept)
                            segment.append(kept, header.base_offset, header.last_offset, header.max_timestamp)
                segment.on_roll()  # the final time index entry, and everything fsynced
            replaced = group_end = max(groups[-1]) + 1 if groups else 0
            manifest = {
                "replaces": [s.base_offset for s in job.segments[:group_end]],
                "bases": [s.base_offset for s in cleaned],
            }
            replace_durably(os.path.join(scratch, MANIFEST), json.dumps(manifest).encode())
        except BaseException:
            for segment in cleaned:
                segment.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return CleanedOutput(
            job, scratch, cleaned, replaced, key_map.end_offset, cleaner.stats, list(cleaner.kept_aborted)
        )
    finally:
        for fd in descriptors:
            os.close(fd)


def _map_segment(
    key_map: KeyMap, fd: int, size: int, first_dirty: int, aborted: list[AbortedTxn], throttle: _Throttle
) -> bool:
    """Add a segment's batches at or after ``first_dirty`` to the map; False once the map is full."""
    for batch in _batches(fd, size):
        throttle.account(len(batch))
        header = records.parse_header(batch)
        if header.last_offset < first_dirty:
            continue
        if not key_map.add_batch(batch, aborted=is_aborted(header, aborted)):
            return False
    return True


# --- step 3: install (event loop) -------------------------------------------------------------


def discard(output: CleanedOutput) -> None:
    for segment in output.segments:
        segment.close()
    shutil.rmtree(output.scratch, ignore_errors=True)


def install(output: CleanedOutput) -> bool:
    """Swap the cleaned segments in if the log is as the pass saw it; False (output discarded) if not."""
    job = output.job
    log = job.log
    replaced = job.segments[: output.replaced]
    if not replaced or not _unchanged(log, job, replaced):
        discard(output)
        return False
    start = next(i for i, s in enumerate(log.segments) if s is replaced[0].segment)
    swap = os.path.join(log.directory, SWAP_DIR)
    os.rename(output.scratch, swap)  # the commit point
    fsync_directory(log.directory)
    for snapshot in replaced:
        log.retire_segment(snapshot.segment)
    for segment in output.segments:
        segment.relocate(swap, log.directory)
    os.unlink(os.path.join(swap, MANIFEST))
    os.rmdir(swap)
    fsync_directory(log.directory)
    log.segments[start : start + len(replaced)] = output.segments
    # Kafka's cleaner rewrites the cleaned segments' transaction index the same way. An entry whose
    # marker the pass removed must go: a read_committed consumer told of it would skip the
    # producer's batches from its first offset until the next abort marker, a later committed
    # transaction's among them.
    low, high = replaced[0].base_offset, replaced[-1].next_offset
    outside = [a for a in log.txns.aborted if not low <= a.last_offset < high]
    log.txns.aborted = sorted(outside + output.kept_aborted, key=lambda a: a.last_offset)
    log.cleaner_checkpoint = output.map_end
    write_checkpoint(log.directory, output.map_end)
    return True


def _unchanged(log: PartitionLog, job: CleaningJob, replaced: list[SegmentSnapshot]) -> bool:
    if log.layout_epoch != job.layout_epoch:
        return False
    try:
        start = next(i for i, s in enumerate(log.segments) if s is replaced[0].segment)
    except StopIteration:
        return False
    live = log.segments[start : start + len(replaced)]
    if len(live) != len(replaced) or start + len(replaced) >= len(log.segments):
        return False  # the active segment is never replaced
    return all(
        s is snap.segment and s.size == snap.size and s.next_offset == snap.next_offset and s.log_path == snap.path
        for s, snap in zip(live, replaced, strict=True)
    )


# --- recovery (loading a log) -----------------------------------------------------------------


def recover(directory: str) -> None:
    """Finish an install a crash interrupted after its commit point (see the module docstring).
    Scratch output of a pass that never committed is removed by the cleaner when it starts."""
    swap = os.path.join(directory, SWAP_DIR)
    if not os.path.isdir(swap):
        return
    manifest_path = os.path.join(swap, MANIFEST)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        manifest = {"replaces": [], "bases": []}  # the install had finished all but the rmdir
    new_bases = set(manifest["bases"])
    for name in os.listdir(swap):
        if name != MANIFEST:
            os.replace(os.path.join(swap, name), os.path.join(directory, name))
    for base in manifest["replaces"]:
        if base in new_bases:
            continue  # its files were replaced by the moves above
        for suffix in (".log", ".index", ".timeindex"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, f"{base:020d}{suffix}"))
    if os.path.exists(manifest_path):
        os.unlink(manifest_path)
    os.rmdir(swap)
    fsync_directory(directory)


def remove_scratch(log_dir: str) -> None:
    """The cleaner's unfinished output (nothing committed refers to it)."""
    shutil.rmtree(os.path.join(log_dir, SCRATCH_DIR), ignore_errors=True)

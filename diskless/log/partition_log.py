"""The log of one partition replica: an ordered list of segments with one continuous offset space.

Sans-clock: every operation that depends on time takes ``now_ms``. Synchronous file I/O only; the
broker's asyncio layer calls it from the event loop, which also makes each call atomic with
respect to other requests. Responsibilities: leader appends (validated batches in, offsets
assigned), follower appends (offsets already assigned), reads bounded by a max offset (the high
watermark), segment rolling, retention and DeleteRecords moving the log start offset, lookups by
timestamp, truncation, recovery after a crash, and the fsync policy of ``flush.messages`` and
``flush.ms`` (Kafka's UnifiedLog.append and LogManager.flushDirtyLogs; the broker runs the
periodic pass).

Every change to the log end, the high watermark or the log start calls ``on_change`` (one hook,
set by the replica owning the log): what replica fetches and their sessions know of a partition
is exactly those three, and they learn of changes this way instead of re-reading every partition
on every fetch (replication/partition.py's watches).
"""

from __future__ import annotations

import bisect
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from diskless.files import replace_durably
from diskless.protocol import records
from diskless.storage import pointer, segment_object
from diskless.tiering.entry import (
    Tier,
    TierCommitError,
    decode_tier_batch,
    may_be_tier,
    tier_batch,
    wrap_tier_state,
)

from . import cleaner
from .batch_codec import in_topic_codec
from .config import LogConfig
from .leader_epoch import LeaderEpochCache
from .producer_state import (
    BatchMetadata,
    ProducerStateManager,
    delete_snapshots,
    load_latest_snapshot,
    write_snapshot,
)
from .segment import POINTERS, RECORDS, SUFFIXES, BatchLocation, LogSegment, remove_deleted_files
from .txn_index import CONTROL_ABORT, CONTROL_COMMIT, AbortedTxn, TxnIndex, marker_batch, marker_fields
from .txn_verification import TxnGuard, TxnVerifier

CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
LOG_START_FILE = "log-start-offset"
EPOCH_FILE = "leader-epoch-checkpoint"
HW_FILE = "high-watermark-checkpoint"
TIER_FILE = "tier-manifest"
TIERED = "tiered"  # a ReadResult whose ``records`` describe a read of a tiered segment object
_OFFSET_INDEX_ENTRY = 8


def _unchanged() -> None:
    pass


def timestamp_allowed(header: records.BatchHeader, config: LogConfig, now_ms: int) -> bool:
    """message.timestamp.before/after.max.ms for CreateTime topics, checked on the batch header."""
    if config.message_timestamp_type != "CreateTime":
        return True
    too_new = header.max_timestamp > now_ms + config.message_timestamp_after_max_ms
    too_old = 0 <= header.base_timestamp < now_ms - config.message_timestamp_before_max_ms
    return not (too_new or too_old)


def check_fits_segment(batches: Sequence[memoryview | bytearray], config: LogConfig) -> None:
    """Refuse an append larger than ``segment.bytes`` (RECORD_LIST_TOO_LARGE), as Kafka's
    UnifiedLog.append does once the batches passed validation: a segment never holds more than
    that, so such an append would have a segment of its own, past the size the topic allows.
    ``max.message.bytes`` (MESSAGE_TOO_LARGE) is checked first, per batch, as in Kafka."""
    size = sum(len(b) for b in batches)
    if size > config.segment_bytes:
        raise records.InvalidBatch(
            "record_list_too_large",
            f"batch of {size} bytes exceeds the maximum configured segment size of {config.segment_bytes}",
        )


class OffsetOutOfRange(Exception):
    pass


class OffsetMovedToTiered(OffsetOutOfRange):
    """A replica read below the pointer entries a log still has: the range lives in segment objects."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # -1 unless message.timestamp.type=LogAppendTime
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes  # record batches, or pointer entries when ``kind`` is POINTERS
    log_start_offset: int
    log_end_offset: int
    kind: str = RECORDS


@dataclass(slots=True)
class RetiredSegment:
    """A segment the log dropped, renamed ``.deleted``, whose files go at ``due_ms`` (stamped by the
    first ``remove_retired_segments`` after the drop: dropping paths do not all know the time)."""

    segment: LogSegment
    due_ms: int | None = None


class PartitionLog:
    def __init__(self, directory: str, config: LogConfig, now_ms: int, hw_file: bool = True) -> None:
        """``hw_file``: keep the high watermark in a file of this log's own (standalone logs); a
        broker passes False and checkpoints all its logs' HWs in one file (replica_manager.py).
        An existing file is read either way (logs written before that file existed)."""
        self.directory = directory
        self.config = config
        self._hw_file = hw_file
        os.makedirs(directory, exist_ok=True)
        self.epochs = LeaderEpochCache(os.path.join(directory, EPOCH_FILE))
        # Called after every change to the log end, the high watermark or the log start (see
        # ``on_change``); set before anything below can change them.
        self.on_change: Callable[[], None] = _unchanged
        self.segments: list[LogSegment] = []
        self.retired: list[RetiredSegment] = []  # dropped, files not yet removed (file.delete.delay.ms)
        self._log_start_offset = 0
        self._high_watermark = 0
        # Tier entries (diskless/tiering/entry.py) by offset; those below the high watermark are in
        # effect up to ``_tier_floor`` (the end of the last of them).
        self.tiers: list[Tier] = []
        self._tier_floor = 0
        self._tiered_aborts: list[AbortedTxn] = []  # aborted txns of ranges whose pointers are gone
        self.recovered_bytes_truncated = 0
        self.producer_state = ProducerStateManager()
        self.txns = TxnIndex()
        # Leader-only, in memory: guards of transactions verified with their coordinator.
        self.txn_verifier = TxnVerifier()
        self._checkpointed_hw = -1
        self._wal_refs: Counter[str] = Counter()
        self._wal_refs_stale = True
        # Kafka's recovery point: offsets below it are fsynced. Segments before the active one
        # always are (``roll`` syncs them), so only the active segment can hold unflushed entries.
        self.recovery_point = 0
        self.last_flush_ms = now_ms  # as Kafka's lastFlushedTime, the log's creation counts
        # Bumped whenever segments may change under a cleaning pass other than by being dropped
        # (truncation, close, delete): the cleaner installs its output only if it did not move.
        self.layout_epoch = 0
        self.cleaner_checkpoint = 0  # where the last cleaning pass's key map ended (cleaner.py)
        self._load(now_ms)

    # --- loading ------------------------------------------------------------------------------

    def _load(self, now_ms: int) -> None:
        clean_marker = os.path.join(self.directory, CLEAN_SHUTDOWN_FILE)
        clean = os.path.exists(clean_marker)
        cleaner.recover(self.directory)  # before listing segments: a crash may have left a swap half done
        remove_deleted_files(self.directory)
        found = sorted(
            (int(name[: -len(suffix)]), kind)
            for name in os.listdir(self.directory)
            for kind, suffix in SUFFIXES.items()
            if name.endswith(suffix) and name[: -len(suffix)].isdigit()
        )
        bases = [base for base, _ in found]
        for i, (base, kind) in enumerate(found):
            segment = LogSegment(self.directory, base, self.config.index_interval_bytes, now_ms, kind)
            is_active = i == len(bases) - 1
            self.recovered_bytes_truncated += segment.load(verify=is_active and not clean)
            self.segments.append(segment)
        if not self.segments:
            self.segments.append(LogSegment(self.directory, 0, self.config.index_interval_bytes, now_ms))
        try:
            with open(os.path.join(self.directory, LOG_START_FILE)) as f:
                self.log_start_offset = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            self.log_start_offset = 0
        self._load_tiers()
        first = self.segments[0].base_offset
        if self.tiers:
            first = min(first, self.tiers[0].base_offset)
        self.log_start_offset = max(self.log_start_offset, first)
        self._apply_ref_floor(max(self.log_start_offset, self._tier_floor))
        self.epochs.truncate_from_end(self.log_end_offset)
        if not clean:
            self._recover_epochs()
        # A stale checkpoint only under-reports; the leader role recomputes the HW from the ISR.
        self.high_watermark = min(self._read_checkpointed_hw(), self.log_end_offset)
        self.cleaner_checkpoint = cleaner.read_checkpoint(self.directory)
        self._rebuild_producer_state()
        self._rebuild_txn_index()
        self.producer_state.expire(now_ms, self.config.producer_id_expiration_ms, self.txns.ongoing)
        # A clean shutdown fsynced everything; after a crash the active segment was read back from
        # the page cache at best, so its entries count as unflushed (Kafka keeps its checkpointed
        # recovery point then, too).
        self.recovery_point = self.log_end_offset if clean else self.active_segment.base_offset
        if clean:
            os.unlink(clean_marker)

    def _recover_epochs(self) -> None:
        """After an unclean shutdown, the active segment's epochs from its batch headers: new
        epochs are written to the checkpoint without fsync (leader_epoch.py), so a machine crash
        may have lost them; older segments' epochs were synced when those segments rolled."""
        segment = self.active_segment
        for _, header in segment.iter_headers(segment.offset_index.lookup(self.log_start_offset)):
            if header.last_offset >= self.log_start_offset:
                self.epochs.assign(header.partition_leader_epoch, max(header.base_offset, self.log_start_offset))

    def _read_checkpointed_hw(self) -> int:
        try:
            with open(os.path.join(self.directory, HW_FILE)) as f:
                return int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def checkpoint_high_watermark(self) -> None:
        if self.high_watermark == self._checkpointed_hw:
            return
        tmp = os.path.join(self.directory, HW_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(self.high_watermark))
        os.replace(tmp, os.path.join(self.directory, HW_FILE))
        self._checkpointed_hw = self.high_watermark

    def _rebuild_txn_index(self) -> None:
        """Open and aborted transactions from the batch headers (and the control batches) in the log."""
        self.txns.reset()
        for segment in self._segments_from(self.log_start_offset):
            for location in segment.iter_batches(segment.offset_index.lookup(self.log_start_offset)):
                if location.last_offset < self.log_start_offset:
                    continue
                header = segment._header_at(location.position)
                if header is None or not header.is_transactional:
                    continue
                marker = self._marker_of(segment, location) if header.is_control else None
                self.txns.on_batch(header, marker[0] if marker is not None else None)
        if self._tiered_aborts:
            known = set(self.txns.aborted)
            merged = [a for a in self._tiered_aborts if a.last_offset >= self.log_start_offset and a not in known]
            self.txns.aborted = sorted(self.txns.aborted + merged, key=lambda a: a.last_offset)
        self.txns.on_high_watermark(self._high_watermark)  # every marker below it is replicated

    @staticmethod
    def _marker_of(segment: LogSegment, location: BatchLocation) -> tuple[int, int] | None:
        """A control batch's marker type and coordinator epoch, read from the segment."""
        raw = segment.read_batch(location)
        if segment.kind == POINTERS:
            entry, _ = pointer.decode_entry(raw, 0)
            if not isinstance(entry, pointer.InlineEntry):
                return None
            raw = entry.batch
        return marker_fields(raw)

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        self._high_watermark = value
        self.txns.on_high_watermark(value)
        if self.tiers and self.tiers[-1].last_offset >= self._tier_floor:
            self._activate_tiers()
        self.on_change()

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @log_start_offset.setter
    def log_start_offset(self, value: int) -> None:
        self._log_start_offset = value
        self.on_change()

    @property
    def last_stable_offset(self) -> int:
        return self.txns.last_stable_offset(self.high_watermark)

    @property
    def read_bounds(self) -> tuple[int, int]:
        """Where consumers' reads stop (high watermark, last stable offset): a change is news to
        the fetches waiting on this log."""
        return self.high_watermark, self.last_stable_offset

    def _rebuild_producer_state(self) -> None:
        """Latest usable snapshot, then replay of the batches written after it."""
        snapshot_offset, self.producer_state = load_latest_snapshot(
            self.directory, self.log_end_offset, self.log_start_offset
        )
        start = max(snapshot_offset, self.log_start_offset)
        for segment in self._segments_from(start):
            for location in segment.iter_batches(segment.offset_index.lookup(start)):
                # A batch that DeleteRecords cut through is still its producer's last (Kafka
                # replays every batch ending at or after the start): skipped, its retry would be
                # appended again and a gap after it accepted. Snapshots sit between batches.
                if location.last_offset < start:
                    continue
                header = segment._header_at(location.position)
                if header is None:
                    continue
                marker = self._marker_of(segment, location) if header.is_control else None
                coordinator_epoch = marker[1] if marker is not None else -1
                self.producer_state.record(header, header.base_offset, header.max_timestamp, coordinator_epoch)

    # --- state --------------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        # Not through active_segment: read for every partition of every fetch, a property less counts.
        return self.segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of the segment files on disk (pointer entries, not the batches they point to)."""
        return sum(s.size for s in self.segments)

    @property
    def data_bytes(self) -> int:
        """Bytes of the batches in the log, wherever they live (``retention.bytes`` limits this)."""
        return sum(s.data_bytes for s in self.segments) + sum(t.info.size for t in self._detached_tiers())

    # --- appending -----------------------------------------------------------------------------

    def validate_and_prepare(
        self, batches: Sequence[memoryview], now_ms: int, from_client: bool = True
    ) -> tuple[list[memoryview | bytearray], list[records.BatchHeader]]:
        """Header-level validation of producer batches (raises records.InvalidBatch), each in the
        topic's codec (``batch_codec``): the batches to append and their headers."""
        prepared: list[memoryview | bytearray] = []
        headers = []
        for batch in batches:
            header = records.validate_batch(batch, self.config.max_message_bytes, from_client)
            if not timestamp_allowed(header, self.config, now_ms):
                raise records.InvalidBatch("invalid_timestamp", "timestamp outside the allowed range")
            converted, header = in_topic_codec(batch, header, self.config)
            prepared.append(converted)
            headers.append(header)
        check_fits_segment(prepared, self.config)
        return prepared, headers

    def in_ongoing_txn(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether the producer's transaction at this epoch is open here: its next transactional
        batch needs no verification with the coordinator (Kafka's hasOngoingTransaction)."""
        if producer_id not in self.txns.ongoing:
            return False
        entry = self.producer_state.producers.get(producer_id)
        return entry is not None and entry.epoch == producer_epoch

    def append_as_leader(
        self,
        batches: Sequence[memoryview],
        leader_epoch: int,
        now_ms: int,
        check_sequence: bool = True,
        txn_guard: TxnGuard | None = None,
        verify_txn: bool = False,
    ) -> AppendResult:
        """Assign offsets to validated producer batches and append them.

        ``check_sequence`` is off for batches a coordinator writes for a producer (transactional
        offset commits), which carry its id and epoch but no sequence, as in Kafka.
        With ``verify_txn`` a transactional batch that would open a transaction here (none ongoing
        for its producer at its epoch) is appended only under a current verified ``txn_guard``
        (``txn_verification``), else refused INVALID_TXN_STATE: Kafka's analyzeAndValidateProducerState.
        """
        prepared, headers = self.validate_and_prepare(batches, now_ms, from_client=check_sequence)
        for header in headers:
            if not check_sequence:
                self.producer_state.check_epoch(header)
                self._check_txn_state(header)
                continue
            duplicate = self.producer_state.check(header)
            if duplicate is not None:
                # A retry of a batch already in the log: answer with where it went, append nothing.
                log_append = self.config.message_timestamp_type == "LogAppendTime"
                return self._duplicate_result(duplicate, log_append)
            self._check_txn_state(header)
            if (
                verify_txn
                and header.is_transactional
                and not self.in_ongoing_txn(header.producer_id, header.producer_epoch)
            ):
                self._check_txn_guard(header, txn_guard, leader_epoch)
        if check_sequence and headers:
            self._abort_superseded_txn(headers[0], leader_epoch, now_ms)
        log_append = self.config.message_timestamp_type == "LogAppendTime"
        base_offset = self.log_end_offset
        next_offset = base_offset
        self.epochs.assign(leader_epoch, base_offset)
        for batch, header in zip(prepared, headers, strict=True):
            owned = bytearray(batch)
            records.assign_offset(owned, next_offset, leader_epoch)
            max_ts = header.max_timestamp
            if log_append:
                records.set_log_append_time(owned, now_ms)
                max_ts = now_ms
            last = next_offset + header.last_offset_delta
            self._append(owned, next_offset, last, max_ts, now_ms)
            self.producer_state.record(header, next_offset, max_ts)
            self.txns.on_batch(header._replace(base_offset=next_offset))
            next_offset = last + 1
        self._flush_if_unflushed_messages(now_ms)
        return AppendResult(base_offset, next_offset - 1, now_ms if log_append else -1, self.log_start_offset)

    def append_pointer_as_leader(
        self,
        header: bytes | bytearray | memoryview,
        object_key: str,
        position: int,
        leader_epoch: int,
        now_ms: int,
        txn_guard: TxnGuard | None = None,
        verify_txn: bool = False,
    ) -> AppendResult:
        """Commit one diskless batch: its data is already in object storage at ``object_key``.

        Same rules as a record batch (idempotence, offsets, epochs); what is appended is a pointer
        entry. Raises records.InvalidBatch for fenced or out-of-sequence producers. With
        ``verify_txn`` a transactional batch is appended only under a current ``txn_guard``
        (``txn_verification``): a commit whose transaction ended is refused, INVALID_TXN_STATE.
        A retry of a batch already appended is still answered as a duplicate, as in Kafka.
        """
        parsed = records.parse_header(header)
        duplicate = self.producer_state.check(parsed)
        if duplicate is not None:
            return self._duplicate_result(duplicate, parsed.is_log_append_time)
        self._check_txn_state(parsed)
        if verify_txn and parsed.is_transactional and not parsed.is_control:
            self._check_txn_guard(parsed, txn_guard, leader_epoch)
        self._abort_superseded_txn(parsed, leader_epoch, now_ms)
        base_offset = self.log_end_offset
        self.epochs.assign(leader_epoch, base_offset)
        assigned = bytearray(header[: records.HEADER_SIZE])
        records.assign_offset(assigned, base_offset, leader_epoch)
        last = base_offset + parsed.last_offset_delta
        entry = pointer.encode_pointer_entry(assigned, object_key, position, parsed.size)
        self._append(entry, base_offset, last, parsed.max_timestamp, now_ms, POINTERS)
        self._note_pointer(entry)
        self.producer_state.record(parsed, base_offset, parsed.max_timestamp)
        self.txns.on_batch(parsed._replace(base_offset=base_offset))
        self._flush_if_unflushed_messages(now_ms)
        log_append_time = parsed.max_timestamp if parsed.is_log_append_time else -1
        return AppendResult(base_offset, last, log_append_time, self.log_start_offset)

    def _check_txn_guard(self, header: records.BatchHeader, guard: TxnGuard | None, leader_epoch: int) -> None:
        refused = self.txn_verifier.check(header.producer_id, header.producer_epoch, guard, leader_epoch)
        if refused is not None:
            raise records.InvalidBatch(
                refused.name, f"producer {header.producer_id}: transactional batch without a current verification"
            )

    def _check_txn_state(self, header: records.BatchHeader) -> None:
        """Refuse a non-transactional batch of a producer whose transaction is open here
        (INVALID_TXN_STATE, Kafka's ProducerAppendInfo.appendDataBatch). Appended, it would sit
        inside the transaction yet outside it: read_committed consumers would get it even if the
        transaction aborts, and it would not be undone with the rest. Checked after the epoch and
        sequence, as Kafka does, so a fenced or out-of-order batch still gets that error."""
        if header.producer_id == records.NO_PRODUCER_ID or header.is_transactional:
            return
        if header.producer_id in self.txns.ongoing:
            raise records.InvalidBatch(
                "invalid_txn_state",
                f"producer {header.producer_id} sent a non-transactional batch while its transaction is open",
            )

    def _duplicate_result(self, duplicate: BatchMetadata, log_append: bool) -> AppendResult:
        """The answer to a retry of a batch already appended: where it went, and for a
        LogAppendTime topic the time it was stamped with, which the first answer carried and the
        producer reports as its records' timestamp (Kafka answers the cached batch's timestamp).
        For CreateTime, -1 as in the first answer: Kafka's cached max timestamp there would make
        the client report one timestamp for every record of the batch."""
        log_append_time = duplicate.max_timestamp if log_append else -1
        return AppendResult(duplicate.first_offset, duplicate.last_offset, log_append_time, self.log_start_offset, True)

    def _abort_superseded_txn(self, header: records.BatchHeader, leader_epoch: int, now_ms: int) -> None:
        """Close, with an ABORT marker, a transaction its producer can no longer end, before a
        transactional batch of that producer at a newer epoch is appended.

        A producer's transaction still open here at an older epoch than its new batch has ended:
        the coordinator bumps an epoch only for a complete transaction (every marker written) or
        by fencing one (its ABORT marker carries the new epoch and closes it), so that transaction
        was opened by a batch that arrived after its marker. That happens to diskless commits:
        the client timed out on a batch, aborted, bumped its epoch (KIP-360) and went on while the
        representative's late flush was still on its way. Left alone, the batch would hold the
        last stable offset and then be committed with the producer's next transaction. (A late
        batch that is followed by no newer epoch looks exactly like the first batch of a next
        transaction at the same epoch; only the coordinator can tell them apart: diskless commits
        are verified with it, ``txn_verification``. This rule stays for logs without that check.)
        """
        if not header.is_transactional or header.is_control or header.producer_id not in self.txns.ongoing:
            return
        entry = self.producer_state.producers.get(header.producer_id)
        if entry is None or header.producer_epoch <= entry.epoch:
            return
        # The marker says who wrote it through the coordinator epoch: -1, not a coordinator.
        self.append_marker_as_leader(header.producer_id, entry.epoch, False, -1, leader_epoch, now_ms, fenced=False)

    def append_pointers_as_follower(self, data: bytes | memoryview, now_ms: int) -> int:
        """Append pointer entries replicated from the leader; returns the new log end offset."""
        view = memoryview(data)
        pos = 0
        while pos < len(view):
            size = pointer.pointer_entry_size(view, pos)
            entry = view[pos : pos + size]
            pos += size
            header = records.parse_header(entry, pointer.ENTRY_HEADER_POS)
            if header.base_offset < self.log_end_offset and not self._restart_inside(header, now_ms):
                continue
            tier = self._tier_of_entry(entry, header)
            if tier is not None:
                self.roll(now_ms)  # a tier entry starts a segment: what it tiers can be deleted whole
            self.epochs.assign(header.partition_leader_epoch, header.base_offset)
            self._append(entry, header.base_offset, header.last_offset, header.max_timestamp, now_ms, POINTERS)
            if tier is not None:
                self._add_tier(Tier(tier, header.base_offset))
            self._note_pointer(entry)
            marker = None
            if header.is_control:
                inline, _ = pointer.decode_entry(entry, 0)
                marker = marker_fields(inline.batch) if isinstance(inline, pointer.InlineEntry) else None
            self._record_replicated(header, marker)
        self._flush_if_unflushed_messages(now_ms)
        return self.log_end_offset

    def append_as_follower(self, data: bytes | memoryview, now_ms: int) -> int:
        """Append batches whose offsets the leader assigned; returns the new log end offset."""
        for batch in records.split_batches(data):
            header = records.parse_header(batch)
            if header.base_offset < self.log_end_offset and not self._restart_inside(header, now_ms):
                continue
            self.epochs.assign(header.partition_leader_epoch, header.base_offset)
            self._append(batch, header.base_offset, header.last_offset, header.max_timestamp, now_ms)
            self._record_replicated(header, marker_fields(batch) if header.is_control else None)
        self._flush_if_unflushed_messages(now_ms)
        return self.log_end_offset

    def _record_replicated(self, header: records.BatchHeader, marker: tuple[int, int] | None) -> None:
        """Producer and transaction state of a batch a follower appended (``marker``: a control
        batch's type and coordinator epoch)."""
        coordinator_epoch = marker[1] if marker is not None else -1
        self.producer_state.record(header, header.base_offset, header.max_timestamp, coordinator_epoch)
        self.txns.on_batch(header, marker[0] if marker is not None else None)
        if header.is_control:
            self.txn_verifier.end(header.producer_id)

    def _restart_inside(self, header: records.BatchHeader, now_ms: int) -> bool:
        """Make room for a replicated batch that holds this empty log's start inside it.

        DeleteRecords moves a leader's log start to any offset, so a follower that restarted its
        log there is sent the whole batch around it. As Kafka does on UnexpectedAppendOffset, the
        empty log restarts at the batch's base (the log start stays where it was): skipping the
        batch as already appended would leave its offsets from the log start on out of the log.
        """
        empty = len(self.segments) == 1 and self.active_segment.size == 0 and not self.tiers
        if not empty or not header.base_offset < self.log_end_offset <= header.last_offset:
            return False
        start, high_watermark = self.log_start_offset, self.high_watermark
        self.truncate_fully_and_start_at(header.base_offset, now_ms)
        self._set_log_start(start)
        self.high_watermark = high_watermark
        return True

    def append_marker_as_leader(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        leader_epoch: int,
        now_ms: int,
        fenced: bool = True,
    ) -> int:
        """Write an end-of-transaction marker (WriteTxnMarkers); returns its offset.

        A stale marker (older producer or coordinator epoch) raises records.InvalidBatch, unless
        ``fenced`` is off: the leader's own marker for a superseded transaction. In a pointers
        segment the marker is stored inline: it is written by the leader itself and never goes to
        object storage."""
        if fenced:
            self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        batch = bytearray(marker_batch(producer_id, producer_epoch, commit, coordinator_epoch, now_ms))
        offset = self.log_end_offset
        self.epochs.assign(leader_epoch, offset)
        records.assign_offset(batch, offset, leader_epoch)
        header = records.parse_header(batch)
        if self.active_segment.kind == POINTERS:
            self._append(pointer.encode_inline_entry(batch), offset, offset, now_ms, now_ms, POINTERS)
        else:
            self._append(batch, offset, offset, now_ms, now_ms)
        self.producer_state.record(header, offset, now_ms, coordinator_epoch)
        self.txns.on_batch(header, CONTROL_COMMIT if commit else CONTROL_ABORT)
        # The transaction ended here: a commit verified in it must not open or join another.
        self.txn_verifier.end(producer_id)
        self._flush_if_unflushed_messages(now_ms)
        return offset

    def _append(
        self,
        entry: bytes | bytearray | memoryview,
        base: int,
        last: int,
        max_ts: int,
        now_ms: int,
        kind: str = RECORDS,
    ) -> None:
        active = self.active_segment
        if active.kind != kind:
            # diskless.enabled switched: the offset space continues in a segment of the other kind.
            if active.size == 0:
                base_offset = active.base_offset
                self._retire(self.segments.pop())
                self.segments.append(
                    LogSegment(self.directory, base_offset, self.config.index_interval_bytes, now_ms, kind)
                )
            else:
                self.roll(now_ms, kind)
        elif self._should_roll(len(entry), last, max_ts, now_ms):
            self.roll(now_ms)
        self.active_segment.append(entry, base, last, max_ts)
        self.on_change()

    def _should_roll(self, size: int, last_offset: int, max_ts: int, now_ms: int) -> bool:
        seg = self.active_segment
        if seg.size == 0:
            return False
        # Kafka's LogSegment.timeWaitedForRoll: the incoming batch's timestamp minus the first
        # batch's, so old CreateTime timestamps do not roll a segment per batch; wall clock otherwise.
        first_ts = seg.first_batch_timestamp
        waited = max_ts - first_ts if first_ts is not None and first_ts >= 0 else now_ms - seg.created_ms
        return (
            seg.size + size > self.config.segment_bytes
            or waited > self.config.max_segment_ms
            or not seg.can_hold(last_offset)
            or (len(seg.offset_index) + 1) * _OFFSET_INDEX_ENTRY > self.config.segment_index_bytes
        )

    def roll(self, now_ms: int, kind: str | None = None) -> LogSegment:
        old = self.active_segment
        if old.size == 0:
            return old
        old.on_roll()
        self.epochs.flush()  # the rolled segment's epochs will not be rebuilt after a crash
        self._flushed(self.log_end_offset, now_ms)  # as Kafka's roll, which flushes up to the new segment
        write_snapshot(self.directory, self.log_end_offset, self.producer_state)
        segment = LogSegment(
            self.directory, self.log_end_offset, self.config.index_interval_bytes, now_ms, kind or old.kind
        )
        self.segments.append(segment)
        return segment

    # --- reading -------------------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int, max_offset: int | None = None, min_one: bool = True, tiered: bool = True
    ) -> ReadResult:
        """Batches from ``offset`` up to ``max_bytes``, never at or past ``max_offset`` (default HW).

        Offsets of a tier in effect are answered (``tiered``) with kind TIERED: ``records`` is then
        a msgpack map (``segment``: the SegmentInfo, ``offset``, ``max_bytes``, ``max_offset``,
        ``min_one``) telling the caller what to read from the segment object. Without ``tiered``
        (replica fetches) the pointer entries are read while they exist; below them
        ``OffsetMovedToTiered`` is raised."""
        limit = self.high_watermark if max_offset is None else max_offset
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(f"offset {offset} outside [{self.log_start_offset}, {self.log_end_offset}]")
        if offset >= limit and offset >= self._tier_floor:
            # A reader at the end (a tail consumer's usual fetch): nothing to look up.
            return ReadResult(b"", self.log_start_offset, self.log_end_offset)
        if offset < self._tier_floor and (tiered or offset < self.segments[0].base_offset):
            if not tiered:
                raise OffsetMovedToTiered(f"offset {offset} is tiered and its pointers are gone")
            if offset >= limit:
                return ReadResult(b"", self.log_start_offset, self.log_end_offset)
            tier = self.tier_at(offset)
            descriptor = {
                "segment": tier.info.to_dict(),
                "offset": offset,
                "max_bytes": max_bytes,
                "max_offset": limit,
                "min_one": min_one,
            }
            return ReadResult(msgpack.packb(descriptor), self.log_start_offset, self.log_end_offset, TIERED)
        if offset < self.segments[0].base_offset:
            # Neither tiered nor in the log (``_settle_tier_floor`` keeps this from happening):
            # nothing, rather than the next segment's records, which would skip the ones between.
            return ReadResult(b"", self.log_start_offset, self.log_end_offset)
        data = b""
        kind = RECORDS
        for segment in self._segments_from(offset):
            if segment.base_offset >= limit:
                break
            data = segment.read(offset, max_bytes, limit, min_one)
            kind = segment.kind
            if data or segment.next_offset > offset:
                # Only a segment holding nothing at or after ``offset`` hands the read to the next one;
                # otherwise a batch too big for max_bytes (min_one off) would be skipped over.
                break
        return ReadResult(data, self.log_start_offset, self.log_end_offset, kind)

    def _segments_from(self, offset: int) -> list[LogSegment]:
        for i in range(len(self.segments) - 1, -1, -1):
            if self.segments[i].base_offset <= offset:
                return self.segments[i:]
        return self.segments

    # --- offsets by time -----------------------------------------------------------------------

    def batches_reaching(self, timestamp: int) -> Iterator[tuple[LogSegment, BatchLocation]]:
        """Entries below the HW whose max timestamp is >= ``timestamp``, oldest first.

        The first record with ts >= ``timestamp`` is in the first of these that holds one at or
        after the log start; finding it needs the records (``first_record_reaching``), which for a
        pointers segment live in object storage, so the caller loads the batch.
        """
        for segment in self._segments_from(self.log_start_offset):
            if segment.max_timestamp < timestamp:
                continue
            start = segment.first_batch_reaching(timestamp, self.log_start_offset)
            if start is None:
                continue
            for location in segment.iter_batches(start.position):
                if location.base_offset >= self.high_watermark:
                    return
                if location.max_timestamp >= timestamp:
                    yield segment, location

    def batch_of_max_timestamp(self) -> tuple[LogSegment, BatchLocation] | None:
        best: LogSegment | None = None
        for segment in self._segments_from(self.log_start_offset):
            if segment.offset_of_max_timestamp >= 0 and (best is None or segment.max_timestamp > best.max_timestamp):
                best = segment
        if best is None:
            return None
        location = best.locate(best.offset_of_max_timestamp)
        if location is None or location.last_offset < self.log_start_offset:
            return None
        return best, location

    def _record_timestamps(self, batch: bytes) -> list[tuple[int, int]]:
        """(offset, timestamp) of the batch's records; none for a batch whose body is corrupt or
        inflates past 64 x max.message.bytes (a decompression bomb): lookups skip it."""
        limit = records.max_decompressed_bytes(self.config.max_message_bytes)
        try:
            return list(records.iter_record_timestamps(batch, limit))
        except records.InvalidBatch:
            return []

    def first_record_reaching(self, batch: bytes, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record of ``batch`` in the log with ts >= ``timestamp``."""
        for offset, record_ts in self._record_timestamps(batch):
            if self.log_start_offset <= offset < self.high_watermark and record_ts >= timestamp:
                return offset, record_ts
        return None

    def record_with_max_timestamp(self, batch: bytes) -> tuple[int, int] | None:
        header = records.parse_header(batch)
        for offset, record_ts in self._record_timestamps(batch):
            if record_ts == header.max_timestamp and offset >= self.log_start_offset:
                return offset, record_ts
        return None

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets by timestamp over local record batches (see ``batches_reaching``)."""
        for segment, location in self.batches_reaching(timestamp):
            if segment.kind != RECORDS:
                raise ValueError("batch lives in object storage; load it and use first_record_reaching")
            found = self.first_record_reaching(segment.read_batch(location), timestamp)
            if found is not None:
                return found
        return None

    def offset_of_max_timestamp(self) -> tuple[int, int] | None:
        found = self.batch_of_max_timestamp()
        if found is None:
            return None
        segment, location = found
        if segment.kind != RECORDS:
            raise ValueError("batch lives in object storage; load it and use record_with_max_timestamp")
        return self.record_with_max_timestamp(segment.read_batch(location))

    # --- retention and deletion ------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """Move the log start offset forward (DeleteRecords); returns the new log start offset."""
        if offset > self.high_watermark:
            raise OffsetOutOfRange(f"offset {offset} is above the high watermark {self.high_watermark}")
        if offset > self.log_start_offset:
            self._set_log_start(offset)
            self._delete_segments_below_start()
        return self.log_start_offset

    def apply_retention(self, now_ms: int) -> int:
        """Delete segments past retention.ms / retention.bytes; returns how many were deleted.
        Idle producers' state goes too (producer.id.expiration.ms)."""
        self.producer_state.expire(now_ms, self.config.producer_id_expiration_ms, self.txns.ongoing)
        deleted = 0
        if not self.config.delete:
            # cleanup.policy=compact alone: records go only by being superseded (the cleaner).
            return self._delete_segments_below_start()
        if self.config.retention_ms >= 0:
            expired_tier = self._expire_tiers(lambda info: now_ms - info.max_timestamp > self.config.retention_ms)
            if not expired_tier:
                deleted += self._delete_oldest(
                    lambda seg: now_ms - seg.max_timestamp > self.config.retention_ms, now_ms
                )
        if self.config.retention_bytes >= 0:
            # A diskless partition is as big as the batches it points to: a pointer entry is ~100
            # bytes whatever the batch, so counting entries would keep ~100x the data asked for.
            excess = self.data_bytes - self.config.retention_bytes

            def tier_over_size(info: segment_object.SegmentInfo) -> bool:
                nonlocal excess
                if excess - info.size < 0:
                    return False
                excess -= info.size
                return True

            if self._expire_tiers(tier_over_size):
                return deleted + self._delete_segments_below_start()

            def over_size(seg: LogSegment) -> bool:
                nonlocal excess
                if excess - seg.data_bytes < 0:
                    return False
                excess -= seg.data_bytes
                return True

            deleted += self._delete_oldest(over_size, now_ms)
        deleted += self._delete_segments_below_start()
        return deleted

    def _delete_oldest(self, expired: Callable[[LogSegment], bool], now_ms: int) -> int:
        """Delete a prefix of segments, oldest first, while ``expired`` holds (Kafka's rule)."""
        victims: list[LogSegment] = []
        for segment in self.segments:
            next_base = segment.next_offset
            # An empty segment other than the active one is one the cleaner emptied: it expires.
            empty_active = segment.size == 0 and segment is self.segments[-1]
            if empty_active or next_base > self.high_watermark or not expired(segment):
                break
            victims.append(segment)
        if not victims:
            return 0
        if victims[-1] is self.active_segment:
            self.roll(now_ms)
        for segment in victims:
            self.segments.remove(segment)
            self._retire(segment)
        self._set_log_start(max(self.log_start_offset, self.segments[0].base_offset))
        return len(victims)

    def _delete_segments_below_start(self) -> int:
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= self.log_start_offset:
            self._retire(self.segments.pop(0))
            deleted += 1
        if self.active_segment.size and self.active_segment.next_offset <= self.log_start_offset:
            # Everything in the active segment is below the start: replace it with an empty one.
            self._retire(self.segments.pop())
            self.segments.append(LogSegment(self.directory, self.log_start_offset, self.config.index_interval_bytes, 0))
            self.recovery_point = max(self.recovery_point, self.log_start_offset)
            deleted += 1
            self.on_change()  # the log end moved up to the start
        return deleted

    def retire_segment(self, segment: LogSegment) -> None:
        """Drop a segment the caller has taken out of ``segments`` (the cleaner replacing it)."""
        self._retire(segment)

    def _retire(self, segment: LogSegment) -> None:
        """Drop a segment the log no longer lists: at once with ``file.delete.delay.ms`` 0, else
        renamed ``.deleted`` and removed after the delay (Kafka's deleteSegmentFiles), so that a
        reader holding it across an await (a ListOffsets by timestamp loading a batch) does not
        read a closed, or reused, descriptor."""
        if self.config.file_delete_delay_ms <= 0:
            segment.delete()
            return
        segment.mark_deleted()
        self.retired.append(RetiredSegment(segment))

    def remove_retired_segments(self, now_ms: int) -> int:
        """Remove the files of retired segments whose delay has passed; a segment retired since the
        last call gets its due time now. Returns how many were removed."""
        if not self.retired:
            return 0
        kept: list[RetiredSegment] = []
        for retired in self.retired:
            if retired.due_ms is None:
                retired.due_ms = now_ms + self.config.file_delete_delay_ms
            if retired.due_ms <= now_ms:
                retired.segment.delete()
            else:
                kept.append(retired)
        removed = len(self.retired) - len(kept)
        self.retired = kept
        return removed

    # --- WAL object references (diskless) ------------------------------------------------------

    def references(self, object_key: str) -> bool:
        """Whether any pointer at or after the log start points into ``object_key``.

        Kept incrementally on append; rebuilt from the segments' counts after the rare changes that
        drop references (retention, DeleteRecords, truncation), so answers are O(1).
        """
        if object_key.startswith(segment_object.SEGMENTS_PREFIX):
            return any(object_key in (t.info.log_key, t.info.index_key) for t in self.tiers)
        return self._refs()[object_key] > 0

    def _refs(self) -> Counter[str]:
        if self._wal_refs_stale:
            total: Counter[str] = Counter()
            for segment in self.segments:
                total.update(segment.wal_refs)
            self._wal_refs = total
            self._wal_refs_stale = False
        return self._wal_refs

    def _note_pointer(self, entry: bytes | bytearray | memoryview) -> None:
        if not self._wal_refs_stale:
            key = pointer.entry_key(entry, 0)
            if key is not None:
                self._wal_refs[key] += 1

    def _set_log_start(self, offset: int) -> None:
        self._apply_ref_floor(offset)
        if self.tiers and self.tiers[0].last_offset < offset:
            self.tiers = [t for t in self.tiers if t.last_offset >= offset]
            self._tiered_aborts = [a for a in self._tiered_aborts if a.last_offset >= offset]
            self._write_tier_manifest()
        self.txns.drop_before(offset)
        self.log_start_offset = offset
        self.epochs.truncate_from_start(offset)
        # Durable: the WAL manager deletes objects below it once we answer that we no longer
        # reference them; an older log start back after a power loss would point below it.
        replace_durably(os.path.join(self.directory, LOG_START_FILE), str(offset).encode())

    def _apply_ref_floor(self, offset: int) -> None:
        """References below the log start are gone: recount the segment the start falls into."""
        self._wal_refs_stale = True
        for segment in self.segments:
            if segment.kind != POINTERS or segment.ref_floor >= offset:
                continue
            if segment.next_offset <= offset:
                segment.ref_floor = offset
                segment.wal_refs.clear()
            else:
                segment.set_ref_floor(offset)

    # --- tiering (diskless/tiering/entry.py) ------------------------------------------------------

    @property
    def tier_end(self) -> int:
        """The first offset a next TierCommit must start at (tiers appended, in effect or not)."""
        if self.tiers:
            return self.tiers[-1].last_offset + 1
        location = None
        for segment in self._segments_from(self.log_start_offset):
            location = segment.locate(self.log_start_offset)
            if location is not None:
                break
        return location.base_offset if location is not None else self.log_start_offset

    @property
    def tiered_end(self) -> int:
        """Offsets below this (and at or after the log start) are served from segment objects."""
        return self._tier_floor

    def tier_at(self, offset: int) -> Tier:
        i = bisect.bisect_left([t.last_offset for t in self.tiers], offset)
        return self.tiers[min(i, len(self.tiers) - 1)]

    def pointer_bytes(self) -> int:
        """Bytes of pointer segments on disk (what tiering bounds)."""
        return sum(s.size for s in self.segments if s.kind == POINTERS)

    def tiers_possible(self) -> bool:
        """Whether this log has pointer segments (a diskless partition, now or before)."""
        return any(s.kind == POINTERS for s in self.segments)

    def range_digest(self, base: int, last: int) -> tuple[int, int, int]:
        """(digest, batches, bytes) of the entries [base, last] exactly (segment_object's digest).

        Raises TierCommitError when the range does not start and end on entries of pointer segments."""
        digest = batches = size = 0
        expected = base
        for segment in self._segments_from(base):
            if segment.base_offset > last:
                break
            for _, header, _ in segment.iter_entries(segment.offset_index.lookup(base)):
                if header.last_offset < base:
                    continue
                if header.base_offset > last:
                    break
                if segment.kind != POINTERS:
                    raise TierCommitError(
                        "invalid_request", f"offset {header.base_offset} is not in a diskless segment"
                    )
                if header.base_offset != expected or header.last_offset > last:
                    raise TierCommitError(
                        "invalid_request", f"[{base}, {last}] does not fall on batch boundaries at {header.base_offset}"
                    )
                digest = segment_object.digest_update(digest, header)
                batches += 1
                size += header.size
                expected = header.last_offset + 1
        if expected != last + 1:
            raise TierCommitError("invalid_request", f"the log holds no batches [{expected}, {last}]")
        return digest, batches, size

    def append_tier_as_leader(self, info: segment_object.SegmentInfo, leader_epoch: int, now_ms: int) -> int | None:
        """Validate a TierCommit and append its tier entry; returns the entry's offset, or None when
        exactly this segment is already tiered here (a rerun of a job that committed it).

        Raises TierCommitError (nothing changed) for a range not contiguous with what is tiered,
        not below the last stable offset, not on batch boundaries, or whose digest, batch count or
        size differ from the log's entries."""
        if any(t.info == info for t in self.tiers):
            return None
        if self.active_segment.kind != POINTERS:
            raise TierCommitError("invalid_request", "the partition is not diskless")
        expected = self.tier_end
        if info.base_offset != expected:
            raise TierCommitError(
                "invalid_request", f"segment starts at {info.base_offset}, the next range to tier starts at {expected}"
            )
        if info.last_offset < info.base_offset or info.last_offset >= self.last_stable_offset:
            raise TierCommitError(
                "invalid_request",
                f"segment ends at {info.last_offset}, not below the last stable offset {self.last_stable_offset}",
            )
        digest, batches, size = self.range_digest(info.base_offset, info.last_offset)
        if (digest, batches, size) != (info.digest, info.batches, info.size):
            raise TierCommitError(
                "corrupt_message",
                f"segment [{info.base_offset}, {info.last_offset}] does not hold the log's batches "
                f"(digest {info.digest:#x}/{digest:#x}, batches {info.batches}/{batches}, bytes {info.size}/{size})",
            )
        self.roll(now_ms)
        batch = bytearray(tier_batch(info, now_ms))
        offset = self.log_end_offset
        self.epochs.assign(leader_epoch, offset)
        records.assign_offset(batch, offset, leader_epoch)
        self._append(pointer.encode_inline_entry(batch), offset, offset, now_ms, now_ms, POINTERS)
        self._add_tier(Tier(info, offset))
        self._flush_if_unflushed_messages(now_ms)
        return offset

    def tier_state_for_replica(self) -> bytes:
        """What a replica fetching below our pointer entries gets (``adopt_tier_state`` there)."""
        aborted = [[a.producer_id, a.first_offset, a.last_offset] for a in self._tiered_aborts]
        resume = self.segments[0].base_offset
        tiers = [t for t in self.tiers if t.entry_offset < resume]
        return wrap_tier_state(tiers, aborted, self.log_start_offset, resume)

    def adopt_tier_state(self, state: dict[str, Any], now_ms: int) -> None:
        """A follower behind the leader's pointer entries: drop our log and continue where the
        leader's entries resume, with its tiers (committed there) serving everything below."""
        resume = int(state["resume"])
        self.truncate_fully_and_start_at(resume, now_ms)
        self.tiers = list(state["tiers"])
        self._tiered_aborts = [AbortedTxn(*a) for a in state["aborted"]]
        self.log_start_offset = min(resume, int(state["log_start"]))
        self._set_log_start(self.log_start_offset)
        self._settle_tier_floor()
        self._write_tier_manifest()
        self._rebuild_txn_index()

    def _tier_of_entry(
        self, entry: bytes | bytearray | memoryview, header: records.BatchHeader
    ) -> segment_object.SegmentInfo | None:
        if not may_be_tier(header):
            return None
        decoded, _ = pointer.decode_entry(entry, 0)
        return decode_tier_batch(decoded.batch) if isinstance(decoded, pointer.InlineEntry) else None

    def _add_tier(self, tier: Tier) -> None:
        self.tiers.append(tier)
        self._settle_tier_floor()  # a replica that adopted its leader's tiers gets the entry after
        self._write_tier_manifest()
        if tier.entry_offset < self.high_watermark:
            self._activate_tiers()

    def _activate_tiers(self) -> None:
        """Put tier entries below the high watermark in effect (irreversible: they are committed):
        their ranges are read from segment objects, reference no WAL object, and pointer segments
        wholly inside them are deleted."""
        end = self._tier_floor
        for tier in reversed(self.tiers):
            if tier.entry_offset < self._high_watermark:
                end = max(end, tier.last_offset + 1)
                break
        if end <= self._tier_floor:
            return
        self._tier_floor = end
        self._apply_ref_floor(max(end, self.log_start_offset))
        self._tiered_aborts = sorted(
            set(self._tiered_aborts) | {a for a in self.txns.aborted if a.first_offset < end},
            key=lambda a: a.last_offset,
        )
        while len(self.segments) > 1 and self.segments[0].next_offset <= end:
            self._retire(self.segments.pop(0))
        self._write_tier_manifest()

    def _detached_tiers(self) -> list[Tier]:
        """Tiers in effect whose range has no pointer segment left (only segment objects hold it)."""
        first_local = self.segments[0].base_offset
        return [
            t
            for t in self.tiers
            if t.last_offset < first_local
            and t.last_offset < self._tier_floor
            and t.last_offset >= self.log_start_offset
        ]

    def _expire_tiers(self, expired: Callable[[segment_object.SegmentInfo], bool]) -> bool:
        """Move the log start past detached tiers, oldest first, while ``expired`` holds; True when
        some detached tier is left (then no pointer segment may expire before it)."""
        detached = self._detached_tiers()
        for i, tier in enumerate(detached):
            if not expired(tier.info):
                return True
            self._set_log_start(max(self.log_start_offset, tier.last_offset + 1))
            if i == len(detached) - 1:
                return False
        return False

    def _write_tier_manifest(self) -> None:
        path = os.path.join(self.directory, TIER_FILE)
        if not self.tiers and not self._tiered_aborts:
            if os.path.exists(path):
                os.unlink(path)
            return
        body = {
            "tiers": [t.to_list() for t in self.tiers],
            "aborted": [[a.producer_id, a.first_offset, a.last_offset] for a in self._tiered_aborts],
            # In effect up to here: not derivable after a crash from the high watermark checkpoint,
            # which may predate an entry that took effect (and whose pointer segments are gone).
            "floor": self._tier_floor,
        }
        replace_durably(path, msgpack.packb(body))  # the floor is a promise to the WAL manager too

    def _load_tiers(self) -> None:
        """Tiers from the manifest (written on every change), then any tier entry a crash kept out
        of it: each starts its segment, so only first entries are looked at."""
        floor = 0
        try:
            with open(os.path.join(self.directory, TIER_FILE), "rb") as f:
                body = msgpack.unpackb(f.read())
            self.tiers = [Tier.from_list(t) for t in body["tiers"]]
            self._tiered_aborts = [AbortedTxn(*a) for a in body["aborted"]]
            floor = int(body.get("floor", 0))  # absent in manifests of older versions
        except (FileNotFoundError, ValueError, KeyError, TypeError, segment_object.CorruptSegment):
            self.tiers = []
        end = self.log_end_offset
        self.tiers = [t for t in self.tiers if t.entry_offset < end]
        after = self.tiers[-1].entry_offset if self.tiers else -1
        for segment in self.segments:
            if segment.kind != POINTERS or segment.base_offset <= after or segment.size == 0:
                continue
            found = segment._entry_at(0)
            if found is None or not may_be_tier(found[0]):
                continue
            info = self._tier_of_entry(segment.read_batch(next(segment.iter_batches(0))), found[0])
            if info is not None and (not self.tiers or info.base_offset == self.tiers[-1].last_offset + 1):
                self.tiers.append(Tier(info, segment.base_offset))
        self._tier_floor = min(floor, self.tiers[-1].last_offset + 1) if self.tiers else 0
        self._settle_tier_floor()
        self._write_tier_manifest()

    def _settle_tier_floor(self) -> None:
        """A tier starting below our first pointer segment is in effect: its entry took effect
        before the pointers of its range were deleted (``_activate_tiers``), or it came from the
        leader's committed tiers (``adopt_tier_state``). Offsets there are served from segment
        objects or not at all: reading on from the first segment would skip them."""
        first_local = self.segments[0].base_offset
        for tier in reversed(self.tiers):
            if tier.base_offset < first_local:
                self._tier_floor = max(self._tier_floor, tier.last_offset + 1)
                return

    # --- truncation (replication) ----------------------------------------------------------------

    def truncate_to(self, offset: int, now_ms: int) -> None:
        """Remove everything at or after ``offset`` (a follower diverged from its leader)."""
        if offset >= self.log_end_offset:
            # No record to remove, but an epoch may start at the log end: this replica led it and
            # appended nothing before another leader was elected. Kept, every later fetch would
            # diverge at it again and the replica would never copy another record (as Kafka's
            # UnifiedLog.truncateTo, the cache is truncated anyway).
            self.epochs.truncate_from_end(self.log_end_offset)
            return
        self._wal_refs_stale = True
        self.layout_epoch += 1
        if self.tiers and self.tiers[-1].entry_offset >= offset:
            self.tiers = [t for t in self.tiers if t.entry_offset < offset]
            self._write_tier_manifest()
        while len(self.segments) > 1 and self.active_segment.base_offset >= offset:
            self._retire(self.segments.pop())
        if self.active_segment.base_offset >= offset:
            self._retire(self.segments.pop())
            self.segments.append(LogSegment(self.directory, offset, self.config.index_interval_bytes, now_ms))
        else:
            cut = self.active_segment.locate(offset)
            self.active_segment.truncate_to(offset)
            if self.log_end_offset < offset and (cut is None or cut.base_offset >= offset):
                self._end_at(offset, now_ms)
        if self.log_end_offset < self.log_start_offset:
            # The removed batch straddled the log start (DeleteRecords mid-batch): as Kafka does,
            # continue empty at the log start instead of below it.
            self.truncate_fully_and_start_at(self.log_start_offset, now_ms)
            return
        self.epochs.truncate_from_end(self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self._truncate_cleaner_checkpoint()
        self._rebuild_producer_state()
        self._rebuild_txn_index()
        self.on_change()  # the log end moved even where the high watermark did not

    def _end_at(self, offset: int, now_ms: int) -> None:
        """Move the log end up to ``offset`` across a gap compaction left below it (no batch was
        cut through): Kafka's LocalLog.truncateTo sets the log end to the target whatever the
        segment holds. Left at the last batch below the gap, the high watermark falls under the
        target, and the replica, elected before its next fetch, hands out again offsets its old
        leader had committed. An empty segment at ``offset`` keeps that end across a restart."""
        active = self.active_segment
        if active.size == 0:
            self._retire(self.segments.pop())
        else:
            active.on_roll()
        self.segments.append(LogSegment(self.directory, offset, self.config.index_interval_bytes, now_ms, active.kind))

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Drop the whole log and continue at ``offset`` (a follower behind the leader's log start)."""
        self._wal_refs_stale = True
        self.layout_epoch += 1
        for segment in self.segments:
            self._retire(segment)
        self.segments = [LogSegment(self.directory, offset, self.config.index_interval_bytes, now_ms)]
        self.recovery_point = offset  # an empty log: nothing to flush
        self.tiers = []
        self._tier_floor = 0
        self._tiered_aborts = []
        self._write_tier_manifest()
        self._set_log_start(offset)
        self.epochs.truncate_from_end(offset)
        self.high_watermark = offset
        self._truncate_cleaner_checkpoint()
        # No snapshot describes the new log, not even one at ``offset`` written for the old one.
        delete_snapshots(self.directory)
        self._rebuild_producer_state()
        self._rebuild_txn_index()
        self.on_change()

    def _truncate_cleaner_checkpoint(self) -> None:
        """What is appended from the new log end on was never in a key map: the next pass's dirty
        part starts there at the latest (Kafka's maybeTruncateCheckpoint). Left above, a tombstone
        appended there would never supersede the older values of its key, and would outlive them."""
        if self.cleaner_checkpoint > self.log_end_offset:
            self.cleaner_checkpoint = self.log_end_offset
            cleaner.write_checkpoint(self.directory, self.cleaner_checkpoint)

    # --- lifecycle ------------------------------------------------------------------------------

    def update_config(self, config: LogConfig) -> None:
        self.config = config
        for segment in self.segments:
            segment.index_interval_bytes = config.index_interval_bytes

    @property
    def unflushed_messages(self) -> int:
        """Offsets appended since the last flush (Kafka's UnifiedLog.unflushedMessages)."""
        return self.log_end_offset - self.recovery_point

    def flush(self, now_ms: int) -> None:
        """fsync the log up to its end: the active segment with its indexes (earlier segments were
        synced when they rolled) and the leader-epoch checkpoint."""
        self.active_segment.fsync()
        self.epochs.flush()
        self._flushed(self.log_end_offset, now_ms)

    def _flushed(self, offset: int, now_ms: int) -> None:
        self.recovery_point = offset
        self.last_flush_ms = now_ms

    def flush_if_stale(self, now_ms: int) -> bool:
        """``flush.ms``: fsync when the last flush is at least that old and something was appended
        since (Kafka's LogManager.flushDirtyLogs; the broker calls this periodically). True when
        it flushed."""
        if now_ms - self.last_flush_ms < self.config.flush_ms or self.unflushed_messages <= 0:
            return False
        self.flush(now_ms)
        return True

    def _flush_if_unflushed_messages(self, now_ms: int) -> None:
        """``flush.messages``: after an append, as Kafka's UnifiedLog.append, fsync once that many
        offsets are unflushed (Kafka's default, Long.MAX, never does)."""
        if self.unflushed_messages >= self.config.flush_messages:
            self.flush(now_ms)

    def close(self, clean: bool = True) -> None:
        self.layout_epoch += 1
        if clean:
            if self._hw_file:
                self.checkpoint_high_watermark()
            write_snapshot(self.directory, self.log_end_offset, self.producer_state)
        for segment in self.segments:
            if clean:
                segment.fsync()
            segment.close()
        for retired in self.retired:
            retired.segment.close()  # the files stay; the next load removes them, as Kafka's does
        self.retired = []
        if clean:
            self.epochs.flush()
            open(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE), "w").close()

    def delete(self) -> None:
        self.layout_epoch += 1
        for segment in self.segments + [r.segment for r in self.retired]:
            segment.delete()
        self.retired = []
        shutil.rmtree(self.directory)

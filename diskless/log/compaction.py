"""The sans-IO core of log compaction (``cleanup.policy=compact``): which records of a log survive a
cleaning pass, and the bytes of the batches that replace the originals.

It follows Apache Kafka's log cleaner (LogCleaner's ``Cleaner`` and ``CleanedTransactionMetadata``,
``MemoryRecords.filterTo``, KIP-534's delete horizon). A pass has two steps, both driven by the
caller (which reads segments, writes the cleaned ones and swaps them in):

1. ``KeyMap``: the dirty batches, in offset order, until the map is full: for every key, the offset
   of its latest record (aborted transactional batches and control batches contribute no keys).
2. ``BatchCleaner``: every batch from the log start to the end of the map's range (and, as Kafka,
   the rest of the segment holding it), in offset order: ``clean`` says what to write instead of
   each batch. A record survives if it lies beyond the map, or is its key's latest record and not
   a tombstone whose delete horizon has passed. Aborted data goes; transaction markers go once
   their transaction holds no data any more and their own delete horizon has passed.

Nothing here touches files, clocks or the event loop: time is passed in, batches are bytes in and
bytes out. Only v2 batches exist in this broker, so older message formats are refused.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from diskless.log.txn_index import CONTROL_ABORT, CONTROL_COMMIT, AbortedTxn
from diskless.protocol import compression, records
from diskless.protocol.varint import read_zigzag, write_zigzag

__all__ = [
    "DELETE_HORIZON_FLAG",
    "BatchCleaner",
    "CleanStats",
    "CleanedTransactions",
    "KeyMap",
    "RawRecord",
    "delete_horizon",
    "is_aborted",
    "parse_records",
]

# KIP-534: attribute bit 6 says the batch's base timestamp is its delete horizon, the time after
# which a cleaning pass may remove its tombstones (and, for a control batch, the marker itself).
DELETE_HORIZON_FLAG = 0x40

INT64_MAX = 2**63 - 1

# The key digest. Kafka's SkimpyOffsetMap keeps MD5 digests of keys, not keys, so the map's memory
# does not depend on key sizes; so does this one, with 128-bit BLAKE2b. Two distinct keys with the
# same digest would make the older one look superseded and drop it. Among n distinct keys the
# chance that any two collide is about n^2 / 2^129: 1.5e-21 for a billion keys. BLAKE2b is a
# cryptographic hash, so (unlike MD5) nobody can craft colliding keys to erase another's record.
DIGEST_SIZE = 16


# Kafka rebuilds a batch with ``Compression.of(type).build()``: every codec at its default level.
_GZIP_DEFAULT_LEVEL = 6  # java.util.zip.Deflater's DEFAULT_COMPRESSION
_ZSTD_DEFAULT_LEVEL = 3  # zstd's own default, Kafka's ZstdCompression.DEFAULT_LEVEL
_DEFAULT_LEVELS = {1: _GZIP_DEFAULT_LEVEL, 3: compression.LZ4_DEFAULT_LEVEL, 4: _ZSTD_DEFAULT_LEVEL}

# The batch header, packed when a batch is rebuilt (records.py only ever reads headers).
_HEADER = struct.Struct(">qiibIhiqqqhii")
_UINT32 = struct.Struct(">I")
_EMPTY_BATCH_LENGTH = records.HEADER_SIZE - records.LOG_OVERHEAD
# What an emptied batch keeps of its attributes (Kafka's writeEmptyHeader recomputes them from
# these three): no codec (there is no body) and no delete horizon (there is nothing to delete).
_EMPTY_KEEPS = records.TIMESTAMP_TYPE_LOG_APPEND | records.TRANSACTIONAL_FLAG | records.CONTROL_FLAG

_CONTROL_KEY = struct.Struct(">hh")  # version, type
_UNKNOWN_CONTROL = -1


def delete_horizon(header: records.BatchHeader) -> int | None:
    """The batch's delete horizon (ms), None while no cleaning pass has set one."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON_FLAG else None


# --- records -------------------------------------------------------------------------------------


class RawRecord(NamedTuple):
    """One record of a decoded batch body, located rather than copied: a record the cleaner keeps
    is written back from these positions, its bytes unchanged but for the timestamp delta."""

    start: int  # the record's length varint
    end: int  # just past the record
    attributes: int
    timestamp_delta: int
    offset_delta: int
    tail: int  # the offset delta varint: offset delta, key, value and headers are copied from here
    key: bytes | memoryview | None
    has_value: bool


def _corrupt(message: str) -> records.InvalidBatch:
    return records.InvalidBatch("corrupt_message", message)


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    byte = buf[pos]  # IndexError past the end, as read_zigzag raises it here
    if byte < 0x80:  # most record fields fit one byte: no call into the general reader
        return (byte >> 1) ^ -(byte & 1), pos + 1
    return read_zigzag(buf, pos, error=IndexError)


def parse_records(header: records.BatchHeader, body: bytes | memoryview) -> list[RawRecord]:
    """Every record of a (decompressed) batch body. Each is checked to end exactly where its length
    says and the body to hold exactly ``record_count`` of them, as Kafka's DefaultRecord.readFrom
    does: a corrupt batch raises InvalidBatch rather than being rewritten, with a fresh CRC, into
    one that looks sound."""
    out: list[RawRecord] = []
    size = len(body)
    pos = 0
    try:
        for _ in range(header.record_count):
            start = pos
            length, pos = _varint(body, pos)
            end = pos + length
            if length <= 0 or end > size:
                raise _corrupt(f"record of {length} bytes at {start} overruns a {size}-byte batch body")
            attributes = body[pos]
            timestamp_delta, pos = _varint(body, pos + 1)
            tail = pos
            offset_delta, pos = _varint(body, pos)
            key_length, pos = _varint(body, pos)
            key = None
            if key_length >= 0:
                key = body[pos : pos + key_length]
                pos += key_length
            value_length, pos = _varint(body, pos)
            pos += max(value_length, 0)
            headers, pos = _varint(body, pos)
            if headers < 0 or headers > end - pos:  # each header takes two bytes at least
                raise _corrupt(f"record at {start} declares {headers} headers")
            for _ in range(headers):
                name_length, pos = _varint(body, pos)
                if name_length < 0:
                    raise _corrupt(f"record at {start} has a header with a null name")
                header_value_length, pos = _varint(body, pos + name_length)
                pos += max(header_value_length, 0)
            if pos != end:
                raise _corrupt(f"record at {start} is {length} bytes long but its fields take {pos - start} bytes")
            out.append(RawRecord(start, end, attributes, timestamp_delta, offset_delta, tail, key, value_length >= 0))
    except IndexError:
        raise _corrupt("record runs past the end of the batch body") from None
    if pos != size:
        raise _corrupt(f"{size - pos} bytes follow the batch's {header.record_count} records")
    return out


def _checked_header(batch: memoryview) -> records.BatchHeader:
    header = records.parse_header(batch)
    if header.magic != 2:
        # Kafka's cleaner still converts v0/v1 message sets; this broker never stores any.
        raise records.InvalidBatch(
            "corrupt_message", f"log compaction handles v2 record batches only, found magic {header.magic}"
        )
    if header.size != len(batch):
        raise _corrupt(f"batch of {len(batch)} bytes declares {header.size}")
    return header


def _body(batch: memoryview, header: records.BatchHeader, max_decompressed: int) -> bytes | memoryview:
    if header.compression == 0:
        # A copy: indexing bytes is ~2x faster than a memoryview, and the records are read byte by byte.
        return bytes(batch[records.HEADER_SIZE :])
    return records.decompress_body(header.compression, bytes(batch[records.HEADER_SIZE :]), max_decompressed)


def _digest(key: bytes | memoryview) -> bytes:
    return hashlib.blake2b(key, digest_size=DIGEST_SIZE).digest()


def _control_type(record: RawRecord) -> int:
    """ABORT, COMMIT or another control type of a control batch's first record; a key Kafka could
    not parse (shorter than version + type, negative version) is an unknown type, kept for good
    (Kafka would fail the whole cleaning pass on it, forever)."""
    key = record.key
    if key is None or len(key) < _CONTROL_KEY.size:
        return _UNKNOWN_CONTROL
    version, kind = _CONTROL_KEY.unpack_from(key, 0)
    return _UNKNOWN_CONTROL if version < 0 else kind


# --- the key map ---------------------------------------------------------------------------------


class KeyMap:
    """Key -> offset of its latest record, over a contiguous run of batches (Kafka's OffsetMap).

    Keys are held as 128-bit digests (see ``DIGEST_SIZE``), so an entry costs the same whatever the
    key's size. Filling stops at whole batches: a map covers up to the end of the last batch it
    took, so a batch's records are never half in and half out of it."""

    def __init__(self, max_entries: int, *, max_decompressed: int = records.DEFAULT_MAX_DECOMPRESSED_BYTES) -> None:
        if max_entries < 0:
            raise ValueError(f"a key map holds at least 0 entries, not {max_entries}")
        self.max_entries = max_entries
        self._max_decompressed = max_decompressed
        self._offsets: dict[bytes, int] = {}
        self._end = -1

    def add_batch(self, batch: bytes | bytearray | memoryview, aborted: bool) -> bool:
        """Account for the next batch (offset order). Control batches and aborted transactional
        batches add no keys but advance end_offset. Returns False and changes nothing if the
        batch's keys would take the map past max_entries (the caller stops there: the map then
        covers the batches added so far); this holds for an empty map too, whose caller then has
        nothing to clean with (Kafka's map would take part of the batch; a larger map is needed)."""
        view = memoryview(batch)
        header = _checked_header(view)
        if header.base_offset < self._end:
            raise ValueError(f"batch at offset {header.base_offset} follows one ending at {self._end - 1}")
        if not (header.is_control or aborted):
            # A later record of a key in the same batch replaces an earlier one, as Kafka puts them in order.
            latest: dict[bytes, int] = {}
            for record in parse_records(header, _body(view, header, self._max_decompressed)):
                if record.key is not None:
                    latest[_digest(record.key)] = header.base_offset + record.offset_delta
            new_keys = sum(1 for digest in latest if digest not in self._offsets)
            if len(self._offsets) + new_keys > self.max_entries:
                return False
            self._offsets.update(latest)
        self._end = header.last_offset + 1
        return True

    @property
    def end_offset(self) -> int:
        """The last offset of the last batch added + 1; -1 when empty (Kafka's latestOffset + 1,
        except that an empty map says -1 rather than 0: it covers nothing, and with ``offset >=
        end_offset`` every record counts as beyond it, which is what Kafka's latestOffset -1 does)."""
        return self._end

    def latest(self, key: bytes | memoryview) -> int | None:
        """The offset of the key's latest record in the covered range, None if it has none."""
        return self._offsets.get(_digest(key))

    def __len__(self) -> int:
        return len(self._offsets)


# --- transactions --------------------------------------------------------------------------------


def is_aborted(header: records.BatchHeader, aborted: Sequence[AbortedTxn]) -> bool:
    """Whether a transactional data batch belongs to an aborted transaction: its producer's, begun
    at or before the batch's last offset and ended by a marker after its base offset. A scan of
    ``aborted``, for a caller filling a ``KeyMap`` over a few batches; ``CleanedTransactions``
    decides the same for a whole log in one pass."""
    if not header.is_transactional or header.is_control:
        return False
    last = header.last_offset
    return any(
        txn.producer_id == header.producer_id and txn.first_offset <= last and header.base_offset < txn.last_offset
        for txn in aborted
    )


class _AbortedInProgress:
    __slots__ = ("observed", "txn")

    def __init__(self, txn: AbortedTxn) -> None:
        self.txn = txn
        self.observed = False  # a batch of it was met in this pass: its marker must stay


class CleanedTransactions:
    """The transactions a cleaning pass walks through (Kafka's CleanedTransactionMetadata).

    Fed every batch in offset order, it says whether a data batch is aborted (and may go) and
    whether a control batch's marker no longer guards any data (and may go once its horizon has
    passed). An ABORT marker must stay while a batch of its transaction is still in the log, or a
    read_committed consumer would see that batch; a COMMIT marker while data of its transaction is,
    so that the data is not read as part of an open transaction. The first pass that finds the data
    gone sets the marker's delete horizon; a later one removes it. Aborted transactions whose
    markers stay are listed in ``kept_aborted``: the cleaned log's transaction index."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda txn: txn.first_offset)
        self._next = 0
        self._aborted: dict[int, _AbortedInProgress] = {}  # producer id -> its aborted transaction
        self._committed: set[int] = set()  # producers with data of a not-aborted transaction met
        self.kept_aborted: list[AbortedTxn] = []

    def _reach(self, offset: int) -> None:
        # An aborted transaction is open from its first offset to its marker.
        while self._next < len(self._pending) and self._pending[self._next].first_offset <= offset:
            txn = self._pending[self._next]
            self._next += 1
            current = self._aborted.get(txn.producer_id)
            if current is None or current.txn.last_offset < txn.first_offset:
                self._aborted[txn.producer_id] = _AbortedInProgress(txn)

    def _aborted_at(self, producer_id: int, offset: int) -> _AbortedInProgress | None:
        """The producer's aborted transaction still open at ``offset``. Kafka trusts its aborted
        list to name only transactions whose markers are in the log (the cleaned segments' index);
        one whose marker lies behind ``offset`` was removed by an earlier pass and is ignored here,
        or the producer's next transaction would look aborted and its data be dropped."""
        in_progress = self._aborted.get(producer_id)
        if in_progress is not None and in_progress.txn.last_offset < offset:
            del self._aborted[producer_id]
            return None
        return in_progress

    def on_data_batch(self, header: records.BatchHeader) -> bool:
        """A data batch was read; True if it is aborted (discardable)."""
        self._reach(header.last_offset)
        if not header.is_transactional:
            return False
        in_progress = self._aborted_at(header.producer_id, header.base_offset)
        if in_progress is not None:
            in_progress.observed = True
            return True
        self._committed.add(header.producer_id)
        return False

    def on_control_batch(self, header: records.BatchHeader, control_type: int | None) -> bool:
        """A control batch was read (``control_type`` of its first record, None if it has none);
        True if its marker guards no data any more (discardable once its horizon has passed)."""
        self._reach(header.last_offset)
        if control_type is None:
            return True  # emptied by an earlier pass
        if control_type == CONTROL_ABORT:
            in_progress = self._aborted_at(header.producer_id, header.base_offset)
            self._aborted.pop(header.producer_id, None)
            if in_progress is not None and in_progress.observed:
                self.kept_aborted.append(in_progress.txn)
                return False
            return True
        if control_type == CONTROL_COMMIT:
            if header.producer_id in self._committed:
                self._committed.discard(header.producer_id)
                return False
            return True
        return False  # another control record (KRaft's): never removed


# --- cleaning ------------------------------------------------------------------------------------


@dataclass(slots=True)
class CleanStats:
    """What a pass read and wrote (Kafka's CleanerStats, and why batches changed)."""

    batches_read: int = 0
    records_read: int = 0
    bytes_read: int = 0
    batches_written: int = 0
    records_written: int = 0
    bytes_written: int = 0
    batches_unchanged: int = 0  # written as they were, byte for byte
    batches_rewritten: int = 0  # re-encoded: records dropped or a delete horizon set
    batches_emptied: int = 0  # kept without records: a producer's last batch, the pass's last batch
    batches_dropped: int = 0
    aborted_batches_dropped: int = 0
    markers_dropped: int = 0
    tombstones_dropped: int = 0
    keyless_dropped: int = 0  # Kafka's invalidMessagesRead: a compacted topic's records need keys
    horizons_set: int = 0


class BatchCleaner:
    """One cleaning pass: batches of the cleanable range, in offset order, from the log start.

    ``last_batch_of_producers`` maps each active producer to the last offset of its last data
    batch: that batch is kept, empty if need be, so the producer's sequence and epoch survive in
    the log. ``marker_epochs`` maps each active producer whose state holds no data batch (a marker
    bumped its epoch: a fenced transaction's ABORT) to that epoch: its control batches at that
    epoch are kept, empty if need be, so that the epoch still fences older ones in a log replayed
    without snapshots (Kafka's isBatchLastRecordOfProducer, third case). ``round_end_offset``,
    the first offset past the cleaned range, likewise keeps the batch ending there, so the log's
    end offset survives."""

    def __init__(
        self,
        key_map: KeyMap,
        aborted: Sequence[AbortedTxn],
        last_batch_of_producers: Mapping[int, int],
        now_ms: int,
        delete_retention_ms: int,
        *,
        round_end_offset: int | None = None,
        marker_epochs: Mapping[int, int] | None = None,
        max_decompressed: int = records.DEFAULT_MAX_DECOMPRESSED_BYTES,
    ) -> None:
        self._map = key_map
        self._txns = CleanedTransactions(aborted)
        self._last_of_producers = last_batch_of_producers
        self._marker_epochs = marker_epochs or {}
        self._now = now_ms
        # Clamped: Kafka's long would wrap a huge delete.retention.ms into a horizon in the past.
        self._new_horizon = min(now_ms + max(delete_retention_ms, 0), INT64_MAX)
        self._round_end = round_end_offset
        self._max_decompressed = max_decompressed
        self._next_offset = -1
        self.stats = CleanStats()

    @property
    def kept_aborted(self) -> list[AbortedTxn]:
        """Aborted transactions whose ABORT markers this pass kept because some of their batches
        were still in the log: the entries of the cleaned log's aborted-transaction index."""
        return self._txns.kept_aborted

    def clean(self, batch: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview | None:
        """What to write in place of this batch: the same object when it is kept whole and
        unchanged, new bytes when records were dropped or its delete horizon was set, None to drop it."""
        view = memoryview(batch)
        header = _checked_header(view)
        if header.base_offset < self._next_offset:
            raise ValueError(f"batch at offset {header.base_offset} follows one ending at {self._next_offset - 1}")
        self._next_offset = header.last_offset + 1
        stats = self.stats
        stats.batches_read += 1
        stats.records_read += header.record_count
        stats.bytes_read += len(view)

        horizon = delete_horizon(header)
        parsed: list[RawRecord] | None = None
        body: bytes | memoryview = b""
        if header.is_control:
            body = _body(view, header, self._max_decompressed)
            parsed = parse_records(header, body)
            discardable = self._txns.on_control_batch(header, _control_type(parsed[0]) if parsed else None)
            # A marker goes only once the horizon its first discardable sighting set has passed.
            drop_records = discardable and horizon is not None and horizon <= self._now
        else:
            discardable = self._txns.on_data_batch(header)
            drop_records = discardable
        producer_last = self._last_of_producers.get(header.producer_id) if header.producer_id >= 0 else None
        retain_empty = (
            producer_last == header.last_offset
            or header.last_offset + 1 == self._round_end
            or (header.is_control and self._marker_epochs.get(header.producer_id, -2) == header.producer_epoch)
        )

        if drop_records:
            if header.record_count:
                if header.is_control:
                    stats.markers_dropped += 1
                else:
                    stats.aborted_batches_dropped += 1
            return self._emptied(batch, header) if retain_empty else self._dropped()

        if parsed is None:
            if header.record_count and horizon is not None and header.base_offset >= self._map.end_offset:
                # Every record lies beyond the map and the horizon is set: nothing can change, and
                # the body need not even be decompressed (the common case for a recent tail).
                return self._unchanged(batch, header.record_count)
            body = _body(view, header, self._max_decompressed)
            parsed = parse_records(header, body)

        kept = parsed if header.is_control else self._kept_records(header, parsed, horizon)
        if not kept:
            return self._emptied(batch, header) if retain_empty else self._dropped()
        needs_horizon = horizon is None and (
            (discardable and header.is_control) or any(not record.has_value for record in kept)
        )
        if len(kept) == len(parsed) and not needs_horizon:
            return self._unchanged(batch, len(kept))
        if records.compute_crc(view) != header.crc:
            # Rewriting would give corrupt records a valid CRC; Kafka's cleaner does not look.
            raise _corrupt(f"record batch at offset {header.base_offset} fails its CRC")
        if needs_horizon:
            stats.horizons_set += 1
        out = _rebuild(header, body, kept, self._new_horizon if needs_horizon else horizon)
        stats.batches_rewritten += 1
        return self._written(out, len(kept))

    def _kept_records(
        self, header: records.BatchHeader, parsed: list[RawRecord], horizon: int | None
    ) -> list[RawRecord]:
        """The records of a data batch that stay (Kafka's Cleaner.shouldRetainRecord)."""
        key_map = self._map
        end = key_map.end_offset
        keep_tombstones = horizon is None or self._now < horizon
        kept = []
        for record in parsed:
            offset = header.base_offset + record.offset_delta
            if offset >= end:
                kept.append(record)  # beyond the map: nothing is known of later records of its key
            elif record.key is None:
                self.stats.keyless_dropped += 1
            else:
                latest = key_map.latest(record.key)
                if latest is not None and offset < latest:
                    continue  # superseded
                if record.has_value or keep_tombstones:
                    kept.append(record)
                else:
                    self.stats.tombstones_dropped += 1
        return kept

    def _unchanged(self, batch: bytes | bytearray | memoryview, count: int) -> bytes | bytearray | memoryview:
        self.stats.batches_unchanged += 1
        return self._written(batch, count)

    def _emptied(
        self, batch: bytes | bytearray | memoryview, header: records.BatchHeader
    ) -> bytes | bytearray | memoryview:
        self.stats.batches_emptied += 1
        out = _empty_batch(header)
        # Already the empty batch it would become (an earlier pass emptied it): the same object.
        return self._written(batch if batch == out else out, 0)

    def _dropped(self) -> None:
        self.stats.batches_dropped += 1
        return None

    def _written(self, out: bytes | bytearray | memoryview, count: int) -> bytes | bytearray | memoryview:
        self.stats.batches_written += 1
        self.stats.records_written += count
        self.stats.bytes_written += len(out)
        return out


def _pack(
    header: records.BatchHeader, attributes: int, base_timestamp: int, max_timestamp: int, count: int, payload: bytes
) -> bytes:
    out = bytearray(
        _HEADER.pack(
            header.base_offset,
            _EMPTY_BATCH_LENGTH + len(payload),
            header.partition_leader_epoch,
            2,
            0,
            attributes,
            header.last_offset_delta,  # the original last offset: the producer's last sequence with it
            base_timestamp,
            max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            count,
        )
    )
    out += payload
    _UINT32.pack_into(out, 17, records.compute_crc(out))
    return bytes(out)


def _empty_batch(header: records.BatchHeader) -> bytes:
    """A batch without records standing for ``header``'s (Kafka's DefaultRecordBatch.writeEmptyHeader):
    its offsets, producer fields and max timestamp; no base timestamp, codec or horizon."""
    return _pack(header, header.attributes & _EMPTY_KEEPS, records.NO_TIMESTAMP, header.max_timestamp, 0, b"")


def _rebuild(
    header: records.BatchHeader, body: bytes | memoryview, kept: list[RawRecord], horizon: int | None
) -> bytes:
    """``header``'s batch holding only ``kept``, in its codec (Kafka's buildRetainedRecordsInto).

    The base timestamp is the delete horizon when there is one, else the first kept record's
    timestamp (what Kafka's MemoryRecordsBuilder takes); each record keeps its absolute timestamp,
    so its delta is recomputed when the base moved, and may become negative. Everything else of a
    record (attributes, offset delta, key, value, headers) is copied as it was."""
    old_base = header.base_timestamp
    new_base = horizon if horizon is not None else old_base + kept[0].timestamp_delta
    out = bytearray()
    max_timestamp = records.NO_TIMESTAMP
    for record in kept:
        timestamp = old_base + record.timestamp_delta
        max_timestamp = max(max_timestamp, timestamp)
        if new_base == old_base:
            out += body[record.start : record.end]
            continue
        inner = bytearray((record.attributes,))
        write_zigzag(timestamp - new_base, inner)
        inner += body[record.tail : record.end]
        write_zigzag(len(inner), out)
        out += inner
    if header.is_log_append_time:
        # Readers take every record's timestamp from the max timestamp: the append time stays. The
        # records' own (create time) timestamps are kept too, where Kafka's builder replaces them
        # with the append time (the base is then the append time, or the horizon): no reader sees
        # the difference, and the producer's times are not lost.
        max_timestamp = header.max_timestamp
    codec = header.compression
    payload = compression.compress_body(codec, out, _DEFAULT_LEVELS.get(codec, 0))
    attributes = header.attributes | (DELETE_HORIZON_FLAG if horizon is not None else 0)
    return _pack(header, attributes, new_base, max_timestamp, len(kept), payload)

"""One log segment: an append-only file of entries plus its offset and time indexes.

A segment is of one kind. A *records* segment (``<baseOffset:020d>.log``, Kafka's layout) holds
v2 record batches. A *pointers* segment (``<baseOffset:020d>.plog``) holds pointer entries
(``diskless/storage/pointer.py``): the batch header plus where the batch lives in a WAL object. Both kinds share
the indexes (``.index``, ``.timeindex``) and every offset/time lookup, because both start each
entry with a real v2 batch header. The segment never looks inside records. Recovery walks the
file entry by entry, checks lengths and CRCs, truncates a torn tail and rebuilds both indexes.
A segment the log drops is first renamed with the ``.deleted`` suffix and removed later
(``file.delete.delay.ms``), as Kafka does, so a reader still holding it keeps reading.
"""

from __future__ import annotations

import bisect
import contextlib
import operator
import os
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from diskless.protocol import records
from diskless.protocol.records import HEADER_SIZE, LOG_OVERHEAD
from diskless.storage import pointer

_INT32_MAX = 2**31 - 1
RECORDS = "records"
POINTERS = "pointers"
SUFFIXES = {RECORDS: ".log", POINTERS: ".plog"}
DELETED_SUFFIX = ".deleted"  # Kafka's LogFileUtils.DELETED_FILE_SUFFIX
_POINTER_READ_CHUNK = 256 * 1024
_LOCATE_CHUNK = 8 * 1024  # at least this much is read at once when scanning for an offset
_LENGTH = struct.Struct(">i")
# Entries most recently appended, located without reading the file: replicas and tail consumers
# read what was just appended (the scan from the index entry was ~4% of a broker's CPU at low rate).
_RECENT_ENTRIES = 64


def _length_at(buf: bytes, pos: int) -> int:
    """The v2 batch ``length`` field of the batch at ``pos`` (after its 8-byte base offset)."""
    return int(_LENGTH.unpack_from(buf, pos + 8)[0])


def _entry_intact(entry: bytes) -> bool:
    try:
        pointer.decode_entry(entry, 0)
    except (pointer.CorruptEntry, ValueError):
        return False
    return True


def segment_path(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, f"{base_offset:020d}{suffix}")


def _add_deleted_suffix(path: str) -> str:
    renamed = path + DELETED_SUFFIX
    with contextlib.suppress(FileNotFoundError):  # an index never written has no file to rename
        os.rename(path, renamed)
    return renamed


def _move_into(path: str, source: str, directory: str) -> str:
    name = os.path.basename(path)
    moved = os.path.join(directory, name)
    os.replace(os.path.join(source, name), moved)
    return moved


def remove_deleted_files(directory: str) -> int:
    """Remove segment files left renamed ``.deleted`` (a restart before their delay passed, as
    Kafka's log loading does); returns how many."""
    removed = 0
    for name in os.listdir(directory):
        if name.endswith(DELETED_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
                removed += 1
    return removed


@dataclass(frozen=True, slots=True)
class BatchLocation:
    position: int
    base_offset: int
    last_offset: int
    size: int
    max_timestamp: int


_last_offset = operator.attrgetter("last_offset")


class LogSegment:
    def __init__(
        self, directory: str, base_offset: int, index_interval_bytes: int, created_ms: int, kind: str = RECORDS
    ) -> None:
        from .index import OffsetIndex, TimeIndex

        self.base_offset = base_offset
        self.kind = kind
        self.log_path = segment_path(directory, base_offset, SUFFIXES[kind])
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.offset_index = OffsetIndex(segment_path(directory, base_offset, ".index"), base_offset)
        self.time_index = TimeIndex(segment_path(directory, base_offset, ".timeindex"), base_offset)
        self.index_interval_bytes = index_interval_bytes
        self.size = os.fstat(self._fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = records.NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp: int | None = None
        self.created_ms = created_ms
        self._bytes_since_index = 0
        # Pointers segments: WAL object key -> entries at or after ``ref_floor`` pointing into it.
        self.wal_refs: Counter[str] = Counter()
        self.ref_floor = base_offset
        self._pointed_bytes = 0  # pointers segments: sum of the batch sizes in the entries' headers
        self._recent: list[BatchLocation] = []  # the last entries appended, in order

    # --- appending -------------------------------------------------------------------------

    def can_hold(self, last_offset: int) -> bool:
        return last_offset - self.base_offset <= _INT32_MAX

    def append(self, batch: bytes | bytearray | memoryview, base_offset: int, last_offset: int, max_ts: int) -> None:
        position = self.size
        os.write(self._fd, batch)
        self.size += len(batch)
        self._track(position, base_offset, last_offset, len(batch), max_ts)
        header_pos = pointer.ENTRY_HEADER_POS if self.kind == POINTERS else 0
        header_max_ts = records.max_timestamp_at(batch, header_pos)
        self._remember(BatchLocation(position, base_offset, last_offset, len(batch), header_max_ts))
        if self.kind == POINTERS:
            self._pointed_bytes += records.peek_offset_and_size(batch, pointer.ENTRY_HEADER_POS)[1]
            key = pointer.entry_key(batch, 0)
            if key is not None:
                self.wal_refs[key] += 1

    @property
    def data_bytes(self) -> int:
        """Bytes of the batches this segment holds, or (pointers) points to or holds inline.

        What a reader of the whole segment gets back, hence what ``retention.bytes`` limits."""
        return self._pointed_bytes if self.kind == POINTERS else self.size

    def set_ref_floor(self, offset: int) -> None:
        """The log start moved into this segment: entries wholly below it reference nothing."""
        self.ref_floor = offset
        self.count_refs()

    def count_refs(self) -> None:
        """Recount ``wal_refs`` (entries at or after ``ref_floor``) and ``data_bytes`` (all entries)."""
        self.wal_refs = Counter()
        self._pointed_bytes = 0
        if self.kind != POINTERS:
            return
        position = 0
        while position < self.size:
            chunk = os.pread(self._fd, min(_POINTER_READ_CHUNK, self.size - position), position)
            at = 0
            while at + pointer.ENTRY_HEADER_POS + HEADER_SIZE + 2 <= len(chunk):
                size = pointer.pointer_entry_size(chunk, at)
                if at + size > len(chunk):
                    break
                self._pointed_bytes += records.peek_offset_and_size(chunk, at + pointer.ENTRY_HEADER_POS)[1]
                if records.last_offset_at(chunk, at + pointer.ENTRY_HEADER_POS) >= self.ref_floor:
                    key = pointer.entry_key(chunk, at)
                    if key is not None:
                        self.wal_refs[key] += 1
                at += size
            if at == 0:
                break
            position += at

    def _track(self, position: int, base_offset: int, last_offset: int, size: int, max_ts: int) -> None:
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = max_ts
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
            self.offset_of_max_timestamp = base_offset
        if self._bytes_since_index >= self.index_interval_bytes or position == 0:
            self.offset_index.append(base_offset, position)
            self.time_index.append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index = 0
        self._bytes_since_index += size
        self.next_offset = last_offset + 1

    def _remember(self, location: BatchLocation) -> None:
        if len(self._recent) >= _RECENT_ENTRIES:
            del self._recent[: _RECENT_ENTRIES // 2]
        self._recent.append(location)

    # --- reading ---------------------------------------------------------------------------

    def _entry_at(self, position: int) -> tuple[records.BatchHeader, int] | None:
        """The batch header of the entry at ``position`` and the entry's size on disk."""
        if self.kind == RECORDS:
            data = os.pread(self._fd, HEADER_SIZE, position)
            if len(data) < HEADER_SIZE:
                return None
            header = records.parse_header(data)
            return header, header.size
        data = os.pread(self._fd, pointer.ENTRY_HEADER_POS + HEADER_SIZE, position)
        if len(data) < pointer.ENTRY_HEADER_POS + HEADER_SIZE:
            return None
        return records.parse_header(data, pointer.ENTRY_HEADER_POS), pointer.pointer_entry_size(data, 0)

    def _header_at(self, position: int) -> records.BatchHeader | None:
        entry = self._entry_at(position)
        return entry[0] if entry else None

    def locate(self, offset: int) -> BatchLocation | None:
        """The entry holding ``offset`` (or the first one after it), via the index then a short scan.

        Every fetch calls this, so the scan reads the stretch after the index entry with one pread
        and looks at each entry's last offset only (two integers), parsing the header of the entry
        it returns alone; an offset at or past the log end (a fetch at the tail) reads nothing."""
        if offset >= self.next_offset:
            return None  # no entry holds it, and none comes after it
        recent = self._recent
        if recent and offset >= recent[0].base_offset:
            # Entries before the remembered ones end below their first base offset.
            return recent[bisect.bisect_left(recent, offset, key=_last_offset)]
        pointers = self.kind == POINTERS
        header_pos = pointer.ENTRY_HEADER_POS if pointers else 0
        need = header_pos + HEADER_SIZE
        chunk_size = min(max(2 * self.index_interval_bytes, _LOCATE_CHUNK), _POINTER_READ_CHUNK)
        position = self.offset_index.lookup(offset)
        while position < self.size:
            chunk = os.pread(self._fd, min(chunk_size, self.size - position), position)
            at = 0
            while at + need <= len(chunk):
                size = pointer.pointer_entry_size(chunk, at) if pointers else LOG_OVERHEAD + _length_at(chunk, at)
                if size <= 0:
                    return None  # garbage: the end of the valid entries
                if records.last_offset_at(chunk, at + header_pos) >= offset:
                    header = records.parse_header(chunk, at + header_pos)
                    return BatchLocation(
                        position + at, header.base_offset, header.last_offset, size, header.max_timestamp
                    )
                at += size
            if at == 0:
                return None  # a torn header at the end
            position += at
        return None

    def read(self, offset: int, max_bytes: int, max_offset: int, min_one: bool) -> bytes:
        """Whole entries from the one holding ``offset``, up to ``max_bytes`` and below ``max_offset``.

        With ``min_one`` the first batch is returned even when larger than ``max_bytes`` (KIP-74).
        For a pointers segment ``max_bytes`` bounds the size of the batches the entries point to,
        which is what a fetch will eventually return.
        """
        start = self.locate(offset)
        if start is None or start.base_offset >= max_offset:
            return b""
        if self.kind == POINTERS:
            return self._read_pointers(start.position, max_bytes, max_offset, min_one)
        want = min(max(max_bytes, start.size if min_one else 0), self.size - start.position)
        data = os.pread(self._fd, want, start.position)
        end = 0
        while end + LOG_OVERHEAD <= len(data):
            base, size = records.peek_offset_and_size(data, end)
            if base >= max_offset or end + size > len(data):
                break
            end += size
        return data[:end] if end < len(data) else data

    def _read_pointers(self, position: int, max_bytes: int, max_offset: int, min_one: bool) -> bytes:
        out = bytearray()
        served = 0
        while position < self.size:
            chunk = os.pread(self._fd, min(_POINTER_READ_CHUNK, self.size - position), position)
            at = 0
            while at + pointer.ENTRY_HEADER_POS + HEADER_SIZE <= len(chunk):
                size = pointer.pointer_entry_size(chunk, at)
                if at + size > len(chunk):
                    break
                base, batch_size = records.peek_offset_and_size(chunk, at + pointer.ENTRY_HEADER_POS)
                if base >= max_offset or (served + batch_size > max_bytes and (served or not min_one)):
                    return bytes(out + chunk[:at])
                served += batch_size
                at += size
            if at == 0:
                break
            out += chunk[:at]
            position += at
        return bytes(out)

    def iter_entries(self, from_position: int = 0) -> Iterator[tuple[int, records.BatchHeader, int]]:
        """(position, batch header, entry size on disk) of every entry from ``from_position``."""
        position = from_position
        while position < self.size:
            entry = self._entry_at(position)
            if entry is None:
                return
            yield position, entry[0], entry[1]
            position += entry[1]

    def iter_headers(self, from_position: int = 0) -> Iterator[tuple[int, records.BatchHeader]]:
        for position, header, _ in self.iter_entries(from_position):
            yield position, header

    def iter_batches(self, from_position: int = 0) -> Iterator[BatchLocation]:
        for position, h, size in self.iter_entries(from_position):
            yield BatchLocation(position, h.base_offset, h.last_offset, size, h.max_timestamp)

    def read_batch(self, location: BatchLocation) -> bytes:
        """The on-disk bytes of one entry: a record batch, or a pointer entry."""
        return os.pread(self._fd, location.size, location.position)

    def first_batch_reaching(self, timestamp: int, start_offset: int) -> BatchLocation | None:
        """The first entry at or after ``start_offset`` whose max timestamp is >= ``timestamp``."""
        scan_from = self.locate(max(self.time_index.lookup(timestamp), start_offset))
        if scan_from is None:
            return None
        for location in self.iter_batches(scan_from.position):
            if location.max_timestamp >= timestamp:
                return location
        return None

    # --- recovery and lifecycle -----------------------------------------------------------------

    def load(self, verify: bool) -> int:
        """Rebuild in-memory state from disk. Returns bytes truncated from a torn or corrupt tail.

        With ``verify`` (unclean shutdown, active segment) every batch is re-read and its CRC
        checked while both indexes are rebuilt. Otherwise the index files are trusted when they
        are consistent, and only the batches after the last index entry are walked.
        """
        truncated = self._load_state(verify)
        self.count_refs()
        return truncated

    def _load_state(self, verify: bool) -> int:
        # The first batch is always indexed, so empty indexes over a non-empty log (missing or
        # emptied files) are inconsistent too: trusting them would lose the max timestamp.
        if (
            not verify
            and self.offset_index.load(self.size)
            and self.time_index.load(2**63 - 1)
            and (self.size == 0 or (len(self.offset_index) > 0 and self.time_index.last_entry() is not None))
        ):
            self._restore_from_indexes()
            return 0
        self.offset_index.clear()
        self.time_index.clear()
        return self._rebuild()

    def _restore_from_indexes(self) -> None:
        last = self.time_index.last_entry()
        if last is not None:
            self.max_timestamp, self.offset_of_max_timestamp = last
        first = self._header_at(0)
        self.first_batch_timestamp = first.max_timestamp if first else None
        for batch in self.iter_batches(self.offset_index.lookup(2**63 - 1)):
            if batch.max_timestamp > self.max_timestamp:
                self.max_timestamp = batch.max_timestamp
                self.offset_of_max_timestamp = batch.base_offset
            self.next_offset = batch.last_offset + 1

    def _rebuild(self) -> int:
        self._recent = []  # what the rebuild finds is read from the file
        self.next_offset = self.base_offset
        self.max_timestamp = records.NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = None
        self._bytes_since_index = 0
        good_end = 0
        while good_end < self.size:
            entry = self._entry_at(good_end)
            if entry is None:
                break
            header, size = entry
            too_small = size < (pointer.ENTRY_FRAME_SIZE + HEADER_SIZE if self.kind == POINTERS else HEADER_SIZE)
            torn = too_small or good_end + size > self.size
            out_of_order = good_end > 0 and header.base_offset < self.next_offset
            if torn or out_of_order or header.magic != 2:
                break
            on_disk = os.pread(self._fd, size, good_end)
            intact = _entry_intact(on_disk) if self.kind == POINTERS else records.compute_crc(on_disk) == header.crc
            if not intact:
                break
            self._track(good_end, header.base_offset, header.last_offset, size, header.max_timestamp)
            good_end += size
        truncated = self.size - good_end
        if truncated:
            os.ftruncate(self._fd, good_end)
            self.size = good_end
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Drop every batch holding an offset >= ``offset``; returns bytes removed.

        A batch straddling ``offset`` goes too (Kafka's LogSegment.truncateTo), so nothing at or
        after ``offset`` survives and the segment ends at that batch's base offset.
        """
        location = self.locate(offset)
        if location is None:
            return 0
        cut = location.position
        removed = self.size - cut
        os.ftruncate(self._fd, cut)
        self.size = cut
        self.offset_index.clear()
        self.time_index.clear()
        self._rebuild()
        self.count_refs()
        return removed

    def on_roll(self) -> None:
        """Seal the segment: record the final max timestamp and make everything durable."""
        if self.max_timestamp >= 0:
            self.time_index.append(self.max_timestamp, self.offset_of_max_timestamp)
        self.fsync()

    def fsync(self) -> None:
        os.fsync(self._fd)
        self.offset_index.fsync()
        self.time_index.fsync()

    def close(self) -> None:
        os.close(self._fd)
        self.offset_index.close()
        self.time_index.close()

    def relocate(self, source: str, directory: str) -> None:
        """Move the segment's files from ``source`` (where its directory was renamed to) into
        ``directory`` (same filesystem), keeping its descriptor: the cleaner builds segments
        elsewhere and moves them in when it installs them."""
        self.log_path = _move_into(self.log_path, source, directory)
        for index in (self.offset_index, self.time_index):
            index._file.path = _move_into(index._file.path, source, directory)

    def mark_deleted(self) -> None:
        """Rename the files with the ``.deleted`` suffix (Kafka's changeFileSuffixes): no load
        lists the segment again, while the open descriptor keeps serving whoever still reads it.
        Nothing may be appended any more; ``delete`` removes the renamed files."""
        self.log_path = _add_deleted_suffix(self.log_path)
        for index in (self.offset_index, self.time_index):
            index._file.path = _add_deleted_suffix(index._file.path)

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.offset_index._file.path, self.time_index._file.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

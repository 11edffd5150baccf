"""One log segment: an append-only file of v2 batches plus its offset and time indexes.

Files are named as in Kafka (``<baseOffset:020d>.log``, ``.index``, ``.timeindex``). The segment
knows batch boundaries only through headers; it never looks inside records. Recovery walks the
file batch by batch, checks lengths and CRCs, truncates a torn tail and rebuilds both indexes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from diskless.protocol import records
from diskless.protocol.records import HEADER_SIZE, LOG_OVERHEAD

_INT32_MAX = 2**31 - 1


def segment_path(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, f"{base_offset:020d}{suffix}")


@dataclass(frozen=True, slots=True)
class BatchLocation:
    position: int
    base_offset: int
    last_offset: int
    size: int
    max_timestamp: int


class LogSegment:
    def __init__(self, directory: str, base_offset: int, index_interval_bytes: int, created_ms: int) -> None:
        from .index import OffsetIndex, TimeIndex

        self.base_offset = base_offset
        self.log_path = segment_path(directory, base_offset, ".log")
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

    # --- appending -------------------------------------------------------------------------

    def can_hold(self, last_offset: int) -> bool:
        return last_offset - self.base_offset <= _INT32_MAX

    def append(self, batch: bytes | bytearray | memoryview, base_offset: int, last_offset: int, max_ts: int) -> None:
        position = self.size
        os.write(self._fd, batch)
        self.size += len(batch)
        self._track(position, base_offset, last_offset, len(batch), max_ts)

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

    def rolling_timestamp(self) -> int:
        return self.first_batch_timestamp if self.first_batch_timestamp is not None else self.created_ms

    # --- reading ---------------------------------------------------------------------------

    def _header_at(self, position: int) -> records.BatchHeader | None:
        data = os.pread(self._fd, HEADER_SIZE, position)
        if len(data) < HEADER_SIZE:
            return None
        return records.parse_header(data)

    def locate(self, offset: int) -> BatchLocation | None:
        """The batch holding ``offset`` (or the first one after it), via the index then a short scan."""
        position = self.offset_index.lookup(offset)
        while position < self.size:
            header = self._header_at(position)
            if header is None:
                return None
            if header.last_offset >= offset:
                return BatchLocation(
                    position, header.base_offset, header.last_offset, header.size, header.max_timestamp
                )
            position += header.size
        return None

    def read(self, offset: int, max_bytes: int, max_offset: int, min_one: bool) -> bytes:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` and below ``max_offset``.

        With ``min_one`` the first batch is returned even when larger than ``max_bytes`` (KIP-74).
        """
        start = self.locate(offset)
        if start is None or start.base_offset >= max_offset:
            return b""
        want = min(max(max_bytes, start.size if min_one else 0), self.size - start.position)
        data = os.pread(self._fd, want, start.position)
        end = 0
        while end + LOG_OVERHEAD <= len(data):
            base, size = records.peek_offset_and_size(data, end)
            if base >= max_offset or end + size > len(data):
                break
            end += size
        return data[:end] if end < len(data) else data

    def iter_headers(self, from_position: int = 0) -> Iterator[tuple[int, records.BatchHeader]]:
        position = from_position
        while position < self.size:
            header = self._header_at(position)
            if header is None:
                return
            yield position, header
            position += header.size

    def iter_batches(self, from_position: int = 0) -> Iterator[BatchLocation]:
        for position, h in self.iter_headers(from_position):
            yield BatchLocation(position, h.base_offset, h.last_offset, h.size, h.max_timestamp)

    def read_batch(self, location: BatchLocation) -> bytes:
        return os.pread(self._fd, location.size, location.position)

    def find_offset_by_timestamp(self, timestamp: int, start_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``start_offset`` with ts >= ``timestamp``."""
        scan_from = self.locate(max(self.time_index.lookup(timestamp), start_offset))
        if scan_from is None:
            return None
        for location in self.iter_batches(scan_from.position):
            if location.max_timestamp < timestamp:
                continue
            for record_offset, record_ts in records.iter_record_timestamps(self.read_batch(location)):
                if record_offset >= start_offset and record_ts >= timestamp:
                    return record_offset, record_ts
        return None

    def exact_offset_of_max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record carrying the segment's max timestamp."""
        if self.offset_of_max_timestamp < 0:
            return None
        location = self.locate(self.offset_of_max_timestamp)
        if location is None:
            return None
        for record_offset, record_ts in records.iter_record_timestamps(self.read_batch(location)):
            if record_ts == self.max_timestamp:
                return record_offset, record_ts
        return location.base_offset, self.max_timestamp

    # --- recovery and lifecycle -----------------------------------------------------------------

    def load(self, verify: bool) -> int:
        """Rebuild in-memory state from disk. Returns bytes truncated from a torn or corrupt tail.

        With ``verify`` (unclean shutdown, active segment) every batch is re-read and its CRC
        checked while both indexes are rebuilt. Otherwise the index files are trusted when they
        are consistent, and only the batches after the last index entry are walked.
        """
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
        self.next_offset = self.base_offset
        self.max_timestamp = records.NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = None
        self._bytes_since_index = 0
        good_end = 0
        while good_end < self.size:
            data = os.pread(self._fd, HEADER_SIZE, good_end)
            if len(data) < HEADER_SIZE:
                break
            header = records.parse_header(data)
            torn = header.batch_length < HEADER_SIZE - LOG_OVERHEAD or good_end + header.size > self.size
            out_of_order = good_end > 0 and header.base_offset < self.next_offset
            if torn or out_of_order or header.magic != 2:
                break
            if records.compute_crc(os.pread(self._fd, header.size, good_end)) != header.crc:
                break
            self._track(good_end, header.base_offset, header.last_offset, header.size, header.max_timestamp)
            good_end += header.size
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

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.offset_index._file.path, self.time_index._file.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

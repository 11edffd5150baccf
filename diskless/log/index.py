"""Sparse offset and time indexes of one segment, in Kafka's on-disk layout.

Offset index entries are (relative offset int32, file position int32); time index entries are
(timestamp int64, relative offset int32). Both are appended as the segment grows, kept in memory
as arrays for bisection, and rebuilt from the log during crash recovery, so a torn index write can
never mislead a reader.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class _AppendOnlyFile:
    """An index file, opened only for the moment of each operation.

    Index writes are sparse (one entry per ``index.interval.bytes``) and reads happen from the
    in-memory arrays, so holding two descriptors per segment open buys nothing, while a broker
    with ten thousand partitions would run out of them (the process limit is often 20k or less).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644))

    def read_all(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def reset(self, data: bytes = b"") -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.ftruncate(fd, 0)
            if data:
                os.write(fd, data)
        finally:
            os.close(fd)

    def fsync(self) -> None:
        # fsync flushes the file's data whichever descriptor asks.
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        pass  # nothing held open


class OffsetIndex:
    def __init__(self, path: str, base_offset: int) -> None:
        self.base_offset = base_offset
        self._file = _AppendOnlyFile(path)
        self._offsets = array("q")
        self._positions = array("q")

    def load(self, log_size: int) -> bool:
        """Load entries from disk; False if they are inconsistent and must be rebuilt."""
        data = self._file.read_all()
        if len(data) % _OFFSET_ENTRY.size:
            return False
        last_rel, last_pos = -1, -1
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
            if rel <= last_rel or pos <= last_pos or pos >= log_size:
                return False
            self._offsets.append(self.base_offset + rel)
            self._positions.append(pos)
            last_rel, last_pos = rel, pos
        return True

    def append(self, offset: int, position: int) -> None:
        if self._offsets and offset <= self._offsets[-1]:
            return
        self._offsets.append(offset)
        self._positions.append(position)
        self._file.append(_OFFSET_ENTRY.pack(offset - self.base_offset, position))

    def lookup(self, offset: int) -> int:
        """File position of the last indexed batch starting at or before ``offset``."""
        i = bisect.bisect_right(self._offsets, offset) - 1
        return self._positions[i] if i >= 0 else 0

    def clear(self) -> None:
        self._offsets = array("q")
        self._positions = array("q")
        self._file.reset()

    def __len__(self) -> int:
        return len(self._offsets)

    def fsync(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        self._file.close()


class TimeIndex:
    def __init__(self, path: str, base_offset: int) -> None:
        self.base_offset = base_offset
        self._file = _AppendOnlyFile(path)
        self._timestamps = array("q")
        self._offsets = array("q")

    def load(self, next_offset: int) -> bool:
        data = self._file.read_all()
        if len(data) % _TIME_ENTRY.size:
            return False
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            offset = self.base_offset + rel
            if (self._timestamps and ts <= self._timestamps[-1]) or offset >= next_offset:
                return False
            self._timestamps.append(ts)
            self._offsets.append(offset)
        return True

    def append(self, max_timestamp: int, offset: int) -> None:
        """Index a batch if it raises the segment's max timestamp (Kafka's rule).

        As in Kafka, an empty index's last timestamp counts as NO_TIMESTAMP (-1), so batches
        without timestamps are never indexed (their offset of max timestamp is -1).
        """
        if max_timestamp < 0 or (self._timestamps and max_timestamp <= self._timestamps[-1]):
            return
        self._timestamps.append(max_timestamp)
        self._offsets.append(offset)
        self._file.append(_TIME_ENTRY.pack(max_timestamp, offset - self.base_offset))

    def lookup(self, timestamp: int) -> int:
        """An offset from which scanning finds the first batch with max timestamp >= ``timestamp``."""
        i = bisect.bisect_left(self._timestamps, timestamp) - 1
        return self._offsets[i] if i >= 0 else self.base_offset

    def last_entry(self) -> tuple[int, int] | None:
        return (self._timestamps[-1], self._offsets[-1]) if self._timestamps else None

    def clear(self) -> None:
        self._timestamps = array("q")
        self._offsets = array("q")
        self._file.reset()

    def fsync(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        self._file.close()

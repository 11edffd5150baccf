"""Entries of diskless log segments (pointers into WAL objects) and serving pointed-to batches. Sans-IO.

A diskless segment file is a sequence of entries. Each entry carries the 61-byte v2 batch header
exactly as a classic log would store it after the leader assigned ``baseOffset`` and
``partitionLeaderEpoch`` (``batchLength`` is the real batch's, the CRC is the producer's), so
offset lookups, producer-state rebuilding and timestamp indexes work on entries the way they work
on batches, without fetching any record bytes.

Framing
=======
The header's ``batchLength`` describes the real batch, not the entry, so a segment scanner cannot
walk entries by it. Every entry therefore starts with its own frame. All integers big endian::

    0   entryLength  int32    bytes after this field (entry size = 4 + entryLength)
    4   entryCrc     uint32   crc32c of bytes [8, entry size): the kind and the body
    8   kind         int8     1 = pointer into a WAL object, 2 = inline batch
    9   header       61 bytes the v2 batch header (both kinds: ENTRY_HEADER_POS = 9)

Pointer body (kind 1), entry size = ``POINTER_ENTRY_OVERHEAD`` (84) + len(key)::

    70    keyLength  uint16   length of the WAL object key in UTF-8
    72    key        bytes    the WAL object key (see ``wal_format.wal_object_key``)
    72+k  offset     int64    byte offset of the batch in the WAL object
    80+k  size       int32    batch size in bytes; always equal to 12 + the header's batchLength

Inline body (kind 2), entry size = ``ENTRY_FRAME_SIZE`` (9) + batch size: the rest of the
batch after its header, i.e. bytes [9, end) are one complete v2 batch. The leader uses it for
batches it writes itself (transaction markers, control batches), which never go to a WAL object.

The entry crc exists because the header's CRC cannot be checked without the real batch: without
it, recovery after a crash could not tell a torn or garbage tail from a valid pointer.
A scanner walks a segment with ``pointer_entry_size`` (reads 4 bytes) and reads header fields at
``pos + ENTRY_HEADER_POS`` with the ``diskless.protocol.records`` helpers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from diskless.protocol import records
from diskless.protocol.records import HEADER_SIZE, BatchHeader

from .wal_format import CorruptWalObject

KIND_POINTER = 1
KIND_INLINE = 2

_FRAME = struct.Struct(">iIb")  # entryLength, entryCrc, kind
_LENGTH = struct.Struct(">i")
_KEY_LENGTH = struct.Struct(">H")
_LOCATION = struct.Struct(">qi")  # offset, size

ENTRY_LENGTH_SIZE = _LENGTH.size  # 4
ENTRY_CRC_START = 8  # the crc covers everything from the kind byte on
ENTRY_FRAME_SIZE = _FRAME.size  # 9: bytes before the batch header, whatever the kind
ENTRY_HEADER_POS = ENTRY_FRAME_SIZE
POINTER_ENTRY_OVERHEAD = ENTRY_FRAME_SIZE + HEADER_SIZE + _KEY_LENGTH.size + _LOCATION.size  # 84, + key length
MIN_ENTRY_SIZE = ENTRY_FRAME_SIZE + HEADER_SIZE  # 70: an inline entry of a header-only batch
_MAX_KEY_BYTES = 2**16 - 1
_INT32_MAX = 2**31 - 1


class CorruptEntry(Exception):
    """Bytes in a diskless segment that are not a whole, valid entry (torn write or corruption)."""


@dataclass(frozen=True, slots=True)
class PointerEntry:
    header_bytes: bytes  # the 61 header bytes as stored
    header: BatchHeader
    key: str
    offset: int
    size: int

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    def serve(self, wal_range: bytes | bytearray | memoryview) -> bytearray:
        """The batch to return to a fetch, from the ``size`` bytes read at ``offset`` of ``key``.

        Checks that those bytes are the batch this entry describes (every header field the leader
        did not assign, including the producer's CRC) so a wrong range is never served.
        """
        view = memoryview(wal_range)
        if len(view) != self.size:
            raise CorruptWalObject(f"pointer says {self.size} bytes, got {len(view)}")
        if view[8:12] != self.header_bytes[8:12] or view[16:HEADER_SIZE] != self.header_bytes[16:HEADER_SIZE]:
            raise CorruptWalObject(f"bytes at {self.key}@{self.offset} are not the batch this pointer describes")
        return serve_batch(view, self.header.base_offset, self.header.partition_leader_epoch)


@dataclass(frozen=True, slots=True)
class InlineEntry:
    batch: bytes
    header: BatchHeader

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset


def _frame(kind: int, body: bytes | bytearray | memoryview) -> bytes:
    crc = crc32c.crc32c(body, crc32c.crc32c(bytes((kind,))))  # covers kind + body, as decode checks
    return _FRAME.pack(ENTRY_FRAME_SIZE - ENTRY_LENGTH_SIZE + len(body), crc, kind) + bytes(body)


def _checked_header(header_bytes: bytes | bytearray | memoryview, size: int) -> BatchHeader:
    header = records.parse_header(header_bytes)
    if header.magic != 2:
        raise ValueError(f"only v2 batch headers can be stored (magic {header.magic})")
    if header.size != size:
        raise ValueError(f"header says the batch is {header.size} bytes, got {size}")
    return header


def encode_pointer_entry(header61: bytes | bytearray | memoryview, key: str, offset: int, size: int) -> bytes:
    """A framed pointer entry, ready to append to a diskless segment."""
    if len(header61) != HEADER_SIZE:
        raise ValueError(f"a batch header is {HEADER_SIZE} bytes, got {len(header61)}")
    _checked_header(header61, size)
    raw_key = key.encode()
    if len(raw_key) > _MAX_KEY_BYTES:
        raise ValueError("WAL object key longer than 65535 bytes")
    if not 0 <= offset < 2**63 or not 0 < size <= _INT32_MAX:
        raise ValueError(f"bad pointer location {offset}+{size}")
    body = bytes(header61) + _KEY_LENGTH.pack(len(raw_key)) + raw_key + _LOCATION.pack(offset, size)
    return _frame(KIND_POINTER, body)


def encode_inline_entry(batch: bytes | bytearray | memoryview) -> bytes:
    """A framed entry holding a whole batch (leader-written control batches)."""
    if len(batch) < HEADER_SIZE:
        raise ValueError("a record batch is at least 61 bytes long")
    _checked_header(batch, len(batch))
    return _frame(KIND_INLINE, batch)


def pointer_entry_size(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """Total size of the entry at ``pos`` (any kind), reading only its 4-byte length.

    Nothing else is checked, so garbage (e.g. a zero-filled tail after a crash) can yield a size
    below ``MIN_ENTRY_SIZE`` or past the end of the data: a scanner must treat both as the end of
    the valid entries. ``decode_entry`` checks everything.
    """
    if len(buf) - pos < ENTRY_LENGTH_SIZE:
        raise CorruptEntry(f"truncated entry length at {pos}")
    return ENTRY_LENGTH_SIZE + _LENGTH.unpack_from(buf, pos)[0]


def entry_header_at(buf: bytes | bytearray | memoryview, pos: int) -> BatchHeader:
    """The batch header of the entry at ``pos`` without checking the entry's crc (for scans)."""
    return records.parse_header(buf, pos + ENTRY_HEADER_POS)


def decode_entry(buf: bytes | bytearray | memoryview, pos: int) -> tuple[PointerEntry | InlineEntry, int]:
    """The fully validated entry at ``pos`` and the position just after it."""
    size = pointer_entry_size(buf, pos)
    if size < MIN_ENTRY_SIZE:
        raise CorruptEntry(f"impossible entry size {size} at {pos}")
    end = pos + size
    if end > len(buf):
        raise CorruptEntry(f"entry at {pos} runs past the end of the data ({end} > {len(buf)})")
    view = memoryview(buf)[pos:end]
    _, crc, kind = _FRAME.unpack_from(view, 0)
    if crc32c.crc32c(view[ENTRY_CRC_START:]) != crc:
        raise CorruptEntry(f"entry crc32c mismatch at {pos}")
    header = records.parse_header(view, ENTRY_HEADER_POS)
    if header.magic != 2:
        raise CorruptEntry(f"entry at {pos} holds a magic {header.magic} header")
    if kind == KIND_INLINE:
        batch = bytes(view[ENTRY_HEADER_POS:])
        if header.size != len(batch):
            raise CorruptEntry(f"inline batch at {pos} is {len(batch)} bytes, its header says {header.size}")
        return InlineEntry(batch, header), end
    if kind != KIND_POINTER:
        raise CorruptEntry(f"unknown entry kind {kind} at {pos}")
    key_pos = ENTRY_HEADER_POS + HEADER_SIZE + _KEY_LENGTH.size
    if len(view) < key_pos + _LOCATION.size:
        raise CorruptEntry(f"pointer entry at {pos} is too short for a pointer")
    (key_length,) = _KEY_LENGTH.unpack_from(view, key_pos - _KEY_LENGTH.size)
    if key_pos + key_length + _LOCATION.size != len(view):
        raise CorruptEntry(f"pointer entry at {pos} has an inconsistent key length")
    try:
        key = str(view[key_pos : key_pos + key_length], "utf-8")
    except UnicodeDecodeError:
        raise CorruptEntry(f"pointer entry at {pos} has a key that is not UTF-8") from None
    offset, size = _LOCATION.unpack_from(view, key_pos + key_length)
    if size != header.size or offset < 0:
        raise CorruptEntry(f"pointer entry at {pos} names {offset}+{size} for a {header.size}-byte batch")
    header_bytes = bytes(view[ENTRY_HEADER_POS : ENTRY_HEADER_POS + HEADER_SIZE])
    return PointerEntry(header_bytes, header, key, offset, size), end


def decode_pointer_entry(buf: bytes | bytearray | memoryview, pos: int) -> tuple[PointerEntry, int]:
    """Like ``decode_entry`` for callers that only accept pointers (inline entries raise ``ValueError``)."""
    entry, next_pos = decode_entry(buf, pos)
    if not isinstance(entry, PointerEntry):
        raise ValueError(f"the entry at {pos} is an inline batch, not a pointer")
    return entry, next_pos


def serve_batch(wal_bytes_range: bytes | bytearray | memoryview, base_offset: int, leader_epoch: int) -> bytearray:
    """A copy of the WAL batch with the leader's ``baseOffset`` and ``partitionLeaderEpoch``.

    Neither field is covered by the v2 CRC, so the producer's CRC stays valid and no record byte
    is touched. ``wal_bytes_range`` must be exactly one batch.
    """
    out = bytearray(wal_bytes_range)
    if len(out) < HEADER_SIZE:
        raise CorruptWalObject(f"{len(out)} bytes cannot hold a record batch")
    _, size = records.peek_offset_and_size(out, 0)
    if size != len(out) or out[16] != 2:
        raise CorruptWalObject("WAL byte range is not exactly one v2 record batch")
    records.assign_offset(out, base_offset, leader_epoch)
    return out


def iter_entries(buf: bytes | bytearray | memoryview) -> list[PointerEntry | InlineEntry]:
    """Every entry of a run of whole entries (as a segment read returns them), validated."""
    out: list[PointerEntry | InlineEntry] = []
    pos = 0
    while pos < len(buf):
        entry, pos = decode_entry(buf, pos)
        out.append(entry)
    return out


def served_size(buf: bytes | bytearray | memoryview) -> int:
    """Bytes the batches behind a run of entries will take in a fetch response (headers only)."""
    total = 0
    pos = 0
    while pos < len(buf):
        total += entry_header_at(buf, pos).size
        pos += pointer_entry_size(buf, pos)
    return total


def entry_key(buf: bytes | bytearray | memoryview, pos: int) -> str | None:
    """The WAL object key of the pointer entry at ``pos`` (None for an inline entry), unvalidated."""
    if buf[pos + ENTRY_LENGTH_SIZE + 4] != KIND_POINTER:
        return None
    key_pos = pos + ENTRY_HEADER_POS + HEADER_SIZE
    (key_length,) = _KEY_LENGTH.unpack_from(buf, key_pos)
    return str(memoryview(buf)[key_pos + _KEY_LENGTH.size : key_pos + _KEY_LENGTH.size + key_length], "utf-8")

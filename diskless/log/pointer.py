"""Pointer entries: what a diskless segment stores for each batch instead of its records.

Layout of one entry (big endian)::

    0   entryLength   uint32   bytes after this field
    4   entryCrc      uint32   crc32c of bytes [8, 4 + entryLength)
    8   header        61 bytes the v2 batch header as the leader assigned it: baseOffset and
                               partitionLeaderEpoch set, batchLength the REAL batch length, the
                               producer's CRC (so header + WAL bytes [61:] is the served batch)
    69  keyLength     uint16
    71  key           WAL object key, utf-8
    ..  position      uint64   byte offset of the batch inside the WAL object
    ..  size          uint32   batch size in bytes (= 12 + batchLength)

The entry length prefix lets a segment walk entries without knowing their kind of payload; the
entry CRC lets crash recovery find a torn tail as it does for record batches. Serving a batch
is: bytes [position, position + size) of the object with the first 61 bytes replaced by the
stored header, which differs from the producer's only in fields the batch CRC does not cover
(and in LogAppendTime, which the representative stamps before upload).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from diskless.protocol import records
from diskless.protocol.records import HEADER_SIZE

_PREFIX = struct.Struct(">II")
_KEY_LEN = struct.Struct(">H")
_TAIL = struct.Struct(">QI")
PREFIX_SIZE = _PREFIX.size
MIN_ENTRY_SIZE = PREFIX_SIZE + HEADER_SIZE + _KEY_LEN.size + _TAIL.size


class CorruptPointer(Exception):
    pass


@dataclass(frozen=True, slots=True)
class PointerEntry:
    header: bytes  # 61 bytes
    object_key: str
    position: int
    size: int

    @property
    def base_offset(self) -> int:
        return int.from_bytes(self.header[0:8], "big", signed=True)

    @property
    def last_offset(self) -> int:
        return records.last_offset_at(self.header, 0)


def encode_entry(header: bytes | bytearray | memoryview, object_key: str, position: int, size: int) -> bytes:
    key = object_key.encode()
    body = bytes(header[:HEADER_SIZE]) + _KEY_LEN.pack(len(key)) + key + _TAIL.pack(position, size)
    return _PREFIX.pack(len(body) + 4, crc32c.crc32c(body)) + body


def entry_size_at(buf: bytes | bytearray | memoryview, pos: int) -> int:
    (length,) = struct.unpack_from(">I", buf, pos)
    return 4 + length


def entry_crc_ok(entry: bytes | bytearray | memoryview) -> bool:
    length, crc = _PREFIX.unpack_from(entry, 0)
    return len(entry) == 4 + length and crc32c.crc32c(memoryview(entry)[PREFIX_SIZE:]) == crc


def decode_entry(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[PointerEntry, int]:
    """Decode the entry at ``pos``; returns it and the position of the next entry."""
    if len(buf) - pos < MIN_ENTRY_SIZE:
        raise CorruptPointer("truncated pointer entry")
    length, _ = _PREFIX.unpack_from(buf, pos)
    end = pos + 4 + length
    if end > len(buf):
        raise CorruptPointer("pointer entry overruns its buffer")
    at = pos + PREFIX_SIZE
    header = bytes(buf[at : at + HEADER_SIZE])
    at += HEADER_SIZE
    (key_len,) = _KEY_LEN.unpack_from(buf, at)
    at += _KEY_LEN.size
    key = bytes(buf[at : at + key_len]).decode()
    at += key_len
    position, size = _TAIL.unpack_from(buf, at)
    return PointerEntry(header, key, position, size), end


def decode_entries(buf: bytes | bytearray | memoryview) -> list[PointerEntry]:
    out = []
    pos = 0
    while pos < len(buf):
        entry, pos = decode_entry(buf, pos)
        out.append(entry)
    return out


def serve(entry: PointerEntry, batch: bytes | bytearray | memoryview) -> bytes:
    """The batch as a consumer must see it: leader-assigned header over the producer's records."""
    return entry.header + bytes(memoryview(batch)[HEADER_SIZE:])

"""Pointer entries as replica fetches carry them: a segment's entries re-encoded compactly. Sans-IO.

Followers copy every entry their leader appends, usually from another AZ, so an entry's wire size
is billed cross-AZ traffic for every produced batch (issue 10). A segment entry (``pointer.py``)
spends ~90 of its ~160 bytes on things a follower can rebuild: the frame (length and crc32c), the
WAL object key's text (its hour prefix repeats its creation time; the uuid is hex), the batch size
(always 12 + the header's ``batchLength``), and the same key once per batch of one object. On the
wire an entry is its 61-byte header plus a key reference and an offset; the follower rebuilds the
leader's segment bytes exactly and checks them against the leader's crc32c of the whole run, so a
bug or a damaged byte here can never put entries in a follower's log that the leader does not have.

Layout (integers big endian; ``uvarint``: unsigned LEB128)::

    crc        uint32    crc32c of the segment bytes this decodes to
    keyCount   uvarint
    keys       keyCount x key
    entries    until the end: kind int8, then
                 1 (pointer): header 61 bytes, keyIndex uvarint, offset uvarint
                 2 (inline):  size uvarint, the batch (size bytes)
    key        tag int8, then
                 1 (a canonical WAL object key, ``wal_format``): createdMs uvarint, azLength uvarint,
                   az bytes, brokerId uvarint, uuid 16 bytes
                 0 (any other key): length uvarint, UTF-8 bytes

``encode`` returns None for anything it cannot represent exactly (an entry whose pointed size is
not its header's); the caller then sends the segment bytes as they are.
"""

from __future__ import annotations

import struct

import crc32c

from diskless.protocol.records import HEADER_SIZE

from .pointer import (
    _FRAME,
    _KEY_LENGTH,
    _LOCATION,
    ENTRY_FRAME_SIZE,
    ENTRY_HEADER_POS,
    KIND_INLINE,
    KIND_POINTER,
    CorruptEntry,
    pointer_entry_size,
)
from .wal_format import parse_wal_object_key, wal_object_key

_CRC = struct.Struct(">I")
_BATCH_LENGTH = struct.Struct(">i")
_KEY_WAL = 1
_KEY_TEXT = 0
_KEY_POS = ENTRY_HEADER_POS + HEADER_SIZE  # where a pointer entry's key length starts


def _uvarint(value: int, out: bytearray) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise CorruptEntry("truncated or oversized varint in compact pointer entries")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_key(key: str, out: bytearray) -> None:
    try:
        info = parse_wal_object_key(key)
        uuid = bytes.fromhex(info.uuid)
    except ValueError:
        raw = key.encode()
        out.append(_KEY_TEXT)
        _uvarint(len(raw), out)
        out += raw
        return
    az = info.az.encode()
    out.append(_KEY_WAL)
    _uvarint(info.created_ms, out)
    _uvarint(len(az), out)
    out += az
    _uvarint(info.broker_id, out)
    out += uuid


def _decode_key(buf: bytes | memoryview, pos: int) -> tuple[str, int]:
    if pos >= len(buf):
        raise CorruptEntry("truncated key table in compact pointer entries")
    tag = buf[pos]
    pos += 1
    try:
        if tag == _KEY_TEXT:
            length, pos = _read_uvarint(buf, pos)
            return str(bytes(buf[pos : pos + length]), "utf-8"), pos + length
        if tag == _KEY_WAL:
            created_ms, pos = _read_uvarint(buf, pos)
            length, pos = _read_uvarint(buf, pos)
            az = str(bytes(buf[pos : pos + length]), "ascii")
            broker, pos = _read_uvarint(buf, pos + length)
            uuid = bytes(buf[pos : pos + 16])
            if len(uuid) != 16:
                raise CorruptEntry("truncated WAL object key in compact pointer entries")
            return wal_object_key(created_ms, az, broker, uuid.hex()), pos + 16
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptEntry(f"bad key in compact pointer entries: {exc}") from None
    raise CorruptEntry(f"unknown key tag {tag} in compact pointer entries")


def encode_key(key: str) -> bytes:
    """A WAL object key in the layout's ``key`` form (also used by CommitBatches on the wire)."""
    out = bytearray()
    _encode_key(key, out)
    return bytes(out)


def decode_key(data: bytes | memoryview) -> str:
    """Inverse of ``encode_key``; ``CorruptEntry`` for anything else."""
    key, end = _decode_key(data, 0)
    if end != len(data):
        raise CorruptEntry("trailing bytes after a WAL object key")
    return key


def encode(entries: bytes | bytearray | memoryview) -> bytes | None:
    """The compact form of a run of whole segment entries (as a pointer read returns them)."""
    view = memoryview(entries)
    keys: dict[str, int] = {}
    body = bytearray()
    pos = 0
    while pos < len(view):
        size = pointer_entry_size(view, pos)
        kind = view[pos + ENTRY_FRAME_SIZE - 1]
        header = view[pos + ENTRY_HEADER_POS : pos + _KEY_POS]
        if kind == KIND_POINTER:
            (key_length,) = _KEY_LENGTH.unpack_from(view, pos + _KEY_POS)
            key_start = pos + _KEY_POS + _KEY_LENGTH.size
            offset, batch_size = _LOCATION.unpack_from(view, key_start + key_length)
            if batch_size != 12 + _BATCH_LENGTH.unpack_from(header, 8)[0] or offset < 0:
                return None
            key = str(view[key_start : key_start + key_length], "utf-8")
            index = keys.setdefault(key, len(keys))
            body.append(KIND_POINTER)
            body += header
            _uvarint(index, body)
            _uvarint(offset, body)
        elif kind == KIND_INLINE:
            batch = view[pos + ENTRY_HEADER_POS : pos + size]
            body.append(KIND_INLINE)
            _uvarint(len(batch), body)
            body += batch
        else:
            return None
        pos += size
    out = bytearray(_CRC.pack(crc32c.crc32c(view)))
    _uvarint(len(keys), out)
    for key in keys:
        _encode_key(key, out)
    return bytes(out + body)


def _framed(kind: int, body: bytes) -> bytes:
    crc = crc32c.crc32c(body, crc32c.crc32c(bytes((kind,))))
    return _FRAME.pack(ENTRY_FRAME_SIZE - 4 + len(body), crc, kind) + body


def decode(data: bytes | bytearray | memoryview) -> bytes:
    """The leader's segment bytes back from ``encode``'s output; ``CorruptEntry`` if they do not check."""
    view = memoryview(data)
    if len(view) < _CRC.size:
        raise CorruptEntry("compact pointer entries shorter than their crc")
    (expected,) = _CRC.unpack_from(view, 0)
    count, pos = _read_uvarint(view, _CRC.size)
    keys: list[bytes] = []
    for _ in range(count):
        key, pos = _decode_key(view, pos)
        raw = key.encode()
        keys.append(_KEY_LENGTH.pack(len(raw)) + raw)
    out: list[bytes] = []
    while pos < len(view):
        kind = view[pos]
        pos += 1
        if kind == KIND_POINTER:
            header = bytes(view[pos : pos + HEADER_SIZE])
            if len(header) != HEADER_SIZE:
                raise CorruptEntry("truncated header in compact pointer entries")
            index, pos = _read_uvarint(view, pos + HEADER_SIZE)
            offset, pos = _read_uvarint(view, pos)
            if index >= len(keys) or offset >= 2**63:
                raise CorruptEntry("bad key reference or offset in compact pointer entries")
            size = 12 + _BATCH_LENGTH.unpack_from(header, 8)[0]
            try:
                location = _LOCATION.pack(offset, size)
            except struct.error:
                raise CorruptEntry(f"impossible batch size {size} in compact pointer entries") from None
            out.append(_framed(KIND_POINTER, header + keys[index] + location))
        elif kind == KIND_INLINE:
            size, pos = _read_uvarint(view, pos)
            batch = bytes(view[pos : pos + size])
            if len(batch) != size:
                raise CorruptEntry("truncated inline batch in compact pointer entries")
            pos += size
            out.append(_framed(KIND_INLINE, batch))
        else:
            raise CorruptEntry(f"unknown entry kind {kind} in compact pointer entries")
    segment = b"".join(out)
    if crc32c.crc32c(segment) != expected:
        raise CorruptEntry("compact pointer entries do not decode to the leader's bytes (crc32c mismatch)")
    return segment

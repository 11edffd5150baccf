"""Pointer entries as replica fetches carry them: a segment's entries re-encoded compactly. Sans-IO.

Followers copy every entry their leader appends, usually from another AZ, so an entry's wire size
is billed cross-AZ traffic for every produced batch (issue 10). A segment entry (``pointer.py``)
spends ~90 of its ~160 bytes on things a follower can rebuild: the frame (length and crc32c), the
WAL object key's text (its hour prefix repeats its creation time; the uuid is hex), the batch size
(always 12 + the header's ``batchLength``), and the same key once per batch of one object. On the
wire an entry is its batch header's fields as differences from the entry before (consecutive
batches: next offset, same epoch, near timestamps, same producer; the producer's CRC as it is), a
key reference and an offset: ~25 bytes where the segment has ~160. The follower rebuilds the
leader's segment bytes exactly and checks them against the leader's crc32c of the whole run, so a
bug or a damaged byte here can never put entries in a follower's log that the leader does not have.

Layout (integers big endian; ``uvarint``: unsigned LEB128)::

    crc        uint32    crc32c of the segment bytes this decodes to
    keyCount   uvarint
    keys       keyCount x key (with a shared table: keyCount x (index uvarint, key))
    entries    until the end: kind int8, then
                 1 (pointer): header (below), keyIndex uvarint, offset uvarint
                 2 (inline):  size uvarint, the batch (size bytes)
    key        tag int8, then
                 1 (a canonical WAL object key, ``wal_format``): createdMs uvarint, azLength uvarint,
                   az bytes, brokerId uvarint, uuid 16 bytes
                 0 (any other key): length uvarint, UTF-8 bytes

    header     the v2 header's fields, each a zigzag varint unless said, against the previous
               pointer entry's header in this run (``prev``; all zero before the first):
               baseOffset - (prev.baseOffset + prev.lastOffsetDelta + 1), batchLength,
               partitionLeaderEpoch - prev.epoch, crc uint32 as is, attributes, lastOffsetDelta,
               baseTimestamp - prev.maxTimestamp, maxTimestamp - baseTimestamp,
               producerId - prev.producerId, producerEpoch, baseSequence, recordCount
               (magic is always 2: another magic is sent uncompacted)

Shared keys: one flush's WAL object holds batches of many partitions, so one
replica fetch answer names the same key in many runs, one per partition (at 1,000 partitions,
~31 of a run's ~65 bytes). Encoded with the answer's table, a run writes only the keys no earlier
run of the answer wrote, each with its index in the table, and refers to the others by index. The
follower gathers every run's written keys first (``collect_keys``), then decodes each run against
them, in any order and whichever runs it applies.

``encode`` returns None for anything it cannot represent exactly (an entry whose pointed size is
not its header's); the caller then sends the segment bytes as they are.
"""

from __future__ import annotations

import functools
import struct

import crc32c

from diskless.protocol.records import HEADER_SIZE
from diskless.protocol.varint import read_uvarint, read_zigzag, write_uvarint, write_zigzag

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

# Replica fetches of a pointers segment carry pointer entries, not record batches. They travel in
# the same ``records`` field behind this 12-byte envelope: a batch frame whose base offset is
# negative, which no record batch in a log ever has, followed by the body's length. Base offset -4:
# the entries in this module's compact form with the answer's shared key table (for followers that
# say they read it); -3: the compact form alone (they cross AZs for every produced batch); -1: the
# segment bytes as they are (what older leaders send; -2 is tiering's envelope).
ENVELOPE = struct.Struct(">qi")
RAW_MARK, COMPACT_MARK, SHARED_MARK = (struct.pack(">q", mark) for mark in (-1, -3, -4))


def enveloped(data: bytes | memoryview) -> tuple[bytes, memoryview] | None:
    """(mark, body) of a pointer envelope, or None for record batches."""
    if len(data) < ENVELOPE.size:
        return None
    mark = bytes(data[:8])
    if mark != RAW_MARK and mark != COMPACT_MARK and mark != SHARED_MARK:
        return None
    _, length = ENVELOPE.unpack_from(data, 0)
    return mark, memoryview(data)[ENVELOPE.size : ENVELOPE.size + length]


_CRC = struct.Struct(">I")
# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_BATCH_LENGTH = struct.Struct(">i")
_KEY_WAL = 1
_KEY_TEXT = 0
_KEY_POS = ENTRY_HEADER_POS + HEADER_SIZE  # where a pointer entry's key length starts


# Differences between neighbouring entries' fields may pass 64 bits (11 groups of 7).
_uvarint = write_uvarint
_zigzag = write_zigzag
_read_uvarint = functools.partial(read_uvarint, max_bits=77, error=CorruptEntry)
_read_zigzag = functools.partial(read_zigzag, max_bits=77, error=CorruptEntry)


class _Previous:
    """The fields the next header is encoded against (all zero before a run's first header)."""

    __slots__ = ("epoch", "max_timestamp", "next_offset", "producer_id")

    def __init__(self) -> None:
        self.next_offset = self.epoch = self.max_timestamp = self.producer_id = 0


def _encode_header(header: bytes | memoryview, prev: _Previous, out: bytearray) -> bool:
    """Append ``header``'s fields; False (nothing appended) for a header this cannot carry."""
    base, length, epoch, magic, crc, attrs, delta, ts, max_ts, pid, pepoch, seq, count = _HEADER.unpack_from(header)
    if magic != 2:
        return False
    _zigzag(base - prev.next_offset, out)
    _zigzag(length, out)
    _zigzag(epoch - prev.epoch, out)
    out += _CRC.pack(crc)
    _zigzag(attrs, out)
    _zigzag(delta, out)
    _zigzag(ts - prev.max_timestamp, out)
    _zigzag(max_ts - ts, out)
    _zigzag(pid - prev.producer_id, out)
    _zigzag(pepoch, out)
    _zigzag(seq, out)
    _zigzag(count, out)
    prev.next_offset, prev.epoch, prev.max_timestamp, prev.producer_id = base + delta + 1, epoch, max_ts, pid
    return True


def _decode_header(buf: bytes | memoryview, pos: int, prev: _Previous) -> tuple[bytes, int]:
    base, pos = _read_zigzag(buf, pos)
    base += prev.next_offset
    length, pos = _read_zigzag(buf, pos)
    epoch, pos = _read_zigzag(buf, pos)
    epoch += prev.epoch
    if pos + _CRC.size > len(buf):
        raise CorruptEntry("truncated header in compact pointer entries")
    (crc,) = _CRC.unpack_from(buf, pos)
    pos += _CRC.size
    attrs, pos = _read_zigzag(buf, pos)
    delta, pos = _read_zigzag(buf, pos)
    ts, pos = _read_zigzag(buf, pos)
    ts += prev.max_timestamp
    max_ts, pos = _read_zigzag(buf, pos)
    max_ts += ts
    pid, pos = _read_zigzag(buf, pos)
    pid += prev.producer_id
    pepoch, pos = _read_zigzag(buf, pos)
    seq, pos = _read_zigzag(buf, pos)
    count, pos = _read_zigzag(buf, pos)
    try:
        header = _HEADER.pack(base, length, epoch, 2, crc, attrs, delta, ts, max_ts, pid, pepoch, seq, count)
    except struct.error:
        raise CorruptEntry("a header field out of range in compact pointer entries") from None
    prev.next_offset, prev.epoch, prev.max_timestamp, prev.producer_id = base + delta + 1, epoch, max_ts, pid
    return header, pos


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


def encode_header(header: bytes | memoryview) -> bytes | None:
    """One v2 batch header in the layout's ``header`` form (against nothing); None if not magic 2."""
    out = bytearray()
    return bytes(out) if len(header) == HEADER_SIZE and _encode_header(header, _Previous(), out) else None


def decode_header(data: bytes | memoryview) -> bytes:
    """Inverse of ``encode_header``; ``CorruptEntry`` for anything else."""
    header, end = _decode_header(data, 0, _Previous())
    if end != len(data):
        raise CorruptEntry("trailing bytes after a batch header")
    return header


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


def encode(entries: bytes | bytearray | memoryview, shared: dict[str, int] | None = None) -> bytes | None:
    """The compact form of a run of whole segment entries (as a pointer read returns them).

    With ``shared``, the key table of a whole replica fetch answer (key -> index, filled as its runs
    are encoded): a key is written once, in the first run of the answer that uses it, with its
    index, and every other run refers to it (the module's "Shared keys"). The table is only added to
    when the run is encoded, so a run sent uncompacted leaves no reference to a key written nowhere.
    """
    view = memoryview(entries)
    known = {} if shared is None else shared
    added: dict[str, int] = {}  # keys this run writes, with their indexes
    body = bytearray()
    prev = _Previous()
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
            index = known.get(key)
            if index is None:
                index = added.setdefault(key, len(known) + len(added))
            body.append(KIND_POINTER)
            if not _encode_header(header, prev, body):
                return None
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
    _uvarint(len(added), out)
    for key, index in added.items():
        if shared is not None:
            _uvarint(index, out)
        _encode_key(key, out)
    if shared is not None:
        shared.update(added)
    return bytes(out + body)


def _framed(kind: int, body: bytes) -> bytes:
    crc = crc32c.crc32c(body, crc32c.crc32c(bytes((kind,))))
    return _FRAME.pack(ENTRY_FRAME_SIZE - 4 + len(body), crc, kind) + body


def _read_keys(view: memoryview, shared: dict[int, bytes] | None) -> tuple[dict[int, bytes], int]:
    """The key table after the crc, as each key's length and text in a segment entry: this run's
    own (indexes in order), or with ``shared`` its written keys added to the answer's table."""
    count, pos = _read_uvarint(view, _CRC.size)
    keys: dict[int, bytes] = {} if shared is None else shared
    for position in range(count):
        index = position
        if shared is not None:
            index, pos = _read_uvarint(view, pos)
        key, pos = _decode_key(view, pos)
        raw = key.encode()
        keys[index] = _KEY_LENGTH.pack(len(raw)) + raw
    return keys, pos


def collect_keys(data: bytes | bytearray | memoryview, shared: dict[int, bytes]) -> None:
    """Add the keys a run encoded with a shared table writes to ``shared`` (the answer's table,
    gathered from all its runs before any is decoded: a run may use a key another run wrote)."""
    view = memoryview(data)
    if len(view) < _CRC.size:
        raise CorruptEntry("compact pointer entries shorter than their crc")
    _read_keys(view, shared)


def decode(data: bytes | bytearray | memoryview, shared: dict[int, bytes] | None = None) -> bytes:
    """The leader's segment bytes back from ``encode``'s output; ``CorruptEntry`` if they do not
    check. ``shared``: the answer's key table (``collect_keys``) for a run encoded with one."""
    view = memoryview(data)
    if len(view) < _CRC.size:
        raise CorruptEntry("compact pointer entries shorter than their crc")
    (expected,) = _CRC.unpack_from(view, 0)
    keys, pos = _read_keys(view, shared)
    out: list[bytes] = []
    prev = _Previous()
    while pos < len(view):
        kind = view[pos]
        pos += 1
        if kind == KIND_POINTER:
            header, pos = _decode_header(view, pos, prev)
            index, pos = _read_uvarint(view, pos)
            offset, pos = _read_uvarint(view, pos)
            key = keys.get(index)
            if key is None or offset >= 2**63:
                raise CorruptEntry("bad key reference or offset in compact pointer entries")
            size = 12 + _BATCH_LENGTH.unpack_from(header, 8)[0]
            try:
                location = _LOCATION.pack(offset, size)
            except struct.error:
                raise CorruptEntry(f"impossible batch size {size} in compact pointer entries") from None
            out.append(_framed(KIND_POINTER, header + key + location))
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

"""Kafka v2 record batches handled at the header level.

The broker's hot paths (produce validation, offset assignment, fetch) only ever look at the
61-byte batch header through ``struct`` and slice batches as memoryviews; records are never
decoded there. Decoding individual records (``iter_record_timestamps``) exists only for the
rare ListOffsets-by-timestamp lookup, which must find the exact record as Kafka does.

Layout of a v2 batch header (big endian)::

    0  baseOffset            int64     (not covered by the CRC)
    8  batchLength           int32     bytes after this field
    12 partitionLeaderEpoch  int32     (not covered by the CRC)
    16 magic                 int8      = 2
    17 crc                   uint32    crc32c of bytes [21, end)
    21 attributes            int16
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordCount           int32
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import crc32c

from .varint import read_zigzag, write_zigzag

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: what precedes the length-counted part
CRC_START = 21

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_LOG_APPEND = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20

NO_PRODUCER_ID = -1
NO_TIMESTAMP = -1


class InvalidBatch(Exception):
    """A batch that fails validation; ``error`` is the Kafka error code name to return."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


class BatchHeader(NamedTuple):
    """A v2 batch header's fields. A named tuple, not a frozen dataclass: one is built per batch
    on every produce, commit, replica append and pointer decode, and a frozen dataclass sets its
    13 fields one ``object.__setattr__`` at a time (1.8 against 0.3 µs per header)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_LOG_APPEND)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)


_new_header = tuple.__new__  # the tuple as unpacked, without NamedTuple.__new__'s argument binding


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    if len(buf) - pos < HEADER_SIZE:
        raise InvalidBatch("corrupt_message", "record batch shorter than its header")
    return _new_header(BatchHeader, _HEADER.unpack_from(buf, pos))


def peek_offset_and_size(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Base offset and total size of the batch at ``pos``, reading 12 bytes only."""
    base_offset, length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    return base_offset, LOG_OVERHEAD + length


def last_offset_at(buf: bytes | bytearray | memoryview, pos: int) -> int:
    return _INT64.unpack_from(buf, pos)[0] + _INT32.unpack_from(buf, pos + 23)[0]


def max_timestamp_at(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """The max timestamp field of the batch header at ``pos``, reading 8 bytes only."""
    return _INT64.unpack_from(buf, pos + 35)[0]


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    return crc32c.crc32c(memoryview(batch)[CRC_START:])


def split_batches(records: bytes | memoryview) -> list[memoryview]:
    """Cut a produce payload into its batches, checking framing only."""
    view = memoryview(records)
    out = []
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise InvalidBatch("corrupt_message", "truncated record batch")
        _, size = peek_offset_and_size(view, pos)
        if size < HEADER_SIZE or pos + size > end:
            raise InvalidBatch("corrupt_message", "record batch length out of bounds")
        out.append(view[pos : pos + size])
        pos += size
    return out


COMPRESSION_ZSTD = 4  # the highest codec id (none, gzip, snappy, lz4, zstd)


def validate_batch(batch: memoryview, max_message_bytes: int, from_client: bool = True) -> BatchHeader:
    """Check one producer batch the way Kafka's LogValidator does at the header level
    (``from_client`` off: a batch a coordinator built for a producer, which has no sequence)."""
    header = parse_header(batch)
    if header.magic in (0, 1):
        raise InvalidBatch("invalid_record", f"produce requests must hold magic 2 batches, not magic {header.magic}")
    if header.magic != 2:
        raise InvalidBatch("corrupt_message", f"invalid magic {header.magic}")
    if len(batch) > max_message_bytes:
        raise InvalidBatch(
            "message_too_large", f"batch of {len(batch)} bytes exceeds max.message.bytes {max_message_bytes}"
        )
    if compute_crc(batch) != header.crc:
        raise InvalidBatch("corrupt_message", "record batch CRC mismatch")
    if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
        raise InvalidBatch("invalid_record", "record count does not match the last offset delta")
    if header.is_control:
        raise InvalidBatch("invalid_record", "clients may not produce control batches")
    if header.compression > COMPRESSION_ZSTD:
        # Stored, no consumer could decode it (Kafka's CompressionType.forId refuses it).
        raise InvalidBatch("corrupt_message", f"unknown compression codec {header.compression}")
    if from_client and header.base_offset != 0:
        raise InvalidBatch("invalid_record", f"a produced batch's base offset must be 0, not {header.base_offset}")
    if from_client and header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidBatch("invalid_record", f"producer {header.producer_id} sent sequence {header.base_sequence}")
    return header


def assign_offset(batch: bytearray | memoryview, base_offset: int, leader_epoch: int) -> None:
    """Write the leader-assigned fields; neither is covered by the CRC."""
    _INT64.pack_into(batch, 0, base_offset)
    _INT32.pack_into(batch, 12, leader_epoch)


def set_log_append_time(batch: bytearray | memoryview, now_ms: int) -> None:
    """Stamp LogAppendTime into the header and refresh the CRC (attributes are covered)."""
    attributes = _INT16.unpack_from(batch, 21)[0]
    _INT16.pack_into(batch, 21, attributes | TIMESTAMP_TYPE_LOG_APPEND)
    _INT64.pack_into(batch, 35, now_ms)
    _UINT32.pack_into(batch, 17, compute_crc(batch))


def rewrite_codec(batch: bytearray, codec: int) -> None:
    """After its records body was replaced: the codec bits, the batch length and the CRC."""
    attributes = _INT16.unpack_from(batch, 21)[0]
    _INT16.pack_into(batch, 21, (attributes & ~COMPRESSION_MASK) | codec)
    _INT32.pack_into(batch, 8, len(batch) - LOG_OVERHEAD)
    _UINT32.pack_into(batch, 17, compute_crc(batch))


# --- record-level decoding: ListOffsets by timestamp only, never on produce/fetch paths ---


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's record fields) and the position after it; IndexError when the
    body ends inside it (callers report the batch as corrupt)."""
    return read_zigzag(buf, pos, error=IndexError)


# A v2 batch is checked at the header level only, so its compressed body is whatever the producer
# sent: zstd turns 200 MB of zeros into 6 KB. Decoding output is therefore capped; Kafka streams
# records instead, we materialise the body, so the cap is what bounds memory (a buffer up to the
# cap plus one copy). A legitimate batch holds at most max.message.bytes compressed; 64 times that
# is beyond real compression ratios on record data.
DECOMPRESSION_RATIO_LIMIT = 64
DEFAULT_MAX_DECOMPRESSED_BYTES = DECOMPRESSION_RATIO_LIMIT * 1048588  # Kafka's default max.message.bytes
_FIRST_GUESS = 64 * 1024


def max_decompressed_bytes(max_message_bytes: int) -> int:
    """The decompressed size a batch of a topic with this ``max.message.bytes`` may reach."""
    return DECOMPRESSION_RATIO_LIMIT * max(max_message_bytes, 1024)


def decompress_body(codec: int, data: bytes, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> bytes:
    """The body of a batch decompressed; InvalidBatch(corrupt_message) if it is corrupt or would
    exceed ``max_bytes`` (decompression stops there: memory never follows the sender's ratio)."""
    import cramjam

    if codec == 0:
        return data
    if codec == 2:
        return _snappy_decompress(data, max_bytes)
    into = {1: cramjam.gzip.decompress_into, 3: cramjam.lz4.decompress_into, 4: cramjam.zstd.decompress_into}.get(codec)
    if into is None:
        raise InvalidBatch("corrupt_message", f"unknown compression codec {codec}")
    # These decoders stream into a fixed buffer and fail once it is full, so try a buffer sized for
    # ordinary ratios first and double it up to the bound (a bomb costs a few bounded passes).
    size = min(max_bytes, max(_FIRST_GUESS, 8 * len(data)))
    while True:
        out = bytearray(size)
        try:
            written = into(data, out)
        except cramjam.DecompressionError as exc:
            if size >= max_bytes:
                raise InvalidBatch(
                    "corrupt_message", f"codec {codec} body is corrupt or decompresses past {max_bytes} bytes: {exc}"
                ) from None
            size = min(max_bytes, 2 * size)
            continue
        return bytes(memoryview(out)[:written])


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_raw(data: bytes | memoryview, budget: int) -> bytes:
    import cramjam

    try:
        # The raw format states its decoded length up front: check it before allocating anything.
        length = cramjam.snappy.decompress_raw_len(data)
        if length > budget:
            raise InvalidBatch("corrupt_message", f"snappy block of {length} bytes exceeds the {budget} left")
        out = bytearray(length)
        written = cramjam.snappy.decompress_raw_into(data, out)
    except cramjam.DecompressionError as exc:
        raise InvalidBatch("corrupt_message", f"corrupt snappy block: {exc}") from None
    return bytes(memoryview(out)[:written])


def _snappy_decompress(data: bytes, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> bytes:
    """Kafka's Java clients frame snappy the xerial way; librdkafka may send raw snappy."""
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_raw(data, max_bytes)
    view = memoryview(data)
    pos = 16  # magic + version + compatible version
    out = bytearray()
    while pos < len(data):
        if pos + 4 > len(data):
            raise InvalidBatch("corrupt_message", "truncated xerial snappy chunk header")
        (chunk_len,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if chunk_len < 0 or pos + chunk_len > len(data):
            raise InvalidBatch("corrupt_message", f"xerial snappy chunk of {chunk_len} bytes overruns the body")
        out += _snappy_raw(view[pos : pos + chunk_len], max_bytes - len(out))
        pos += chunk_len
    return bytes(out)


def iter_record_timestamps(
    batch: bytes, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED_BYTES
) -> Iterator[tuple[int, int]]:
    """Yield (offset, timestamp) of every record in a batch (decompressing if needed, at most
    ``max_decompressed`` bytes: InvalidBatch past that)."""
    header = parse_header(batch)
    if header.is_log_append_time and header.record_count == header.last_offset_delta + 1:
        # Every record at its own offset (a batch the log cleaner left whole): nothing to decode.
        for delta in range(header.record_count):
            yield header.base_offset + delta, header.max_timestamp
        return
    body = decompress_body(header.compression, bytes(batch[HEADER_SIZE:]), max_decompressed)
    pos = 0
    for _ in range(header.record_count):
        try:
            length, pos = read_varint(body, pos)
            end = pos + length
            pos += 1  # record attributes
            ts_delta, pos = read_varint(body, pos)
            off_delta, pos = read_varint(body, pos)
        except IndexError:
            raise InvalidBatch("corrupt_message", "record runs past the end of the batch body") from None
        # A LogAppendTime batch's records all carry the append time, whatever their own fields say.
        timestamp = header.max_timestamp if header.is_log_append_time else header.base_timestamp + ts_delta
        yield header.base_offset + off_delta, timestamp
        pos = end


# --- whole-record encoding: only for batches the broker writes itself (internal topics) ----------


def _zigzag(value: int) -> bytes:
    out = bytearray()
    write_zigzag(value, out)
    return bytes(out)


def _varbytes(value: bytes | None) -> bytes:
    return _zigzag(-1) if value is None else _zigzag(len(value)) + value


def build_batch(
    entries: list[tuple[bytes | None, bytes | None]],
    timestamp_ms: int,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """An uncompressed v2 batch of (key, value) records, base offset 0 (the log assigns it)."""
    body = bytearray()
    for delta, (key, value) in enumerate(entries):
        record = b"\x00" + _zigzag(0) + _zigzag(delta) + _varbytes(key) + _varbytes(value) + _zigzag(0)
        body += _zigzag(len(record)) + record
    header = bytearray(
        _HEADER.pack(
            0,
            HEADER_SIZE - LOG_OVERHEAD + len(body),
            -1,
            2,
            0,
            attributes,
            len(entries) - 1,
            timestamp_ms,
            timestamp_ms,
            producer_id,
            producer_epoch,
            base_sequence,
            len(entries),
        )
    )
    batch = header + body
    _UINT32.pack_into(batch, 17, compute_crc(batch))
    return bytes(batch)


def iter_records(batch: bytes) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of a batch (decompressing if needed)."""
    header = parse_header(batch)
    body = decompress_body(header.compression, bytes(batch[HEADER_SIZE:]))
    pos = 0
    for _ in range(header.record_count):
        length, pos = read_varint(body, pos)
        end = pos + length
        pos += 1
        _, pos = read_varint(body, pos)  # timestamp delta
        offset_delta, pos = read_varint(body, pos)
        key_len, pos = read_varint(body, pos)
        key = None if key_len < 0 else body[pos : pos + key_len]
        pos += max(key_len, 0)
        value_len, pos = read_varint(body, pos)
        value = None if value_len < 0 else body[pos : pos + value_len]
        yield header.base_offset + offset_delta, key, value
        pos = end

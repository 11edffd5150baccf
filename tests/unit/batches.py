"""Build and decode Kafka v2 record batches byte by byte, independently of ``diskless``.

Tests use this to feed the broker real bytes (varint-encoded records, optional compression,
crc32c over the covered part) and to read record payloads back without trusting the code under
test. Only the standard library, ``crc32c`` and ``cramjam`` are used.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import cramjam
import crc32c

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = (NONE, GZIP, SNAPPY, LZ4, ZSTD)
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

TIMESTAMP_TYPE_LOG_APPEND = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20

HEADER_SIZE = 61
_HEADER = struct.Struct(">qiibIhiqqqhii")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


# --- varints ---------------------------------------------------------------------------------


def zigzag_varint(value: int) -> bytes:
    """Kafka's signed varint/varlong: zigzag then base-128, least significant group first."""
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = encoded & 0x7F
        encoded >>= 7
        if encoded:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_zigzag_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _nullable_bytes(value: bytes | None) -> bytes:
    if value is None:
        return zigzag_varint(-1)
    return zigzag_varint(len(value)) + value


# --- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    value: bytes | None
    key: bytes | None = None
    timestamp: int | None = None  # absolute; None means "the batch base timestamp"
    headers: tuple[tuple[str, bytes | None], ...] = field(default_factory=tuple)


def encode_record(offset_delta: int, timestamp_delta: int, record: Record) -> bytes:
    body = bytearray(b"\x00")  # record attributes (unused)
    body += zigzag_varint(timestamp_delta)
    body += zigzag_varint(offset_delta)
    body += _nullable_bytes(record.key)
    body += _nullable_bytes(record.value)
    body += zigzag_varint(len(record.headers))
    for name, value in record.headers:
        raw = name.encode()
        body += zigzag_varint(len(raw)) + raw
        body += _nullable_bytes(value)
    return zigzag_varint(len(body)) + bytes(body)


def compress(codec: int, data: bytes, *, xerial: bool = True) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        if not xerial:
            return bytes(cramjam.snappy.compress_raw(data))
        # The Java client's framing: magic, version 1, compatible version 1, then sized chunks.
        out = bytearray(_XERIAL_MAGIC + struct.pack(">ii", 1, 1))
        chunk_size = 32 * 1024
        for i in range(0, max(len(data), 1), chunk_size):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + chunk_size]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown codec {codec}")


def decompress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.decompress(data)
    if codec == SNAPPY:
        if not data.startswith(_XERIAL_MAGIC):
            return bytes(cramjam.snappy.decompress_raw(data))
        pos, out = 16, bytearray()
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            out += bytes(cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        return bytes(out)
    if codec == LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"unknown codec {codec}")


def make_batch(
    records: Sequence[Record | bytes | None],
    *,
    base_offset: int = 0,
    base_timestamp: int = 1_700_000_000_000,
    compression: int = NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    log_append_time: bool = False,
    transactional: bool = False,
    control: bool = False,
    xerial: bool = True,
    magic: int = 2,
) -> bytes:
    """A complete, CRC-correct v2 batch holding ``records`` (bytes or None are plain values)."""
    recs = [r if isinstance(r, Record) else Record(r) for r in records]
    if not recs:
        raise ValueError("a batch needs at least one record")
    timestamps = [base_timestamp if r.timestamp is None else r.timestamp for r in recs]
    first_ts = timestamps[0]
    body = b"".join(encode_record(i, ts - first_ts, r) for i, (r, ts) in enumerate(zip(recs, timestamps, strict=True)))
    payload = compress(compression, body, xerial=xerial)
    attributes = compression
    if log_append_time:
        attributes |= TIMESTAMP_TYPE_LOG_APPEND
    if transactional:
        attributes |= TRANSACTIONAL_FLAG
    if control:
        attributes |= CONTROL_FLAG
    batch_length = HEADER_SIZE - 12 + len(payload)
    header = bytearray(
        _HEADER.pack(
            base_offset,
            batch_length,
            partition_leader_epoch,
            magic,
            0,
            attributes,
            len(recs) - 1,
            first_ts,
            max(timestamps),
            producer_id,
            producer_epoch,
            base_sequence,
            len(recs),
        )
    )
    batch = header + payload
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def values_batch(
    count: int, *, tag: str = "v", start_ts: int = 1_700_000_000_000, ts_step: int = 1, **kwargs: object
) -> bytes:
    """``count`` records ``{tag}-{i}`` with timestamps ``start_ts + i * ts_step``."""
    recs = [Record(f"{tag}-{i}".encode(), timestamp=start_ts + i * ts_step) for i in range(count)]
    return make_batch(recs, **kwargs)  # type: ignore[arg-type]


# --- decoding (test-side, independent of diskless) --------------------------------------------


@dataclass(frozen=True)
class DecodedRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class DecodedBatch:
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
    records: tuple[DecodedRecord, ...]

    @property
    def size(self) -> int:
        return 12 + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def crc_ok(batch: bytes) -> bool:
    (stored,) = struct.unpack_from(">I", batch, 17)
    return crc32c.crc32c(bytes(batch[21:])) == stored


def _read_nullable(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_zigzag_varint(buf, pos)
    if length < 0:
        return None, pos
    return bytes(buf[pos : pos + length]), pos + length


def decode_batch(batch: bytes) -> DecodedBatch:
    fields_ = _HEADER.unpack_from(batch, 0)
    header = dict(
        zip(
            (
                "base_offset",
                "batch_length",
                "partition_leader_epoch",
                "magic",
                "crc",
                "attributes",
                "last_offset_delta",
                "base_timestamp",
                "max_timestamp",
                "producer_id",
                "producer_epoch",
                "base_sequence",
                "record_count",
            ),
            fields_,
            strict=True,
        )
    )
    end = 12 + header["batch_length"]
    body = decompress(header["attributes"] & 0x07, bytes(batch[HEADER_SIZE:end]))
    log_append = bool(header["attributes"] & TIMESTAMP_TYPE_LOG_APPEND)
    out = []
    pos = 0
    for _ in range(header["record_count"]):
        length, pos = read_zigzag_varint(body, pos)
        rec_end = pos + length
        pos += 1
        ts_delta, pos = read_zigzag_varint(body, pos)
        off_delta, pos = read_zigzag_varint(body, pos)
        key, pos = _read_nullable(body, pos)
        value, pos = _read_nullable(body, pos)
        n_headers, pos = read_zigzag_varint(body, pos)
        hdrs = []
        for _ in range(n_headers):
            name, pos = _read_nullable(body, pos)
            hval, pos = _read_nullable(body, pos)
            hdrs.append(((name or b"").decode(), hval))
        assert pos == rec_end, "record length does not match its contents"
        ts = header["max_timestamp"] if log_append else header["base_timestamp"] + ts_delta
        out.append(DecodedRecord(header["base_offset"] + off_delta, ts, key, value, tuple(hdrs)))
    assert pos == len(body), "trailing bytes after the last record"
    return DecodedBatch(**header, records=tuple(out))


def split(data: bytes) -> list[bytes]:
    """Cut concatenated batches (a fetch response / a log file) into whole batches."""
    out = []
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        if pos + 12 + length > len(data):
            break
        out.append(bytes(data[pos : pos + 12 + length]))
        pos += 12 + length
    return out


def decode_all(data: bytes) -> list[DecodedRecord]:
    return [rec for batch in split(data) for rec in decode_batch(batch).records]

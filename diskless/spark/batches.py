"""Kafka v2 record batches decoded into Arrow columns for the ``diskless`` Spark data source. Sans-IO.

The broker never decodes records; the data source must, since Spark wants rows. Batches arrive
with their leader-assigned base offsets (served from a WAL range or read from a classic segment);
each is decompressed once (every Kafka codec, via ``records.decompress_body``) and its records are
appended to plain column lists, which become one ``pyarrow.RecordBatch`` per call of ``take``.

Transactions are filtered exactly as Kafka's consumer does for ``read_committed`` (its
``Fetcher``): the aborted transactions a fetch answer lists are taken in first-offset order; a
transactional batch whose producer has an aborted transaction starting at or before the batch's
last offset is dropped; that producer's ABORT marker ends the dropping. Control batches (commit
and abort markers) are never rows.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from diskless.protocol import records
from diskless.protocol.records import HEADER_SIZE, BatchHeader
from diskless.protocol.records import read_varint as _varint

_CONTROL_KEY = struct.Struct(">hh")  # version, type
CONTROL_ABORT = 0
TIMESTAMP_CREATE = 0
TIMESTAMP_LOG_APPEND = 1


class CorruptBatch(Exception):
    """Bytes that do not decode as the record batch their header promises."""


def iter_batches(data: bytes | bytearray | memoryview) -> Iterable[memoryview]:
    """Whole v2 batches of a run of batches; a partial batch at the end (a size-bounded read) is left out."""
    view = memoryview(data)
    pos = 0
    while len(view) - pos >= HEADER_SIZE:
        _, size = records.peek_offset_and_size(view, pos)
        if size < HEADER_SIZE or pos + size > len(view):
            return
        yield view[pos : pos + size]
        pos += size


@dataclass
class AbortedFilter:
    """Kafka consumer's read_committed filter over one fetch answer's aborted transactions."""

    pending: list[tuple[int, int]] = field(default_factory=list)  # heap of (first_offset, producer_id)
    aborting: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, aborted: Iterable[tuple[int, int]]) -> AbortedFilter:
        """From (producer_id, first_offset) pairs as FetchPointers answers them."""
        heap = [(int(first), int(pid)) for pid, first in aborted]
        heapq.heapify(heap)
        return cls(heap)

    def skip(self, header: BatchHeader, control_type: int | None) -> bool:
        """Whether the batch's records are hidden; updates the state for the batches after it."""
        if header.producer_id >= 0:
            # Taken in before an ABORT marker ends the dropping, as Kafka's consumer does for every
            # batch with a producer id: a read starting between an aborted transaction's records
            # and its marker sees the marker first, and taking the transaction in only later would
            # hide the producer's next (committed) transaction.
            while self.pending and self.pending[0][0] <= header.last_offset:
                self.aborting.add(heapq.heappop(self.pending)[1])
        if header.is_control:
            if control_type == CONTROL_ABORT:
                self.aborting.discard(header.producer_id)
            return True
        return header.is_transactional and header.producer_id in self.aborting


def control_type(batch: memoryview, header: BatchHeader) -> int | None:
    """The marker type (0 abort, 1 commit) of a control batch's first record, None if unreadable."""
    try:
        body = records.decompress_body(header.compression, bytes(batch[HEADER_SIZE:]))
        _, pos = _varint(body, 0)  # record length
        pos += 1  # attributes
        _, pos = _varint(body, pos)  # timestamp delta
        _, pos = _varint(body, pos)  # offset delta
        key_len, pos = _varint(body, pos)
        if key_len < _CONTROL_KEY.size:
            return None
        return _CONTROL_KEY.unpack_from(body, pos)[1]
    except (IndexError, struct.error, records.InvalidBatch):
        return None


class Columns:
    """Rows of one topic partition being gathered into Arrow columns (Spark's Kafka schema)."""

    def __init__(self, topic: str, partition: int, schema: pa.Schema) -> None:
        self.topic = topic
        self.partition = partition
        self.schema = schema
        self._clear()

    def _clear(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []  # microseconds, as Spark's timestamp type
        self.timestamp_types: list[int] = []
        self.header_starts: list[int] = [0]
        self.header_nulls: list[bool] = []
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []
        self.value_bytes = 0

    def __len__(self) -> int:
        return len(self.offsets)

    def add_batch(self, batch: memoryview, start: int, end: int) -> int:
        """Append the records of ``batch`` with offsets in [start, end); returns how many."""
        header = records.parse_header(batch)
        if header.size != len(batch):
            raise CorruptBatch(
                f"batch at offset {header.base_offset} is {len(batch)} bytes, its header says {header.size}"
            )
        if records.compute_crc(batch) != header.crc:
            raise CorruptBatch(f"batch at offset {header.base_offset} fails its CRC")
        try:
            body = records.decompress_body(header.compression, bytes(batch[HEADER_SIZE:]))
        except Exception as exc:
            raise CorruptBatch(f"batch at offset {header.base_offset}: cannot decompress: {exc}") from exc
        log_append = header.is_log_append_time
        ts_type = TIMESTAMP_LOG_APPEND if log_append else TIMESTAMP_CREATE
        base_offset = header.base_offset
        base_ts = header.base_timestamp
        keys, values, offsets, stamps, types = (
            self.keys,
            self.values,
            self.offsets,
            self.timestamps,
            self.timestamp_types,
        )
        h_starts, h_nulls = self.header_starts, self.header_nulls
        h_keys, h_values = self.header_keys, self.header_values
        added = 0
        value_bytes = 0
        base_us = base_ts * 1000
        append_us = header.max_timestamp * 1000
        pos = 0
        try:
            # Varints of one or two bytes (lengths, deltas, header counts) are decoded inline:
            # this loop is the reader's hot path, and a call per field costs more than the field.
            for _ in range(header.record_count):
                b = body[pos]
                if b < 0x80:
                    length, pos = (b >> 1) ^ -(b & 1), pos + 1
                elif body[pos + 1] < 0x80:
                    raw = (b & 0x7F) | (body[pos + 1] << 7)
                    length, pos = (raw >> 1) ^ -(raw & 1), pos + 2
                else:
                    length, pos = _varint(body, pos)
                record_end = pos + length
                b = body[pos + 1]  # after the record attributes (unused in v2)
                if b < 0x80:
                    ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
                else:
                    ts_delta, pos = _varint(body, pos + 1)
                b = body[pos]
                if b < 0x80:
                    offset = base_offset + ((b >> 1) ^ -(b & 1))
                    pos += 1
                else:
                    offset_delta, pos = _varint(body, pos)
                    offset = base_offset + offset_delta
                if not start <= offset < end:
                    pos = record_end
                    continue
                b = body[pos]
                if b < 0x80:
                    key_len, pos = (b >> 1) ^ -(b & 1), pos + 1
                else:
                    key_len, pos = _varint(body, pos)
                if key_len >= 0:
                    keys.append(body[pos : pos + key_len])
                    pos += key_len
                else:
                    keys.append(None)
                b = body[pos]
                if b < 0x80:
                    value_len, pos = (b >> 1) ^ -(b & 1), pos + 1
                elif body[pos + 1] < 0x80:
                    raw = (b & 0x7F) | (body[pos + 1] << 7)
                    value_len, pos = (raw >> 1) ^ -(raw & 1), pos + 2
                else:
                    value_len, pos = _varint(body, pos)
                if value_len >= 0:
                    values.append(body[pos : pos + value_len])
                    pos += value_len
                    value_bytes += value_len
                else:
                    values.append(None)
                count = body[pos]
                if count < 0x80:
                    count, pos = (count >> 1) ^ -(count & 1), pos + 1
                else:
                    count, pos = _varint(body, pos)
                for _ in range(count):
                    hk_len, pos = _varint(body, pos)
                    h_keys.append(body[pos : pos + hk_len].decode())
                    pos += hk_len
                    hv_len, pos = _varint(body, pos)
                    if hv_len >= 0:
                        h_values.append(body[pos : pos + hv_len])
                        pos += hv_len
                    else:
                        h_values.append(None)
                h_starts.append(len(h_keys))
                h_nulls.append(count == 0)  # Spark's Kafka source: no headers is a null array
                offsets.append(offset)
                stamps.append(append_us if log_append else base_us + ts_delta * 1000)
                types.append(ts_type)
                added += 1
                if pos != record_end:
                    raise CorruptBatch(f"record at offset {offset} is {pos - record_end} bytes off its length")
        except (IndexError, UnicodeDecodeError) as exc:
            raise CorruptBatch(f"batch at offset {base_offset}: truncated or garbled record ({exc})") from exc
        finally:
            self.value_bytes += value_bytes
        return added

    def take(self) -> pa.RecordBatch:
        """The gathered rows as one Arrow batch of ``schema``; starts gathering afresh."""
        n = len(self.offsets)
        headers_type = self.schema.field("headers").type
        item = headers_type.value_type
        pairs = pa.StructArray.from_arrays(
            [
                pa.array(self.header_keys, type=item.field("key").type),
                pa.array(self.header_values, type=item.field("value").type),
            ],
            fields=list(item),
        )
        headers = pa.ListArray.from_arrays(
            pa.array(self.header_starts, type=pa.int32()),
            pairs,
            type=headers_type,
            mask=pa.array(self.header_nulls, type=pa.bool_()),
        )
        columns = {
            "key": pa.array(self.keys, type=pa.binary()),
            "value": pa.array(self.values, type=pa.binary()),
            "topic": pa.repeat(pa.scalar(self.topic, self.schema.field("topic").type), n),
            "partition": pa.repeat(pa.scalar(self.partition, self.schema.field("partition").type), n),
            "offset": pa.array(self.offsets, type=self.schema.field("offset").type),
            "timestamp": pa.array(self.timestamps, type=self.schema.field("timestamp").type),
            "timestampType": pa.array(self.timestamp_types, type=self.schema.field("timestampType").type),
            "headers": headers,
        }
        self._clear()
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.schema], schema=self.schema)

"""A minimal Kafka client over a raw TCP socket: kio entities in, kio entities out.

Used where real clients cannot go: malformed frames, unsupported versions, hand-made record
batches, and APIs no client library exposes (OffsetForLeaderEpoch). Everything blocks with a
deadline; nothing sleeps.
"""

from __future__ import annotations

import datetime
import importlib
import io
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import crc32c
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.serial import entity_reader, entity_writer

API_VERSIONS_KEY = 18
_SIZE = struct.Struct(">i")


def response_class(request: Any) -> type:
    """The kio response class matching a request entity (same API, same version)."""
    module = type(request).__module__.rsplit(".", 1)[0] + ".response"
    name = type(request).__name__.removesuffix("Request") + "Response"
    return getattr(importlib.import_module(module), name)


def encode_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None, flexible: bool) -> bytes:
    out = struct.pack(">hhi", api_key, api_version, correlation_id)
    if client_id is None:
        out += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        out += struct.pack(">h", len(raw)) + raw
    if flexible:
        out += b"\x00"  # no tagged fields
    return out


def encode_request(request: Any, correlation_id: int, client_id: str | None = "rawclient") -> bytes:
    cls = type(request)
    body = io.BytesIO()
    entity_writer(cls)(body, request)
    header = encode_header(int(cls.__api_key__), int(cls.__version__), correlation_id, client_id, cls.__flexible__)
    payload = header + body.getvalue()
    return _SIZE.pack(len(payload)) + payload


class ConnectionClosed(Exception):
    pass


class RawClient:
    """One blocking connection. ``request`` sends and waits for the matching response."""

    def __init__(self, bootstrap: str, timeout: float = 10.0) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.timeout = timeout
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._next_correlation = 1
        self._buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def correlation(self) -> int:
        cid = self._next_correlation
        self._next_correlation += 1
        return cid

    def send(self, request: Any) -> int:
        cid = self.correlation()
        self.sock.sendall(encode_request(request, cid))
        return cid

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete response within {self.timeout}s")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError as exc:
                raise ConnectionClosed("connection reset by broker") from exc
            if not chunk:
                raise ConnectionClosed("broker closed the connection")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def read_frame(self) -> bytes:
        deadline = time.monotonic() + self.timeout
        (size,) = _SIZE.unpack(self._read_exact(4, deadline))
        return self._read_exact(size, deadline)

    def receive(self, response_cls: type, api_key: int, expect_correlation: int | None = None) -> Any:
        frame = self.read_frame()
        (correlation,) = _SIZE.unpack_from(frame, 0)
        if expect_correlation is not None:
            assert correlation == expect_correlation, f"response for {correlation}, expected {expect_correlation}"
        pos = 4
        if response_cls.__flexible__ and api_key != API_VERSIONS_KEY:
            assert frame[pos] == 0, "unexpected tagged fields in response header"
            pos += 1
        entity, _ = entity_reader(response_cls)(frame, pos)
        return entity

    def request(self, request: Any) -> Any:
        cid = self.send(request)
        return self.receive(response_class(request), int(type(request).__api_key__), cid)

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """True once the broker has closed this connection (EOF or reset) within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not chunk:
                return True
        return False


# --- v2 record batches by hand -------------------------------------------------------------------


def _zigzag_varint(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_zigzag(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _encode_bytes(value: bytes | None) -> bytes:
    if value is None:
        return _zigzag_varint(-1)
    return _zigzag_varint(len(value)) + value


BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
CRC_START = 21


def build_batch(
    records: list[tuple[bytes | None, bytes | None]],
    base_timestamp: int | None = None,
    timestamps: list[int] | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """An uncompressed magic-2 batch of (key, value) records with a correct CRC32C."""
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    if timestamps is None:
        timestamps = [base_timestamp] * len(records)
    body = bytearray()
    for delta, ((key, value), ts) in enumerate(zip(records, timestamps, strict=True)):
        record = (
            b"\x00"  # attributes
            + _zigzag_varint(ts - base_timestamp)
            + _zigzag_varint(delta)
            + _encode_bytes(key)
            + _encode_bytes(value)
            + _zigzag_varint(0)  # no headers
        )
        body += _zigzag_varint(len(record)) + record
    count = len(records)
    header = BATCH_HEADER.pack(
        0,  # base offset: the broker assigns it
        BATCH_HEADER.size - 12 + len(body),
        -1,  # partition leader epoch
        2,  # magic
        0,  # crc placeholder
        attributes,
        count - 1,
        base_timestamp,
        max(timestamps),
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    batch = bytearray(header + body)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[CRC_START:])))
    return bytes(batch)


@dataclass(frozen=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def decode_batches(data: bytes) -> list[Record]:
    """Records of uncompressed v2 batches as returned by Fetch (a partial trailing batch is skipped)."""
    out: list[Record] = []
    pos = 0
    while pos + BATCH_HEADER.size <= len(data):
        fields = BATCH_HEADER.unpack_from(data, pos)
        base_offset, length, _, magic, _, attributes, _, base_ts, max_ts = fields[:9]
        count = fields[12]
        end = pos + 12 + length
        if end > len(data):
            break
        assert magic == 2 and attributes & 0x07 == 0, "only uncompressed v2 batches are decoded here"
        p = pos + BATCH_HEADER.size
        for _ in range(count):
            length_r, p = _read_zigzag(data, p)
            record_end = p + length_r
            p += 1
            ts_delta, p = _read_zigzag(data, p)
            off_delta, p = _read_zigzag(data, p)
            key_len, p = _read_zigzag(data, p)
            key = None if key_len < 0 else data[p : p + key_len]
            p += max(key_len, 0)
            value_len, p = _read_zigzag(data, p)
            value = None if value_len < 0 else data[p : p + value_len]
            timestamp = max_ts if attributes & 0x08 else base_ts + ts_delta
            out.append(Record(base_offset + off_delta, timestamp, key, value))
            p = record_end
        pos = end
    return out


# --- request builders ---------------------------------------------------------------------------


def produce_request(topic: str, partition: int, batch: bytes, acks: int = -1, version: int = 7) -> Any:
    mod = importlib.import_module(f"kio.schema.produce.v{version}.request")
    return mod.ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=_ms(10000),
        topic_data=(
            mod.TopicProduceData(
                name=topic, partition_data=(mod.PartitionProduceData(index=partition, records=batch),)
            ),
        ),
    )


def fetch_request(topic: str, partition: int, offset: int, max_bytes: int = 1 << 20, max_wait_ms: int = 0) -> Any:
    return FetchRequest(
        replica_id=-1,
        max_wait=_ms(max_wait_ms),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def metadata_request(topics: list[str] | None, allow_auto_create: bool = False) -> Any:
    return MetadataRequest(
        topics=None if topics is None else tuple(MetadataRequestTopic(name=t) for t in topics),
        allow_auto_topic_creation=allow_auto_create,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def _ms(value: int) -> Any:
    return datetime.timedelta(milliseconds=value)


class Session(RawClient):
    """RawClient plus the few round trips tests need over and over."""

    def produce(self, topic: str, partition: int, batch: bytes, acks: int = -1) -> Any:
        response = self.request(produce_request(topic, partition, batch, acks))
        return response.responses[0].partition_responses[0]

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20) -> Any:
        response = self.request(fetch_request(topic, partition, offset, max_bytes))
        return response.responses[0].partitions[0]

    def fetch_all(self, topic: str, partition: int, offset: int = 0) -> list[Record]:
        """Every record from ``offset`` up to the high watermark."""
        out: list[Record] = []
        while True:
            part = self.fetch(topic, partition, offset)
            assert int(part.error_code) == 0, f"fetch error {part.error_code!r}"
            batch_records = [r for r in decode_batches(part.records or b"") if r.offset >= offset]
            out += batch_records
            if not batch_records or out[-1].offset + 1 >= part.high_watermark:
                return out
            offset = out[-1].offset + 1

    def metadata(self, topics: list[str] | None, allow_auto_create: bool = False) -> Any:
        return self.request(metadata_request(topics, allow_auto_create))

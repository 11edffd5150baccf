"""Replica fetches between diskless brokers in a compact form (``INTERNAL_REPLICA_FETCH``).

Why. A follower in another AZ fetches every produced batch's pointer, so Kafka's Fetch framing is
paid across AZs per batch. Fetch v13 spends 33 bytes on each partition of a request (offsets and
epochs as int64/int32), ~37 on each partition of an answer (high watermark, last stable offset and
log start offset as int64, empty lists, tags), and 12 on the envelope of a pointer run; each
request's header carries the fetcher's 36-byte client id. With ~2 KB batches at 1,000 partitions
that framing was most of the bytes crossing AZs. Here the same fields are varints, the last stable
offset is written relative to the high watermark (usually 0: one byte), optional fields are bits
of a flags byte, and a shared-key pointer run (envelope -4, ``replication/partition.py``) is a flag
instead of its envelope.

Same semantics. Only the bytes differ: the leader reads a request into the very Fetch v13 request
entity a Fetch would give it and runs the same handler (sessions, quiet partitions, diverging
epochs, throttling, tier state are all its business); the answer is the same dict, written here
instead of by ``fetch_response``. The follower reads it into ``FetchAnswer``, which has the
attributes of kio's Fetch v13 response that the fetcher uses. Records are passed through whole.

Negotiation. A leader that serves this API says so in its answer to the internal authentication
challenge (``internal.SERVED_APIS``), which every broker-to-broker connection starts with; a
follower sends Fetch v13 to a leader that does not (an older version, mid-upgrade). Requests carry
no client id: the connection's was given at its authentication.

Request body (after the request header):
    zigzag replica_id; uvarint max_wait_ms, min_bytes, max_bytes; byte isolation_level;
    zigzag session_id, session_epoch; uvarint partition_max_bytes (the default of the partitions);
    uvarint topic count, per topic: 16-byte id, uvarint partition count, per partition:
        zigzag partition, current_leader_epoch, fetch_offset, last_fetched_epoch,
        log_start_offset; uvarint partition_max_bytes + 1 (0: the request's default);
    uvarint forgotten topic count, per topic: 16-byte id, uvarint count, zigzag partitions;
    uvarint rack length, rack (UTF-8).
Answer body (after the correlation id):
    zigzag throttle_time_ms, error_code, session_id;
    uvarint topic count, per topic: 16-byte id, uvarint partition count, per partition:
        zigzag partition_index, error_code, high_watermark,
        high_watermark - last_stable_offset, log_start_offset; byte flags (below);
        [aborted: uvarint count, per entry zigzag producer_id, first_offset]
        [diverging: zigzag epoch, end_offset] [preferred: zigzag read replica]
        [records: uvarint length, bytes].
"""

from __future__ import annotations

import datetime
import functools
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13.request import FetchPartition, FetchRequest, FetchTopic, ForgottenTopic

from .response_wire import I32, milliseconds
from .varint import read_uvarint, read_zigzag, write_uvarint, write_zigzag

__all__ = [
    "AnsweredPartition",
    "AnsweredTopic",
    "Diverging",
    "FetchAnswer",
    "ReplicaFetchWireError",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_request",
]


T = TypeVar("T")


class ReplicaFetchWireError(ValueError):
    """Bytes that are not a well-formed request or answer of this form."""


# Partition answer flags.
_ABORTED = 0x01  # a list of aborted transactions follows (absent: the empty list)
_ABORTED_NULL = 0x02  # the list is null (read_committed fetches of old versions; kept for fidelity)
_DIVERGING = 0x04  # a diverging epoch follows
_PREFERRED = 0x08  # a preferred read replica follows (absent: -1)
_RECORDS = 0x10  # records follow (absent: empty)
_RECORDS_NULL = 0x20  # records are null
_POINTER_RUN = 0x40  # the records are a shared-key pointer run, written without its envelope
_KNOWN_FLAGS = 0x7F

# The 12-byte envelope of a shared-key pointer run: base offset -4, then the body's length.
_ENVELOPE = struct.Struct(">qi")
_SHARED_MARK = struct.pack(">q", -4)

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_ZERO_ID = bytes(16)


def _read_u(buf: memoryview, pos: int) -> tuple[int, int]:
    return read_uvarint(buf, pos, max_bits=64, error=ReplicaFetchWireError)


def _read_z(buf: memoryview, pos: int) -> tuple[int, int]:
    return read_zigzag(buf, pos, max_bits=64, error=ReplicaFetchWireError)


def _read_i64(buf: memoryview, pos: int) -> tuple[int, int]:
    value, pos = _read_z(buf, pos)
    _check_i64(value)
    return value, pos


def _check_i64(value: int) -> None:
    # A 10-byte varint holds 70 bits; offsets go on into logs and checkpoints as int64s.
    if not _I64_MIN <= value <= _I64_MAX:
        raise ReplicaFetchWireError(f"{value} does not fit an int64")


def _read_i32(buf: memoryview, pos: int, signed: bool = True) -> tuple[int, int]:
    value, pos = _read_z(buf, pos) if signed else _read_u(buf, pos)
    if not _I32_MIN <= value <= _I32_MAX:
        raise ReplicaFetchWireError(f"{value} does not fit an int32")
    return value, pos


def _read_count(buf: memoryview, pos: int, least_bytes: int) -> tuple[int, int]:
    """An element count, refused when the rest of the buffer cannot hold that many elements of at
    least ``least_bytes`` each (a hostile count must not make the reader allocate)."""
    count, pos = _read_u(buf, pos)
    if count * least_bytes > len(buf) - pos:
        raise ReplicaFetchWireError(f"count {count} larger than the bytes left")
    return count, pos


def _read_id(buf: memoryview, pos: int) -> tuple[uuid.UUID, int]:
    end = pos + 16
    if end > len(buf):
        raise ReplicaFetchWireError("truncated topic id")
    return uuid.UUID(bytes=bytes(buf[pos:end])), end


def _id_bytes(topic_id: Any) -> bytes:
    if topic_id is None:
        return _ZERO_ID
    if isinstance(topic_id, uuid.UUID):
        return topic_id.bytes
    return uuid.UUID(str(topic_id)).bytes


# --- requests (follower -> leader) -------------------------------------------------------------


def encode_request(request: FetchRequest) -> bytes:
    """The body of an ``INTERNAL_REPLICA_FETCH`` request for a Fetch v13 request entity."""
    out = bytearray()
    u, z = write_uvarint, write_zigzag
    z(int(request.replica_id), out)
    u(milliseconds(request.max_wait), out)
    u(int(request.min_bytes), out)
    u(int(request.max_bytes), out)
    out.append(int(request.isolation_level))
    z(int(request.session_id), out)
    z(int(request.session_epoch), out)
    default_max = _default_max(request.topics)
    u(default_max, out)
    u(len(request.topics), out)
    for topic in request.topics:
        out += _id_bytes(topic.topic_id)
        u(len(topic.partitions), out)
        for p in topic.partitions:
            z(int(p.partition), out)
            z(int(p.current_leader_epoch), out)
            z(int(p.fetch_offset), out)
            z(int(p.last_fetched_epoch), out)
            z(int(p.log_start_offset), out)
            u(0 if p.partition_max_bytes == default_max else int(p.partition_max_bytes) + 1, out)
    u(len(request.forgotten_topics_data), out)
    for forgotten in request.forgotten_topics_data:
        out += _id_bytes(forgotten.topic_id)
        u(len(forgotten.partitions), out)
        for index in forgotten.partitions:
            z(int(index), out)
    rack = (request.rack_id or "").encode()
    u(len(rack), out)
    out += rack
    return bytes(out)


def _default_max(topics: Iterable[FetchTopic]) -> int:
    """The request's default partition_max_bytes (the first partition's): a replica fetcher asks
    the same of every partition, which then costs one byte each."""
    for topic in topics:
        for p in topic.partitions:
            return int(p.partition_max_bytes)
    return 0


def decode_request(data: bytes | memoryview) -> FetchRequest:
    """The Fetch v13 request entity an ``INTERNAL_REPLICA_FETCH`` body stands for."""
    buf = memoryview(data)
    try:
        return _decode_request(buf)
    except IndexError as exc:  # a byte read past the end
        raise ReplicaFetchWireError("truncated replica fetch request") from exc


def _read_topics(
    buf: memoryview, pos: int, item_bytes: int, read_item: Callable[[memoryview, int], tuple[T, int]]
) -> tuple[list[tuple[uuid.UUID, list[T]]], int]:
    """A topic list: a count, then per topic its id and a count of items ``read_item`` reads (each
    at least ``item_bytes`` long)."""
    count, pos = _read_count(buf, pos, 16 + 1)
    topics = []
    for _ in range(count):
        topic_id, pos = _read_id(buf, pos)
        n, pos = _read_count(buf, pos, item_bytes)
        items = []
        for _ in range(n):
            item, pos = read_item(buf, pos)
            items.append(item)
        topics.append((topic_id, items))
    return topics, pos


def _read_fetch_partition(buf: memoryview, pos: int, default_max: int) -> tuple[FetchPartition, int]:
    index, pos = _read_i32(buf, pos)
    current_epoch, pos = _read_i32(buf, pos)
    fetch_offset, pos = _read_i64(buf, pos)
    last_epoch, pos = _read_i32(buf, pos)
    log_start, pos = _read_i64(buf, pos)
    part_max, pos = _read_u(buf, pos)  # partition_max_bytes + 1, or 0
    if part_max > _I32_MAX + 1:
        raise ReplicaFetchWireError(f"partition_max_bytes {part_max - 1} does not fit an int32")
    partition = FetchPartition(
        partition=index,  # type: ignore[arg-type]
        current_leader_epoch=current_epoch,  # type: ignore[arg-type]
        fetch_offset=fetch_offset,  # type: ignore[arg-type]
        last_fetched_epoch=last_epoch,  # type: ignore[arg-type]
        log_start_offset=log_start,  # type: ignore[arg-type]
        partition_max_bytes=part_max - 1 if part_max else default_max,  # type: ignore[arg-type]
    )
    return partition, pos


def _decode_request(buf: memoryview) -> FetchRequest:
    replica_id, pos = _read_i32(buf, 0)
    max_wait, pos = _read_i32(buf, pos, signed=False)
    min_bytes, pos = _read_i32(buf, pos, signed=False)
    max_bytes, pos = _read_i32(buf, pos, signed=False)
    isolation_level = buf[pos]
    pos += 1
    if isolation_level not in (0, 1):  # read_uncommitted, read_committed
        raise ReplicaFetchWireError(f"isolation level {isolation_level}")
    session_id, pos = _read_i32(buf, pos)
    session_epoch, pos = _read_i32(buf, pos)
    default_max, pos = _read_i32(buf, pos, signed=False)
    fetched, pos = _read_topics(buf, pos, 6, functools.partial(_read_fetch_partition, default_max=default_max))
    topics = tuple(FetchTopic(topic_id=topic_id, partitions=tuple(partitions)) for topic_id, partitions in fetched)
    dropped, pos = _read_topics(buf, pos, 1, _read_i32)
    forgotten = tuple(ForgottenTopic(topic_id=t, partitions=tuple(indexes)) for t, indexes in dropped)  # type: ignore[arg-type]
    rack_len, pos = _read_count(buf, pos, 1)
    try:
        rack = bytes(buf[pos : pos + rack_len]).decode()
    except UnicodeDecodeError as exc:
        raise ReplicaFetchWireError("rack is not UTF-8") from exc
    pos += rack_len
    if pos != len(buf):
        raise ReplicaFetchWireError(f"{len(buf) - pos} bytes after the request")
    return FetchRequest(
        replica_id=replica_id,  # type: ignore[arg-type]
        max_wait=datetime.timedelta(milliseconds=max_wait),  # type: ignore[arg-type]
        min_bytes=min_bytes,  # type: ignore[arg-type]
        max_bytes=max_bytes,  # type: ignore[arg-type]
        isolation_level=isolation_level,  # type: ignore[arg-type]
        session_id=session_id,  # type: ignore[arg-type]
        session_epoch=session_epoch,  # type: ignore[arg-type]
        topics=topics,
        forgotten_topics_data=forgotten,
        rack_id=rack,
    )


# --- answers (leader -> follower) --------------------------------------------------------------


class Diverging(NamedTuple):
    epoch: int
    end_offset: int


class AnsweredPartition(NamedTuple):
    partition_index: int
    error_code: ErrorCode
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[tuple[int, int], ...] | None  # (producer id, first offset)
    diverging_epoch: Diverging | None
    preferred_read_replica: int
    records: bytes | None


class AnsweredTopic(NamedTuple):
    topic_id: uuid.UUID
    partitions: list[AnsweredPartition]


class FetchAnswer(NamedTuple):
    throttle_time_ms: int
    error_code: ErrorCode
    session_id: int
    responses: list[AnsweredTopic]


def encode_answer(correlation_id: int, body: Mapping[str, Any]) -> bytes:
    """The whole frame (size, correlation id, body) answering a replica fetch with the Fetch
    handler's dict (keys as in FetchResponse.json, a missing one meaning its default)."""
    out = bytearray(8)  # size and correlation id, filled in below
    u, z = write_uvarint, write_zigzag
    z(milliseconds(body.get("throttle_time", 0)), out)
    z(int(body.get("error_code", 0)), out)
    z(int(body.get("session_id", 0)), out)
    topics = list(body.get("responses", ()))
    u(len(topics), out)
    for topic in topics:
        out += _id_bytes(topic.get("topic_id"))
        partitions = topic.get("partitions", ())
        u(len(partitions), out)
        for p in partitions:
            _encode_partition(p, out)
    struct.pack_into(">ii", out, 0, len(out) - 4, correlation_id)
    return bytes(out)


def _encode_partition(p: Mapping[str, Any], out: bytearray) -> None:
    u, z = write_uvarint, write_zigzag
    z(int(p["partition_index"]), out)
    z(int(p.get("error_code", 0)), out)
    high_watermark = int(p.get("high_watermark", 0))
    z(high_watermark, out)
    z(high_watermark - int(p.get("last_stable_offset", -1)), out)
    z(int(p.get("log_start_offset", -1)), out)
    aborted = p.get("aborted_transactions", ())
    diverging = p.get("diverging_epoch")
    if diverging is not None and diverging["epoch"] == -1 and diverging["end_offset"] == -1:
        diverging = None  # Kafka's default: no divergence
    preferred = int(p.get("preferred_read_replica", -1))
    records = p.get("records", b"")
    flags = 0
    if aborted is None:
        flags |= _ABORTED_NULL
    elif aborted:
        flags |= _ABORTED
    if diverging is not None:
        flags |= _DIVERGING
    if preferred != -1:
        flags |= _PREFERRED
    if records is None:
        flags |= _RECORDS_NULL
    elif records:
        flags |= _RECORDS
        if records[:8] == _SHARED_MARK and len(records) >= 12 and I32.unpack_from(records, 8)[0] == len(records) - 12:
            flags |= _POINTER_RUN
            records = memoryview(records)[12:]
    out.append(flags)
    if flags & _ABORTED:
        u(len(aborted), out)
        for entry in aborted:
            z(int(entry["producer_id"]), out)
            z(int(entry["first_offset"]), out)
    if diverging is not None:
        z(int(diverging["epoch"]), out)
        z(int(diverging["end_offset"]), out)
    if flags & _PREFERRED:
        z(preferred, out)
    if flags & _RECORDS:
        u(len(records), out)
        out += records


def decode_answer(data: bytes | memoryview) -> FetchAnswer:
    """A replica fetch answer's body (after the correlation id)."""
    buf = memoryview(data)
    try:
        return _decode_answer(buf)
    except IndexError as exc:
        raise ReplicaFetchWireError("truncated replica fetch answer") from exc


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError as exc:
        raise ReplicaFetchWireError(f"unknown error code {code}") from exc


def _decode_answer(buf: memoryview) -> FetchAnswer:
    throttle, pos = _read_i32(buf, 0)
    error, pos = _read_i32(buf, pos)
    session_id, pos = _read_i32(buf, pos)
    answered, pos = _read_topics(buf, pos, 6, _decode_partition)
    topics = [AnsweredTopic(topic_id, partitions) for topic_id, partitions in answered]
    if pos != len(buf):
        raise ReplicaFetchWireError(f"{len(buf) - pos} bytes after the answer")
    return FetchAnswer(throttle, _error(error), session_id, topics)


def _decode_partition(buf: memoryview, pos: int) -> tuple[AnsweredPartition, int]:
    index, pos = _read_i32(buf, pos)
    error, pos = _read_i32(buf, pos)
    high_watermark, pos = _read_i64(buf, pos)
    stable_gap, pos = _read_z(buf, pos)
    _check_i64(high_watermark - stable_gap)
    log_start, pos = _read_i64(buf, pos)
    flags = buf[pos]
    pos += 1
    if flags & ~_KNOWN_FLAGS:
        raise ReplicaFetchWireError(f"unknown flags {flags:#x}")
    aborted: tuple[tuple[int, int], ...] | None = None if flags & _ABORTED_NULL else ()
    if flags & _ABORTED:
        n, pos = _read_count(buf, pos, 2)
        entries = []
        for _ in range(n):
            producer_id, pos = _read_i64(buf, pos)
            first_offset, pos = _read_i64(buf, pos)
            entries.append((producer_id, first_offset))
        aborted = tuple(entries)
    diverging = None
    if flags & _DIVERGING:
        epoch, pos = _read_i32(buf, pos)
        end_offset, pos = _read_i64(buf, pos)
        diverging = Diverging(epoch, end_offset)
    preferred = -1
    if flags & _PREFERRED:
        preferred, pos = _read_i32(buf, pos)
    records: bytes | None = None if flags & _RECORDS_NULL else b""
    if flags & _RECORDS:
        size, pos = _read_count(buf, pos, 1)
        body = buf[pos : pos + size]
        pos += size
        records = _ENVELOPE.pack(-4, size) + body if flags & _POINTER_RUN else bytes(body)
    answered = AnsweredPartition(
        index,
        _error(error),
        high_watermark,
        high_watermark - stable_gap,
        log_start,
        aborted,
        diverging,
        preferred,
        records,
    )
    return answered, pos

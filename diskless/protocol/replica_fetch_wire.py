"""Replica fetches between diskless brokers in a compact form (``INTERNAL_REPLICA_FETCH``).

Why. A follower in another AZ fetches every produced batch's pointer, so Kafka's Fetch framing is
paid across AZs per batch. Fetch v13 spends 33 bytes on each partition of a request (offsets and
epochs as int64/int32), ~37 on each partition of an answer (high watermark, last stable offset and
log start offset as int64, empty lists, tags), and 12 on the envelope of a pointer run; each
request's header carries the fetcher's 36-byte client id. With ~2 KB batches at 1,000 partitions
that framing was most of the bytes crossing AZs. Here the same fields are varints, the last stable
offset is written relative to the high watermark (usually 0: one byte), optional fields are bits
of a flags byte, and a shared-key pointer run (envelope -4, ``storage/pointer_wire.py``) is a flag
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

Per connection (``ConnectionState``). A topic id is written whole (16 bytes) once per connection
and by alias after that, and a request repeats no constant field (replica id, waits, sizes,
isolation, rack) the previous one on the connection had: at the low rates where framing matters
most, a follower's request and the leader's answer each name one topic, and these were 16 and ~12
of their bytes.

Request body (after the request header):
    byte flags (1: the constant fields follow; else they are the previous request's);
    [zigzag replica_id; uvarint max_wait_ms, min_bytes, max_bytes; byte isolation_level;
     uvarint partition_max_bytes (the default of the partitions); uvarint rack length, rack];
    zigzag session_id, session_epoch;
    uvarint topic count, per topic: topic, uvarint partition count, per partition:
        zigzag partition, current_leader_epoch, fetch_offset, last_fetched_epoch,
        log_start_offset; uvarint partition_max_bytes + 1 (0: the request's default);
    uvarint forgotten topic count, per topic: topic, uvarint count, zigzag partitions.
Answer body (after the correlation id):
    zigzag throttle_time_ms, error_code, session_id;
    uvarint topic count, per topic: topic, uvarint partition count, per partition:
        zigzag partition_index, error_code, high_watermark,
        high_watermark - last_stable_offset, log_start_offset; byte flags (below);
        [aborted: uvarint count, per entry zigzag producer_id, first_offset]
        [diverging: zigzag epoch, end_offset] [preferred: zigzag read replica]
        [records: uvarint length, bytes].
A topic is uvarint alias + 1, or 0 and the id's 16 bytes.
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

from diskless.storage import pointer_wire

from .response_wire import milliseconds, topic_uuid
from .varint import read_uvarint, read_zigzag, write_uvarint, write_zigzag

__all__ = [
    "AnsweredPartition",
    "AnsweredTopic",
    "ConnectionState",
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
_ABORTED_NULL = 0x02  # the list is null (what the handler gives for read_uncommitted fetches, as replicas send)
_DIVERGING = 0x04  # a diverging epoch follows
_PREFERRED = 0x08  # a preferred read replica follows (absent: -1)
_RECORDS = 0x10  # records follow (absent: empty)
_RECORDS_NULL = 0x20  # records are null
_POINTER_RUN = 0x40  # the records are a shared-key pointer run, written without its envelope
_KNOWN_FLAGS = 0x7F


_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


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


class ConnectionState:
    """What one connection's two ends remember between replica fetches, in step: topic aliases and
    the request's constant fields. Each end keeps one per connection and a new connection starts
    afresh, so nothing outlives the byte stream that built it.

    Aliases: the follower gives a topic id the next alias the first time one of its requests on
    the connection names it (written whole, once); the leader, reading the requests in order,
    gives it the same. From then on both sides write the alias. The leader uses an alias in an
    answer only once a request defined it, so the follower, which defined it before sending,
    always knows it; a topic no request named yet (a session carried over from an earlier
    connection) is written whole.
    """

    __slots__ = ("aliases", "constants", "ids")

    def __init__(self) -> None:
        self.ids: list[uuid.UUID] = []  # alias -> topic id
        self.aliases: dict[uuid.UUID, int] = {}  # topic id -> alias
        self.constants: tuple[Any, ...] | None = None  # the last request's constant fields

    def define(self, topic_id: uuid.UUID) -> None:
        """Give ``topic_id`` the next alias, unless the table is full: then it stays written whole
        (both ends see the same count, so they skip the same ids)."""
        if len(self.ids) < MAX_ALIASES:
            self.aliases[topic_id] = len(self.ids)
            self.ids.append(topic_id)


# Bounds what a peer can make the other end remember: far more topics than one leader hosts.
MAX_ALIASES = 1 << 20


def _write_topic(topic_id: Any, out: bytearray, state: ConnectionState, define: bool) -> None:
    """A topic reference: alias + 1, or 0 and the id's 16 bytes (then aliased if ``define``)."""
    wire = topic_uuid(topic_id)
    alias = state.aliases.get(wire)
    if alias is not None:
        write_uvarint(alias + 1, out)
        return
    out.append(0)
    out += wire.bytes
    if define:
        state.define(wire)


def _read_topic(buf: memoryview, pos: int, state: ConnectionState, define: bool) -> tuple[uuid.UUID, int]:
    ref, pos = _read_u(buf, pos)
    if ref:
        if ref > len(state.ids):
            raise ReplicaFetchWireError(f"topic alias {ref - 1} was never defined on this connection")
        return state.ids[ref - 1], pos
    end = pos + 16
    if end > len(buf):
        raise ReplicaFetchWireError("truncated topic id")
    topic_id = uuid.UUID(bytes=bytes(buf[pos:end]))
    if define:
        if topic_id in state.aliases:  # the follower writes a topic whole only once
            raise ReplicaFetchWireError(f"topic {topic_id} defined twice on this connection")
        state.define(topic_id)
    return topic_id, end


# --- requests (follower -> leader) -------------------------------------------------------------


def encode_request(request: FetchRequest, state: ConnectionState) -> bytes:
    """The body of an ``INTERNAL_REPLICA_FETCH`` request for a Fetch v13 request entity, on the
    connection whose follower-side state is ``state``."""
    out = bytearray()
    u, z = write_uvarint, write_zigzag
    default_max = _default_max(request.topics)
    rack = (request.rack_id or "").encode()
    constants = (
        int(request.replica_id),
        milliseconds(request.max_wait),
        int(request.min_bytes),
        int(request.max_bytes),
        int(request.isolation_level),
        default_max,
        rack,
    )
    if constants == state.constants:
        out.append(0)
    else:
        state.constants = constants
        out.append(_CONSTANTS)
        z(constants[0], out)
        for value in constants[1:4]:
            u(value, out)
        out.append(constants[4])
        u(default_max, out)
        u(len(rack), out)
        out += rack
    z(int(request.session_id), out)
    z(int(request.session_epoch), out)
    u(len(request.topics), out)
    for topic in request.topics:
        _write_topic(topic.topic_id, out, state, define=True)
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
        _write_topic(forgotten.topic_id, out, state, define=True)
        u(len(forgotten.partitions), out)
        for index in forgotten.partitions:
            z(int(index), out)
    return bytes(out)


# Request flags: the constant fields follow (else they are the previous request's on the connection).
_CONSTANTS = 0x01


def _default_max(topics: Iterable[FetchTopic]) -> int:
    """The request's default partition_max_bytes (the first partition's): a replica fetcher asks
    the same of every partition, which then costs one byte each."""
    for topic in topics:
        for p in topic.partitions:
            return int(p.partition_max_bytes)
    return 0


def decode_request(data: bytes | memoryview, state: ConnectionState) -> FetchRequest:
    """The Fetch v13 request entity an ``INTERNAL_REPLICA_FETCH`` body stands for, read on the
    connection whose leader-side state is ``state`` (requests in the order they arrived)."""
    buf = memoryview(data)
    try:
        return _decode_request(buf, state)
    except IndexError as exc:  # a byte read past the end
        raise ReplicaFetchWireError("truncated replica fetch request") from exc


def _read_topics(
    buf: memoryview,
    pos: int,
    item_bytes: int,
    read_item: Callable[[memoryview, int], tuple[T, int]],
    state: ConnectionState,
    define: bool,
) -> tuple[list[tuple[uuid.UUID, list[T]]], int]:
    """A topic list: a count, then per topic its reference and a count of items ``read_item``
    reads (each at least ``item_bytes`` long)."""
    count, pos = _read_count(buf, pos, 2)
    topics = []
    for _ in range(count):
        topic_id, pos = _read_topic(buf, pos, state, define)
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


def _read_constants(buf: memoryview, pos: int) -> tuple[tuple[Any, ...], int]:
    replica_id, pos = _read_i32(buf, pos)
    max_wait, pos = _read_i32(buf, pos, signed=False)
    min_bytes, pos = _read_i32(buf, pos, signed=False)
    max_bytes, pos = _read_i32(buf, pos, signed=False)
    isolation_level = buf[pos]
    pos += 1
    if isolation_level not in (0, 1):  # read_uncommitted, read_committed
        raise ReplicaFetchWireError(f"isolation level {isolation_level}")
    default_max, pos = _read_i32(buf, pos, signed=False)
    rack_len, pos = _read_count(buf, pos, 1)
    try:
        rack = bytes(buf[pos : pos + rack_len]).decode()
    except UnicodeDecodeError as exc:
        raise ReplicaFetchWireError("rack is not UTF-8") from exc
    return (replica_id, max_wait, min_bytes, max_bytes, isolation_level, default_max, rack), pos + rack_len


def _decode_request(buf: memoryview, state: ConnectionState) -> FetchRequest:
    flags = buf[0]
    if flags & ~_CONSTANTS:
        raise ReplicaFetchWireError(f"unknown request flags {flags:#x}")
    if flags & _CONSTANTS:
        state.constants, pos = _read_constants(buf, 1)
    elif state.constants is None:
        raise ReplicaFetchWireError("the first request on a connection must carry its constant fields")
    else:
        pos = 1
    assert state.constants is not None
    replica_id, max_wait, min_bytes, max_bytes, isolation_level, default_max, rack = state.constants
    session_id, pos = _read_i32(buf, pos)
    session_epoch, pos = _read_i32(buf, pos)
    read_partition = functools.partial(_read_fetch_partition, default_max=default_max)
    fetched, pos = _read_topics(buf, pos, 6, read_partition, state, define=True)
    topics = tuple(FetchTopic(topic_id=topic_id, partitions=tuple(partitions)) for topic_id, partitions in fetched)
    dropped, pos = _read_topics(buf, pos, 1, _read_i32, state, define=True)
    forgotten = tuple(ForgottenTopic(topic_id=t, partitions=tuple(indexes)) for t, indexes in dropped)  # type: ignore[arg-type]
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


def encode_answer(correlation_id: int, body: Mapping[str, Any], state: ConnectionState) -> bytearray:
    """The whole frame (size, correlation id, body) answering a replica fetch with the Fetch
    handler's dict (keys as in FetchResponse.json, a missing one meaning its default), on the
    connection whose leader-side state is ``state``."""
    out = bytearray(8)  # size and correlation id, filled in below
    u, z = write_uvarint, write_zigzag
    z(milliseconds(body.get("throttle_time", 0)), out)
    z(int(body.get("error_code", 0)), out)
    z(int(body.get("session_id", 0)), out)
    topics = list(body.get("responses", ()))
    u(len(topics), out)
    for topic in topics:
        _write_topic(topic.get("topic_id"), out, state, define=False)
        partitions = topic.get("partitions", ())
        u(len(partitions), out)
        for p in partitions:
            _encode_partition(p, out)
    struct.pack_into(">ii", out, 0, len(out) - 4, correlation_id)
    return out  # written as it is: a bytes() copy would copy every record byte once more


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
        envelope = pointer_wire.ENVELOPE
        # Only an envelope whose stated length is exactly what follows (not ``enveloped``, which
        # cuts the body to what is there): the flag restores just that one.
        if (
            records[:8] == pointer_wire.SHARED_MARK
            and len(records) >= envelope.size
            and envelope.unpack_from(records)[1] == len(records) - envelope.size
        ):
            flags |= _POINTER_RUN
            records = memoryview(records)[envelope.size :]
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


def decode_answer(data: bytes | memoryview, state: ConnectionState) -> FetchAnswer:
    """A replica fetch answer's body (after the correlation id), on the connection whose
    follower-side state is ``state``."""
    buf = memoryview(data)
    try:
        return _decode_answer(buf, state)
    except IndexError as exc:
        raise ReplicaFetchWireError("truncated replica fetch answer") from exc


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError as exc:
        raise ReplicaFetchWireError(f"unknown error code {code}") from exc


def _decode_answer(buf: memoryview, state: ConnectionState) -> FetchAnswer:
    throttle, pos = _read_i32(buf, 0)
    error, pos = _read_i32(buf, pos)
    session_id, pos = _read_i32(buf, pos)
    answered, pos = _read_topics(buf, pos, 6, _decode_partition, state, define=False)
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
        records = pointer_wire.ENVELOPE.pack(-4, size) + body if flags & _POINTER_RUN else bytes(body)
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

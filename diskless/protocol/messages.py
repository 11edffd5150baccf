"""Request/response codec on top of kio's generated schemas.

kio gives one dataclass per API version. Handlers are written once, version-agnostic: they read
request fields by name and return plain dicts; ``build`` turns a dict into the kio entity of the
exact response version the client asked for, filling fields that version has and dropping ones it
does not. Request headers are parsed here with ``struct`` (v1 and flexible v2 with tagged fields).
"""

from __future__ import annotations

import datetime
import io
import struct
import types
import typing
import uuid
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import cache, partial
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from . import fetch_response, produce_response
from .framing import encode_frame
from .length_guard import check_lengths
from .varint import read_uvarint

API_PRODUCE = 0
API_FETCH = 1
API_LIST_OFFSETS = 2
API_METADATA = 3
API_OFFSET_COMMIT = 8
API_OFFSET_FETCH = 9
API_FIND_COORDINATOR = 10
API_JOIN_GROUP = 11
API_HEARTBEAT = 12
API_LEAVE_GROUP = 13
API_SYNC_GROUP = 14
API_DESCRIBE_GROUPS = 15
API_LIST_GROUPS = 16
API_API_VERSIONS = 18
API_CREATE_TOPICS = 19
API_DELETE_TOPICS = 20
API_DELETE_RECORDS = 21
API_INIT_PRODUCER_ID = 22
API_ADD_PARTITIONS_TO_TXN = 24
API_ADD_OFFSETS_TO_TXN = 25
API_END_TXN = 26
API_WRITE_TXN_MARKERS = 27
API_TXN_OFFSET_COMMIT = 28
API_OFFSET_FOR_LEADER_EPOCH = 23
API_DESCRIBE_CONFIGS = 32
API_DELETE_GROUPS = 42
API_OFFSET_DELETE = 47
API_ALTER_CONFIGS = 33
API_CREATE_PARTITIONS = 37
API_INCREMENTAL_ALTER_CONFIGS = 44
API_DESCRIBE_CLUSTER = 60
API_CONSUMER_GROUP_HEARTBEAT = 68
API_CONSUMER_GROUP_DESCRIBE = 69
API_ALTER_REPLICA_LOG_DIRS = 34
API_DESCRIBE_LOG_DIRS = 35
API_ELECT_LEADERS = 43
API_ALTER_PARTITION_REASSIGNMENTS = 45
API_LIST_PARTITION_REASSIGNMENTS = 46
API_DESCRIBE_TOPIC_PARTITIONS = 75
API_DESCRIBE_PRODUCERS = 61  # KIP-664: finding and aborting hanging transactions
API_DESCRIBE_TRANSACTIONS = 65
API_LIST_TRANSACTIONS = 66
API_SASL_HANDSHAKE = 17  # security (broker/security_apis.py)
API_SASL_AUTHENTICATE = 36
API_DESCRIBE_ACLS = 29
API_CREATE_ACLS = 30
API_DELETE_ACLS = 31
API_DESCRIBE_USER_SCRAM_CREDENTIALS = 50
API_ALTER_USER_SCRAM_CREDENTIALS = 51
API_DESCRIBE_CLIENT_QUOTAS = 48  # client quotas (broker/quota_apis.py)
API_ALTER_CLIENT_QUOTAS = 49

# Version ranges we serve. Upper bounds cover what aiokafka 0.14, kafka-python 3, librdkafka 2.x
# and kcat negotiate; lower bounds are where kio's schemas start (Kafka 4 dropped older ones).
# Fetch v13 (topics named by id, KIP-516) is what brokers fetch from each other with; ApiVersions
# offers clients less (broker/apis.py ADVERTISED_MAX_VERSIONS).
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    API_PRODUCE: (3, 9),
    API_FETCH: (4, 13),
    API_LIST_OFFSETS: (1, 7),
    API_METADATA: (0, 12),
    API_FIND_COORDINATOR: (0, 4),
    API_OFFSET_COMMIT: (2, 9),
    API_OFFSET_FETCH: (1, 9),
    API_JOIN_GROUP: (0, 9),
    API_HEARTBEAT: (0, 4),
    API_LEAVE_GROUP: (0, 5),
    API_SYNC_GROUP: (0, 5),
    API_DESCRIBE_GROUPS: (0, 5),
    API_LIST_GROUPS: (0, 5),
    API_DELETE_GROUPS: (0, 2),
    API_OFFSET_DELETE: (0, 0),
    API_API_VERSIONS: (0, 4),
    API_CREATE_TOPICS: (2, 7),
    API_DELETE_TOPICS: (1, 6),
    API_DELETE_RECORDS: (0, 2),
    API_INIT_PRODUCER_ID: (0, 4),
    API_WRITE_TXN_MARKERS: (1, 1),
    API_ADD_PARTITIONS_TO_TXN: (0, 3),
    API_ADD_OFFSETS_TO_TXN: (0, 3),
    API_END_TXN: (0, 3),
    API_TXN_OFFSET_COMMIT: (0, 3),
    API_OFFSET_FOR_LEADER_EPOCH: (2, 4),
    API_DESCRIBE_CONFIGS: (1, 4),
    API_ALTER_CONFIGS: (0, 2),
    API_CREATE_PARTITIONS: (0, 3),
    API_INCREMENTAL_ALTER_CONFIGS: (0, 1),
    API_DESCRIBE_CLUSTER: (0, 1),
    API_CONSUMER_GROUP_HEARTBEAT: (0, 1),
    API_CONSUMER_GROUP_DESCRIBE: (0, 1),
    API_ALTER_REPLICA_LOG_DIRS: (1, 2),
    API_DESCRIBE_LOG_DIRS: (1, 4),
    API_ELECT_LEADERS: (0, 2),
    API_ALTER_PARTITION_REASSIGNMENTS: (0, 0),  # v1 (KIP-860) is Kafka 4.1: ApiVersions stays 4.0's
    API_LIST_PARTITION_REASSIGNMENTS: (0, 0),
    API_DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    API_DESCRIBE_PRODUCERS: (0, 0),
    API_DESCRIBE_TRANSACTIONS: (0, 0),
    # v2 (KIP-1152, a transactional id pattern) is Kafka 4.1: ApiVersions stays 4.0's.
    API_LIST_TRANSACTIONS: (0, 1),
    # Security. librdkafka wants SaslHandshake v0 advertised before it uses SASL at all.
    API_SASL_HANDSHAKE: (0, 1),
    API_SASL_AUTHENTICATE: (0, 2),
    API_DESCRIBE_ACLS: (1, 3),
    API_CREATE_ACLS: (1, 3),
    API_DELETE_ACLS: (1, 3),
    API_DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    API_ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    API_DESCRIBE_CLIENT_QUOTAS: (0, 1),
    API_ALTER_CLIENT_QUOTAS: (0, 1),
}

_HEADER_FIXED = struct.Struct(">hhih")
_CORRELATION = struct.Struct(">i")


class MalformedRequest(Exception):
    """The frame cannot be decoded: the connection that sent it is closed."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


# Compact lengths and tag counts are uint32s: at most 5 groups of 7 bits.
_read_uvarint = partial(read_uvarint, max_bits=35, error=MalformedRequest)


def is_supported(api_key: int, version: int) -> bool:
    bounds = SUPPORTED_VERSIONS.get(api_key)
    return bounds is not None and bounds[0] <= version <= bounds[1]


@cache
def _request_type(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@cache
def _response_type(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def is_flexible(api_key: int, version: int) -> bool:
    return bool(_request_type(api_key, version).__flexible__)


def parse_header(frame: bytes) -> tuple[RequestHeader, int]:
    """Parse the request header; returns it and the position where the body starts.

    Whether the header carries tagged fields depends on the version being flexible, which is
    only known for supported versions; for others the body is never decoded anyway.
    """
    if len(frame) < _HEADER_FIXED.size:
        raise MalformedRequest("frame shorter than a request header")
    api_key, version, correlation_id, client_len = _HEADER_FIXED.unpack_from(frame, 0)
    pos = _HEADER_FIXED.size
    client_id = None
    if client_len >= 0:
        if pos + client_len > len(frame):
            raise MalformedRequest("client id overruns frame")
        client_id = frame[pos : pos + client_len].decode("utf-8", "replace")
        pos += client_len
    header = RequestHeader(api_key, version, correlation_id, client_id)
    if is_supported(api_key, version) and is_flexible(api_key, version):
        count, pos = _read_uvarint(frame, pos)
        for _ in range(count):
            _, pos = _read_uvarint(frame, pos)
            size, pos = _read_uvarint(frame, pos)
            pos += size
        if pos > len(frame):
            raise MalformedRequest("tagged fields overrun frame")
    return header, pos


def decode_request(header: RequestHeader, frame: bytes, body_pos: int) -> Any:
    cls = _request_type(header.api_key, header.api_version)
    try:
        # Lengths first: kio reserves memory from a declared count, and an absurd one aborts the
        # process (length_guard.py).
        check_lengths(cls, memoryview(frame)[body_pos:])
        entity, _size = _reader(cls)(memoryview(frame)[body_pos:], 0)
    except Exception as exc:  # kio raises assorted errors on garbage
        raise MalformedRequest(f"cannot decode {cls.__name__}: {exc}") from exc
    return entity


def encode_response(header: RequestHeader, body: dict[str, Any], version: int | None = None) -> bytes:
    """Encode a response frame; ``version`` overrides the request's (ApiVersions fallback)."""
    version = header.api_version if version is None else version
    if header.api_key == API_FETCH and fetch_response.FIRST_VERSION <= version <= fetch_response.LAST_VERSION:
        return fetch_response.encode_fetch_response(version, header.correlation_id, body)
    if header.api_key == API_PRODUCE and produce_response.FIRST_VERSION <= version <= produce_response.LAST_VERSION:
        return produce_response.encode_produce_response(version, header.correlation_id, body)
    return encode_response_with_kio(header, body, version)


def encode_response_with_kio(header: RequestHeader, body: dict[str, Any], version: int) -> bytes:
    """Any response frame, through a kio entity built from ``body`` and kio's writer."""
    cls = _response_type(header.api_key, version)
    out = io.BytesIO()
    out.write(_CORRELATION.pack(header.correlation_id))
    # ApiVersions responses always use header v0 so that any client can read them.
    if cls.__flexible__ and header.api_key != API_API_VERSIONS:
        out.write(b"\x00")
    _writer(cls)(out, build(cls, body))
    return encode_frame(out.getvalue())


# --- dict -> kio entity -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kafka_type: str | None
    entity: type | None
    is_tuple: bool
    optional: bool
    has_default: bool


def _unwrap(tp: Any) -> tuple[Any, bool, bool]:
    """Return (inner type, is_tuple, optional) for a kio field annotation."""
    optional = False
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = True
        tp = args[0]
        origin = typing.get_origin(tp)
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        if typing.get_origin(inner) in (types.UnionType, typing.Union):
            inner = next(a for a in typing.get_args(inner) if a is not type(None))
        return inner, True, optional
    return tp, False, optional


@cache
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    plans = []
    for f in fields(cls):
        inner, is_tuple, optional = _unwrap(f.type)
        entity = inner if is_dataclass(inner) else None
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        plans.append(_FieldPlan(f.name, f.metadata.get("kafka_type"), entity, is_tuple, optional, has_default))
    return tuple(plans)


_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


def _convert(kafka_type: str | None, value: Any) -> Any:
    if kafka_type == "error_code":
        return ErrorCode(value)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value)
    if kafka_type == "uuid" and isinstance(value, str):
        return uuid.UUID(value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        return _EPOCH + datetime.timedelta(milliseconds=value)
    return value


def _zero(plan: _FieldPlan) -> Any:
    if plan.is_tuple:
        return ()
    if plan.optional:
        return None
    if plan.entity is not None:
        return build(plan.entity, {})
    match plan.kafka_type:
        case "string":
            return ""
        case "bool":
            return False
        case "error_code":
            return ErrorCode.none
        case "timedelta_i32" | "timedelta_i64":
            return datetime.timedelta(0)
        case "bytes" | "records":
            return b""
        case "uuid":
            return None
        case "datetime_i64":
            return _EPOCH
        case _:
            return 0


def build(cls: type, data: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for plan in _plan(cls):
        if plan.name not in data:
            if not plan.has_default:
                kwargs[plan.name] = _zero(plan)
            continue
        value = data[plan.name]
        if value is None:
            kwargs[plan.name] = None
        elif plan.entity is not None:
            if plan.is_tuple:
                kwargs[plan.name] = tuple(build(plan.entity, item) for item in value)
            else:
                kwargs[plan.name] = build(plan.entity, value)
        elif plan.is_tuple:
            kwargs[plan.name] = tuple(_convert(plan.kafka_type, v) for v in value)
        else:
            kwargs[plan.name] = _convert(plan.kafka_type, value)
    return cls(**kwargs)

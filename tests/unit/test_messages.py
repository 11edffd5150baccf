"""Request headers, request decoding and dict -> kio response encoding at several versions."""

from __future__ import annotations

import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from batches import decode_all, values_batch
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from diskless.protocol import messages as m


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _header(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    if client_id is None:
        return struct.pack(">hhih", api_key, version, correlation_id, -1)
    raw = client_id.encode()
    return struct.pack(">hhih", api_key, version, correlation_id, len(raw)) + raw


def _tagged(fields: list[tuple[int, bytes]]) -> bytes:
    out = _uvarint(len(fields))
    for tag, data in fields:
        out += _uvarint(tag) + _uvarint(len(data)) + data
    return out


# --- request headers -------------------------------------------------------------------------


@given(
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    client_id=st.one_of(st.none(), st.text(max_size=30)),
    body=st.binary(max_size=20),
    version=st.integers(0, 8),
)
def test_parse_header_v1(correlation_id: int, client_id: str | None, body: bytes, version: int) -> None:
    # Metadata v0-v8 are not flexible: request header v1, no tagged fields.
    head = _header(m.API_METADATA, version, correlation_id, client_id)
    header, pos = m.parse_header(head + body)
    assert header == m.RequestHeader(m.API_METADATA, version, correlation_id, client_id)
    assert pos == len(head)


@given(
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    client_id=st.one_of(st.none(), st.text(max_size=30)),
    tags=st.lists(st.tuples(st.integers(0, 2**20), st.binary(max_size=200)), max_size=4),
    body=st.binary(max_size=20),
    api=st.sampled_from([(m.API_METADATA, 9), (m.API_METADATA, 12), (m.API_FETCH, 12), (m.API_API_VERSIONS, 3)]),
)
def test_parse_header_v2_skips_tagged_fields(
    correlation_id: int, client_id: str | None, tags: list[tuple[int, bytes]], body: bytes, api: tuple[int, int]
) -> None:
    api_key, version = api
    head = _header(api_key, version, correlation_id, client_id) + _tagged(tags)
    header, pos = m.parse_header(head + body)
    assert header == m.RequestHeader(api_key, version, correlation_id, client_id)
    assert pos == len(head)


def test_unsupported_version_has_no_tagged_fields_parsed() -> None:
    head = _header(m.API_METADATA, 99, 1, "c")
    header, pos = m.parse_header(head + b"\xff\xff")
    assert header.api_version == 99
    assert pos == len(head)
    assert not m.is_supported(m.API_METADATA, 99)
    assert not m.is_supported(12345, 0)
    assert m.is_supported(m.API_PRODUCE, 9) and not m.is_supported(m.API_PRODUCE, 2)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03\x00\x0c\x00\x00\x00",  # shorter than the fixed part
        _header(m.API_METADATA, 5, 1, None)[:-2] + struct.pack(">h", 10) + b"abc",  # client id overruns
        _header(m.API_METADATA, 12, 1, "c"),  # flexible, tagged-field count missing
        _header(m.API_METADATA, 12, 1, "c") + b"\x01\x00\x05ab",  # tagged field overruns
        _header(m.API_METADATA, 12, 1, "c") + b"\x81",  # truncated varint
        _header(m.API_METADATA, 12, 1, "c") + b"\xff" * 6 + b"\x01",  # varint too long
    ],
)
def test_malformed_headers(frame: bytes) -> None:
    with pytest.raises(m.MalformedRequest):
        m.parse_header(frame)


# --- request bodies --------------------------------------------------------------------------


def _encode_entity(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


@pytest.mark.parametrize("version", [0, 4, 9, 12])
def test_decode_metadata_request(version: int) -> None:
    cls = load_request_schema(m.API_METADATA, version)
    entity = m.build(cls, {"topics": [{"name": "alpha"}, {"name": "beta"}], "allow_auto_topic_creation": False})
    head = _header(m.API_METADATA, version, 42, "tests")
    if m.is_flexible(m.API_METADATA, version):
        head += b"\x00"
    frame = head + _encode_entity(entity)
    header, pos = m.parse_header(frame)
    decoded = m.decode_request(header, frame, pos)
    assert decoded == entity
    assert [t.name for t in decoded.topics] == ["alpha", "beta"]


@pytest.mark.parametrize("version", [4, 12])
def test_decode_fetch_request(version: int) -> None:
    cls = load_request_schema(m.API_FETCH, version)
    topic_key = "topic"
    entity = m.build(
        cls,
        {
            "replica_id": -1,
            "max_wait": 500,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_epoch": -1,
            "topics": [
                {topic_key: "t", "partitions": [{"partition": 0, "fetch_offset": 5, "partition_max_bytes": 100}]}
            ],
        },
    )
    head = _header(m.API_FETCH, version, 7, None) + (b"\x00" if version >= 12 else b"")
    frame = head + _encode_entity(entity)
    header, pos = m.parse_header(frame)
    decoded = m.decode_request(header, frame, pos)
    assert decoded == entity
    assert decoded.max_wait == datetime.timedelta(milliseconds=500)
    assert decoded.topics[0].partitions[0].fetch_offset == 5


def test_decode_garbage_body_is_malformed() -> None:
    frame = _header(m.API_PRODUCE, 9, 1, "c") + b"\x00" + b"\x07\xff\xff"
    header, pos = m.parse_header(frame)
    with pytest.raises(m.MalformedRequest):
        m.decode_request(header, frame, pos)


# --- responses -------------------------------------------------------------------------------


def _decode_response(api_key: int, version: int, frame: bytes, correlation_id: int) -> Any:
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    (corr,) = struct.unpack_from(">i", frame, 4)
    assert corr == correlation_id
    cls = load_response_schema(api_key, version)
    pos = 8
    if cls.__flexible__ and api_key != m.API_API_VERSIONS:
        assert frame[pos] == 0  # empty tagged fields of response header v1
        pos += 1
    entity, used = entity_reader(cls)(memoryview(frame)[pos:], 0)
    assert pos + used == len(frame), "response body not fully consumed"
    return entity


def _respond(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 77) -> Any:
    header = m.RequestHeader(api_key, version, correlation_id, "tests")
    frame = m.encode_response(header, body)
    decoded = _decode_response(api_key, version, frame, correlation_id)
    assert decoded == m.build(load_response_schema(api_key, version), body)
    return decoded


TOPIC_ID = uuid.UUID("8a4d5a9e-1b2c-4d3e-9f00-112233445566")


def _metadata_body() -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "brokers": [
            {"node_id": 1, "host": "a", "port": 9092, "rack": "az1"},
            {"node_id": 2, "host": "b", "port": 9093, "rack": None},
        ],
        "cluster_id": "cluster-x",
        "controller_id": 1,
        "topics": [
            {
                "error_code": ErrorCode.none,
                "name": "orders",
                "topic_id": TOPIC_ID,
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": ErrorCode.none,
                        "partition_index": i,
                        "leader_id": 1 + i % 2,
                        "leader_epoch": 3,
                        "replica_nodes": [1, 2],
                        "isr_nodes": [1 + i % 2],
                        "offline_replicas": [],
                    }
                    for i in range(3)
                ],
                "topic_authorized_operations": -(2**31),
            },
            {"error_code": ErrorCode.unknown_topic_or_partition, "name": "missing"},
        ],
        "cluster_authorized_operations": -(2**31),
    }


@pytest.mark.parametrize("version", [0, 1, 5, 9, 12])
def test_metadata_response_round_trip(version: int) -> None:
    decoded = _respond(m.API_METADATA, version, _metadata_body())
    assert [b.node_id for b in decoded.brokers] == [1, 2]
    topic = decoded.topics[0]
    assert topic.name == "orders"
    assert [p.partition_index for p in topic.partitions] == [0, 1, 2]
    assert [p.leader_id for p in topic.partitions] == [1, 2, 1]
    assert decoded.topics[1].error_code == ErrorCode.unknown_topic_or_partition
    assert decoded.topics[1].partitions == ()
    if version >= 1:
        assert decoded.brokers[0].rack == "az1" and decoded.controller_id == 1
    if version >= 2:
        assert decoded.cluster_id == "cluster-x"
    if version >= 7:
        assert topic.partitions[0].leader_epoch == 3
    if version >= 10:
        assert topic.topic_id == TOPIC_ID


def test_metadata_v12_accepts_topic_id_as_string() -> None:
    body = _metadata_body()
    body["topics"][0]["topic_id"] = str(TOPIC_ID)
    assert _respond(m.API_METADATA, 12, body).topics[0].topic_id == TOPIC_ID


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_fetch_response_round_trip(version: int) -> None:
    data = values_batch(3, base_offset=10) + values_batch(2, base_offset=13, tag="w")
    body = {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "session_id": 0,
        "responses": [
            {
                "topic": "orders",
                "partitions": [
                    {
                        "partition_index": 0,
                        "error_code": ErrorCode.none,
                        "high_watermark": 15,
                        "last_stable_offset": 15,
                        "log_start_offset": 2,
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": data,
                    },
                    {
                        "partition_index": 1,
                        "error_code": ErrorCode.offset_out_of_range,
                        "high_watermark": -1,
                        "last_stable_offset": -1,
                        "log_start_offset": -1,
                        "aborted_transactions": [],
                        "preferred_read_replica": -1,
                        "records": b"",
                    },
                ],
            }
        ],
    }
    decoded = _respond(m.API_FETCH, version, body)
    parts = decoded.responses[0].partitions
    assert parts[0].high_watermark == 15
    assert parts[1].error_code == ErrorCode.offset_out_of_range
    assert [(r.offset, r.value) for r in decode_all(bytes(parts[0].records))] == [
        (10, b"v-0"),
        (11, b"v-1"),
        (12, b"v-2"),
        (13, b"w-0"),
        (14, b"w-1"),
    ]
    if version >= 5:
        assert parts[0].log_start_offset == 2


@pytest.mark.parametrize("version", [3, 5, 8, 9])
def test_produce_response_round_trip(version: int) -> None:
    body = {
        "responses": [
            {
                "name": "orders",
                "partition_responses": [
                    {
                        "index": 0,
                        "error_code": ErrorCode.none,
                        "base_offset": 41,
                        "log_append_time": 1_700_000_000_123,
                        "log_start_offset": 0,
                        "record_errors": [],
                        "error_message": None,
                    },
                    {
                        "index": 1,
                        "error_code": ErrorCode.corrupt_message,
                        "base_offset": -1,
                        "log_append_time": None,
                        "log_start_offset": -1,
                        "record_errors": [],
                        "error_message": "record batch CRC mismatch",
                    },
                ],
            }
        ],
        "throttle_time": 0,
    }
    decoded = _respond(m.API_PRODUCE, version, body)
    ok, bad = decoded.responses[0].partition_responses
    assert ok.base_offset == 41
    assert ok.log_append_time == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.UTC)
    assert bad.error_code == ErrorCode.corrupt_message and bad.log_append_time is None
    if version >= 8:
        assert bad.error_message == "record batch CRC mismatch"


def test_produce_v3_wire_bytes_by_hand() -> None:
    body = {
        "responses": [
            {
                "name": "t",
                "partition_responses": [
                    {"index": 2, "error_code": ErrorCode.none, "base_offset": 5, "log_append_time": None},
                ],
            }
        ],
        "throttle_time": 3,
    }
    frame = m.encode_response(m.RequestHeader(m.API_PRODUCE, 3, 9, None), body)
    expected_body = (
        struct.pack(">i", 9)  # correlation id, response header v0
        + struct.pack(">i", 1)  # one topic
        + struct.pack(">h", 1)
        + b"t"
        + struct.pack(">i", 1)  # one partition
        + struct.pack(">ihqq", 2, 0, 5, -1)  # index, error, base offset, log append time
        + struct.pack(">i", 3)  # throttle time
    )
    assert frame == struct.pack(">i", len(expected_body)) + expected_body


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_response_always_uses_header_v0(version: int) -> None:
    keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in m.SUPPORTED_VERSIONS.items()]
    body = {"error_code": ErrorCode.none, "api_keys": keys, "throttle_time": 0}
    frame = m.encode_response(m.RequestHeader(m.API_API_VERSIONS, version, 1234, "c"), body)
    assert frame[4:8] == struct.pack(">i", 1234)
    assert frame[8:10] == b"\x00\x00"  # error code follows the correlation id directly: no tagged fields
    decoded = _decode_response(m.API_API_VERSIONS, version, frame, 1234)
    assert {(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys} == {
        (k, lo, hi) for k, (lo, hi) in m.SUPPORTED_VERSIONS.items()
    }


def test_api_versions_fallback_version_override() -> None:
    # A client asking with an unsupported version gets a v0 answer carrying unsupported_version.
    header = m.RequestHeader(m.API_API_VERSIONS, 9, 5, "c")
    frame = m.encode_response(header, {"error_code": ErrorCode.unsupported_version, "api_keys": []}, version=0)
    decoded = _decode_response(m.API_API_VERSIONS, 0, frame, 5)
    assert decoded.error_code == ErrorCode.unsupported_version


def test_flexible_response_has_header_tagged_fields() -> None:
    # Metadata v9+ is flexible: correlation id, then an empty tagged-field section (0x00), then the body.
    for version in (9, 12):
        frame = m.encode_response(m.RequestHeader(m.API_METADATA, version, 3, None), _metadata_body())
        assert frame[8] == 0
        assert frame[9:13] == b"\x00\x00\x00\x00"  # throttle time
    frame_v8 = m.encode_response(m.RequestHeader(m.API_METADATA, 8, 3, None), _metadata_body())
    assert frame_v8[8:12] == b"\x00\x00\x00\x00"  # throttle time right after the correlation id
    assert frame_v8[12:16] == b"\x00\x00\x00\x02"  # int32 broker count (non-compact array)


# --- build -----------------------------------------------------------------------------------


def test_build_fills_missing_fields_and_drops_unknown_ones() -> None:
    cls = load_response_schema(m.API_METADATA, 12)
    entity = m.build(cls, {"topics": [{"name": "x", "partitions": [{}]}], "not_a_field": 1})
    assert entity.throttle_time == datetime.timedelta(0)
    assert entity.brokers == ()
    assert entity.controller_id == -1  # kio schema default kept
    topic = entity.topics[0]
    assert topic.error_code == ErrorCode.none and topic.is_internal is False
    assert topic.partitions[0].replica_nodes == ()
    v0 = m.build(load_response_schema(m.API_METADATA, 0), {"throttle_time": 5, "cluster_id": "c", "topics": []})
    assert not hasattr(v0, "cluster_id")


def test_build_converts_kafka_types() -> None:
    cls = load_response_schema(m.API_FETCH, 12)
    entity = m.build(cls, {"throttle_time": 250, "error_code": 3, "responses": []})
    assert entity.throttle_time == datetime.timedelta(milliseconds=250)
    assert entity.error_code is ErrorCode.unknown_topic_or_partition

"""Fuzzed request decoding: every API key and version, random and mutated frames.

Whatever the bytes, the request path's decoding either yields a request or raises
``MalformedRequest`` (the connection is then closed), in bounded time and memory: no other
exception, no hang on huge counts, no allocation driven by a length field. The frame decoder
refuses an oversized frame from its 4-byte size prefix alone.
"""

from __future__ import annotations

import io
import struct
import time
import tracemalloc
import uuid
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from diskless.protocol import internal, records
from diskless.protocol import messages as m
from diskless.protocol.framing import FrameDecoder, FrameError

SUPPORTED = sorted((key, version) for key, (lo, hi) in m.SUPPORTED_VERSIONS.items() for version in range(lo, hi + 1))
HUGE = [0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFE, 0x10000]
TIME_LIMIT_S = 1.0  # per decode, even on a loaded machine; real decodes take microseconds
MEMORY_LIMIT = 16 * 1024 * 1024  # peak bytes traced while decoding a frame of at most a few KiB


def header_bytes(api_key: int, version: int, correlation_id: int = 7, client_id: str | None = "fuzz") -> bytes:
    out = struct.pack(">hhi", api_key, version, correlation_id)
    if client_id is None:
        out += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        out += struct.pack(">h", len(raw)) + raw
    if m.is_supported(api_key, version) and m.is_flexible(api_key, version):
        out += b"\x00"  # no tagged fields
    return out


def valid_body(api_key: int, version: int) -> bytes:
    """A well-formed request of this API and version with every field at its zero value."""
    cls = m._request_type(api_key, version)
    out = io.BytesIO()
    m._writer(cls)(out, m.build(cls, {}))
    return out.getvalue()


def decode(frame: bytes) -> None:
    """The server's steps for one frame (``Connection._dispatch``), bounded in time and memory."""
    tracemalloc.start()
    began = time.monotonic()
    try:
        header, pos = m.parse_header(frame)
        if header.api_key in internal.INTERNAL_APIS:
            try:
                internal.unpack(memoryview(frame)[pos:])
            except Exception as exc:  # the server wraps any of these into MalformedRequest
                raise m.MalformedRequest(str(exc)) from exc
        elif m.is_supported(header.api_key, header.api_version):
            m.decode_request(header, frame, pos)
    except m.MalformedRequest:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    took = time.monotonic() - began
    assert took < TIME_LIMIT_S, f"decoding {len(frame)} bytes took {took:.2f}s"
    assert peak < MEMORY_LIMIT, f"decoding {len(frame)} bytes peaked at {peak} bytes"


def test_every_api_and_version_has_a_decodable_zero_request() -> None:
    for api_key, version in SUPPORTED:
        frame = header_bytes(api_key, version) + valid_body(api_key, version)
        header, pos = m.parse_header(frame)
        assert (header.api_key, header.api_version, header.correlation_id) == (api_key, version, 7)
        m.decode_request(header, frame, pos)


@settings(max_examples=400)
@given(api=st.sampled_from(SUPPORTED), body=st.binary(max_size=600))
def test_random_bodies_for_every_api_and_version(api: tuple[int, int], body: bytes) -> None:
    decode(header_bytes(*api) + body)


@settings(max_examples=400)
@given(
    api=st.sampled_from(SUPPORTED),
    data=st.data(),
)
def test_mutated_valid_requests(api: tuple[int, int], data: st.DataObject) -> None:
    """Flip bytes, cut the frame, or plant huge counts and lengths anywhere in a valid request."""
    frame = bytearray(header_bytes(*api) + valid_body(*api))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "huge32", "huge16", "varint", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(frame) - 1)))
        if kind == "flip" and frame:
            frame[pos] ^= data.draw(st.integers(1, 255))
        elif kind == "truncate":
            del frame[pos:]
        elif kind == "huge32":
            frame[pos : pos + 4] = struct.pack(">I", data.draw(st.sampled_from(HUGE)))
        elif kind == "huge16":
            frame[pos : pos + 2] = struct.pack(">H", data.draw(st.sampled_from([0x7FFF, 0xFFFF, 0x8000])))
        elif kind == "varint":  # a compact length / tagged-field count of about 2^28
            frame[pos:pos] = b"\xff\xff\xff\x7f"
        else:
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
    decode(bytes(frame))


@settings(max_examples=200)
@given(
    api_key=st.integers(-(2**15), 2**15 - 1),
    version=st.integers(-(2**15), 2**15 - 1),
    client_len=st.integers(-(2**15), 2**15 - 1),
    tail=st.binary(max_size=64),
)
def test_any_header_any_api_key_and_version(api_key: int, version: int, client_len: int, tail: bytes) -> None:
    decode(struct.pack(">hhih", api_key, version, 1, client_len) + tail)


@settings(max_examples=200)
@given(key=st.sampled_from(sorted(internal.INTERNAL_APIS)), body=st.binary(max_size=300))
def test_internal_api_bodies(key: int, body: bytes) -> None:
    decode(header_bytes(key, 0) + body)


@settings(max_examples=200)
@given(size=st.integers(-(2**31), 2**31 - 1), rest=st.binary(max_size=64))
@example(size=0, rest=b"\x00\x00\x04\x01")  # the bytes after an empty frame declared 1025
def test_frame_size_is_checked_before_the_body_arrives(size: int, rest: bytes) -> None:
    limit = 1024
    decoder = FrameDecoder(limit)
    # One frame only: bytes past its body would be read as the next frame's (random) size.
    decoder.feed(struct.pack(">i", size) + (rest[:size] if 0 <= size <= limit else rest))
    if size < 0 or size > limit:
        with pytest.raises(FrameError):
            decoder.frames()
    else:
        frames = decoder.frames()
        assert decoder.buffered <= 4 + limit
        assert all(len(f) == size for f in frames)


@settings(max_examples=300)
@given(
    rows=st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=50)), min_size=1, max_size=5),
    data=st.data(),
)
def test_corrupt_and_truncated_batches_fail_validation_with_kafka_errors(
    rows: list[tuple[bytes, bytes]], data: st.DataObject
) -> None:
    """A producer batch that was cut or altered is refused as Kafka refuses it, never crashes."""
    batch = bytearray(records.build_batch([(k, v) for k, v in rows], timestamp_ms=1_700_000_000_000))
    records.validate_batch(memoryview(batch), 1 << 20)
    kind = data.draw(st.sampled_from(["truncate", "flip", "count", "length"]))
    if kind == "truncate":
        del batch[data.draw(st.integers(0, len(batch) - 1)) :]
    elif kind == "flip":
        batch[data.draw(st.integers(0, len(batch) - 1))] ^= data.draw(st.integers(1, 255))
    elif kind == "count":
        batch[57:61] = struct.pack(">I", data.draw(st.sampled_from([*HUGE, 0])))
    else:
        batch[8:12] = struct.pack(">I", data.draw(st.sampled_from([*HUGE, 0, 1, 48])))
    # The produce path: framing first (split_batches), then each batch's header and CRC.
    try:
        for one in records.split_batches(bytes(batch)):
            header = records.validate_batch(one, 1 << 20)
            # Only a change the CRC does not cover (base offset, length, epoch) may pass.
            assert header.magic == 2
    except records.InvalidBatch as exc:
        assert exc.error in (
            "corrupt_message",
            "invalid_record",
            "unsupported_for_message_format",
            "message_too_large",
        )


_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "error_code": (0, 0),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "timedelta_i32": (0, 2**31 - 1),
    "timedelta_i64": (0, 2**40),
}


def _value(kafka_type: str | None, optional: bool, data: st.DataObject) -> Any:
    if optional and data.draw(st.booleans()):
        return None
    if kafka_type == "string":
        return data.draw(st.text(max_size=12))
    if kafka_type in ("bytes", "records"):
        return data.draw(st.binary(max_size=40))
    if kafka_type == "bool":
        return data.draw(st.booleans())
    if kafka_type == "uuid":
        return uuid.UUID(int=data.draw(st.integers(0, 2**128 - 1)))
    if kafka_type == "float64":  # AlterClientQuotas' values
        return data.draw(st.floats(allow_nan=False))
    lo, hi = _INT_RANGES[kafka_type or "int32"]
    return data.draw(st.integers(lo, hi))


def random_fields(cls: type, data: st.DataObject, depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for plan in m._plan(cls):
        if plan.entity is not None:
            if plan.is_tuple:
                size = data.draw(st.integers(0, 2 if depth < 2 else 0))
                out[plan.name] = [random_fields(plan.entity, data, depth + 1) for _ in range(size)]
            elif not plan.optional or data.draw(st.booleans()):
                out[plan.name] = random_fields(plan.entity, data, depth + 1)
            else:
                out[plan.name] = None
        elif plan.is_tuple:
            if plan.optional and data.draw(st.booleans()):
                out[plan.name] = None
            else:
                out[plan.name] = [_value(plan.kafka_type, False, data) for _ in range(data.draw(st.integers(0, 3)))]
        else:
            out[plan.name] = _value(plan.kafka_type, plan.optional, data)
    return out


@settings(max_examples=600)
@given(api=st.sampled_from(SUPPORTED), data=st.data())
def test_well_formed_requests_pass_the_length_guard_and_decode_unchanged(
    api: tuple[int, int], data: st.DataObject
) -> None:
    """The guard never refuses what kio encodes: random valid requests of every API and version."""
    cls = m._request_type(*api)
    entity = m.build(cls, random_fields(cls, data))
    out = io.BytesIO()
    m._writer(cls)(out, entity)
    frame = header_bytes(*api) + out.getvalue()
    header, pos = m.parse_header(frame)
    again = io.BytesIO()
    m._writer(cls)(again, m.decode_request(header, frame, pos))
    assert again.getvalue() == out.getvalue()


def test_null_is_refused_where_the_schema_does_not_allow_it() -> None:
    """CreatePartitions v0 with topics = null (count -1) reached the handler as None and failed there."""
    frame = header_bytes(37, 0) + struct.pack(">i", -1) + struct.pack(">i", 1000) + b"\x00"
    header, pos = m.parse_header(frame)
    with pytest.raises(m.MalformedRequest, match="null"):
        m.decode_request(header, frame, pos)
    # Metadata v4's topics may be null ("all topics"): still accepted.
    frame = header_bytes(3, 4) + struct.pack(">i", -1) + b"\x01"
    header, pos = m.parse_header(frame)
    assert m.decode_request(header, frame, pos).topics is None

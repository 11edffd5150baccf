"""Produce responses (v3-v9) written straight from the handler's dicts with ``struct``.

librdkafka puts one partition in each ProduceRequest, so a broker answers one Produce per batch:
~150 a second per broker at the bench's low rate. Building a kio entity and walking kio's generic
writer cost ~150 µs of each answer, as much as the produce itself (bench/request_cost.py, under
cProfile); here an answer is a few ``struct.pack`` calls.

The bytes are kio's for every field and version (tests/unit/test_produce_response.py checks them
against kio). The dicts are the ones ``messages.encode_response`` takes: keys as in
ProduceResponse.json, a missing key meaning the field's default.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Mapping
from typing import Any

from .response_wire import I32, frame, frame_start, length, milliseconds, string

__all__ = ["FIRST_VERSION", "LAST_VERSION", "encode_produce_response"]

FIRST_VERSION = 3
LAST_VERSION = 9
FLEXIBLE_FROM = 9

# A partition's fixed fields: index, error code, base offset, log append time (v2+), log start
# offset (v5+).
_HEAD_V3 = struct.Struct(">ihqq")
_HEAD_V5 = struct.Struct(">ihqqq")
_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


def _epoch_ms(value: Any) -> int:
    """log_append_time as the handlers give it (None, milliseconds, or a datetime) in milliseconds."""
    if value is None:
        return -1
    if isinstance(value, datetime.datetime):
        return (value - _EPOCH) // datetime.timedelta(milliseconds=1)
    return int(value)


def _partition(p: Mapping[str, Any], version: int, flexible: bool, out: list[bytes | memoryview]) -> None:
    fixed = (p["index"], p.get("error_code", 0), p.get("base_offset", 0), _epoch_ms(p.get("log_append_time", -1)))
    out.append(_HEAD_V5.pack(*fixed, p.get("log_start_offset", -1)) if version >= 5 else _HEAD_V3.pack(*fixed))
    if version >= 8:
        errors = p.get("record_errors") or ()
        out.append(length(len(errors), flexible))
        for error in errors:
            out.append(I32.pack(error["batch_index"]))
            out.append(string(error.get("batch_index_error_message"), flexible))
            if flexible:
                out.append(b"\x00")
        out.append(string(p.get("error_message"), flexible))
    if flexible:
        out.append(b"\x00")


def encode_produce_response(version: int, correlation_id: int, body: Mapping[str, Any]) -> bytes:
    """The whole response frame (size, header, body) of a Produce ``version`` answer."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Produce v{version} responses are not written here")
    flexible = version >= FLEXIBLE_FROM
    out = frame_start(correlation_id, flexible)
    topics = list(body.get("responses", ()))
    out.append(length(len(topics), flexible))
    for topic in topics:
        out.append(string(str(topic.get("name", "")), flexible))
        partitions = topic.get("partition_responses", ())
        out.append(length(len(partitions), flexible))
        for p in partitions:
            _partition(p, version, flexible, out)
        if flexible:
            out.append(b"\x00")
    out.append(I32.pack(milliseconds(body.get("throttle_time", 0))))
    if flexible:
        out.append(b"\x00")
    return frame(out)

"""Checks every length and count of a request body against the bytes that remain, before kio.

kio's native reader reserves memory for an array from its declared count before reading any
element: a count of 2^31 in a 30-byte Metadata request made it ask for tens of gigabytes, and
the failed allocation aborts the whole broker process (Rust's out-of-memory handler), which no
``except`` can catch. So a request body is walked here first, field by field along the same kio
schema, and refused with ``MalformedRequest`` as soon as an array, string or bytes length
claims more than what is left of the frame (an element takes at least its minimal encoded
size). Only then does kio decode it. The walk reads lengths, never copies data.
"""

from __future__ import annotations

import struct
import types
import typing
from dataclasses import fields, is_dataclass
from functools import cache, partial
from typing import Any

from .varint import read_uvarint

FIXED = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "float64": 8,
    "int64": 8,
    "uint64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
LENGTH_PREFIXED = {"string": 2, "bytes": 4, "records": 4}  # prefix size in non-flexible versions
# Elements that encode to nothing (none in Kafka's request schemas today): a count beyond this
# would only spin, so it is refused however many bytes remain.
MAX_EMPTY_ELEMENTS = 1 << 16

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class LengthError(ValueError):
    """A declared length or count does not fit in the frame."""


# One step of a plan: (kind, detail, is_array, optional, tag)
#   kind "fixed": detail = size; "prefixed": detail = non-flexible prefix size; "entity": detail = class
_Step = tuple[str, Any, bool, bool, int | None]


def _unwrap(tp: Any) -> tuple[Any, bool, bool]:
    optional = False
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        optional = True
    if typing.get_origin(tp) is tuple:
        inner = typing.get_args(tp)[0]
        if typing.get_origin(inner) in (types.UnionType, typing.Union):
            inner = next(a for a in typing.get_args(inner) if a is not type(None))
        return inner, True, optional
    return tp, False, optional


@cache
def _plan(cls: type) -> tuple[tuple[_Step, ...], dict[int, _Step], bool]:
    """The positional steps, the tagged ones by tag, and whether the entity is flexible."""
    steps: list[_Step] = []
    tagged: dict[int, _Step] = {}
    for f in fields(cls):
        inner, is_array, optional = _unwrap(f.type)
        kafka_type = f.metadata.get("kafka_type")
        tag = f.metadata.get("tag")
        step: _Step
        if is_dataclass(inner):
            step = ("entity", inner, is_array, optional, tag)
        elif kafka_type in FIXED:
            step = ("fixed", FIXED[kafka_type], is_array, optional, tag)
        elif kafka_type in LENGTH_PREFIXED:
            step = ("prefixed", LENGTH_PREFIXED[kafka_type], is_array, optional, tag)
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: unknown kafka type {kafka_type!r}")
        if tag is None:
            steps.append(step)
        else:
            tagged[int(tag)] = step
    return tuple(steps), tagged, bool(getattr(cls, "__flexible__", False))


@cache
def _min_size(cls: type) -> int:
    steps, _, flexible = _plan(cls)
    total = 1 if flexible else 0  # the tagged-fields count
    for kind, detail, is_array, _optional, _tag in steps:
        if is_array or kind == "prefixed":
            total += 1 if flexible else (4 if is_array else detail)
        elif kind == "fixed":
            total += detail
        else:
            total += _min_size(detail)
    return total


@cache
def _fixed_size(cls: type) -> int | None:
    """The encoded size of an entity's positional fields when all are fixed-size scalars (a Fetch
    partition, an OffsetCommit partition without metadata...), else None. Such entities, repeated
    by the thousand in one request, are stepped over in one move instead of field by field."""
    steps, _, _ = _plan(cls)
    if any(kind != "fixed" or is_array or optional for kind, _, is_array, optional, _ in steps):
        return None
    return sum(detail for _, detail, _, _, _ in steps)


# Compact lengths and counts are uint32s: at most 5 groups of 7 bits.
_uvarint = partial(read_uvarint, max_bits=35, error=LengthError)


def _need(pos: int, size: int, end: int, what: str) -> int:
    if size < 0 or pos + size > end:
        raise LengthError(f"{what} of {size} bytes at {pos} overruns the frame (ends at {end})")
    return pos + size


def _length(buf: memoryview, pos: int, end: int, flexible: bool, prefix: int) -> tuple[int, int]:
    """A length or count; -1 means null."""
    if flexible:
        value, pos = _uvarint(buf, pos, end)
        return value - 1, pos
    _need(pos, prefix, end, "length")
    value = (_I16 if prefix == 2 else _I32).unpack_from(buf, pos)[0]
    return value, pos + prefix


def _element(buf: memoryview, pos: int, end: int, kind: str, detail: Any, flexible: bool, nullable: bool) -> int:
    if kind == "fixed":
        return _need(pos, detail, end, "field")
    if kind == "prefixed":
        size, pos = _length(buf, pos, end, flexible, detail)
        if size < 0:
            if not nullable:
                raise LengthError(f"non-nullable string or bytes at {pos} is null")
            return pos
        return _need(pos, size, end, "string or bytes")
    return _entity(buf, pos, end, detail)


def _step(buf: memoryview, pos: int, end: int, step: _Step, flexible: bool) -> int:
    kind, detail, is_array, optional, _tag = step
    if is_array:
        count, pos = _length(buf, pos, end, flexible, 4)
        if count < 0:
            # kio would hand a handler None where the schema promises a sequence; Kafka refuses it.
            if not optional:
                raise LengthError(f"non-nullable array at {pos} is null")
            return pos
        smallest = (
            _min_size(detail) if kind == "entity" else (detail if kind == "fixed" else (1 if flexible else detail))
        )
        if count * smallest > end - pos or (smallest == 0 and count > MAX_EMPTY_ELEMENTS):
            raise LengthError(f"array of {count} elements at {pos} cannot fit in {end - pos} bytes")
        if kind == "fixed":  # checked above to fit
            return pos + count * detail
        if kind == "entity" and _fixed_size(detail) is not None:
            return _fixed_entities(buf, pos, end, detail, count)
        for _ in range(count):
            pos = _element(buf, pos, end, kind, detail, flexible, True)
        return pos
    if kind == "entity" and optional:
        _need(pos, 1, end, "struct marker")
        present = buf[pos] != 0xFF
        pos += 1
        if not present:
            return pos
    return _element(buf, pos, end, kind, detail, flexible, optional)


def _entity(buf: memoryview, pos: int, end: int, cls: type) -> int:
    steps, tagged, flexible = _plan(cls)
    fixed = _fixed_size(cls)
    if fixed is not None:
        pos = _need(pos, fixed, end, "fields")
    else:
        for step in steps:
            pos = _step(buf, pos, end, step, flexible)
    return _tagged_fields(buf, pos, end, tagged) if flexible else pos


def _tagged_fields(buf: memoryview, pos: int, end: int, tagged: dict[int, _Step]) -> int:
    """Step over a flexible entity's tagged fields, checking the ones the schema knows."""
    if pos < end and buf[pos] == 0:  # no tagged fields, as nearly always
        return pos + 1
    count, pos = _uvarint(buf, pos, end)
    for _ in range(count):
        tag, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        field_end = _need(pos, size, end, "tagged field")
        if tag in tagged:
            _step(buf, pos, field_end, tagged[tag], True)
        pos = field_end
    return pos


def _fixed_entities(buf: memoryview, pos: int, end: int, cls: type, count: int) -> int:
    """Step over ``count`` entities whose positional fields are all fixed-size (``_fixed_size``)."""
    fixed = _fixed_size(cls)
    assert fixed is not None
    _, tagged, flexible = _plan(cls)
    if not flexible:
        return _need(pos, count * fixed, end, "array")
    for _ in range(count):
        pos += fixed
        if pos < end and buf[pos] == 0:
            pos += 1
        elif pos > end:
            raise LengthError(f"entity of {fixed} bytes ending at {pos} overruns the frame (ends at {end})")
        else:
            pos = _tagged_fields(buf, pos, end, tagged)
    return pos


def check_lengths(cls: type, body: memoryview) -> None:
    """Raise ``LengthError`` if any length or count in ``body`` (a ``cls`` request) overruns it."""
    _entity(body, 0, len(body), cls)

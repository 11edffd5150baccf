"""Pieces of Kafka's wire format for the responses written with ``struct`` (hot APIs only).

``fetch_response`` and ``produce_response`` write their answers straight from the handlers'
dicts instead of through kio's generic writer; these are the length prefixes and strings both
need, in the classic (int16/int32 lengths) and the flexible (unsigned varint, length + 1) forms.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from typing import Any

from .varint import write_uvarint

ZERO_UUID = uuid.UUID(int=0)
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")

_SMALL_UVARINTS = tuple(bytes([value]) for value in range(128))


def uvarint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL_UVARINTS[value]
    out = bytearray()
    write_uvarint(value, out)
    return bytes(out)


def length(count: int, flexible: bool) -> bytes:
    """An array or bytes length prefix (``count`` -1 for null)."""
    return uvarint(count + 1) if flexible else I32.pack(count)


def string(value: str | None, flexible: bool) -> bytes:
    """A (nullable) string: int16 length in classic versions, length + 1 as a varint in flexible ones."""
    if value is None:
        return b"\x00" if flexible else I16.pack(-1)
    raw = value.encode()
    return (uvarint(len(raw) + 1) if flexible else I16.pack(len(raw))) + raw


def milliseconds(value: Any) -> int:
    """A duration field as the handlers give it (milliseconds, or a timedelta) in milliseconds."""
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)


def frame_start(correlation_id: int, flexible: bool) -> list[bytes | memoryview]:
    """The parts a response frame starts with: a size to fill in (``frame``), then the response
    header (v1, flexible versions: no tagged fields)."""
    out: list[bytes | memoryview] = [b"", I32.pack(correlation_id)]
    if flexible:
        out.append(b"\x00")
    return out


def frame(out: list[bytes | memoryview]) -> bytes:
    """The frame of the parts ``frame_start`` began: its size, then every part."""
    out[0] = I32.pack(sum(len(part) for part in out))  # the size part is still empty
    return b"".join(out)


def topic_uuid(topic_id: Any) -> uuid.UUID:
    """A handler's topic id (a ``uuid.UUID``, its text, or None for none) as a UUID; none is the
    zero id, as Kafka writes it."""
    if topic_id is None:
        return ZERO_UUID
    return topic_id if isinstance(topic_id, uuid.UUID) else uuid.UUID(str(topic_id))

"""Pieces of Kafka's wire format for the responses written with ``struct`` (hot APIs only).

``fetch_response`` and ``produce_response`` write their answers straight from the handlers'
dicts instead of through kio's generic writer; these are the length prefixes and strings both
need, in the classic (int16/int32 lengths) and the flexible (unsigned varint, length + 1) forms.
"""

from __future__ import annotations

import struct

from .varint import write_uvarint

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

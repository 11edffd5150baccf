"""Variable-length integers: unsigned LEB128 (Kafka's compact lengths and tagged fields) and zigzag
(Kafka's record fields), read from and written to byte buffers.

One reader serves every decoder; each says how wide a value may be and which exception a
truncated or over-long varint raises (a request decoder closes the connection, a pointer decoder
refuses the entries, a record decoder calls the batch corrupt), so none of them needs a wrapper.
"""

from __future__ import annotations

__all__ = ["read_uvarint", "read_zigzag", "write_uvarint", "write_zigzag"]


def read_uvarint(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int | None = None,
    *,
    max_bits: int = 64,
    error: type[Exception] = ValueError,
) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it.

    ``error("bad varint ...")`` when it runs past ``end`` (default: the buffer's end) or has more
    groups of 7 bits than ``max_bits`` needs."""
    if end is None:
        end = len(buf)
    value = shift = 0
    while True:
        if pos >= end or shift >= max_bits:
            raise error(f"bad varint at {pos}: truncated or wider than {max_bits} bits")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def read_zigzag(
    buf: bytes | bytearray | memoryview, pos: int, *, max_bits: int = 64, error: type[Exception] = ValueError
) -> tuple[int, int]:
    """The zigzag-encoded signed varint at ``pos`` and the position after it."""
    raw, pos = read_uvarint(buf, pos, max_bits=max_bits, error=error)
    return (raw >> 1) ^ -(raw & 1), pos


def write_uvarint(value: int, out: bytearray) -> None:
    """Append ``value`` (>= 0, any size) as an unsigned varint."""
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_zigzag(value: int, out: bytearray) -> None:
    """Append a signed ``value`` of any size zigzag-encoded (Kafka's 64-bit fields stay within 10 bytes)."""
    write_uvarint(value * 2 if value >= 0 else -value * 2 - 1, out)

"""The one varint reader and writer every decoder uses (protocol/varint.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.protocol.varint import read_uvarint, read_zigzag, write_uvarint, write_zigzag


class Refused(Exception):
    pass


@given(st.integers(min_value=0, max_value=2**64 - 1), st.binary(max_size=4))
def test_unsigned_round_trip_leaves_what_follows(value: int, tail: bytes) -> None:
    out = bytearray()
    write_uvarint(value, out)
    assert read_uvarint(bytes(out) + tail, 0) == (value, len(out))


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_zigzag_round_trip_of_kafka_longs_within_ten_bytes(value: int) -> None:
    out = bytearray()
    write_zigzag(value, out)
    assert len(out) <= 10
    assert read_zigzag(out, 0) == (value, len(out))


@pytest.mark.parametrize(
    ("value", "encoded"), [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (-64, b"\x7f"), (64, b"\x80\x01")]
)
def test_zigzag_matches_kafkas_encoding(value: int, encoded: bytes) -> None:
    out = bytearray()
    write_zigzag(value, out)
    assert bytes(out) == encoded


def test_a_truncated_varint_raises_the_callers_error() -> None:
    with pytest.raises(Refused):
        read_uvarint(b"\x80\x80", 0, error=Refused)
    with pytest.raises(Refused):
        read_uvarint(b"\x05\x80\x01", 1, 2, error=Refused)  # ``end`` cuts it even though bytes follow


def test_a_varint_wider_than_allowed_is_refused_at_its_bound() -> None:
    five_groups = b"\xff\xff\xff\xff\x7f"  # 2**35 - 1 fits 35 bits
    assert read_uvarint(five_groups, 0, max_bits=35) == (2**35 - 1, 5)
    with pytest.raises(Refused):
        read_uvarint(b"\xff\xff\xff\xff\xff\x01", 0, max_bits=35, error=Refused)

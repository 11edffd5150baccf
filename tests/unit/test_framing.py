"""Size-prefixed frames: any chunking of a byte stream yields the same frames."""

from __future__ import annotations

import struct
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.protocol.framing import FrameDecoder, FrameError, encode_frame

MAX = 1024


def _chunks(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in pairwise(points)]


@given(bodies=st.lists(st.binary(max_size=200), max_size=20), cuts=st.lists(st.integers(0, 10**6), max_size=40))
def test_arbitrary_chunking_yields_same_frames(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(b) for b in bodies)
    decoder = FrameDecoder(MAX)
    out: list[bytes] = []
    for chunk in _chunks(stream, cuts):
        decoder.feed(chunk)
        out.extend(decoder.frames())
    assert out == bodies
    assert decoder.buffered == 0


@given(bodies=st.lists(st.binary(max_size=50), min_size=1, max_size=5), keep=st.integers(1, 50))
def test_partial_frame_stays_buffered(bodies: list[bytes], keep: int) -> None:
    stream = b"".join(encode_frame(b) for b in bodies)
    last = encode_frame(b"tail-frame")
    keep = min(keep, len(last) - 1)
    decoder = FrameDecoder(MAX)
    decoder.feed(stream + last[:keep])
    assert decoder.frames() == bodies
    assert decoder.buffered == keep
    assert decoder.frames() == []
    decoder.feed(last[keep:])
    assert decoder.frames() == [b"tail-frame"]


def test_byte_at_a_time() -> None:
    stream = encode_frame(b"abc") + encode_frame(b"") + encode_frame(b"x" * 300)
    decoder = FrameDecoder(MAX)
    out = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        out.extend(decoder.frames())
    assert out == [b"abc", b"", b"x" * 300]


@pytest.mark.parametrize("size", [-1, -(2**31), MAX + 1, 2**31 - 1])
def test_bad_size_raises_without_waiting_for_the_body(size: int) -> None:
    decoder = FrameDecoder(MAX)
    decoder.feed(encode_frame(b"ok") + struct.pack(">i", size))
    with pytest.raises(FrameError):
        decoder.frames()


def test_frame_of_exactly_max_is_accepted() -> None:
    decoder = FrameDecoder(MAX)
    decoder.feed(encode_frame(b"z" * MAX))
    assert decoder.frames() == [b"z" * MAX]


def test_encode_frame() -> None:
    assert encode_frame(b"hello") == b"\x00\x00\x00\x05hello"

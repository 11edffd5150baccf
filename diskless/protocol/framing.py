"""Size-prefixed Kafka frames as a sans-IO decoder.

Bytes go in with ``feed``; complete frame bodies come out of ``frames``. A frame whose declared
size is negative or above the limit raises ``FrameError`` so the caller can close that one
connection (Kafka's ``socket.request.max.bytes`` behaviour) without reading the body.
"""

from __future__ import annotations

import struct

_SIZE = struct.Struct(">i")


class FrameError(Exception):
    pass


class FrameDecoder:
    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> list[bytes]:
        out: list[bytes] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > self._max:
                raise FrameError(f"frame size {size} outside [0, {self._max}]")
            if len(buf) - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


def encode_frame(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body

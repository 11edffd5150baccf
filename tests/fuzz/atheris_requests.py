"""Coverage-guided fuzzing of the request decoding path with atheris (libFuzzer).

Run: ``python tests/fuzz/atheris_requests.py -max_total_time=60`` (any libFuzzer flag works).
Each input picks a supported API key and version, then the rest is the request body; the
server's decoding steps (``parse_header``, the length guard, kio) may only raise
``MalformedRequest``. libFuzzer also stops on a crash, an abort (kio's out-of-memory handler),
a single allocation above ``-malloc_limit_mb`` or a slow input (``-timeout``).
"""

from __future__ import annotations

import struct
import sys

import atheris

with atheris.instrument_imports(include=["diskless.protocol"]):
    from diskless.protocol import messages as m
    from diskless.protocol import records

SUPPORTED = sorted((key, version) for key, (lo, hi) in m.SUPPORTED_VERSIONS.items() for version in range(lo, hi + 1))


def header(api_key: int, version: int) -> bytes:
    out = struct.pack(">hhih", api_key, version, 1, 4) + b"fuzz"
    if m.is_flexible(api_key, version):
        out += b"\x00"
    return out


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    api_key, version = SUPPORTED[int.from_bytes(data[:2], "big") % len(SUPPORTED)]
    frame = header(api_key, version) + data[2:]
    try:
        parsed, pos = m.parse_header(frame)
        m.decode_request(parsed, frame, pos)
    except m.MalformedRequest:
        pass
    # The produce path's batch framing and validation on the same bytes.
    try:
        for batch in records.split_batches(data[2:]):
            records.validate_batch(batch, 1 << 20)
    except records.InvalidBatch:
        pass


def main() -> None:
    argv = list(sys.argv)
    if not any(arg.startswith("-malloc_limit_mb") for arg in argv):
        argv.append("-malloc_limit_mb=512")
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

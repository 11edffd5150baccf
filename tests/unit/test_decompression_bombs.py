"""Decompression bombs: a small compressed batch that inflates to far more than any legitimate one.

A produced batch is only checked at the header level, so a zstd batch of a few KB can carry 128 MiB
of zeros. The broker decompresses batches only for ListOffsets by timestamp (and the Spark source
for reads); there the output must be bounded by the topic's ``max.message.bytes`` (times
``records.DECOMPRESSION_RATIO_LIMIT``), the over-sized batch skipped, and memory never follow the
attacker's ratio. Memory is measured as the peak RSS of a child process, which also sees what the
Rust decompressors allocate (tracemalloc would not).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest
from batches import CODEC_NAMES, GZIP, LZ4, SNAPPY, ZSTD, Record, compress, make_batch, zigzag_varint
from loghelpers import T0, open_log

from diskless.protocol import records

BOMB_BYTES = 128 * 1024 * 1024
SMALL_MAX_MESSAGE = 128 * 1024  # bound = 64 x 128 KiB = 8 MiB, far below the bomb

_HEADER = struct.Struct(">qiibIhiqqqhii")


def bomb_batch(codec: int, *, xerial: bool = True, size: int = BOMB_BYTES) -> bytes:
    """One well-formed record whose value is ``size`` zero bytes, compressed with ``codec``."""
    body = b"\x00" + zigzag_varint(0) + zigzag_varint(0) + zigzag_varint(-1) + zigzag_varint(size)
    record_len = len(body) + size + 1  # + the headers count
    plain = zigzag_varint(record_len) + body + bytes(size) + zigzag_varint(0)
    payload = compress(codec, plain, xerial=xerial)
    del plain
    header = bytearray(_HEADER.pack(0, 49 + len(payload), -1, 2, 0, codec, 0, T0, T0, -1, -1, -1, 1))
    batch = header + payload
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[3])


def peak_kib():
    # VmHWM belongs to this process's address space; ru_maxrss would carry the forking parent's peak
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

from loghelpers import open_log
batch = open(sys.argv[1], "rb").read()
log = open_log(sys.argv[2], max_message_bytes=int(sys.argv[4]))
before = peak_kib()
try:
    found = log.first_record_reaching(batch, 0)
    outcome = repr(found)
except Exception as exc:
    outcome = type(exc).__name__ + ": " + str(exc)
after = peak_kib()
print(json.dumps({"outcome": outcome, "rss_growth_kib": after - before}))
"""


BOMBS = [(GZIP, True), (SNAPPY, True), (SNAPPY, False), (LZ4, True), (ZSTD, True)]


@pytest.mark.parametrize(
    ("codec", "xerial"), BOMBS, ids=[CODEC_NAMES[c] + ("" if x or c != SNAPPY else "-raw") for c, x in BOMBS]
)
def test_bomb_is_skipped_with_bounded_memory(tmp_path: Path, codec: int, xerial: bool) -> None:
    path = tmp_path / "bomb.batch"
    path.write_bytes(bomb_batch(codec, xerial=xerial))
    unit_dir = str(Path(__file__).parent)
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path / "log"), unit_dir, str(SMALL_MAX_MESSAGE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The log is empty, so no record could be an answer anyway: what matters is the work done.
    assert report["outcome"] == "None", report
    bound_kib = 64 * SMALL_MAX_MESSAGE // 1024
    # A buffer up to the bound and one copy of it, plus slack for the allocator.
    assert report["rss_growth_kib"] < 3 * bound_kib + 16 * 1024, report


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=lambda c: CODEC_NAMES[c])
def test_decompress_over_the_bound_is_corrupt_message(codec: int) -> None:
    batch = bomb_batch(codec, size=4 * 1024 * 1024)
    with pytest.raises(records.InvalidBatch) as raised:
        records.decompress_body(codec, batch[records.HEADER_SIZE :], max_bytes=1024 * 1024)
    assert raised.value.error == "corrupt_message"
    # Exactly at the bound is fine (the bound is inclusive).
    body = records.decompress_body(codec, batch[records.HEADER_SIZE :], max_bytes=4 * 1024 * 1024 + 64)
    assert len(body) > 4 * 1024 * 1024


def test_list_offsets_skips_the_bomb_and_finds_the_next_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_message_bytes=SMALL_MAX_MESSAGE)
    log.append_as_leader([memoryview(bomb_batch(ZSTD))], 0, T0)
    recs = [Record(b"a", timestamp=T0 + 5), Record(b"b", timestamp=T0 + 9)]
    log.append_as_leader([memoryview(make_batch(recs, compression=ZSTD))], 0, T0)
    log.high_watermark = log.log_end_offset
    assert log.offset_for_timestamp(T0) == (1, T0 + 5)
    assert log.offset_for_timestamp(T0 + 6) == (2, T0 + 9)
    log.close()


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=lambda c: CODEC_NAMES[c])
def test_corrupt_compressed_body_is_corrupt_message(codec: int) -> None:
    good = compress(codec, b"x" * 10000)
    mangled = good[: len(good) // 2] + bytes(len(good) - len(good) // 2)
    with pytest.raises(records.InvalidBatch) as raised:
        records.decompress_body(codec, mangled, max_bytes=1024 * 1024)
    assert raised.value.error == "corrupt_message"

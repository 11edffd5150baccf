"""How fast the log cleaner compacts a classic log, and how much memory its key map takes.

Usage: python bench/compaction.py [--records N] [--keys K] [--value-bytes B] [--batch R] [--codec C] [--memory]

Writes N records over K keys (round robin, so each pass keeps K of them) in batches of R records
into a PartitionLog with 1 MiB segments, then runs one cleaning pass (prepare, the worker's run,
install) and prints the pass's wall time, MB/s of segments read, bytes before/after, and the
key map's peak traced memory (``--memory``). One process, no broker: the figure is the cleaner's own cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "unit"))

from batches import LZ4, NONE, ZSTD, Record, make_batch

from diskless.log import cleaner
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog

T0 = 1_700_000_000_000
CODECS = {"none": NONE, "lz4": LZ4, "zstd": ZSTD}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--codec", choices=sorted(CODECS), default="none")
    parser.add_argument("--memory", action="store_true", help="trace the pass's memory (slows it ~2x)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        config = LogConfig(cleanup_policy="compact", segment_bytes=1 << 20, min_cleanable_dirty_ratio=0.0)
        log = PartitionLog(os.path.join(directory, "t-0"), config, T0)
        value = b"v" * args.value_bytes
        for start in range(0, args.records, args.batch):
            records = [Record(value, key=b"key-%d" % ((start + i) % args.keys)) for i in range(args.batch)]
            log.append_as_leader([memoryview(make_batch(records, compression=CODECS[args.codec]))], 0, T0)
        log.roll(T0)
        log.high_watermark = log.log_end_offset
        segments = len(log.segments) - 1
        started = time.perf_counter()
        job = cleaner.prepare(log, T0)
        assert job is not None
        if args.memory:
            tracemalloc.start()
        output = cleaner.run(job, 10_000_000)
        peak = tracemalloc.get_traced_memory()[1] if args.memory else 0
        tracemalloc.stop()
        assert output is not None and cleaner.install(output)
        elapsed = time.perf_counter() - started
        before, after = output.bytes_before, output.bytes_after
        print(
            f"{args.records} records over {args.keys} keys, {args.codec}, {segments} segments: "
            f"one pass {elapsed:.2f} s, {before / elapsed / 1e6:.1f} MB/s read, "
            f"{before / 1e6:.1f} MB -> {after / 1e6:.2f} MB, "
            f"{output.stats.records_read / elapsed / 1e3:.0f}k records/s"
            + (f", peak traced memory {peak / 1e6:.1f} MB ({peak / args.keys:.0f} B per key)" if args.memory else "")
        )
        log.close()


if __name__ == "__main__":
    main()

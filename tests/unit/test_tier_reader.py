"""Serving tiered ranges from segment objects: exact batches, byte limits, max offset, cached blocks."""

from __future__ import annotations

import asyncio

import msgpack
from batches import Record, make_batch

from diskless.fetch.tier_reader import TierReader
from diskless.fetch.wal_reader import WalCache
from diskless.protocol import records
from diskless.storage.segment_object import SegmentWriter, iter_batches


class FakeStore:
    """An in-memory object store counting ranged GETs."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.range_gets = 0

    async def get(self, key: str) -> bytes:
        return self.objects[key]

    async def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        self.range_gets += 1
        return [self.objects[key][a:b] for a, b in ranges]


def build(store: FakeStore, batches: int = 40, size: int = 500) -> tuple[dict[str, object], list[bytes]]:
    writer = SegmentWriter("tid", 1)
    served = []
    offset = 100
    for _ in range(batches):
        batch = bytearray(make_batch([Record(b"z" * size, timestamp=i) for i in range(3)], base_timestamp=0))
        records.assign_offset(batch, offset, 2)
        writer.add(batch)
        served.append(bytes(batch))
        offset += 3
    log_bytes, index_bytes, info = writer.finish()
    store.objects[info.log_key] = log_bytes
    store.objects[info.index_key] = index_bytes
    return info.to_dict(), served


def read(reader: TierReader, segment: dict[str, object], offset: int, max_bytes: int, max_offset: int) -> bytes:
    descriptor = {"segment": segment, "offset": offset, "max_bytes": max_bytes, "max_offset": max_offset}
    return asyncio.run(reader.read(msgpack.packb(descriptor)))


def test_reads_whole_batches_within_limits() -> None:
    store = FakeStore()
    segment, served = build(store)
    reader = TierReader(store, WalCache(1 << 30), block_bytes=4096)  # type: ignore[arg-type]
    assert read(reader, segment, 100, 1, 10_000) == served[0]  # min_one
    assert read(reader, segment, 104, 1, 10_000) == served[1]  # the batch holding 104
    data = read(reader, segment, 100, 3 * len(served[0]), 10_000)
    assert data == b"".join(served[:3])
    everything = read(reader, segment, 100, 1 << 30, 10_000)
    assert [bytes(b) for b in iter_batches(everything)] == served
    assert read(reader, segment, 100, 1 << 30, 106) == b"".join(served[:2])  # below max_offset only
    assert read(reader, segment, 106, 1 << 30, 106) == b""


def test_consumer_reading_along_hits_cached_blocks() -> None:
    store = FakeStore()
    segment, served = build(store, batches=200)
    reader = TierReader(store, WalCache(1 << 30), block_bytes=16 * 1024)  # type: ignore[arg-type]
    offset = 100
    got = []
    while True:
        data = read(reader, segment, offset, 4096, 10_000)
        if not data:
            break
        for batch in iter_batches(data):
            got.append(bytes(batch))
            offset = records.parse_header(batch).last_offset + 1
    assert got == served
    size = len(b"".join(served))
    assert store.range_gets <= size // (16 * 1024) + 2  # about one GET per block, not per fetch
    before = store.range_gets
    read(reader, segment, 100, 1 << 20, 10_000)  # another consumer of the same range: cache only
    assert store.range_gets == before

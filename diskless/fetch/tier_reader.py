"""Serving tiered ranges: a TIERED read (partition_log.py) in, record batches out. Async edge.

A tiered range lives in a segment object (``diskless/storage/segment_object.py``) whose batches are
already exactly what a consumer gets, so serving is: find the batch holding the fetch offset in the
segment's offset index (the small ``.index`` object, fetched once and kept), read whole batches up
to the fetch's byte limit, drop batches at or past the read's ``max_offset`` (high watermark or
last stable offset). Segment bytes are read and cached in blocks of whole batches (the batches
that start within an aligned ``BLOCK_BYTES`` window), so a consumer reading along a segment makes
about one ranged GET per block and other consumers of the same range hit the cache; blocks live in
the WAL cache's lagging share, which cannot evict the tail's WAL objects.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Any

import msgpack

from diskless.metrics import TIER_READ_BYTES
from diskless.protocol import records
from diskless.storage.object_store import ObjectStore
from diskless.storage.segment_object import SegmentIndex, SegmentInfo

from .wal_reader import WalCache

BLOCK_BYTES = 1024 * 1024
_MAX_INDEXES = 4096


class TierReader:
    def __init__(self, store: ObjectStore, cache: WalCache, block_bytes: int = BLOCK_BYTES) -> None:
        self.store = store
        self.cache = cache
        self.block_bytes = block_bytes
        self._indexes: OrderedDict[str, SegmentIndex] = OrderedDict()
        self.gets = 0  # ranged GETs of segment bytes (tests and benchmarks)

    async def index(self, info: SegmentInfo) -> SegmentIndex:
        index = self._indexes.get(info.index_key)
        if index is None:
            data = await self.store.get(info.index_key)
            index = SegmentIndex(data, info.base_offset, info.size)
            self._indexes[info.index_key] = index
            while len(self._indexes) > _MAX_INDEXES:
                self._indexes.popitem(last=False)
        self._indexes.move_to_end(info.index_key)
        return index

    async def read(self, descriptor: bytes | dict[str, Any]) -> bytes:
        """The batches a TIERED read result (its ``records``, or the map they decode to) describes."""
        d = msgpack.unpackb(descriptor) if isinstance(descriptor, bytes | bytearray) else descriptor
        info = SegmentInfo.from_dict(d["segment"])
        if int(d["offset"]) > info.last_offset:
            return b""
        index = await self.index(info)
        start, end = index.byte_range(int(d["offset"]), int(d["max_bytes"]), bool(d.get("min_one", True)))
        if end <= start:
            return b""
        data = await self._bytes(info, index, start, end)
        # Never at or past the read's limit (the high watermark, or the LSO for read_committed).
        max_offset = int(d["max_offset"])
        cut = 0
        while cut < len(data):
            base, size = records.peek_offset_and_size(data, cut)
            if base >= max_offset:
                break
            cut += size
        TIER_READ_BYTES.inc(cut)
        return data[:cut]

    def _block_bounds(self, index: SegmentIndex, block: int) -> tuple[int, int]:
        """[start, end) of the batches starting in the block's aligned window."""
        first = bisect.bisect_left(index.positions, block * self.block_bytes)
        after = bisect.bisect_left(index.positions, (block + 1) * self.block_bytes)
        start = index.positions[first] if first < len(index.positions) else index.log_size
        end = index.positions[after] if after < len(index.positions) else index.log_size
        return start, end

    async def _bytes(self, info: SegmentInfo, index: SegmentIndex, start: int, end: int) -> bytes:
        last_batch = index.positions[bisect.bisect_right(index.positions, end - 1) - 1]
        blocks = range(start // self.block_bytes, last_batch // self.block_bytes + 1)
        bounds = [self._block_bounds(index, b) for b in blocks]
        chunks: list[bytes | None] = [self.cache.get(f"{info.log_key}#{b}") for b in blocks]
        missing = [i for i, chunk in enumerate(chunks) if chunk is None and bounds[i][1] > bounds[i][0]]
        if missing:
            self.gets += 1
            fetched = await self.store.get_ranges(info.log_key, [bounds[i] for i in missing])
            for i, chunk in zip(missing, fetched, strict=True):
                chunks[i] = chunk
                # Tiered ranges are far behind the tail: their blocks must not evict tail objects.
                self.cache.put(f"{info.log_key}#{blocks[i]}", chunk, lagging=True)
        joined = b"".join(c or b"" for c in chunks)
        first_start = bounds[0][0]
        return joined[start - first_start : end - first_start]

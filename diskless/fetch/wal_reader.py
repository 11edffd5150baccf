"""Serving diskless batches: pointer entries in, record batches out, through a bounded cache.

WAL objects live in a byte-bounded LRU cache. A broker that appends pointers (leader or follower
replica) prefetches the objects they point into, so consumers at the tail of the log are served
from memory and an object is fetched about once per AZ. Cache misses (consumers reading older
data) fetch only the needed byte ranges, coalesced into few ranged GETs per object. The served
batch is the stored header (leader-assigned offset and epoch) over the producer's bytes; records
are never decoded or re-encoded.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import structlog

from diskless.metrics import DISKLESS_CACHE, child
from diskless.storage.object_store import ObjectStore

log = structlog.get_logger(__name__)


class WalCache:
    """Whole WAL objects by key, least recently used evicted first once ``max_bytes`` is exceeded."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> bytes | None:
        data = self._objects.get(key)
        if data is not None:
            self._objects.move_to_end(key)
        return data

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes or key in self._objects:
            return
        self._objects[key] = data
        self._size += len(data)
        while self._size > self.max_bytes:
            _, evicted = self._objects.popitem(last=False)
            self._size -= len(evicted)

    @property
    def size(self) -> int:
        return self._size


class WalReader:
    def __init__(self, store: ObjectStore, cache: WalCache) -> None:
        self.store = store
        self.cache = cache
        self._inflight: dict[str, asyncio.Future[bytes]] = {}

    def prefetch(self, keys: set[str]) -> None:
        """Start fetching whole objects that are neither cached nor on their way."""
        for key in keys:
            if self.cache.get(key) is None and key not in self._inflight:
                self._inflight[key] = asyncio.ensure_future(self._fetch_whole(key))

    async def _fetch_whole(self, key: str) -> bytes:
        try:
            data = await self.store.get(key)
            self.cache.put(key, data)
            return data
        finally:
            self._inflight.pop(key, None)

    async def batches(self, entries: list[Any]) -> list[bytes]:
        """The served batch of every pointer entry, in order."""
        out: list[bytes | None] = [None] * len(entries)
        missing: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            data = self.cache.get(entry.key)
            if data is not None:
                child(DISKLESS_CACHE, "hit").inc()
                self.cache.hits += 1
                out[i] = bytes(entry.serve(memoryview(data)[entry.offset : entry.offset + entry.size]))
            else:
                missing.setdefault(entry.key, []).append(i)
        waits = []
        for key, indexes in missing.items():
            waits.append(self._load_ranges(key, indexes, entries, out))
        if waits:
            await asyncio.gather(*waits)
        return [b for b in out if b is not None]

    async def _load_ranges(self, key: str, indexes: list[int], entries: list[Any], out: list[bytes | None]) -> None:
        pending = self._inflight.get(key)
        if pending is not None:
            # A prefetch of this object is under way: waiting for it costs no extra request.
            data = await asyncio.shield(pending)
            child(DISKLESS_CACHE, "prefetching").inc(len(indexes))
            self.cache.hits += len(indexes)
            for i in indexes:
                entry = entries[i]
                out[i] = bytes(entry.serve(memoryview(data)[entry.offset : entry.offset + entry.size]))
            return
        child(DISKLESS_CACHE, "miss").inc(len(indexes))
        self.cache.misses += len(indexes)
        ranges = [(entries[i].offset, entries[i].offset + entries[i].size) for i in indexes]
        chunks = await self.store.get_ranges(key, ranges)
        for i, chunk in zip(indexes, chunks, strict=True):
            out[i] = bytes(entries[i].serve(chunk))

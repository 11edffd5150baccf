"""Serving diskless batches: pointer entries in, record batches out, through a bounded cache.

WAL objects live in a byte-bounded cache. A broker that appends pointers (leader or follower
replica) prefetches the objects they point into, so consumers at the tail of the log are served
from memory and an object is fetched about once per AZ; reads far behind the tail get a separate
share of the cache and cannot evict those objects (``WalCache``). Cache misses (consumers reading older
data) fetch only the needed byte ranges, coalesced into few ranged GETs per object. The served
batch is the stored header (leader-assigned offset and epoch) over the producer's bytes; records
are never decoded or re-encoded.

Two lanes to object storage. Whole-object GETs at the tail (prefetches) and the cache misses of
readers far behind it have separate connections and request slots, so a reader catching up from
the beginning, with hundreds of ranged GETs queued, never stands in front of the tail. A read at
its partition's end, starting in a young object (``lagging_reads.at_tail``), that finds its object
neither cached nor on its way (the prefetch failed, or the replica was catching up when it
appended) fetches the whole object in the tail lane; and a read that found a prefetch under way
waits for that prefetch, even if it finishes before the read's own step runs. Before, such a
read found neither the cache entry nor the prefetch and sent a ranged GET in the miss lane, ~2 a
second per broker at the bench's low rate: ~6 ms each on an idle lane, 0.7-2.3 s each behind a
lagging reader, and the tail consumers of that broker's AZ waited for them (issue 10's
lagging-reader phase).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import structlog

from diskless.metrics import DISKLESS_CACHE, DISKLESS_CACHE_BYTES, child
from diskless.storage.hedging import HedgePolicy
from diskless.storage.object_store import ObjectStore

log = structlog.get_logger(__name__)


class WalCache:
    """Cached bytes by key in two byte-bounded shares that never evict each other.

    The tail share holds whole WAL objects uploaded or prefetched at the log end, which tail
    consumers read within moments; it is first in, first out, so its content depends only on
    the order of tail puts: no lookup or put made for a reader far behind the tail (a consumer
    reading a topic from its beginning) can push out what tail consumers are about to read.
    The lagging share (``lagging=True`` puts: blocks of tiered segments) is least recently used
    first, so readers moving along a range hit the blocks the reader before them fetched. The
    lagging share is ``lagging_max_bytes`` (default a quarter of ``max_bytes``), the tail share
    the rest; together they never exceed ``max_bytes``.
    """

    def __init__(self, max_bytes: int, lagging_max_bytes: int = -1) -> None:
        self.max_bytes = max_bytes
        lagging = max_bytes // 4 if lagging_max_bytes < 0 else lagging_max_bytes
        self.lagging_max_bytes = min(lagging, max_bytes)
        self._tail: OrderedDict[str, bytes] = OrderedDict()
        self._lagging: OrderedDict[str, bytes] = OrderedDict()
        self._tail_size = 0
        self._lagging_size = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> bytes | None:
        data = self._tail.get(key)
        if data is not None:
            return data
        data = self._lagging.get(key)
        if data is not None:
            self._lagging.move_to_end(key)
        return data

    def __contains__(self, key: str) -> bool:  # no use recorded, unlike ``get``
        return key in self._tail or key in self._lagging

    def put(self, key: str, data: bytes, lagging: bool = False) -> None:
        if key in self._tail or key in self._lagging:
            return
        if lagging:
            self._lagging_size = self._admit(self._lagging, self._lagging_size, self.lagging_max_bytes, key, data)
        else:
            budget = self.max_bytes - self.lagging_max_bytes
            self._tail_size = self._admit(self._tail, self._tail_size, budget, key, data)
        DISKLESS_CACHE_BYTES.labels("tail").set(self._tail_size)
        DISKLESS_CACHE_BYTES.labels("lagging").set(self._lagging_size)

    @staticmethod
    def _admit(share: OrderedDict[str, bytes], size: int, budget: int, key: str, data: bytes) -> int:
        """Add to one share, evicting its oldest entries; returns the share's new size."""
        if len(data) > budget:
            return size
        share[key] = data
        size += len(data)
        while size > budget:
            _, evicted = share.popitem(last=False)
            size -= len(evicted)
        return size

    @property
    def size(self) -> int:
        return self._tail_size + self._lagging_size

    @property
    def lagging_size(self) -> int:
        return self._lagging_size

    def tail_keys(self) -> list[str]:
        return list(self._tail)

    def lagging_keys(self) -> list[str]:
        return list(self._lagging)


def _report_failed_prefetch(key: str, task: asyncio.Future[bytes]) -> None:
    """A failed prefetch only costs its readers ranged GETs, but it says something about the store
    (and asyncio would otherwise report its exception as never retrieved, when collected)."""
    if not task.cancelled() and task.exception() is not None:
        error = repr(task.exception())
        log.warning("WAL object prefetch failed; its readers fetch ranges instead", key=key, error=error)


class WalReader:
    def __init__(
        self,
        store: ObjectStore,
        cache: WalCache,
        miss_store: ObjectStore | None = None,
        hedge: HedgePolicy | None = None,
    ) -> None:
        self.store = store  # whole-object prefetches at the tail
        # Tail GETs are hedged (storage/hedging.py): a tail consumer in another AZ waits for them.
        # Ranged GETs of cache misses are not: they serve readers far behind, bounded by a quota.
        self.hedge = hedge
        # Ranged GETs of cache misses: a store of their own (a lane with its own connections and
        # request slots), so a reader far behind the tail cannot queue the tail's requests.
        self.miss_store = store if miss_store is None else miss_store
        self.cache = cache
        self._inflight: dict[str, asyncio.Future[bytes]] = {}

    def prefetch(self, keys: set[str]) -> set[str]:
        """Start fetching whole objects that are neither cached nor on their way; returns those started."""
        started: set[str] = set()
        for key in keys:
            if self.cache.get(key) is None and key not in self._inflight:
                task = self._inflight[key] = asyncio.ensure_future(self._fetch_whole(key))
                task.add_done_callback(functools.partial(_report_failed_prefetch, key))
                started.add(key)
        return started

    async def _fetch_whole(self, key: str) -> bytes:
        try:
            data = await self.store.get(key, self.hedge)
            self.cache.put(key, data)
            return data
        finally:
            self._inflight.pop(key, None)

    def read_cost(self, entry: Any) -> int:
        """Bytes serving this entry would read from the object store: none for an inline entry or
        an object cached or on its way in a prefetch."""
        key = getattr(entry, "key", None)
        return 0 if key is None or key in self._inflight or key in self.cache else entry.size

    async def batches(self, entries: list[Any]) -> list[bytes]:
        """The served batch of every pointer entry, in order."""
        result = (await self.batches_of_partitions([entries]))[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def batches_of_partitions(
        self, groups: list[list[Any]], at_tail: Sequence[bool] = ()
    ) -> list[list[bytes] | Exception]:
        """The served batches of several partitions' pointer entries (a group each), read together.

        Ranges of one WAL object are read by one coalesced GET whichever partition they belong to:
        every object holds batches of many partitions, so a consumer reading many partitions far
        behind the tail would otherwise GET each object once per partition. A group gets the
        exception of an object it points into that could not be read; other groups are served.
        ``at_tail[i]``: group i reads up to its partition's end; its objects that are neither
        cached nor on their way are fetched whole in the tail lane (module docstring)."""
        flat = [entry for group in groups for entry in group]
        out: list[bytes | None] = [None] * len(flat)
        missing: dict[str, list[int]] = {}
        tail_keys: set[str] = set()
        start = 0
        for g, group in enumerate(groups):
            tail = g < len(at_tail) and at_tail[g]
            for i, entry in enumerate(group, start):
                data = self.cache.get(entry.key)
                if data is not None:
                    child(DISKLESS_CACHE, "hit").inc()
                    self.cache.hits += 1
                    out[i] = bytes(entry.serve(memoryview(data)[entry.offset : entry.offset + entry.size]))
                else:
                    missing.setdefault(entry.key, []).append(i)
                    if tail:
                        tail_keys.add(entry.key)
            start += len(group)
        # Each missing object's prefetch is taken now, in this step: one that finishes before the
        # loads below start has left the cache check behind and would otherwise not be found.
        started = self.prefetch(tail_keys)
        pending = {key: self._inflight.get(key) for key in missing}
        failed: dict[str, Exception] = {}

        async def load(key: str, indexes: list[int]) -> None:
            try:
                await self._load_ranges(key, indexes, flat, out, pending[key], key in started)
            except Exception as exc:
                failed[key] = exc

        if missing:
            await asyncio.gather(*(load(key, indexes) for key, indexes in missing.items()))
        results: list[list[bytes] | Exception] = []
        start = 0
        for group in groups:
            end = start + len(group)
            error = next((failed[entry.key] for entry in group if entry.key in failed), None) if failed else None
            results.append(error if error is not None else [b for b in out[start:end] if b is not None])
            start = end
        return results

    async def _load_ranges(
        self,
        key: str,
        indexes: list[int],
        entries: list[Any],
        out: list[bytes | None],
        pending: asyncio.Future[bytes] | None,
        started_here: bool = False,
    ) -> None:
        """Serve ``indexes`` of ``entries`` from one object: from ``pending`` (a whole-object GET
        under way when the read looked; ``started_here`` if this read started it: a miss), else
        by ranged GETs in the miss lane."""
        if pending is not None:
            data = await asyncio.shield(pending)
            if started_here:
                child(DISKLESS_CACHE, "miss").inc(len(indexes))
                self.cache.misses += len(indexes)
            else:  # waiting for a prefetch costs no request
                child(DISKLESS_CACHE, "prefetching").inc(len(indexes))
                self.cache.hits += len(indexes)
            for i in indexes:
                entry = entries[i]
                out[i] = bytes(entry.serve(memoryview(data)[entry.offset : entry.offset + entry.size]))
            return
        child(DISKLESS_CACHE, "miss").inc(len(indexes))
        self.cache.misses += len(indexes)
        ranges = [(entries[i].offset, entries[i].offset + entries[i].size) for i in indexes]
        chunks = await self.miss_store.get_ranges(key, ranges)
        for i, chunk in zip(indexes, chunks, strict=True):
            out[i] = bytes(entries[i].serve(chunk))

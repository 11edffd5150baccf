"""A fetch's partitions read each WAL object once (fetch/wal_reader.py batches_of_partitions)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from diskless.fetch.wal_reader import WalCache, WalReader
from diskless.storage.object_store import NoSuchKey


@dataclass(frozen=True)
class Entry:
    """What the reader uses of a pointer entry: where its batch is, and how to serve those bytes."""

    key: str
    offset: int
    size: int

    def serve(self, data: bytes | memoryview) -> bytes:
        return bytes(data)


class CountingStore:
    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gets: list[str] = []

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.gets.append(key)
        if key not in self.objects:
            raise NoSuchKey(key)
        return [self.objects[key][start:end] for start, end in ranges]


OBJECTS = {"wal/a": bytes(range(100)), "wal/b": bytes(range(100, 200))}


def test_partitions_pointing_into_one_object_share_its_get() -> None:
    store = CountingStore(OBJECTS)
    reader = WalReader(store, WalCache(0))  # type: ignore[arg-type]
    p0 = [Entry("wal/a", 0, 10), Entry("wal/b", 0, 5)]
    p1 = [Entry("wal/a", 10, 10), Entry("wal/b", 5, 5)]
    p2 = [Entry("wal/a", 50, 1)]
    served = asyncio.run(reader.batches_of_partitions([p0, p1, p2]))
    assert served == [
        [OBJECTS["wal/a"][0:10], OBJECTS["wal/b"][0:5]],
        [OBJECTS["wal/a"][10:20], OBJECTS["wal/b"][5:10]],
        [OBJECTS["wal/a"][50:51]],
    ]
    assert sorted(store.gets) == ["wal/a", "wal/b"]  # one GET per object, not one per partition


def test_an_unreadable_object_fails_only_the_partitions_pointing_into_it() -> None:
    store = CountingStore({"wal/a": OBJECTS["wal/a"]})
    reader = WalReader(store, WalCache(0))  # type: ignore[arg-type]
    served = asyncio.run(reader.batches_of_partitions([[Entry("wal/a", 0, 3)], [Entry("wal/gone", 0, 3)], []]))
    assert served[0] == [OBJECTS["wal/a"][0:3]]
    assert isinstance(served[1], NoSuchKey)
    assert served[2] == []


class PrefetchingStore(CountingStore):
    async def get(self, key: str, hedge: object = None) -> bytes:
        self.gets.append(key)
        return self.objects[key]


def test_cache_misses_use_their_own_lane_and_prefetches_the_tails() -> None:
    tail, misses = PrefetchingStore(OBJECTS), CountingStore(OBJECTS)
    reader = WalReader(tail, WalCache(1 << 20), misses)  # type: ignore[arg-type]

    async def scenario() -> None:
        reader.prefetch({"wal/b"})
        await reader.batches([Entry("wal/a", 0, 4)])  # far behind the tail: not cached, not prefetched
        await reader.batches([Entry("wal/b", 0, 4)])  # the prefetched object, from the cache

    asyncio.run(scenario())
    assert (tail.gets, misses.gets) == (["wal/b"], ["wal/a"])


def test_a_failed_prefetch_is_reported_and_its_object_read_as_a_miss() -> None:
    import structlog

    class BrokenStore(CountingStore):
        async def get(self, key: str, hedge: object = None) -> bytes:
            raise OSError("store unreachable")

    misses = CountingStore(OBJECTS)
    reader = WalReader(BrokenStore(OBJECTS), WalCache(1 << 20), misses)  # type: ignore[arg-type]

    async def scenario() -> None:
        reader.prefetch({"wal/b"})
        await asyncio.wait([reader._inflight["wal/b"]])  # the prefetch runs and fails
        await reader.batches([Entry("wal/b", 0, 4)])

    with structlog.testing.capture_logs() as logs:
        asyncio.run(scenario())
    assert misses.gets == ["wal/b"]
    failed = [e for e in logs if e["event"].startswith("WAL object prefetch failed")]
    assert failed and failed[0]["key"] == "wal/b" and "store unreachable" in failed[0]["error"]

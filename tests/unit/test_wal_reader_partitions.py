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


class HeldStore(CountingStore):
    """A tail lane whose whole-object GETs finish when the test says (``release``), and a miss lane
    whose ranged GETs never do (a lane queued up behind a lagging reader's requests)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        super().__init__(objects)
        self.release: asyncio.Future[None] | None = None

    async def get(self, key: str, hedge: object = None) -> bytes:
        self.gets.append(key)
        if self.release is not None:
            await self.release
        return self.objects[key]

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.gets.append(key)
        await asyncio.get_running_loop().create_future()  # never answered
        raise AssertionError("unreachable")


def test_a_prefetch_finishing_before_the_read_loads_is_still_what_the_read_waits_for() -> None:
    """The read looks in the cache (the object is on its way), then its loads start a loop step
    later; the prefetch finished in between. The read used to find neither the cache entry (looked
    already) nor the prefetch (gone) and sent a ranged GET to the miss lane: ~2 a second per
    broker in ``diskless bench``, each waiting 0.7-2.3 s there behind a lagging reader."""
    tail, misses = HeldStore(OBJECTS), HeldStore(OBJECTS)
    reader = WalReader(tail, WalCache(1 << 20), misses)  # type: ignore[arg-type]

    async def scenario() -> list[list[bytes] | Exception]:
        tail.release = asyncio.get_running_loop().create_future()
        reader.prefetch({"wal/a"})
        await asyncio.sleep(0)  # the prefetch's GET is under way
        tail.release.set_result(None)  # it resumes in the next step, before the read's loads
        # Awaited directly: the read's cache check runs in this step, before the prefetch resumes.
        return await reader.batches_of_partitions([[Entry("wal/a", 0, 4)]])

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=10)) == [[OBJECTS["wal/a"][0:4]]]
    assert (tail.gets, misses.gets) == (["wal/a"], [])


def test_a_read_at_the_tail_missing_the_cache_fetches_the_whole_object_in_the_tail_lane() -> None:
    """Neither cached nor on its way (its prefetch failed, or its replica was catching up): a read
    reaching its partition's end must not queue in the miss lane behind readers far behind."""
    tail, misses = HeldStore(OBJECTS), HeldStore(OBJECTS)
    reader = WalReader(tail, WalCache(1 << 20), misses)  # type: ignore[arg-type]

    async def scenario() -> list[list[bytes] | Exception]:
        behind = asyncio.ensure_future(reader.batches_of_partitions([[Entry("wal/b", 0, 4)]], [False]))
        at_end = reader.batches_of_partitions([[Entry("wal/a", 0, 4)], [Entry("wal/a", 4, 4)]], [True, False])
        served = await asyncio.wait_for(at_end, timeout=10)
        assert not behind.done()  # still queued in the miss lane
        behind.cancel()
        return served

    served = asyncio.run(scenario())
    assert served == [[OBJECTS["wal/a"][0:4]], [OBJECTS["wal/a"][4:8]]]  # one whole GET for both groups
    assert (tail.gets, misses.gets) == (["wal/a"], ["wal/b"])
    assert reader.cache.get("wal/a") == OBJECTS["wal/a"]  # kept for the tail's other readers


def test_two_tail_reads_of_one_uncached_object_share_its_whole_get() -> None:
    """Two consumers' Fetches (two calls, concurrent) at the end of partitions in one object that
    is neither cached nor prefetched: the first read starts the whole GET, the second waits for it."""
    tail, misses = HeldStore(OBJECTS), HeldStore(OBJECTS)
    reader = WalReader(tail, WalCache(1 << 20), misses)  # type: ignore[arg-type]

    async def scenario() -> list[list[list[bytes] | Exception]]:
        tail.release = asyncio.get_running_loop().create_future()
        first = asyncio.ensure_future(reader.batches_of_partitions([[Entry("wal/a", 0, 4)]], [True]))
        second = asyncio.ensure_future(reader.batches_of_partitions([[Entry("wal/a", 4, 4)]], [True]))
        await asyncio.sleep(0)  # both have looked: one GET under way
        tail.release.set_result(None)
        return list(await asyncio.gather(first, second))

    served = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert served == [[[OBJECTS["wal/a"][0:4]]], [[OBJECTS["wal/a"][4:8]]]]
    assert (tail.gets, misses.gets) == (["wal/a"], [])

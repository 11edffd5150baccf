"""How a consumer Fetch is answered under diskless.fetch.lagging.max.bytes.per.second
(``FetchApis._within_lagging_quota``): in-memory cache and quota, no sockets."""

from __future__ import annotations

import asyncio
import functools
import time
from types import SimpleNamespace
from typing import Any

from batches import make_batch

from diskless.broker.fetch_apis import FetchApis
from diskless.fetch.lagging_reads import TAIL_HORIZON_MS
from diskless.fetch.read_quota import UNLIMITED, ReadQuota
from diskless.fetch.wal_reader import WalCache, WalReader
from diskless.storage import pointer
from diskless.storage.object_store import coalesce_ranges
from diskless.storage.wal_format import wal_object_key

HOT, COLD = "wal/hot", "wal/cold"
NOW_MS = 1_764_306_000_000  # the brokers' wall clock in these tests


def pointers(key: str, batches: int = 1) -> bytes:
    """Pointer entries of ``batches`` batches of 4 records each (offsets 0-3, 4-7, ...)."""
    out = b""
    for i in range(batches):
        batch = make_batch([b"v" * 500] * 4, base_offset=4 * i)
        out += pointer.encode_pointer_entry(batch[:61], key, len(batch) * i, len(batch))
    return out


def answer(end: int = 100) -> dict[str, Any]:
    """A partition's answer being built; ``end`` its last stable offset (the read stops at 4)."""
    return {"records": None, "aborted_transactions": None, "last_stable_offset": end}


def handler(quota: ReadQuota, clock: list[float]) -> Any:
    cache = WalCache(1 << 20)
    cache.put(HOT, b"x" * 4096)  # only HOT is cached: COLD would be read from object storage
    broker = SimpleNamespace(
        now_ms=lambda: NOW_MS,
        lagging_read_quota=quota,
        wal_reader=WalReader(store=None, cache=cache),  # type: ignore[arg-type]
        monotonic_ms=lambda: clock[0],
    )
    return SimpleNamespace(broker=broker)


def parts(remote: list[tuple[dict[str, Any], bytes]]) -> list[Any]:
    """What ``_serve_pointers`` hands the quota: (answer, its pointer entries parsed)."""
    return [(entry, pointer.iter_entries(raw)) for entry, raw in remote]


def serve(fake: Any, remote: list[tuple[dict[str, Any], bytes]], deadline_s: float) -> list[Any]:
    """The answers of the partitions served now."""
    total = sum(pointer.served_size(raw) for _, raw in remote)
    chosen = asyncio.run(FetchApis._within_lagging_quota(fake, parts(remote), total, time.monotonic() + deadline_s))
    return [entry for entry, _ in chosen]


def test_unlimited_serves_everything() -> None:
    fake = handler(ReadQuota(UNLIMITED, 0), [0.0])
    remote = [(answer(), pointers(COLD))]
    assert serve(fake, remote, 0.0) == [remote[0][0]]


def test_over_the_quota_the_tail_is_answered_at_once_and_the_lagging_partition_later() -> None:
    clock = [0.0]
    quota = ReadQuota(1000, 0)
    quota.record(5000, 0)  # in debt for 4 s
    fake = handler(quota, clock)
    hot, cold = answer(), answer()
    started = time.monotonic()
    served = serve(fake, [(hot, pointers(HOT)), (cold, pointers(COLD))], deadline_s=5.0)
    assert time.monotonic() - started < 1.0  # no wait: the response has the tail's batches
    assert served == [hot]
    assert cold["records"] == b""  # answered empty, no error: asked again from the same offset


def test_a_response_of_lagging_partitions_only_waits_within_its_max_wait_and_charges_the_quota() -> None:
    clock = [0.0]
    quota = ReadQuota(1000, 0)
    quota.record(600, 0)  # the bucket holds 500 B: 100 ms of debt
    fake = handler(quota, clock)
    cold = answer()
    remote = [(cold, pointers(COLD))]

    async def advance() -> list[Any]:
        task = asyncio.ensure_future(FetchApis._within_lagging_quota(fake, parts(remote), 2000, time.monotonic() + 5))
        await asyncio.sleep(0.01)
        assert not task.done()  # waiting for the quota
        clock[0] = 150.0  # the debt is paid back
        return await task

    assert [entry for entry, _ in asyncio.run(advance())] == [cold]
    size = pointer.iter_entries(remote[0][1])[0].size
    assert round(quota.wait_ms(150.0)) == size - 50  # charged when admitted: 50 B were left, 1 B/ms


def test_past_its_max_wait_a_lagging_only_response_is_answered_empty() -> None:
    quota = ReadQuota(1000, 0)
    quota.record(10_000, 0)
    fake = handler(quota, [0.0])
    cold = {**answer(), "aborted_transactions": []}
    assert serve(fake, [(cold, pointers(COLD))], deadline_s=0.05) == []
    assert cold["records"] == b""


def test_a_tail_read_missing_the_cache_is_never_held_by_the_quota() -> None:
    """A tail consumer's read of an object whose prefetch has not started misses the cache too;
    with a lagging reader keeping the quota in debt it was held for its whole max wait (+500 ms
    on the tail consumers' e2e p99 beside the reader, in ``diskless bench``)."""
    quota = ReadQuota(1000, 0)
    quota.record(10_000, 0)
    fake = handler(quota, [0.0])
    tail = answer(end=4)  # the read reaches the partition's end
    remote = [(tail, pointers(COLD))]
    started = time.monotonic()
    assert serve(fake, remote, deadline_s=5.0) == [tail]
    assert time.monotonic() - started < 1.0


def wal_objects(objects: int, partitions: int, batches: int) -> list[bytes]:
    """Each partition's pointer entries into ``objects`` WAL objects laid out as a flush writes
    them: one object per flush, holding every partition's ``batches`` batches, partition after
    partition; keys sort by creation time."""
    batch = make_batch([b"v" * 500] * 4)
    size = len(batch)
    out = [b""] * partitions
    for o in range(objects):
        key = f"wal/2026/11/28/05/{1_764_306_000_000 + o * 100}-az-1-1-x.wal"
        for p in range(partitions):
            for b in range(batches):
                base = 4 * (o * batches + b)
                header = make_batch([b"v" * 500] * 4, base_offset=base)[:61]
                out[p] += pointer.encode_pointer_entry(header, key, size * (p * batches + b), size)
    return out


def read_until_caught_up(fake: Any, streams: list[bytes]) -> tuple[int, int, int]:
    """A lagging reader's successive Fetches, each served within the quota's allowance (refilled
    in between): (bytes served, bytes its ranged GETs would read, GETs)."""
    left = [pointer.iter_entries(raw) for raw in streams]
    served = fetched = gets = 0
    while any(left):
        fake.broker.lagging_read_quota = ReadQuota(20_000, 0)  # a fresh allowance of 10,000 B
        answers = [answer(end=10**6) for _ in left]
        chosen = asyncio.run(
            FetchApis._within_lagging_quota(fake, list(zip(answers, left, strict=True)), 0, time.monotonic() + 5)
        )
        kept = [entries for _, entries in chosen]
        assert any(kept), "every read moves on"
        by_object: dict[str, list[tuple[int, int]]] = {}
        for entries in kept:
            for e in entries:
                by_object.setdefault(e.key, []).append((e.offset, e.offset + e.size))
                served += e.size
        for ranges in by_object.values():
            plan = coalesce_ranges(ranges, max_gap=256 * 1024, max_size=8 * 1024 * 1024)
            gets += len(plan)
            fetched += sum(end - start for start, end, _ in plan)
        left = [entries[len(k) :] for entries, k in zip(left, kept, strict=True)]
    return served, fetched, gets


def test_within_the_quota_a_lagging_read_takes_one_gapless_span_per_object() -> None:
    """A full bucket of a second's reads once went to one response: 16 MiB, hundreds of GETs at
    once, and the tail's consumers waited up to 2.7 s (``diskless bench``). Then the allowance was
    split evenly over the partitions: every read took a slice of each partition's run in an object,
    the coalesced GET read the gaps between the slices too, and the next read fetched the same span
    again (the bench's lagging phase: twice the bytes, twice the GETs). Now a read takes the
    allowance in the order the batches lie in the objects."""
    fake = handler(ReadQuota(20_000, 0), [0.0])
    streams = wal_objects(objects=4, partitions=6, batches=2)  # 12 batches (~25 KB) per object
    served, fetched, gets = read_until_caught_up(fake, streams)
    assert fetched == served  # no gap read, no byte read twice
    object_bytes = served // 4
    assert gets <= 4 * (object_bytes // 10_000 + 2)  # one span per read and object


def test_a_lagging_read_stays_within_its_allowance_but_for_one_batch() -> None:
    quota = ReadQuota(20_000, 0)  # a burst of 10,000 B
    fake = handler(quota, [0.0])
    remote = [(answer(end=1000), raw) for raw in wal_objects(objects=2, partitions=2, batches=5)]
    batch_size = pointer.iter_entries(remote[0][1])[0].size  # ~2 KiB
    chosen = asyncio.run(FetchApis._within_lagging_quota(fake, parts(remote), 0, time.monotonic() + 5))
    kept = [entries for _, entries in chosen]
    taken = sum(len(entries) for entries in kept)
    assert taken == -(-10_000 // batch_size)  # up to the allowance, the last batch whole
    assert [len(entries) for entries in kept] == [5, taken - 5]  # partition 0's run first: it lies first
    assert quota.allowance(0) == 0 and round(quota.wait_ms(0)) == round((taken * batch_size - 10_000) / 20)


def test_a_partition_always_gets_at_least_one_batch() -> None:
    quota = ReadQuota(1000, 0)  # allowance 500 B, less than a batch
    fake = handler(quota, [0.0])
    remote = [(answer(end=1000), pointers(COLD, batches=3))]
    chosen = asyncio.run(FetchApis._within_lagging_quota(fake, parts(remote), 0, time.monotonic() + 5))
    assert [len(entries) for _, entries in chosen] == [1]


class Lane:
    """One lane to object storage, recording what was asked of it."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.whole: list[str] = []
        self.ranged: list[str] = []

    async def get(self, key: str, hedge: object = None) -> bytes:
        self.whole.append(key)
        return self.objects[key]

    async def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        self.ranged.append(key)
        return [self.objects[key][start:end] for start, end in ranges]


def test_a_tail_read_missing_the_cache_takes_the_tail_lane_and_a_lagging_one_the_miss_lane() -> None:
    """``_serve_pointers`` tells the reader which partitions read up to their end: those objects
    are fetched whole beside the prefetches, never queued behind a lagging reader's ranged GETs."""
    batch = make_batch([b"v" * 500] * 4)
    objects = {"wal/tail": batch, "wal/old": batch}
    tail_lane, miss_lane = Lane(objects), Lane(objects)
    reader = WalReader(tail_lane, WalCache(1 << 20), miss_lane)  # type: ignore[arg-type]
    broker = SimpleNamespace(lagging_read_quota=ReadQuota(UNLIMITED, 0), wal_reader=reader, now_ms=lambda: NOW_MS)
    fake = SimpleNamespace(broker=broker)
    fake._within_lagging_quota = functools.partial(FetchApis._within_lagging_quota, fake)
    at_end, behind = answer(end=4), answer(end=100)
    remote = [(at_end, pointers("wal/tail")), (behind, pointers("wal/old"))]
    asyncio.run(FetchApis._serve_pointers(fake, remote, 0, time.monotonic() + 5))  # type: ignore[arg-type]
    assert at_end["records"] == behind["records"] == batch
    assert (tail_lane.whole, tail_lane.ranged) == (["wal/tail"], [])
    assert (miss_lane.whole, miss_lane.ranged) == ([], ["wal/old"])


def test_a_read_to_the_end_from_an_old_object_is_a_lagging_read() -> None:
    """A reader far behind reads a small partition from its start to its end in one Fetch: at
    1,000 partitions every read of a lagging reader did. Taken for the tail's, those reads escaped
    the quota and fetched old objects whole into the tail's share of the cache (``diskless
    bench``: 436 MB of GETs for ~170 MB served). Only a read starting in a young object is the
    tail's."""
    batch = make_batch([b"v" * 500] * 4)
    old = wal_object_key(NOW_MS - TAIL_HORIZON_MS - 1, "az-1", 1, "0" * 32)
    young = wal_object_key(NOW_MS - 2_000, "az-1", 1, "1" * 32)
    objects = {old: batch, young: batch}
    tail_lane, miss_lane = Lane(objects), Lane(objects)
    reader = WalReader(tail_lane, WalCache(1 << 20), miss_lane)  # type: ignore[arg-type]
    quota = ReadQuota(1000, 0)
    quota.record(10_000, 0)  # deep in debt: a lagging read is not served now
    broker = SimpleNamespace(lagging_read_quota=quota, wal_reader=reader, now_ms=lambda: NOW_MS, monotonic_ms=lambda: 0)
    fake = SimpleNamespace(broker=broker)
    fake._within_lagging_quota = functools.partial(FetchApis._within_lagging_quota, fake)
    tail, behind = answer(end=4), answer(end=4)  # both read their partition to its end
    remote = [(tail, pointers(young)), (behind, pointers(old))]
    asyncio.run(FetchApis._serve_pointers(fake, remote, 2 * len(batch), time.monotonic() + 5))  # type: ignore[arg-type]
    assert tail["records"] == batch and behind["records"] == b""  # the old one waits for the quota
    assert (tail_lane.whole, miss_lane.whole, miss_lane.ranged) == ([young], [], [])

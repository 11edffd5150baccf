"""The WAL cache's tail/lagging isolation (issue 10: a consumer reading a topic from the beginning
must not evict what tail consumers read) and its byte bounds."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_tier_reader import FakeStore, build, read

from diskless.fetch.tier_reader import TierReader
from diskless.fetch.wal_reader import WalCache
from diskless.protocol import records
from diskless.storage.segment_object import iter_batches

MAX = 64 * 1024


def test_lagging_tiered_reads_do_not_evict_tail_objects() -> None:
    # Tail objects (uploaded or prefetched WAL objects) fill the tail's share; then a lagging
    # consumer reads a tiered segment several times the whole cache's size from its beginning.
    cache = WalCache(MAX)
    tail = {f"wal/{i}": bytes([i]) * 4096 for i in range(8)}
    for key, data in tail.items():
        cache.put(key, data)
    store = FakeStore()
    segment, served = build(store, batches=400, size=500)
    assert len(b"".join(served)) > 4 * MAX
    reader = TierReader(store, cache, block_bytes=8 * 1024)  # type: ignore[arg-type]
    # Read the whole segment along, fetch by fetch, as a consumer does.
    offset, got = 100, []
    while data := read(reader, segment, offset, 4096, 10_000):
        for batch in iter_batches(data):
            got.append(bytes(batch))
            offset = records.parse_header(batch).last_offset + 1
    assert got == served
    assert {key for key in tail if cache.get(key) is not None} == set(tail)
    assert cache.size <= MAX


# An operation: (kind, key number, size). Tail puts are uploads and prefetches at the log end;
# lagging puts are blocks read far behind it; gets are any reader's lookups.
OPS = st.lists(
    st.tuples(st.sampled_from(["tail", "lagging", "get"]), st.integers(0, 30), st.integers(1, MAX // 3)),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(0, MAX))
@example(ops=[("tail", 0, 1), ("tail", 0, 2)], lagging_max=MAX - 1)  # one key drawn with two sizes
def test_tail_content_depends_on_tail_puts_only(ops: list[tuple[str, int, int]], lagging_max: int) -> None:
    everything = WalCache(MAX, lagging_max)
    tail_only = WalCache(MAX, lagging_max)
    sizes: dict[str, int] = {}
    for kind, number, drawn in ops:
        key = f"{kind}/{number}" if kind != "get" else f"{'tail' if number % 2 else 'lagging'}/{number // 2}"
        size = sizes.setdefault(key, drawn)  # an object's key names its bytes: never two sizes for one key
        if kind == "tail":
            everything.put(key, b"t" * size)
            tail_only.put(key, b"t" * size)
            # The newest tail object is always kept when it fits the tail's share.
            assert (everything.get(key) is not None) == (size <= MAX - everything.lagging_max_bytes)
        elif kind == "lagging":
            everything.put(key, b"l" * size, lagging=True)
        else:
            everything.get(key)
        assert everything.tail_keys() == tail_only.tail_keys()
        assert everything.size <= MAX
        assert everything.lagging_size <= everything.lagging_max_bytes
        assert everything.size == sum(
            len(everything.get(k) or b"") for k in [*everything.tail_keys(), *everything.lagging_keys()]
        )


def test_lagging_share_defaults_to_a_quarter_and_is_clamped() -> None:
    assert WalCache(MAX).lagging_max_bytes == MAX // 4
    assert WalCache(MAX, 2 * MAX).lagging_max_bytes == MAX
    assert WalCache(MAX, 0).lagging_max_bytes == 0


def test_lagging_blocks_are_served_from_their_share() -> None:
    cache = WalCache(MAX)
    store = FakeStore()
    segment, served = build(store, batches=8, size=300)  # fits the lagging share (MAX // 4)
    reader = TierReader(store, cache, block_bytes=4096)  # type: ignore[arg-type]
    assert read(reader, segment, 100, 1 << 20, 10_000) == b"".join(served)
    gets = reader.gets
    assert read(reader, segment, 100, 1 << 20, 10_000) == b"".join(served)
    assert reader.gets == gets  # the second reader hits the blocks the first one cached
    assert cache.lagging_size > 0 and not cache.tail_keys()

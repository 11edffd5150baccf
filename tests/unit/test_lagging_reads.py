"""The lagging-read decisions without a broker (``fetch/lagging_reads.py``): which reads are cold,
which are the tail's, and how an allowance cuts them."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from batches import make_batch

from diskless.fetch import lagging_reads
from diskless.fetch.lagging_reads import TAIL_HORIZON_MS, TieredRead, admit, at_tail, cold_reads
from diskless.storage import pointer
from diskless.storage.wal_format import wal_object_key

NOW_MS = 1_764_306_000_000
YOUNG = wal_object_key(NOW_MS - 1_000, "az-1", 1, "1" * 32)
OLD = wal_object_key(NOW_MS - TAIL_HORIZON_MS - 10_000, "az-1", 1, "0" * 32)
LATER_OLD = wal_object_key(NOW_MS - TAIL_HORIZON_MS - 5_000, "az-1", 1, "3" * 32)  # after OLD, still old
BATCH = make_batch([b"v" * 500] * 4)


def entries(key: str, batches: int = 1, first_offset: int = 0) -> list[Any]:
    """Pointer entries of ``batches`` batches of 4 records from ``first_offset``, laid out in ``key``."""
    raw = b"".join(
        pointer.encode_pointer_entry(
            make_batch([b"v" * 500] * 4, base_offset=first_offset + 4 * i)[:61], key, len(BATCH) * i, len(BATCH)
        )
        for i in range(batches)
    )
    return pointer.iter_entries(raw)


def answer(end: int, aborted: list[Any] | None = None) -> dict[str, Any]:
    return {"records": None, "aborted_transactions": aborted, "last_stable_offset": end}


def tiered(size: int, max_bytes: int) -> TieredRead:
    return TieredRead(msgpack.packb({"max_bytes": max_bytes, "segment": {"size": size}}))


def test_a_read_is_the_tails_when_it_reaches_the_end_from_a_young_object() -> None:
    assert at_tail(answer(end=4), entries(YOUNG), NOW_MS)
    assert not at_tail(answer(end=4), entries(OLD), NOW_MS)  # old: a reader far behind, reading a small partition
    edge = wal_object_key(NOW_MS - TAIL_HORIZON_MS, "az-1", 1, "4" * 32)
    assert at_tail(answer(end=4), entries(edge), NOW_MS)  # exactly the horizon old: still the tail's
    assert not at_tail(answer(end=100), entries(YOUNG), NOW_MS)  # short of the end
    assert at_tail(answer(end=4), entries("some/other/key"), NOW_MS)  # no age to judge by
    assert not at_tail(answer(end=0), [], NOW_MS)


def test_cold_reads_are_tiered_ones_and_misses_short_of_the_tail() -> None:
    cached = {YOUNG}

    def cost(entry: Any) -> int:
        return 0 if entry.key in cached else entry.size

    parts: list[Any] = [
        (answer(end=4), entries(YOUNG)),  # cached, at the end: not cold
        (answer(end=4), entries(wal_object_key(NOW_MS - 500, "az-1", 2, "2" * 32))),  # a miss at the tail: never held
        (answer(end=100), entries(OLD, 2)),  # a miss short of the end: cold
        (answer(end=100), entries(YOUNG, 1)),  # short of the end but cached: nothing to read
        (answer(end=100), tiered(size=5_000, max_bytes=3_000)),  # tiered: cold, served up to max_bytes
    ]
    cold = cold_reads(parts, cost, NOW_MS)
    assert cold.indices == [2, 4]
    assert cold.served_bytes == 2 * len(BATCH) + 3_000


def test_an_allowance_charges_tiered_reads_whole_and_cuts_pointer_reads_to_prefixes() -> None:
    def cost(entry: Any) -> int:
        return entry.size

    emptied = answer(end=100, aborted=[{"producer_id": 1, "first_offset": 0}])
    parts: list[Any] = [
        (answer(end=100), tiered(size=1_000, max_bytes=10_000)),
        (answer(end=100), entries(OLD, 3)),
        (emptied, entries(LATER_OLD, 2, first_offset=12)),
    ]
    # The tiered read takes 1,000; what is left pays for the first two of partition 1's batches, which
    # lie first; partition 2's lie after them and get nothing this time.
    charged = admit(parts, [0, 1, 2], 1_000 + 2 * len(BATCH), cost)
    assert charged == 1_000 + 2 * len(BATCH)
    assert [len(parts[1][1]), len(parts[2][1])] == [2, 0]
    assert emptied["aborted_transactions"] == []  # no batches served, no aborted transactions either


def test_at_least_one_entry_is_admitted_even_from_an_empty_allowance() -> None:
    parts: list[Any] = [(answer(end=100), entries(OLD, 3))]
    assert admit(parts, [0], 0, lambda e: e.size) == len(BATCH)
    assert len(parts[0][1]) == 1


def test_a_tiered_reads_size_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    read = tiered(size=70, max_bytes=0)
    assert read.size == 1  # at least one byte: a tiered read always serves something
    monkeypatch.setattr(lagging_reads.msgpack, "unpackb", lambda _data: pytest.fail("decoded again"))
    assert read.size == 1 and TieredRead(b"").size == 0

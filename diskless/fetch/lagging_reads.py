"""Which partitions of a consumer's Fetch are lagging reads, and how much of each the quota lets
through now. Sans-IO: answers, parsed pointer entries and times in, decisions out.

A Fetch served from object storage reads, per partition, either pointer entries (batches in WAL
objects) or a tiered segment range (``TieredRead``). The lagging-read quota (``read_quota``)
holds back only *cold* reads: tiered ranges, and pointer reads that would miss the WAL cache short
of the tail. The broker's edge (``broker/fetch_apis.py``) asks ``cold_reads`` which those are,
waits for the quota or defers them, and cuts the admitted ones with ``admit``.

The tail is never held. A read is the tail's when it reaches its partition's end *and* starts in
a young WAL object (``at_tail``); such a read is served even when its object is not cached yet
(a prefetch not started). Reaching the end alone is not enough: a reader far behind reads a small
partition from its start to its end in one Fetch. At 1,000 partitions with ~300 records each, a
lagging reader's every read did; taken for the tail's, those reads escaped the quota and fetched
old WAL objects whole in the tail lane, into the tail's share of the cache (``diskless bench``:
436 MB of GETs for ~170 MB served).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from diskless.storage import pointer
from diskless.storage.wal_format import parse_wal_object_key

from .read_quota import prefixes_in_object_order

# How old the first object of a read reaching its partition's end may be for the read to count
# as the tail's. Tail consumers are seconds behind at most, even on a saturated machine (bench:
# e2e p99 under 3 s at 1,000 partitions beside a lagging reader).
TAIL_HORIZON_MS = 30_000


class TieredRead(bytes):
    """A TIERED log read's descriptor (msgpack), waiting beside pointer entries to be served."""

    @functools.cached_property
    def size(self) -> int:
        """What serving it returns, at most (fetch size accounting); decoded once."""
        if not self:
            return 0
        d = msgpack.unpackb(self)
        return max(1, min(int(d["max_bytes"]), int(d["segment"]["size"])))


# A consumer's partition served from object storage: its answer (a Fetch response partition), and
# what the log read returned: its pointer entries parsed, or a tiered read.
RemotePart = tuple[dict[str, Any], Any]


def batch_bytes(entry: pointer.PointerEntry | pointer.InlineEntry) -> int:
    """What an entry's batch takes in a response."""
    return entry.size if isinstance(entry, pointer.PointerEntry) else len(entry.batch)


def at_tail(answer: dict[str, Any], entries: Sequence[Any], now_ms: int) -> bool:
    """Whether a partition's read is the tail's: it reaches the partition's end (the answer's last
    stable offset), starting in a WAL object written within ``TAIL_HORIZON_MS``."""
    if not entries or entries[-1].last_offset + 1 < answer["last_stable_offset"]:
        return False
    first = next((e for e in entries if isinstance(e, pointer.PointerEntry)), None)
    if first is None:
        return True  # inline batches only: nothing to read from object storage
    created_ms = _created_ms(first.key)
    return created_ms is None or created_ms >= now_ms - TAIL_HORIZON_MS  # None: no age to judge by


@functools.lru_cache(maxsize=4096)
def _created_ms(key: str) -> int | None:
    """A WAL object's creation time from its key, None for any other key. Cached: the partitions of
    one read share a few objects, and a read is judged twice (quota, then lane)."""
    try:
        return parse_wal_object_key(key).created_ms
    except ValueError:
        return None


def _place(entry: pointer.PointerEntry) -> tuple[str, int]:
    """Where a pointed batch's bytes lie: WAL object keys sort by creation time (``wal_format``)."""
    return entry.key, entry.offset


@dataclass(frozen=True, slots=True)
class ColdReads:
    """The cold parts of a response, by index, and the bytes serving them adds to it."""

    indices: list[int]
    served_bytes: int


def cold_reads(parts: Sequence[RemotePart], read_cost: Callable[[Any], int], now_ms: int) -> ColdReads:
    """The parts the quota holds: tiered reads, and pointer reads that are not the tail's and would
    read something from object storage (``read_cost`` of an entry: its bytes to GET, 0 if cached or
    on its way)."""
    indices: list[int] = []
    served = 0
    for i, (answer, entries) in enumerate(parts):
        if isinstance(entries, TieredRead):
            served += entries.size
        elif at_tail(answer, entries, now_ms) or not any(read_cost(e) for e in entries):
            continue
        else:
            served += sum(batch_bytes(e) for e in entries)
        indices.append(i)
    return ColdReads(indices, served)


def admit(parts: list[RemotePart], cold: Sequence[int], allowance: int, read_cost: Callable[[Any], int]) -> int:
    """Cut the cold pointer reads of ``parts`` (in place) to what ``allowance`` bytes pay for, and
    return the bytes charged. Tiered reads are charged whole (read in blocks of their own); the
    pointer reads share what is left in the order their batches lie in the WAL objects, each to a
    prefix of its batches, at least one entry in all (``prefixes_in_object_order``): a read is one
    gapless span per object, and the partitions move on together. A part left with no batches
    loses its aborted-transaction list too."""
    tiered = [i for i in cold if isinstance(parts[i][1], TieredRead)]
    pointed = [i for i in cold if not isinstance(parts[i][1], TieredRead)]
    charged = sum(parts[i][1].size for i in tiered)
    counts = prefixes_in_object_order([parts[i][1] for i in pointed], max(0, allowance - charged), read_cost, _place)
    for i, n in zip(pointed, counts, strict=True):
        answer, entries = parts[i]
        kept = entries[:n]
        parts[i] = (answer, kept)
        charged += sum(read_cost(e) for e in kept)
        if not kept and answer.get("aborted_transactions"):
            answer["aborted_transactions"] = []
    return charged

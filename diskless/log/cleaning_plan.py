"""Which part of a compacted log the cleaner may rewrite, whether it is worth it now, and in which groups.

Sans-IO: it sees segment summaries and offsets, never files, and is given the time. The rules are
Kafka's LogCleanerManager / LogToClean / Cleaner.groupSegmentsBySize:

- Never clean past the first uncleanable offset: the last stable offset (an open transaction's
  records may still be aborted, and nothing above the high watermark is committed), the active
  segment's base (it is still being written), and the first segment holding a record younger than
  ``min.compaction.lag.ms``. Here the cleanable range is whole segments only: a segment is cleaned
  when all of it is below that bound (Kafka can stop its key map inside a segment; stopping at a
  segment boundary cleans a little later and never differently).
- The *dirty* part starts at the cleaner checkpoint (where the last pass's key map ended); the
  log is worth cleaning when dirty bytes / cleanable bytes >= ``min.cleanable.dirty.ratio``, or
  when its oldest dirty record is older than ``max.compaction.lag.ms`` (KIP-354).
- The rewrite goes in groups of consecutive segments whose total size fits one segment
  (``segment.bytes``), whose offsets fit a segment's 32-bit relative offsets and whose index
  entries fit ``segment.index.bytes``: small cleaned segments are merged as they shrink.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_INT32_MAX = 2**31 - 1
_OFFSET_INDEX_ENTRY = 8


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int
    next_offset: int  # one past its last batch's last offset (its base when empty)
    size: int
    max_timestamp: int  # -1 when it holds no batch
    first_batch_timestamp: int | None
    index_entries: int


@dataclass(frozen=True, slots=True)
class CleaningPlan:
    cleanable: int  # how many segments, from the first, may be rewritten
    first_dirty: int  # the key map starts here
    end: int  # the first offset not cleanable (the next_offset of the last cleanable segment)
    dirty_ratio: float
    overdue: bool  # max.compaction.lag.ms passed for its oldest dirty record
    groups: tuple[tuple[int, ...], ...]  # indexes into the segments, each group one cleaned segment


def uncleanable_bound(
    segments: Sequence[SegmentSummary], last_stable_offset: int, now_ms: int, min_compaction_lag_ms: int
) -> int:
    """The first offset the cleaner must leave alone (Kafka's firstUncleanableDirtyOffset)."""
    bound = min(last_stable_offset, segments[-1].base_offset)
    if min_compaction_lag_ms > 0:
        for segment in segments[:-1]:
            if segment.max_timestamp > now_ms - min_compaction_lag_ms:
                bound = min(bound, segment.base_offset)
                break
    return bound


def plan_cleaning(
    segments: Sequence[SegmentSummary],
    *,
    log_start_offset: int,
    checkpoint: int,
    last_stable_offset: int,
    now_ms: int,
    min_cleanable_dirty_ratio: float,
    min_compaction_lag_ms: int,
    max_compaction_lag_ms: int,
    segment_bytes: int,
    segment_index_bytes: int,
) -> CleaningPlan | None:
    """The pass to run now, or None when there is nothing dirty enough (or overdue) to clean.

    ``segments`` are the log's, oldest first, the active one last."""
    if len(segments) < 2:
        return None
    bound = uncleanable_bound(segments, last_stable_offset, now_ms, min_compaction_lag_ms)
    cleanable = 0
    while cleanable < len(segments) - 1 and segments[cleanable].next_offset <= bound:
        cleanable += 1
    if cleanable == 0:
        return None
    end = segments[cleanable - 1].next_offset
    first_dirty = max(checkpoint, log_start_offset, segments[0].base_offset)
    if first_dirty >= end:
        return None
    clean_bytes = dirty_bytes = 0
    first_dirty_segment: SegmentSummary | None = None
    for segment in segments[:cleanable]:
        if segment.next_offset <= first_dirty:
            clean_bytes += segment.size
        else:
            dirty_bytes += segment.size
            if first_dirty_segment is None:
                first_dirty_segment = segment
    if dirty_bytes == 0 or first_dirty_segment is None:
        return None
    ratio = dirty_bytes / (clean_bytes + dirty_bytes)
    oldest = first_dirty_segment.first_batch_timestamp
    overdue = oldest is not None and oldest >= 0 and now_ms - oldest > max_compaction_lag_ms
    if ratio < min_cleanable_dirty_ratio and not overdue:
        return None
    return CleaningPlan(
        cleanable=cleanable,
        first_dirty=first_dirty,
        end=end,
        dirty_ratio=ratio,
        overdue=overdue,
        groups=group_by_size(segments[:cleanable], segment_bytes, segment_index_bytes),
    )


def group_by_size(
    segments: Sequence[SegmentSummary], segment_bytes: int, segment_index_bytes: int
) -> tuple[tuple[int, ...], ...]:
    """Consecutive segments merged while the group fits one segment (Kafka's groupSegmentsBySize:
    sizes before cleaning, so a group never outgrows ``segment.bytes``)."""
    groups: list[tuple[int, ...]] = []
    i = 0
    while i < len(segments):
        group = [i]
        size = segments[i].size
        entries = segments[i].index_entries
        base = segments[i].base_offset
        j = i + 1
        while j < len(segments):
            candidate = segments[j]
            if (
                size + candidate.size > segment_bytes
                or (entries + candidate.index_entries) * _OFFSET_INDEX_ENTRY > segment_index_bytes
                or candidate.next_offset - 1 - base > _INT32_MAX
            ):
                break
            group.append(j)
            size += candidate.size
            entries += candidate.index_entries
            j += 1
        groups.append(tuple(group))
        i = j
    return tuple(groups)

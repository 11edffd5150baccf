"""Where tiers are in effect (``PartitionLog._tier_floor``) survives a crash and a replica's
adoption of its leader's tiers.

A tier entry takes effect once the high watermark passes it; the pointer segments wholly inside
its range are then deleted. The floor used to be rebuilt on load from the high watermark
checkpoint, written every few seconds, so after a crash it could be below an entry that had taken
effect. Offsets of that range were then neither tiered nor in a segment, and ``read`` served the
first segment after the hole: a consumer silently skipped every record of the range. A replica
that adopted its leader's tiers had the same hole until its high watermark next moved.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
from loghelpers import T0, open_log
from test_tier_log import adopt_and_copy, commit_batch, pointer_log, segment_of

from diskless.log.config import LogConfig
from diskless.log.partition_log import TIERED, PartitionLog
from diskless.storage import pointer
from diskless.storage.segment_object import SegmentInfo


def first_offset_served(log: PartitionLog, offset: int, max_offset: int | None = None) -> int:
    """The first offset a consumer reading at ``offset`` gets (the batch holding it); -1 for none."""
    result = log.read(offset, 1 << 20, max_offset=max_offset)
    if result.kind == TIERED:
        descriptor = msgpack.unpackb(result.records)
        info = SegmentInfo.from_dict(descriptor["segment"])
        assert info.base_offset <= int(descriptor["offset"]) <= info.last_offset
        return int(descriptor["offset"])
    if not result.records:
        return -1
    entry, _ = pointer.decode_entry(result.records, 0)
    return entry.base_offset if entry.last_offset >= offset else -1


def test_a_crash_after_a_tier_took_effect_leaves_no_hole(tmp_path: Path) -> None:
    log, served = pointer_log(tmp_path, batches=6)  # offsets 0..11, batches of two records
    log.append_tier_as_leader(segment_of(log, served, 0, 3), 0, T0)  # entry at 12
    log.high_watermark = log.log_end_offset
    assert log.append_tier_as_leader(segment_of(log, served, 4, 9), 0, T0) == 13
    log.high_watermark = 13
    log.checkpoint_high_watermark()  # the last checkpoint before the crash: entry 13 not in effect
    log.high_watermark = log.log_end_offset  # the second tier takes effect
    assert log.tiered_end == 10
    assert log.segments[0].base_offset > 5, "the pointer segment of [0, 5] is deleted"
    assert first_offset_served(log, 4) == 4

    for segment in log.segments:  # crash: no clean close
        segment.close()
    reopened = PartitionLog(str(tmp_path), LogConfig(segment_bytes=300, diskless_enabled=True), T0)

    assert reopened.high_watermark == 13 and reopened.log_start_offset == 0
    assert reopened.tiered_end == 10
    for offset in range(0, 10):
        assert first_offset_served(reopened, offset) == offset, f"a read at {offset} skips records"


def test_a_manifest_without_a_floor_settles_it_from_the_segments(tmp_path: Path) -> None:
    """Manifests of older versions have no floor: a tier starting below the first pointer
    segment took effect, or its pointers would still be there."""
    log, served = pointer_log(tmp_path, batches=6)
    log.append_tier_as_leader(segment_of(log, served, 0, 5), 0, T0)
    log.high_watermark = log.log_end_offset
    assert log.tiered_end == 6 and log.segments[0].base_offset >= 6
    log._tier_floor = 0
    log._write_tier_manifest()  # as an older version wrote it
    log._tier_floor = 6
    log._high_watermark = 6  # a checkpoint from before the entry (at 6) took effect
    log.checkpoint_high_watermark()
    for segment in log.segments:
        segment.close()
    reopened = PartitionLog(str(tmp_path), LogConfig(segment_bytes=300, diskless_enabled=True), T0)
    assert reopened.high_watermark == 6 and reopened.tiered_end == 6
    assert first_offset_served(reopened, 2) == 2


def test_a_replica_that_adopted_its_leaders_tiers_serves_them_at_once(tmp_path: Path) -> None:
    leader, served = pointer_log(tmp_path / "leader")
    leader.append_tier_as_leader(segment_of(leader, served, 0, 5), 0, T0)
    leader.high_watermark = leader.log_end_offset
    commit_batch(leader, "wal/after")
    fresh = open_log(tmp_path / "fresh", segment_bytes=300, diskless_enabled=True, commit=False)
    adopt_and_copy(leader, fresh)
    # Before the replica's high watermark moves again: the tiered range is served from the
    # segment object, never from the pointers that follow it.
    assert first_offset_served(fresh, 0, max_offset=fresh.log_end_offset) == 0
    assert fresh.tiered_end == 6

"""Tier entries in a diskless partition log (issue 12): TierCommit validation, replication to a
follower, effect only once committed (reads, WAL references, pointer segments), persistence,
truncation, retention and DeleteRecords over tiered ranges."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
from batches import Record, make_batch
from loghelpers import T0, open_log

from diskless.log.partition_log import TIERED, OffsetMovedToTiered, PartitionLog
from diskless.log.segment import POINTERS
from diskless.protocol import records
from diskless.storage import pointer
from diskless.storage.segment_object import SegmentInfo, SegmentWriter
from diskless.tiering.entry import TierCommitError, unwrap_tier_state

TOPIC_ID = "t-id"


def commit_batch(log: PartitionLog, key: str, count: int = 2, ts: int = T0, hw: bool = True) -> bytes:
    """Commit a pointer to a real batch (kept here as if in S3); returns the batch as served."""
    batch = make_batch([Record(b"x" * 20, timestamp=ts + i) for i in range(count)], base_timestamp=ts)
    result = log.append_pointer_as_leader(batch[: records.HEADER_SIZE], key, 0, 0, ts)
    if hw:
        log.high_watermark = log.log_end_offset
    served = bytearray(batch)
    records.assign_offset(served, result.base_offset, 0)
    return bytes(served)


def segment_of(log: PartitionLog, served: dict[int, bytes], base: int, last: int) -> SegmentInfo:
    """What the tier job writes for [base, last]: the served batches (inline ones from the log)."""
    writer = SegmentWriter(TOPIC_ID, 0)
    offset = base
    while offset <= last:
        data = log.read(offset, 1, max_offset=last + 1, tiered=False).records
        entry, _ = pointer.decode_entry(data, 0)
        batch = entry.batch if isinstance(entry, pointer.InlineEntry) else served[entry.base_offset]
        writer.add(batch)
        offset = records.parse_header(batch).last_offset + 1
    return writer.finish()[2]


def pointer_log(tmp_path: Path, batches: int = 6, **config: object) -> tuple[PartitionLog, dict[int, bytes]]:
    log = open_log(tmp_path, segment_bytes=300, diskless_enabled=True, **config)
    served = {}
    for i in range(batches):
        batch = commit_batch(log, f"wal/obj-{i // 2}")
        served[records.parse_header(batch).base_offset] = batch
    return log, served


def adopt_and_copy(leader: PartitionLog, fresh: PartitionLog) -> None:
    """A replica behind the leader's pointers adopts its tiers, then copies the pointers after
    them, as the replica fetcher does (its high watermark left where adoption put it)."""
    state = unwrap_tier_state(leader.tier_state_for_replica())
    assert state is not None
    fresh.adopt_tier_state(state, T0)
    while fresh.log_end_offset < leader.log_end_offset:
        data = leader.read(fresh.log_end_offset, 1 << 20, tiered=False, max_offset=leader.log_end_offset).records
        fresh.append_pointers_as_follower(data, T0)


def test_tier_commit_takes_effect_once_committed(tmp_path: Path) -> None:
    log, served = pointer_log(tmp_path)
    assert log.references("wal/obj-0") and log.active_segment.kind == POINTERS
    info = segment_of(log, served, 0, 5)  # three WAL objects, six batches of two records
    entry = log.append_tier_as_leader(info, 0, T0)
    assert entry == 12
    # Not committed yet: nothing changed for readers and the WAL manager.
    assert log.references("wal/obj-0") and log.references(info.log_key)
    assert log.read(0, 1 << 20).kind == POINTERS
    log.high_watermark = log.log_end_offset
    assert log.tiered_end == 6
    assert not log.references("wal/obj-0")  # batches 0 and 1: all tiered
    assert log.references("wal/obj-1")  # batch 2 is tiered, batch 3 is not
    assert log.references(info.log_key) and log.references(info.index_key)
    result = log.read(3, 1 << 20)
    assert result.kind == TIERED
    descriptor = msgpack.unpackb(result.records)
    assert SegmentInfo.from_dict(descriptor["segment"]) == info and descriptor["offset"] == 3
    assert log.read(6, 1 << 20).kind == POINTERS  # past the tier: pointers as before
    # A rerun committing exactly the same segment changes nothing.
    end = log.log_end_offset
    assert log.append_tier_as_leader(info, 0, T0) is None and log.log_end_offset == end


def test_bad_tier_commits_change_nothing(tmp_path: Path) -> None:
    log, served = pointer_log(tmp_path)
    good = segment_of(log, served, 0, 3)
    end = log.log_end_offset
    cases = {
        "not contiguous": segment_of(log, served, 2, 5),
        "digest": SegmentInfo(**{**good.to_dict(), "digest": good.digest ^ 1}),
        "size": SegmentInfo(**{**good.to_dict(), "size": good.size + 1}),
        "mid-batch end": SegmentInfo(**{**good.to_dict(), "last_offset": 4}),
    }
    for why, info in cases.items():
        with pytest.raises(TierCommitError) as raised:
            log.append_tier_as_leader(info, 0, T0)
        assert raised.value.error in ("invalid_request", "corrupt_message"), why
        assert log.log_end_offset == end and not log.tiers, why
    # Not below the last stable offset: an uncommitted tail cannot be tiered.
    commit_batch(log, "wal/late", hw=False)
    too_far = SegmentInfo(**{**segment_of(log, served, 0, 5).to_dict(), "last_offset": 13})
    with pytest.raises(TierCommitError, match="last stable offset"):
        log.append_tier_as_leader(too_far, 0, T0)
    assert not log.tiers


def test_follower_replicates_tier_entries_and_catches_up(tmp_path: Path) -> None:
    leader, served = pointer_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", segment_bytes=300, diskless_enabled=True, commit=False)
    info = segment_of(leader, served, 0, 5)
    leader.append_tier_as_leader(info, 0, T0)
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_pointers_as_follower(
            leader.read(follower.log_end_offset, 1 << 20, tiered=False, max_offset=leader.log_end_offset).records, T0
        )
    assert [t.info for t in follower.tiers] == [info]
    assert follower.references("wal/obj-0")  # not committed as far as the follower knows
    follower.high_watermark = follower.log_end_offset
    leader.high_watermark = leader.log_end_offset
    assert not follower.references("wal/obj-0") and follower.read(0, 100).kind == TIERED
    # Pointer segments wholly tiered are gone from disk on both replicas.
    for log in (leader, follower):
        assert log.segments[0].base_offset >= 6
        with pytest.raises(OffsetMovedToTiered):
            log.read(0, 100, tiered=False)


def test_tiers_survive_reopen_and_uncommitted_ones_truncate(tmp_path: Path) -> None:
    log, served = pointer_log(tmp_path)
    first = segment_of(log, served, 0, 3)
    log.append_tier_as_leader(first, 0, T0)
    log.high_watermark = log.log_end_offset
    before = log.pointer_bytes()
    log.close()
    log = PartitionLog(str(tmp_path), log.config, T0)
    log.high_watermark = log.log_end_offset
    assert [t.info for t in log.tiers] == [first] and log.tiered_end == 4
    assert log.log_start_offset == 0 and log.read(1, 10).kind == TIERED
    assert not log.references("wal/obj-0") and log.pointer_bytes() == before
    second = segment_of(log, served, 4, 6)  # 6 is the first tier entry, a control batch
    entry = log.append_tier_as_leader(second, 0, T0)
    assert entry is not None and log.references(second.log_key)
    log.truncate_to(entry, T0)  # the new leader never had it
    assert [t.info for t in log.tiers] == [first] and not log.references(second.log_key)
    log.close(clean=False)
    log = PartitionLog(str(tmp_path), log.config, T0)
    assert [t.info for t in log.tiers] == [first]


def test_retention_and_delete_records_on_tiered_ranges(tmp_path: Path) -> None:
    log, served = pointer_log(tmp_path, retention_ms=1000)
    info = segment_of(log, served, 0, 5)
    log.append_tier_as_leader(info, 0, T0)
    log.high_watermark = log.log_end_offset
    log.delete_records_before(2)
    assert log.log_start_offset == 2 and log.references(info.log_key)
    assert log.read(2, 100).kind == TIERED
    log.apply_retention(T0 + 500)
    assert log.log_start_offset == 2
    log.apply_retention(T0 + 10_000)  # the tier and the pointer segments after it expire
    assert log.log_start_offset >= 6 and not log.tiers and not log.references(info.log_key)


def test_replica_behind_the_leaders_pointers_adopts_its_tiers(tmp_path: Path) -> None:
    leader, served = pointer_log(tmp_path / "leader")
    info = segment_of(leader, served, 0, 5)
    leader.append_tier_as_leader(info, 0, T0)
    leader.high_watermark = leader.log_end_offset
    commit_batch(leader, "wal/after")
    fresh = open_log(tmp_path / "fresh", segment_bytes=300, diskless_enabled=True, commit=False)
    with pytest.raises(OffsetMovedToTiered):
        leader.read(fresh.log_end_offset, 1 << 20, tiered=False)
    adopt_and_copy(leader, fresh)
    fresh.high_watermark = leader.high_watermark
    assert fresh.log_start_offset == 0 and [t.info for t in fresh.tiers] == [info]
    assert fresh.read(0, 100).kind == TIERED and fresh.read(0, 100).records == leader.read(0, 100).records
    assert fresh.references("wal/after") and not fresh.references("wal/obj-0")


def test_per_partition_tiering_gauges(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from prometheus_client import REGISTRY

    from diskless.broker.tier_rpcs import TierRpcs

    log, served = pointer_log(tmp_path)
    info = segment_of(log, served, 0, 5)
    log.append_tier_as_leader(info, 0, T0)
    log.high_watermark = log.log_end_offset

    class Broker:  # weakly referenced by the collector, as a real broker is
        replicas = SimpleNamespace(partitions={("gauged", 4): SimpleNamespace(log=log)})

    broker = Broker()
    TierRpcs(broker)  # type: ignore[arg-type]
    labels = {"topic": "gauged", "partition": "4"}
    assert REGISTRY.get_sample_value("diskless_partition_segment_objects", labels) == 1
    assert REGISTRY.get_sample_value("diskless_partition_tiered_bytes", labels) == info.size
    assert REGISTRY.get_sample_value("diskless_partition_pointer_bytes", labels) == log.pointer_bytes()

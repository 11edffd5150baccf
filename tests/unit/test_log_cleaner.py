"""Log compaction's IO side (log/cleaner.py): a pass over a real PartitionLog on disk, its install,
the cases where the log moved under the pass, and recovery from a crash at every step of an install."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from batches import CONTROL_FLAG, TRANSACTIONAL_FLAG, Record, decode_batch, make_batch, split
from loghelpers import T0, open_log, read_records

from diskless.log import cleaner
from diskless.log.partition_log import PartitionLog
from diskless.log.producer_state import delete_snapshots

COMPACT: dict[str, Any] = {"cleanup_policy": "compact", "min_cleanable_dirty_ratio": 0.0, "delete_retention_ms": 0}


def put(
    log: PartitionLog,
    pairs: list[tuple[bytes | None, bytes | None]],
    *,
    roll: bool = False,
    now_ms: int = T0,
    **kw: Any,
) -> None:
    """One batch of (key, value) records; with ``roll`` it starts a segment of its own."""
    batch = make_batch([Record(v, key=k, timestamp=now_ms) for k, v in pairs], base_timestamp=now_ms, **kw)
    if roll:
        log.roll(now_ms)
    log.append_as_leader([memoryview(batch)], 0, now_ms)
    log.high_watermark = log.log_end_offset


def view(log: PartitionLog) -> dict[bytes | None, tuple[int, bytes | None]]:
    """key -> (offset, value) of the latest record of each key a reader from the start finds."""
    out: dict[bytes | None, tuple[int, bytes | None]] = {}
    for rec in read_records(log):
        out[rec.key] = (rec.offset, rec.value)
    return out


def offsets(log: PartitionLog) -> list[int]:
    return [rec.offset for rec in read_records(log)]


def clean(log: PartitionLog, now_ms: int = T0, max_entries: int = 1 << 20) -> cleaner.CleanedOutput | None:
    job = cleaner.prepare(log, now_ms)
    if job is None:
        return None
    output = cleaner.run(job, max_entries)
    assert output is not None
    assert cleaner.install(output)
    return output


def versions(tmp_path: Path, **config: Any) -> PartitionLog:
    """Three keys written five times each, one version per segment, then an active segment."""
    log = open_log(tmp_path, **{**COMPACT, **config})
    for v in range(5):
        put(log, [(b"a", b"a%d" % v), (b"b", b"b%d" % v), (b"c", b"c%d" % v)], roll=v > 0)
    put(log, [(b"z", b"active")], roll=True)
    return log


def test_a_pass_keeps_the_latest_record_of_each_key_at_its_offset(tmp_path: Path) -> None:
    log = versions(tmp_path)
    before = view(log)
    output = clean(log)
    assert output is not None and output.replaced == 5
    assert view(log) == before == {b"a": (12, b"a4"), b"b": (13, b"b4"), b"c": (14, b"c4"), b"z": (15, b"active")}
    assert offsets(log) == [12, 13, 14, 15]
    assert log.log_end_offset == 16 and log.log_start_offset == 0
    assert len(log.segments) == 2  # the five small segments merged into one, then the active one
    assert log.cleaner_checkpoint == 15 == cleaner.read_checkpoint(str(tmp_path))
    assert not os.path.exists(cleaner.scratch_path(str(tmp_path)))
    assert clean(log) is None  # nothing dirty any more


def test_reads_at_removed_offsets_get_the_next_record(tmp_path: Path) -> None:
    log = versions(tmp_path)
    clean(log)
    for offset in (0, 5, 11, 12):
        first = read_records(log, offset)[0]
        assert first.offset == 12
    assert read_records(log, 13)[0].offset == 13


def test_the_result_survives_a_restart(tmp_path: Path) -> None:
    log = versions(tmp_path)
    clean(log)
    before = view(log)
    log.close()
    again = open_log(tmp_path, **COMPACT)
    assert view(again) == before
    assert again.cleaner_checkpoint == 15
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".deleted", ".swap"))]


def test_a_log_that_is_not_compacted_is_never_cleaned(tmp_path: Path) -> None:
    log = versions(tmp_path, cleanup_policy="delete")
    assert cleaner.prepare(log, T0) is None


def test_compact_alone_deletes_nothing_by_time(tmp_path: Path) -> None:
    log = versions(tmp_path, retention_ms=1)
    assert log.apply_retention(T0 + 10_000_000) == 0
    both = versions(tmp_path / "both", cleanup_policy="compact,delete", retention_ms=1)
    assert both.apply_retention(T0 + 10_000_000) > 0


def test_an_idempotent_producers_last_batch_stays_and_its_retry_is_a_duplicate(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT)
    put(log, [(b"k", b"1")], producer_id=7, producer_epoch=0, base_sequence=0)
    put(log, [(b"k", b"2")], producer_id=8, producer_epoch=0, base_sequence=0, roll=True)
    put(log, [(b"x", b"x")], roll=True)
    clean(log)
    # producer 7's only batch is superseded, but it is its last: kept, emptied, sequence intact
    assert view(log) == {b"k": (1, b"2"), b"x": (2, b"x")}
    log.close()
    delete_snapshots(str(tmp_path))  # the producer's state must come from the log itself
    again = PartitionLog(str(tmp_path), log.config, T0)
    assert again.producer_state.producers[7].last_seq == 0
    retry = make_batch([Record(b"1", key=b"k")], producer_id=7, producer_epoch=0, base_sequence=0)
    assert again.append_as_leader([memoryview(retry)], 0, T0).duplicate


def test_aborted_records_never_win(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT)
    put(log, [(b"k", b"committed")])
    put(log, [(b"k", b"aborted")], producer_id=9, producer_epoch=0, base_sequence=0, transactional=True, roll=True)
    log.append_marker_as_leader(9, 0, False, 0, 0, T0)  # abort
    log.high_watermark = log.log_end_offset
    put(log, [(b"y", b"y")], roll=True)
    clean(log)
    read_committed = [r for r in read_records(log) if r.key == b"k"]
    assert [(r.offset, r.value) for r in read_committed] == [(0, b"committed")]


def read_committed(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a read_committed consumer gets, by the Java client's rule (Fetcher's
    abortedProducerIds): an aborted transaction listed by the broker starts skipping its
    producer's transactional batches at its first offset, until that producer's abort marker."""
    data = log.read(log.log_start_offset, 1 << 30).records
    aborted = sorted(log.txns.aborted_between(log.log_start_offset, log.high_watermark), key=lambda a: a.first_offset)
    skipping: set[int] = set()
    out = []
    for raw in split(data):
        batch = decode_batch(raw)
        last = batch.base_offset + batch.last_offset_delta
        while aborted and aborted[0].first_offset <= last:
            skipping.add(aborted.pop(0).producer_id)
        if batch.attributes & CONTROL_FLAG:
            if batch.records and batch.records[0].key == b"\x00\x00\x00\x00":  # an ABORT marker
                skipping.discard(batch.producer_id)
            continue
        if batch.attributes & TRANSACTIONAL_FLAG and batch.producer_id in skipping:
            continue
        out += [(r.offset, r.key, r.value) for r in batch.records]
    return out


def test_a_transaction_after_an_aborted_one_whose_marker_went_is_still_read(tmp_path: Path) -> None:
    """The cleaner removes an aborted transaction's data, then (past its horizon) its marker: its
    entry must leave the aborted index too, or read_committed consumers skip the producer's next,
    committed, transaction up to the following abort marker (found by the end-to-end test)."""
    log = open_log(tmp_path, **{**COMPACT, "delete_retention_ms": 1000})
    now = T0
    txn = {"producer_id": 5, "producer_epoch": 0, "transactional": True}
    sequence = 0

    def transaction(pairs: list[tuple[bytes, bytes]], commit: bool) -> None:
        nonlocal sequence
        put(log, pairs, roll=True, now_ms=now, base_sequence=sequence, **txn)
        sequence += len(pairs)
        log.append_marker_as_leader(5, 0, commit, 0, 0, now)
        log.high_watermark = log.log_end_offset

    def pass_() -> None:
        nonlocal now
        put(log, [(b"tick", b"x")], roll=True, now_ms=now)
        job = cleaner.prepare(log, now)
        if job is not None:
            output = cleaner.run(job, 1 << 20)
            assert output is not None
            cleaner.install(output)
        now += 2000

    transaction([(b"a", b"aborted-1")], commit=False)
    transaction([(b"c", b"committed")], commit=True)
    transaction([(b"d", b"aborted-2")], commit=False)
    for _ in range(4):  # the first abort's data goes, then its marker gets a horizon, then goes
        pass_()
    markers = [b for b in map(decode_batch, split(log.read(0, 1 << 30).records)) if b.attributes & CONTROL_FLAG]
    assert [m.base_offset for m in markers if m.records] == [3, 5]  # the first abort's marker (1) went
    assert (b"c", b"committed") in [(k, v) for _, k, v in read_committed(log)]
    assert not [v for _, _, v in read_committed(log) if v is not None and v.startswith(b"aborted")]


def test_install_is_refused_when_the_log_was_truncated(tmp_path: Path) -> None:
    log = versions(tmp_path)
    job = cleaner.prepare(log, T0)
    assert job is not None
    output = cleaner.run(job, 1 << 20)
    assert output is not None
    log.truncate_to(14, T0)  # a follower diverged: the segments the pass read are not all there
    assert not cleaner.install(output)
    assert not os.path.exists(output.scratch)
    assert offsets(log)[:3] == [0, 1, 2]  # nothing was replaced


def test_install_is_refused_when_retention_dropped_a_segment_meanwhile(tmp_path: Path) -> None:
    log = versions(tmp_path)
    job = cleaner.prepare(log, T0)
    assert job is not None
    output = cleaner.run(job, 1 << 20)
    assert output is not None
    log.delete_records_before(6)
    assert not cleaner.install(output)
    assert log.segments[0].base_offset == 6


def test_a_segment_dropped_before_the_worker_opens_it_ends_the_pass(tmp_path: Path) -> None:
    log = versions(tmp_path)
    job = cleaner.prepare(log, T0)
    assert job is not None
    log.delete_records_before(3)  # renames segment 0 .deleted
    assert cleaner.run(job, 1 << 20) is None


def test_a_reader_holding_a_replaced_segment_keeps_reading(tmp_path: Path) -> None:
    log = versions(tmp_path)
    held = log.segments[0]
    clean(log)
    assert held not in log.segments
    assert held.read(0, 1 << 20, 100, True)  # its descriptor is open until file.delete.delay.ms


def test_a_cancelled_pass_leaves_no_scratch(tmp_path: Path) -> None:
    log = versions(tmp_path)
    job = cleaner.prepare(log, T0)
    assert job is not None
    job.cancelled = True
    with pytest.raises(cleaner.CleaningCancelled):
        cleaner.run(job, 1 << 20)
    assert not os.path.exists(cleaner.scratch_path(str(tmp_path)))


def test_a_small_key_map_cleans_in_several_passes(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT)
    for v in range(5):
        put(log, [(b"s", b"s%d" % v), (b"u%d" % v, b"x")], roll=v > 0)
    put(log, [(b"z", b"active")], roll=True)
    expected = view(log)
    passes = 0
    while clean(log, max_entries=3) is not None:
        passes += 1
        assert passes < 10
    assert passes >= 2
    assert view(log) == expected
    assert offsets(log) == [1, 3, 5, 7, 8, 9, 10]


# --- crash recovery ---------------------------------------------------------------------------


def _committed_but_not_installed(tmp_path: Path) -> tuple[PartitionLog, dict[bytes | None, tuple[int, bytes | None]]]:
    """A pass whose output reached the commit point (renamed cleaned.swap) and no further."""
    log = versions(tmp_path)
    expected = view(log)
    job = cleaner.prepare(log, T0)
    assert job is not None
    output = cleaner.run(job, 1 << 20)
    assert output is not None
    for segment in output.segments:
        segment.close()
    os.rename(output.scratch, os.path.join(tmp_path, cleaner.SWAP_DIR))
    log.close(clean=False)
    return log, expected


def test_a_crash_after_the_commit_point_is_finished_by_the_next_load(tmp_path: Path) -> None:
    _, expected = _committed_but_not_installed(tmp_path)
    again = open_log(tmp_path, **COMPACT)
    assert view(again) == expected and offsets(again) == [12, 13, 14, 15]
    assert not os.path.exists(os.path.join(tmp_path, cleaner.SWAP_DIR))
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".log")) == [
        "00000000000000000000.log",
        "00000000000000000015.log",
    ]


def test_a_recovery_interrupted_after_moving_some_files_is_finished_again(tmp_path: Path) -> None:
    _, expected = _committed_but_not_installed(tmp_path)
    swap = os.path.join(tmp_path, cleaner.SWAP_DIR)
    moved = sorted(n for n in os.listdir(swap) if n != cleaner.MANIFEST)[0]
    os.replace(os.path.join(swap, moved), os.path.join(tmp_path, moved))  # the first recovery's first move
    again = open_log(tmp_path, **COMPACT)
    assert view(again) == expected


def test_a_crash_before_the_commit_point_keeps_the_old_segments(tmp_path: Path) -> None:
    log = versions(tmp_path)
    expected = offsets(log)
    job = cleaner.prepare(log, T0)
    assert job is not None
    output = cleaner.run(job, 1 << 20)
    assert output is not None
    log.close(clean=False)
    again = open_log(tmp_path, **COMPACT)
    assert offsets(again) == expected  # the scratch output is not the log's
    cleaner.remove_scratch(os.path.dirname(tmp_path))
    assert not os.path.exists(output.scratch)
    shutil.rmtree(tmp_path)


# --- review findings ---------------------------------------------------------------------------


def _pass(log: PartitionLog, now_ms: int) -> None:
    job = cleaner.prepare(log, now_ms)
    if job is not None:
        output = cleaner.run(job, 1 << 20)
        assert output is not None
        cleaner.install(output)


def test_truncation_below_the_cleaner_checkpoint_does_not_resurrect_a_deleted_key(tmp_path: Path) -> None:
    """A follower truncated below where its last pass's key map ended: the records appended there
    since are dirty (Kafka's maybeTruncateCheckpoint). Counted clean, a tombstone there never
    entered a key map, so the value it deletes was never superseded and outlived the tombstone."""
    log = open_log(tmp_path, **COMPACT)
    put(log, [(b"k", b"v1")])
    put(log, [(b"a", b"a")], roll=True)
    put(log, [(b"b", b"b")], roll=True)
    put(log, [(b"z", b"z")], roll=True)
    _pass(log, T0)
    assert log.cleaner_checkpoint == 3
    log.truncate_to(1, T0)  # the leader's log diverged at offset 1
    assert log.cleaner_checkpoint <= log.log_end_offset == 1
    put(log, [(b"k", None)])  # the leader's record at 1: k deleted
    put(log, [(b"y", b"y")], roll=True)
    put(log, [(b"w", b"w")], roll=True)
    now = T0
    for _ in range(3):  # the tombstone gets its horizon (delete.retention.ms 0), then goes
        now += 10
        put(log, [(b"t%d" % now, b"x")], roll=True, now_ms=now)
        _pass(log, now)
    assert b"k" not in view(log)


def test_a_checkpoint_past_the_log_end_is_not_trusted(tmp_path: Path) -> None:
    """As Kafka's cleanableOffsets: a checkpoint ahead of the log end (data lost since) restarts
    the dirty part at the log start, or what is below it would never be mapped."""
    log = open_log(tmp_path, **COMPACT)
    put(log, [(b"k", b"v1")])
    put(log, [(b"k", b"v2")], roll=True)
    put(log, [(b"z", b"z")], roll=True)
    log.cleaner_checkpoint = 100
    job = cleaner.prepare(log, T0)
    assert job is not None and job.plan.first_dirty == 0


def test_a_producers_last_marker_at_a_bumped_epoch_stays_for_fencing(tmp_path: Path) -> None:
    """A coordinator that fences a producer (timeout, InitProducerId) ends its transaction with an
    ABORT marker at the bumped epoch: the producer's last entry, and the only one at that epoch.
    Kafka's cleaner keeps it (isBatchLastRecordOfProducer, case 3), emptied if need be, so that a
    replica rebuilding producer state from the log still fences the old epoch."""
    log = open_log(tmp_path, **COMPACT)
    put(log, [(b"k", b"aborted")], producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    log.append_marker_as_leader(5, 1, False, 0, 0, T0)  # fenced: the marker carries epoch 1
    log.high_watermark = log.log_end_offset
    now = T0
    for _ in range(4):  # the data goes, the marker gets its horizon, then would go
        now += 10
        put(log, [(b"t%d" % now, b"x")], roll=True, now_ms=now)
        _pass(log, now)
    log.close()
    delete_snapshots(str(tmp_path))  # the producer's state from the log alone (a new replica's)
    again = PartitionLog(str(tmp_path), log.config, now)
    assert again.producer_state.producers[5].epoch == 1
    zombie = make_batch([Record(b"z", key=b"k")], producer_id=5, producer_epoch=0, base_sequence=1, transactional=True)
    with pytest.raises(Exception, match="epoch"):
        again.append_as_leader([memoryview(zombie)], 0, now)


def test_list_offsets_on_a_log_append_time_log_names_a_record_the_cleaner_kept(tmp_path: Path) -> None:
    """A cleaned LogAppendTime batch's records are no longer at consecutive offsets: ListOffsets
    answers the first kept record's own offset (its offset delta), as Kafka's findOffsetByTimestamp,
    not the batch's n-th offset."""
    log = open_log(tmp_path, **COMPACT, message_timestamp_type="LogAppendTime")
    put(log, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2")])
    put(log, [(b"z", b"z")], roll=True)
    clean(log)
    assert offsets(log) == [1, 2, 3]
    assert log.offset_for_timestamp(0) == (1, T0)
    assert log.offset_of_max_timestamp() == (1, T0)


def test_a_log_whose_batch_outgrows_the_key_map_does_not_starve_the_others(tmp_path: Path) -> None:
    """A dirty batch with more keys than the key map holds can never be cleaned. Kafka fails the
    pass and marks the partition uncleanable; a pass that merely gave up left the log the filthiest
    for good, picked first every time, and no other compacted log of the broker was cleaned again."""
    import asyncio
    from types import SimpleNamespace

    from diskless.broker.log_cleaner import LogCleaner

    big = open_log(tmp_path / "big-0", **COMPACT)
    put(big, [(b"k%d" % i, b"v") for i in range(5)])
    put(big, [(b"z", b"z")], roll=True)
    small = open_log(tmp_path / "small-0", **COMPACT)
    put(small, [(b"a", b"1")])
    put(small, [(b"a", b"2")], roll=True)
    put(small, [(b"z", b"z")], roll=True)
    settings = SimpleNamespace(max_map_entries=3, io_max_bytes_per_second=float("inf"), backoff_ms=1)
    log_cleaner = LogCleaner(lambda: [("big", big), ("small", small)], lambda: T0, lambda: settings, str(tmp_path))

    async def passes() -> None:
        for _ in range(3):
            await log_cleaner.clean_once()

    asyncio.run(passes())
    assert small.cleaner_checkpoint == 2
    assert view(small) == {b"a": (1, b"2"), b"z": (2, b"z")}


def test_a_batch_the_topic_accepted_is_not_too_large_to_clean(tmp_path: Path) -> None:
    """Produce to a compacted topic decompresses each batch up to 64 x its max.message.bytes
    (key_check); the cleaner bounded every batch by 64 x Kafka's default max.message.bytes, so a
    topic with a larger max.message.bytes could hold a batch no pass could read: its every pass
    failed and the log was never compacted again."""
    from batches import GZIP

    log = open_log(tmp_path, **COMPACT, max_message_bytes=2 * 1024 * 1024)
    big = make_batch([Record(bytes(70 * 1024 * 1024), key=b"k")], compression=GZIP)
    log.append_as_leader([memoryview(big)], 0, T0)
    del big
    put(log, [(b"k", b"small")], roll=True)
    put(log, [(b"z", b"z")], roll=True)
    clean(log)
    assert view(log) == {b"k": (1, b"small"), b"z": (2, b"z")}


def test_a_throttled_pass_stops_soon_when_cancelled(tmp_path: Path) -> None:
    """log.cleaner.io.max.bytes.per.second makes the worker sleep until its average rate is back
    under the limit: at a low rate that is one long sleep per batch, which a stopping broker (the
    interpreter joins the worker thread at exit) waited out."""
    import threading
    import time

    log = versions(tmp_path)
    job = cleaner.prepare(log, T0)
    assert job is not None
    job.io_max_bytes_per_second = 1.0  # every batch read costs minutes of sleep
    threading.Timer(0.2, lambda: setattr(job, "cancelled", True)).start()
    started = time.monotonic()
    with pytest.raises(cleaner.CleaningCancelled):
        cleaner.run(job, 1 << 20)
    assert time.monotonic() - started < 5


def stored(log: PartitionLog) -> list[tuple[int, bytes | None]]:
    """(offset, key) of every record in the log, whatever the high watermark."""
    out = []
    for segment in log.segments:
        data = segment.read(segment.base_offset, 1 << 30, 1 << 62, True)
        out += [(r.offset, r.key) for raw in split(data or b"") for r in decode_batch(raw).records]
    return out


def test_truncation_into_a_gap_the_cleaner_left_ends_the_log_at_the_target(tmp_path: Path) -> None:
    """A follower truncated to an offset inside a gap compaction left (offsets 1 and 2 removed):
    as Kafka's LocalLog.truncateTo, its log then ends at the target. It ended at the last batch
    kept below the gap instead: the high watermark fell below the target too (offsets the leader
    had committed were out of range for consumers reading from this follower), and, elected
    leader before its next fetch, it gave new records offsets below the old high watermark, which
    consumers already positioned past them never read."""
    log = open_log(tmp_path, **COMPACT)
    put(log, [(b"a", b"a")])
    put(log, [(b"k", b"1")])
    put(log, [(b"k", b"2")])
    put(log, [(b"k", b"3")])
    put(log, [(b"z", b"z")], roll=True)
    clean(log)
    assert offsets(log) == [0, 3, 4]
    assert log.high_watermark == 5
    log.truncate_to(2, T0)  # diverged at 2: offsets 0 and 1 are the leader's too
    assert log.log_end_offset == 2
    assert log.high_watermark == 2
    assert stored(log) == [(0, b"a")]
    assert log.read(2, 1 << 20).records == b""  # in range, nothing there yet
    appended = log.append_as_leader([memoryview(make_batch([Record(b"new", key=b"n")]))], 1, T0)
    assert appended.base_offset == 2
    log.close()
    again = open_log(tmp_path, commit=False, **COMPACT)
    assert again.log_end_offset == 3
    assert stored(again) == [(0, b"a"), (2, b"n")]


def test_truncation_through_a_batch_still_ends_below_it(tmp_path: Path) -> None:
    """A batch holding the target goes whole (its records below the target are fetched again),
    so the log ends at its base offset, not at the target."""
    log = open_log(tmp_path, **COMPACT)
    put(log, [(b"a", b"a")])
    put(log, [(b"b", b"1"), (b"c", b"1"), (b"d", b"1")])
    put(log, [(b"z", b"z")], roll=True)
    log.truncate_to(2, T0)
    assert log.log_end_offset == 1
    assert stored(log) == [(0, b"a")]


def test_a_trailing_marker_a_full_key_map_lets_go_leaves_transactions_closed_after_a_reload(tmp_path: Path) -> None:
    """The key map fills before the end of the dirty part: the pass still rewrites the whole
    segment the map ended in, and only the batch where the map ended is kept for its offset, so a
    marker ending that segment, right before an empty active segment, goes once its horizon has
    passed (as in Kafka, whose cleaning round keeps only its own last batch). That is safe: every
    pass reads the log from its start through the whole rewritten range, so the marker is only
    discardable when no batch of its transaction is left before it (here: an ABORT for which the
    partition got no data), and the empty active segment keeps the log end."""
    log = open_log(tmp_path, **{**COMPACT, "delete_retention_ms": 1000})
    txn = {"producer_id": 5, "producer_epoch": 0, "transactional": True}
    put(log, [(b"k", b"committed")], base_sequence=0, **txn)
    log.append_marker_as_leader(5, 0, True, 0, 0, T0)  # 1
    for i, key in enumerate((b"a", b"b", b"c")):  # 2, 3, 4
        put(log, [(key, b"%d" % i)])
    log.append_marker_as_leader(5, 0, False, 0, 0, T0)  # 5: the partition got no data of this one
    log.high_watermark = log.log_end_offset
    log.roll(T0)  # an empty active segment at 6
    now = T0
    assert [o for o, _ in stored(log)] == [0, 1, 2, 3, 4, 5]
    for _ in range(3):  # a map of one key: the marker gets its horizon, then goes
        assert clean(log, now, max_entries=1) is not None
        now += 2000
    assert [o for o, _ in stored(log)] == [0, 1, 2, 3, 4]  # the producer's last batch and its COMMIT stay
    assert log.log_end_offset == 6 == log.last_stable_offset
    log.close()
    delete_snapshots(str(tmp_path))  # producer state and transactions from the log alone
    again = open_log(tmp_path, now, **COMPACT)
    assert again.log_end_offset == 6
    assert not again.txns.ongoing and again.last_stable_offset == again.high_watermark == 6
    assert (0, b"k", b"committed") in read_committed(again)
    assert again.producer_state.producers[5].last_seq == 0

"""PartitionLog reopen: clean shutdown keeps everything, a crash loses at most a torn or corrupt tail."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest
from batches import GZIP, SNAPPY, values_batch
from loghelpers import T0, batches_of, log_files, open_log, produce, read_records

from diskless.log import producer_state as ps
from diskless.log.partition_log import CLEAN_SHUTDOWN_FILE, PartitionLog
from diskless.protocol.records import InvalidBatch

CONFIG = {"segment_bytes": 700, "index_interval_bytes": 150}


def _populate(directory: Path, batches: int = 30, **config: object) -> tuple[PartitionLog, list[tuple[int, bytes]]]:
    log = open_log(directory, **{**CONFIG, **config})
    rng = random.Random(batches)
    for i in range(batches):
        produce(
            log,
            rng.randint(1, 5),
            tag=f"b{i}",
            now_ms=T0 + i * 10,
            start_ts=T0 + rng.randint(0, batches * 10),  # timestamps go up and down
            ts_step=rng.choice([-3, 0, 5]),
            compression=rng.choice([0, GZIP, SNAPPY]),
            producer_id=1000,
            producer_epoch=0,
            base_sequence=log.log_end_offset,
        )
    assert len(log.segments) > 1
    return log, _contents(log)


def _contents(log: PartitionLog) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in read_records(log)]


def _active_log_file(directory: Path) -> Path:
    return directory / log_files(directory, ".log")[-1]


def _last_batch_position(log: PartitionLog) -> tuple[int, int, int]:
    """(file position, base offset, size) of the last batch of the active segment."""
    loc = list(log.active_segment.iter_batches())[-1]
    return loc.position, loc.base_offset, loc.size


def _reopen(directory: Path, **config: object) -> PartitionLog:
    return open_log(directory, commit=False, **{**CONFIG, **config})


# --- clean shutdown ---------------------------------------------------------------------------


def test_clean_reopen_keeps_everything(tmp_path: Path) -> None:
    log, contents = _populate(tmp_path)
    log.delete_records_before(7)
    contents = _contents(log)
    leo, segments, epochs = log.log_end_offset, [s.base_offset for s in log.segments], log.epochs.latest_epoch
    by_time = log.offset_for_timestamp(T0 + 95)
    log.close(clean=True)
    assert os.path.exists(tmp_path / CLEAN_SHUTDOWN_FILE)

    log = _reopen(tmp_path)
    assert not os.path.exists(tmp_path / CLEAN_SHUTDOWN_FILE), "a later crash must not look clean"
    assert log.recovered_bytes_truncated == 0
    assert log.log_end_offset == leo and log.high_watermark == leo
    assert log.log_start_offset == 7
    assert [s.base_offset for s in log.segments] == segments
    assert log.epochs.latest_epoch == epochs
    assert _contents(log) == contents
    assert log.offset_for_timestamp(T0 + 95) == by_time
    # producer state survived: a retry of the last batch is a duplicate, the next sequence is accepted
    _, last_base, _ = _last_batch_position(log)
    last = batches_of(log.read(last_base, 1).records)[0]
    (count,) = struct.unpack_from(">i", last, 57)
    retry = produce(log, count, tag="retry", producer_id=1000, producer_epoch=0, base_sequence=last_base)
    assert retry.duplicate and retry.base_offset == last_base
    assert log.log_end_offset == leo
    nxt = produce(log, 1, tag="next", producer_id=1000, producer_epoch=0, base_sequence=leo)
    assert not nxt.duplicate and nxt.base_offset == leo
    log.close()


def test_clean_reopen_then_append_and_reopen_again(tmp_path: Path) -> None:
    log, _ = _populate(tmp_path, batches=10)
    log.close()
    for round_ in range(3):
        log = _reopen(tmp_path)
        log.high_watermark = log.log_end_offset
        for i in range(5):
            produce(log, 2, tag=f"r{round_}-{i}")
        contents = _contents(log)
        log.close(clean=round_ % 2 == 0)
        log = _reopen(tmp_path)
        log.high_watermark = log.log_end_offset
        assert _contents(log) == contents
        log.close()


# --- crashes ----------------------------------------------------------------------------------


def test_unclean_reopen_without_damage_keeps_everything(tmp_path: Path) -> None:
    log, contents = _populate(tmp_path)
    leo = log.log_end_offset
    log.close(clean=False)
    log = _reopen(tmp_path)
    assert log.recovered_bytes_truncated == 0
    assert log.log_end_offset == leo
    log.high_watermark = leo
    assert _contents(log) == contents


@pytest.mark.parametrize("garbage", [b"\x00", b"\x00" * 11, b"\xff" * 61, os.urandom(500)])
def test_garbage_tail_is_truncated(tmp_path: Path, garbage: bytes) -> None:
    log, contents = _populate(tmp_path)
    leo = log.log_end_offset
    log.close(clean=False)
    with open(_active_log_file(tmp_path), "ab") as f:
        f.write(garbage)
    log = _reopen(tmp_path)
    assert log.recovered_bytes_truncated == len(garbage)
    assert log.log_end_offset == leo
    log.high_watermark = leo
    assert _contents(log) == contents
    produce(log, 2, tag="after")
    assert _contents(log)[-2:] == [(leo, b"after-0"), (leo + 1, b"after-1")]


@pytest.mark.parametrize("keep", [1, 12, 60, 61, 80])
def test_torn_half_batch_is_truncated(tmp_path: Path, keep: int) -> None:
    log, contents = _populate(tmp_path)
    leo = log.log_end_offset
    log.close(clean=False)
    torn = bytearray(values_batch(6, tag="torn"))
    struct.pack_into(">q", torn, 0, leo)
    with open(_active_log_file(tmp_path), "ab") as f:
        f.write(torn[: min(keep, len(torn) - 1)])
    log = _reopen(tmp_path)
    assert log.recovered_bytes_truncated == min(keep, len(torn) - 1)
    assert log.log_end_offset == leo
    log.high_watermark = leo
    assert _contents(log) == contents


@pytest.mark.parametrize("where", ["crc", "attributes", "records", "last_byte", "length"])
def test_corrupt_last_batch_is_dropped(tmp_path: Path, where: str) -> None:
    log, contents = _populate(tmp_path)
    position, base, size = _last_batch_position(log)
    log.close(clean=False)
    offset_in_batch = {"crc": 18, "attributes": 22, "records": 61, "last_byte": size - 1, "length": 11}[where]
    path = _active_log_file(tmp_path)
    with open(path, "r+b") as f:
        f.seek(position + offset_in_batch)
        byte = f.read(1)
        f.seek(position + offset_in_batch)
        f.write(bytes([byte[0] ^ 0x5A]))
    log = _reopen(tmp_path)
    assert log.recovered_bytes_truncated == size
    assert log.log_end_offset == base
    assert os.path.getsize(path) == position
    log.high_watermark = base
    assert _contents(log) == [c for c in contents if c[0] < base]


def test_corrupt_batch_in_the_middle_of_the_active_segment_drops_the_rest(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(6):
        produce(log, 2, tag=f"b{i}")
    contents = _contents(log)
    middle = list(log.active_segment.iter_batches())[3]
    log.close(clean=False)
    with open(_active_log_file(tmp_path), "r+b") as f:
        f.seek(middle.position + 40)
        f.write(b"\xee")
    log = _reopen(tmp_path)
    assert log.log_end_offset == middle.base_offset == 6
    log.high_watermark = log.log_end_offset
    assert _contents(log) == contents[:6]


def test_crash_recovery_truncates_epochs_and_producer_state(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(3):
        produce(log, 2, tag=f"a{i}", epoch=1, producer_id=5, producer_epoch=0, base_sequence=2 * i)
    produce(log, 2, tag="b", epoch=2, producer_id=5, producer_epoch=0, base_sequence=6)
    assert log.epochs.latest_epoch == 2
    position, base, _ = _last_batch_position(log)
    log.close(clean=False)
    with open(_active_log_file(tmp_path), "r+b") as f:
        f.truncate(position + 30)  # the epoch-2 batch is torn
    log = _reopen(tmp_path)
    assert log.log_end_offset == base == 6
    assert log.epochs.latest_epoch == 1
    assert log.epochs.end_offset_for(1, log.log_end_offset) == (1, 6)
    log.high_watermark = log.log_end_offset
    # the lost batch is not remembered: its retry is appended, and the one before is still a duplicate
    dup = produce(log, 2, tag="a2", producer_id=5, producer_epoch=0, base_sequence=4)
    assert dup.duplicate and dup.base_offset == 4
    retry = produce(log, 2, tag="b", epoch=2, producer_id=5, producer_epoch=0, base_sequence=6)
    assert not retry.duplicate and retry.base_offset == 6


def test_stale_snapshot_beyond_the_recovered_end_is_ignored(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(4):
        produce(log, 1, tag=f"s{i}", producer_id=9, producer_epoch=0, base_sequence=i)
    position, base, _ = _last_batch_position(log)
    log.close(clean=True)  # snapshot at offset 4
    os.unlink(tmp_path / CLEAN_SHUTDOWN_FILE)  # ... but then the machine crashed and lost the last write
    with open(_active_log_file(tmp_path), "r+b") as f:
        f.truncate(position + 5)
    log = _reopen(tmp_path)
    assert log.log_end_offset == base == 3
    log.high_watermark = 3
    assert not any(name.startswith(f"{4:020d}") for name in os.listdir(tmp_path))
    result = produce(log, 1, tag="s3", producer_id=9, producer_epoch=0, base_sequence=3)
    assert not result.duplicate and result.base_offset == 3


def test_snapshot_below_the_log_start_is_not_used(tmp_path: Path) -> None:
    """A snapshot older than the log start misses the deleted batches between them: replaying
    from the log start left producer 9 at sequence 1 and refused its next batch as out of order.
    As Kafka, the snapshot is dropped and a producer known only from deleted batches is unknown."""
    log = open_log(tmp_path)
    produce(log, 2, tag="a", producer_id=9, producer_epoch=0, base_sequence=0)
    produce(log, 2, tag="b", producer_id=9, producer_epoch=0, base_sequence=2, roll=True)  # snapshot at 2
    produce(log, 2, tag="c", producer_id=7, producer_epoch=0, base_sequence=0)
    log.delete_records_before(4)
    log.close(clean=False)
    log = _reopen(tmp_path)
    assert log.log_start_offset == 4 and 9 not in log.producer_state.producers
    log.high_watermark = log.log_end_offset
    assert produce(log, 1, tag="d", producer_id=9, producer_epoch=0, base_sequence=4).base_offset == 6
    assert produce(log, 1, tag="e", producer_id=7, producer_epoch=0, base_sequence=2).base_offset == 7
    with pytest.raises(InvalidBatch):
        produce(log, 1, tag="f", producer_id=7, producer_epoch=0, base_sequence=9)


def test_batch_cut_by_delete_records_still_counts_for_its_producer_after_a_crash(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = produce(log, 10, producer_id=9, producer_epoch=0, base_sequence=0)
    log.delete_records_before(5)
    log.close(clean=False)  # no snapshot: the state is replayed from the log start
    log = _reopen(tmp_path)
    log.high_watermark = log.log_end_offset
    retry = produce(log, 10, producer_id=9, producer_epoch=0, base_sequence=0)
    assert retry.duplicate and retry.base_offset == first.base_offset and log.log_end_offset == 10
    with pytest.raises(InvalidBatch):
        produce(log, 1, producer_id=9, producer_epoch=0, base_sequence=15)
    assert produce(log, 1, producer_id=9, producer_epoch=0, base_sequence=10).base_offset == 10


def test_truncating_fully_forgets_every_producer(tmp_path: Path) -> None:
    """Kafka's truncateFullyAndStartAt clears the producers and deletes every snapshot: none
    describes the new log, not one that happens to sit at the offset it starts at."""
    log = open_log(tmp_path)
    produce(log, 2, producer_id=9, producer_epoch=0, base_sequence=0)
    produce(log, 2, producer_id=9, producer_epoch=0, base_sequence=2, roll=True)  # snapshot at 2
    log.truncate_fully_and_start_at(2, T0)
    assert log.producer_state.producers == {} and ps.list_snapshots(str(tmp_path)) == []
    # Leading now, it takes the producer where its sequence is (it went on in the log that was
    # dropped), instead of refusing it against the snapshot's sequence 1.
    assert produce(log, 1, producer_id=9, producer_epoch=0, base_sequence=40).base_offset == 2


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("suffixes", [(".index",), (".timeindex",), (".index", ".timeindex")])
def test_reopen_after_index_files_are_deleted(tmp_path: Path, clean: bool, suffixes: tuple[str, ...]) -> None:
    log, contents = _populate(tmp_path, batches=40)
    assert len(log.segments) > 3
    leo = log.log_end_offset
    targets = list(range(T0 - 5, T0 + 40 * 10 + 5, 7))
    by_time = {t: log.offset_for_timestamp(t) for t in targets}
    max_ts = log.offset_of_max_timestamp()
    segment_max = [s.max_timestamp for s in log.segments]
    log.close(clean=clean)
    for suffix in suffixes:
        for name in log_files(tmp_path, suffix):
            os.unlink(tmp_path / name)

    log = _reopen(tmp_path)
    assert log.recovered_bytes_truncated == 0
    assert log.log_end_offset == leo
    log.high_watermark = leo
    assert _contents(log) == contents
    assert {t: log.offset_for_timestamp(t) for t in targets} == by_time
    assert log.offset_of_max_timestamp() == max_ts
    assert [s.max_timestamp for s in log.segments] == segment_max
    # the indexes exist again and hold entries for every segment
    for segment in log.segments:
        assert len(segment.offset_index) > 0
        assert segment.time_index.last_entry() is not None
        assert os.path.getsize(segment.offset_index._file.path) > 0
        assert os.path.getsize(segment.time_index._file.path) > 0
    # retention by time sees the real segment timestamps, not ones lost with the time index
    log.update_config(log.config.__class__(**CONFIG, retention_ms=10**9))
    assert log.apply_retention(T0 + 1000) == 0
    log.close()
    log = _reopen(tmp_path)
    log.high_watermark = log.log_end_offset
    assert _contents(log) == contents


def test_corrupt_index_files_are_rebuilt(tmp_path: Path) -> None:
    log, contents = _populate(tmp_path)
    log.close(clean=True)
    for name in log_files(tmp_path, ".index"):
        with open(tmp_path / name, "ab") as f:
            f.write(b"\x01\x02\x03")  # not a whole entry
    for name in log_files(tmp_path, ".timeindex"):
        with open(tmp_path / name, "r+b") as f:
            f.write(struct.pack(">qi", 2**62, 0))  # timestamps no longer increase
    log = _reopen(tmp_path)
    log.high_watermark = log.log_end_offset
    assert _contents(log) == contents
    assert log.offset_for_timestamp(T0 + 100) is not None


def test_high_watermark_checkpoint(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    produce(log, 5)
    log.high_watermark = 3
    log.close(clean=True)
    log = _reopen(tmp_path)
    assert log.log_end_offset == 5 and log.high_watermark == 3
    log.close(clean=False)
    log = _reopen(tmp_path)
    assert log.high_watermark <= log.log_end_offset


def test_empty_directory_and_empty_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.close(clean=False)
    log = _reopen(tmp_path)
    assert log.log_end_offset == 0 and log.log_start_offset == 0
    produce(log, 2)
    log.roll(T0)  # leaves an empty active segment at 2
    log.close(clean=False)
    log = _reopen(tmp_path)
    assert log.log_end_offset == 2
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.high_watermark = 2
    assert [r.offset for r in read_records(log)] == [0, 1]

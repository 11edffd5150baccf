"""The fsync policy of a partition log: ``flush.messages`` after appends, ``flush.ms`` by a periodic
pass with the time passed in (Kafka's UnifiedLog.append and LogManager.flushDirtyLogs)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from loghelpers import T0, open_log, produce

from diskless.log.partition_log import PartitionLog
from diskless.log.segment import LogSegment


def _count_segment_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Base offsets of the segments fsynced (each with its indexes), in order."""
    synced: list[int] = []
    real = LogSegment.fsync

    def counting(self: LogSegment) -> None:
        synced.append(self.base_offset)
        real(self)

    monkeypatch.setattr(LogSegment, "fsync", counting)
    return synced


def _copy_to_follower(leader: PartitionLog, follower: PartitionLog) -> None:
    data = leader.read(follower.log_end_offset, 1 << 20, max_offset=leader.log_end_offset).records
    follower.append_as_follower(data, T0)


# --- flush.messages --------------------------------------------------------------------------------


def test_the_default_never_flushes_by_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path)
    synced = _count_segment_fsyncs(monkeypatch)
    for _ in range(50):
        produce(log, 3)
    assert synced == []
    assert log.unflushed_messages == 150


def test_flush_messages_flushes_once_that_many_records_are_unflushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path, flush_messages=3)
    synced = _count_segment_fsyncs(monkeypatch)
    produce(log, 1)
    produce(log, 1)
    assert synced == [] and log.unflushed_messages == 2
    produce(log, 1)
    assert synced == [0] and log.unflushed_messages == 0 and log.recovery_point == 3
    produce(log, 5)  # one append of more than flush.messages: one flush after it, as in Kafka
    assert synced == [0, 0] and log.recovery_point == 8


def test_flush_messages_one_fsyncs_every_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, flush_messages=1)
    synced = _count_segment_fsyncs(monkeypatch)
    for _ in range(4):
        produce(log, 2)
    assert synced == [0, 0, 0, 0]
    log.append_marker_as_leader(7, 0, True, 0, 0, T0)  # a transaction marker is an append too
    assert len(synced) == 5 and log.unflushed_messages == 0


def test_flush_messages_counts_from_the_last_roll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A roll fsyncs the segment it closes, so the count starts again there (Kafka's roll flushes)."""
    log = open_log(tmp_path, flush_messages=4)
    synced = _count_segment_fsyncs(monkeypatch)
    produce(log, 3)
    log.roll(T0)
    assert synced == [0] and log.unflushed_messages == 0
    produce(log, 3)
    assert synced == [0]
    produce(log, 1)
    assert synced == [0, 3]


def test_a_follower_honours_flush_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", commit=False, flush_messages=5)
    for _ in range(3):
        produce(leader, 2)
    synced = _count_segment_fsyncs(monkeypatch)
    _copy_to_follower(leader, follower)  # three batches, six records, one append
    assert synced == [0] and follower.unflushed_messages == 0


def test_truncation_below_the_recovery_point_lowers_it(tmp_path: Path) -> None:
    log = open_log(tmp_path, flush_messages=4)
    produce(log, 2)
    produce(log, 2)
    assert log.recovery_point == 4
    log.truncate_to(2, T0)
    assert log.recovery_point == 2 and log.unflushed_messages == 0


def test_after_a_crash_the_active_segment_counts_as_unflushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its entries were read back from the page cache at best; a clean shutdown synced them."""
    log = open_log(tmp_path)
    produce(log, 3)
    log.roll(T0)
    produce(log, 2)
    log.close(clean=False)
    reopened = open_log(tmp_path, flush_messages=3)
    assert reopened.recovery_point == 3 and reopened.unflushed_messages == 2
    synced = _count_segment_fsyncs(monkeypatch)
    produce(reopened, 1)
    assert synced == [3]
    reopened.close(clean=True)
    assert open_log(tmp_path).unflushed_messages == 0


# --- flush.ms --------------------------------------------------------------------------------------


def test_flush_ms_flushes_a_log_whose_last_flush_is_that_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, now_ms=T0, flush_ms=1_000)
    synced = _count_segment_fsyncs(monkeypatch)
    produce(log, 2, now_ms=T0 + 100)
    assert not log.flush_if_stale(T0 + 999)  # the log's creation counts as its last flush
    assert log.flush_if_stale(T0 + 1_000)
    assert synced == [0] and log.last_flush_ms == T0 + 1_000 and log.unflushed_messages == 0
    produce(log, 1, now_ms=T0 + 1_500)
    assert not log.flush_if_stale(T0 + 1_999)
    assert log.flush_if_stale(T0 + 2_000)
    assert synced == [0, 0]


def test_flush_ms_skips_a_log_with_nothing_unflushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, flush_ms=0)
    produce(log, 2)
    log.roll(T0)  # the roll synced everything
    synced = _count_segment_fsyncs(monkeypatch)
    assert not log.flush_if_stale(T0 + 10**6)
    assert synced == []


def test_the_default_flush_ms_never_flushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path)
    produce(log, 2)
    synced = _count_segment_fsyncs(monkeypatch)
    assert not log.flush_if_stale(T0 + 10**12)
    assert synced == []


def test_the_broker_pass_flushes_only_stale_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diskless.broker.broker import Broker
    from diskless.config import load_config

    broker = Broker(load_config(environ={}, overrides={"log.dirs": str(tmp_path / "data")}))
    fast = open_log(tmp_path / "fast", flush_ms=500)
    slow = open_log(tmp_path / "slow", flush_ms=60_000)
    never = open_log(tmp_path / "never")
    for plog in (fast, slow, never):
        produce(plog, 3)
    logs = {"fast": fast, "slow": slow, "never": never}
    broker.replicas.partitions = {(name, 0): SimpleNamespace(log=plog) for name, plog in logs.items()}
    monkeypatch.setattr(broker, "now_ms", lambda: T0 + 1_000)
    assert broker.flush_dirty_logs() == 1
    assert (fast.unflushed_messages, slow.unflushed_messages, never.unflushed_messages) == (0, 3, 3)

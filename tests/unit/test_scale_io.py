"""Per-partition costs that decide whether 10,000 partitions fit on a broker (issue 9, scale).

Becoming leader of thousands of partitions must not fsync a file each; applying the whole
metadata at broker start must leave the event loop turns (the etcd lease refresh needs several);
and what is deferred must still be recovered after a crash.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
from loghelpers import open_log, produce

from diskless.broker.broker import APPLY_SLICE_S
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.log.config import LogConfig
from diskless.log.leader_epoch import LeaderEpochCache
from diskless.log.partition_log import CLEAN_SHUTDOWN_FILE, EPOCH_FILE, PartitionLog

NODE = 1
APPLY_S = 0.002


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


# --- leader epoch checkpoint ---------------------------------------------------------------------


def test_becoming_leader_does_not_fsync_the_epoch_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~3,300 leaderships per broker at creation: one fsync each took most of a minute under load."""
    logs = [PartitionLog(str(tmp_path / f"t-{i}"), LogConfig(), 0) for i in range(20)]
    fsyncs = _count_fsyncs(monkeypatch)
    for plog in logs:
        plog.epochs.assign(0, plog.log_end_offset)  # what Partition._become_leader does
    assert fsyncs == []
    # Still written (a process crash keeps it: the page cache survives), just not forced to disk.
    assert LeaderEpochCache(str(tmp_path / "t-0" / EPOCH_FILE)).latest_epoch == 0


def test_epoch_file_is_made_durable_at_roll_flush_and_clean_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path)
    produce(log, 2, epoch=3)
    fsyncs = _count_fsyncs(monkeypatch)
    epoch_fd_synced = len(fsyncs)
    log.roll(0)
    assert len(fsyncs) > epoch_fd_synced  # segment + indexes + epoch file
    assert not log.epochs.dirty
    produce(log, 2, epoch=4)
    assert log.epochs.dirty
    log.flush(0)
    assert not log.epochs.dirty
    produce(log, 2, epoch=5)
    log.close(clean=True)
    assert LeaderEpochCache(str(tmp_path / EPOCH_FILE)).latest_epoch == 5


def test_unclean_reopen_rebuilds_epochs_lost_from_the_active_segment(tmp_path: Path) -> None:
    """Power loss can lose epoch file writes that were never fsynced: the entries of the active
    segment (older segments' entries were made durable when they rolled) come back from the
    batch headers, as Kafka's segment recovery does."""
    log = open_log(tmp_path)
    produce(log, 2, epoch=1)
    log.roll(0)  # epoch file durable with (1, 0)
    durable = (tmp_path / EPOCH_FILE).read_bytes()
    produce(log, 2, epoch=2)
    produce(log, 2, epoch=4)
    log.close(clean=False)
    (tmp_path / EPOCH_FILE).write_bytes(durable)  # the later, unsynced versions were lost
    log = open_log(tmp_path, commit=False)
    assert log.epochs.latest_epoch == 4
    assert log.epochs.end_offset_for(1, log.log_end_offset) == (1, 2)
    assert log.epochs.end_offset_for(2, log.log_end_offset) == (2, 4)
    assert log.epochs.end_offset_for(3, log.log_end_offset) == (2, 4)
    log.close(clean=True)


def test_unclean_reopen_with_no_epoch_file_at_all(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    produce(log, 2, epoch=7)
    log.close(clean=False)
    os.unlink(tmp_path / EPOCH_FILE)
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    log = open_log(tmp_path, commit=False)
    assert log.epochs.latest_epoch == 7
    log.close(clean=True)


def test_a_fresh_log_writes_no_epoch_file(tmp_path: Path) -> None:
    """A follower replica that never received data has no epochs: no file per partition for it."""
    log = PartitionLog(str(tmp_path), LogConfig(), 0)
    log.close(clean=False)
    log = PartitionLog(str(tmp_path), LogConfig(), 0)
    log.close(clean=True)
    assert not (tmp_path / EPOCH_FILE).exists()


# --- applying the whole metadata at broker start ---------------------------------------------------


async def test_apply_all_leaves_the_event_loop_turns_within_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart with 10,000 hosted replicas applied them without yielding: the lease keepalive
    (its own task) could not run for the whole stretch and the broker lost its lease."""
    from diskless.broker.broker import Broker

    broker = Broker(BrokerConfig(node_id=NODE, log_dirs=str(tmp_path / "broker")))
    count = 300
    broker.metadata.topics["t"] = TopicMetadata(
        "t", uuid.uuid4().hex, [PartitionState([NODE], NODE, 0, [NODE]) for _ in range(count)]
    )
    real_apply = broker.replicas.apply
    ticks = 0  # event loop turns taken by another task so far
    turns_seen: list[int] = []  # for each apply, how many turns the other task had taken before it

    def slow_apply(*args: object) -> object:
        time.sleep(APPLY_S)  # a loaded disk: creating a log takes milliseconds
        turns_seen.append(ticks)
        return real_apply(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(broker.replicas, "apply", slow_apply)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await broker._apply_all()
    task.cancel()
    assert len(turns_seen) == count and len(broker.replicas.partitions) == count
    # Counted in applies, not seconds, so a loaded machine cannot fail it: each apply takes at
    # least APPLY_S, so the loop must turn at least every APPLY_SLICE_S / APPLY_S + 1 applies.
    # Unyielding, the one stretch is all 300.
    longest = max(sum(1 for seen in turns_seen if seen == turn) for turn in set(turns_seen))
    assert longest <= APPLY_SLICE_S / APPLY_S + 2, f"{longest} applies of {count} without a loop turn"
    await broker.replicas.close()


def test_a_partition_taking_a_role_is_not_an_info_line(tmp_path: Path) -> None:
    """One info line per partition is 10,000 lines (and their formatting) per broker at creation."""
    import structlog

    from diskless.broker.replica_manager import ReplicaManager

    manager = ReplicaManager(str(tmp_path), NODE, lambda _: None, 500, 1 << 20, lambda _: None, None)
    topic = TopicMetadata("t", uuid.uuid4().hex, [PartitionState([NODE], NODE, 0, [NODE]) for _ in range(3)])
    with structlog.testing.capture_logs() as logs:
        for index in range(3):
            manager.apply(topic, index, LogConfig(), 0)
        manager.log_role_summary()
    roles = [entry for entry in logs if entry["event"] == "partition role"]
    assert len(roles) == 3 and {entry["log_level"] for entry in roles} == {"debug"}
    (summary,) = [entry for entry in logs if entry["log_level"] == "info"]
    assert summary["event"] == "partition roles" and summary["topics"] == {"t": {"leader": 3}}
    assert summary["first_role_topics"] == ["t"]
    asyncio.run(manager.close())


# --- one high-watermark checkpoint file per log directory -------------------------------------------


def _manager(log_dir: Path) -> object:
    from diskless.broker.replica_manager import ReplicaManager

    return ReplicaManager(str(log_dir), NODE, lambda _: None, 500, 1 << 20, lambda _: None, None)


def _hosted(log_dir: Path, topic: TopicMetadata, hws: list[int]) -> object:
    """A manager hosting every partition of ``topic`` as leader, each with len(hws) > i records."""
    manager = _manager(log_dir)
    for index, hw in enumerate(hws):
        replica = manager.apply(topic, index, LogConfig(), 0)  # type: ignore[attr-defined]
        produce(replica.log, 10, commit=False)
        replica.log.high_watermark = hw
    return manager


def _leader_topic(count: int) -> TopicMetadata:
    return TopicMetadata("t", uuid.uuid4().hex, [PartitionState([NODE], NODE, 0, [NODE]) for _ in range(count)])


def _reload(log_dir: Path, topic: TopicMetadata) -> dict[int, int]:
    manager = _manager(log_dir)
    manager.load({topic.name: topic}, lambda _: LogConfig(), 0)  # type: ignore[attr-defined]
    hws = {index: p.log.high_watermark for (_, index), p in manager.partitions.items()}  # type: ignore[attr-defined]
    asyncio.run(manager.close())  # type: ignore[attr-defined]
    return hws


def _per_partition_hw_files(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*/high-watermark-checkpoint*"))


def test_high_watermarks_round_trip_through_one_file_per_log_dir(tmp_path: Path) -> None:
    """Kafka keeps ONE replication-offset-checkpoint per log dir: 10,000 files rewritten every
    5 s cost seconds of event loop under load."""
    from diskless.broker.replica_manager import HW_CHECKPOINT_FILE

    topic = _leader_topic(4)
    manager = _hosted(tmp_path, topic, [3, 0, 10, 7])
    manager.checkpoint_high_watermarks()  # type: ignore[attr-defined]
    assert (tmp_path / HW_CHECKPOINT_FILE).is_file()
    assert _per_partition_hw_files(tmp_path) == []
    for replica in manager.partitions.values():  # type: ignore[attr-defined]
        replica.log.close(clean=False)  # a crash: only the periodic checkpoint survives
    assert _reload(tmp_path, topic) == {0: 3, 1: 0, 2: 10, 3: 7}


def test_high_watermark_checkpoint_survives_a_crash_while_writing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written to a temporary file, synced, then renamed over the old one: a crash before the
    rename leaves the previous checkpoint whole (a torn file would lose every partition's HW)."""
    from diskless.broker.replica_manager import HW_CHECKPOINT_FILE

    topic = _leader_topic(2)
    manager = _hosted(tmp_path, topic, [4, 5])
    manager.checkpoint_high_watermarks()  # type: ignore[attr-defined]
    before = (tmp_path / HW_CHECKPOINT_FILE).read_bytes()
    for replica in manager.partitions.values():  # type: ignore[attr-defined]
        replica.log.high_watermark = 9

    def crash(*_: object) -> None:
        raise OSError("crashed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        manager.checkpoint_high_watermarks()  # type: ignore[attr-defined]
    monkeypatch.undo()
    assert (tmp_path / HW_CHECKPOINT_FILE).read_bytes() == before
    for replica in manager.partitions.values():  # type: ignore[attr-defined]
        replica.log.close(clean=False)
    assert _reload(tmp_path, topic) == {0: 4, 1: 5}


def test_clean_shutdown_writes_the_one_file_and_no_per_partition_files(tmp_path: Path) -> None:
    topic = _leader_topic(3)
    manager = _hosted(tmp_path, topic, [1, 2, 3])
    asyncio.run(manager.close())  # type: ignore[attr-defined]
    assert _per_partition_hw_files(tmp_path) == []
    assert _reload(tmp_path, topic) == {0: 1, 1: 2, 2: 3}


def test_upgrade_reads_per_partition_files_then_drops_them(tmp_path: Path) -> None:
    from diskless.log.partition_log import HW_FILE

    topic = _leader_topic(2)
    manager = _hosted(tmp_path, topic, [0, 0])
    for replica in manager.partitions.values():  # type: ignore[attr-defined]
        replica.log.close(clean=False)
    (tmp_path / "t-0" / HW_FILE).write_text("6")  # what the previous version left
    (tmp_path / "t-1" / HW_FILE).write_text("8")
    manager = _manager(tmp_path)
    manager.load({"t": topic}, lambda _: LogConfig(), 0)  # type: ignore[attr-defined]
    assert {i: p.log.high_watermark for (_, i), p in manager.partitions.items()} == {0: 6, 1: 8}  # type: ignore[attr-defined]
    manager.checkpoint_high_watermarks()  # type: ignore[attr-defined]
    assert _per_partition_hw_files(tmp_path) == []
    asyncio.run(manager.close())  # type: ignore[attr-defined]
    assert _reload(tmp_path, topic) == {0: 6, 1: 8}


def test_checkpoint_of_an_older_incarnation_is_not_applied(tmp_path: Path) -> None:
    """Entries name the topic id: a topic re-created under the same name does not inherit the old
    incarnation's high watermarks (a follower would serve reads above its real HW)."""
    from diskless.broker.replica_manager import HW_CHECKPOINT_FILE

    old = _leader_topic(1)
    manager = _hosted(tmp_path, old, [9])
    manager.checkpoint_high_watermarks()  # type: ignore[attr-defined]
    saved = (tmp_path / HW_CHECKPOINT_FILE).read_bytes()
    new = _leader_topic(1)
    manager.on_topic(new, LogConfig())  # type: ignore[attr-defined]
    replica = manager.apply(new, 0, LogConfig(), 0)  # type: ignore[attr-defined]
    produce(replica.log, 10, commit=False)
    replica.log.high_watermark = 2
    replica.log.close(clean=False)
    (tmp_path / HW_CHECKPOINT_FILE).write_bytes(saved)  # crashed before the next checkpoint
    assert _reload(tmp_path, new) == {0: 0}


# --- ISR changes of thousands of partitions at once ---------------------------------------------------


async def test_isr_proposals_are_bounded_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After creating 10,000 partitions, a leader shrank ~3,000 ISRs in one pass, each an etcd
    transaction started at once: the lease refresh queued behind them on the same client and
    timed out (broker fenced, partitions moved). Proposals beyond a small bound wait their turn."""
    from diskless.broker import broker as broker_module
    from diskless.broker.broker import Broker

    broker = Broker(BrokerConfig(node_id=NODE, log_dirs=str(tmp_path / "broker")))
    count = 200
    broker.metadata.topics["t"] = TopicMetadata(
        "t", uuid.uuid4().hex, [PartitionState([NODE, 2], NODE, 0, [NODE, 2]) for _ in range(count)]
    )
    await broker._apply_all()
    in_flight = 0
    peak = 0
    done = 0

    async def update_partition(*_: object) -> bool:
        nonlocal in_flight, peak, done
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        done += 1
        return True

    monkeypatch.setattr(broker.backend, "update_partition", update_partition)
    for partition in broker.replicas.leading():
        broker._propose_isr(partition, [NODE])
    deadline = time.monotonic() + 30
    while done < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert done == count
    assert peak <= 32, f"{peak} ISR transactions in flight at once"
    assert peak <= broker_module.ISR_PROPOSALS_IN_FLIGHT
    await broker.replicas.close()

"""The broker's log cleaner (broker/log_cleaner.py): which log it cleans first, how it backs off a log
whose pass fails, and that settings are read at every pass."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from batches import Record, make_batch
from loghelpers import T0, open_log

from diskless.broker.log_cleaner import LogCleaner
from diskless.log import cleaner
from diskless.log.config import CleanerConfig
from diskless.log.partition_log import PartitionLog
from diskless.metrics import LOG_CLEANER_DIRTIEST_RATIO, LOG_CLEANER_LAST_PASS, LOG_CLEANER_UNCLEANABLE

COMPACT: dict[str, Any] = {"cleanup_policy": "compact", "min_cleanable_dirty_ratio": 0.0}


def compacted_log(directory: Path, versions: int, **config: Any) -> PartitionLog:
    """``versions`` segments each rewriting the same two keys, then an active segment."""
    log = open_log(directory, **{**COMPACT, **config})
    for v in range(versions + 1):
        if v:
            log.roll(T0)
        batch = make_batch([Record(b"%d" % v, key=b"a"), Record(b"%d" % v, key=b"b")], base_timestamp=T0)
        log.append_as_leader([memoryview(batch)], 0, T0)
        log.high_watermark = log.log_end_offset
    return log


def make_cleaner(logs: dict[str, PartitionLog], tmp_path: Path, settings: CleanerConfig | None = None) -> LogCleaner:
    current = settings or CleanerConfig()
    return LogCleaner(lambda: logs.items(), lambda: T0, lambda: current, str(tmp_path))


def test_the_dirtiest_log_goes_first_and_an_overdue_one_before_it(tmp_path: Path) -> None:
    # ratio 1.0 for both at first; "clean" already passed once, so a new segment makes it less dirty
    dirty = compacted_log(tmp_path / "dirty-0", 4)
    cleaned_once = compacted_log(tmp_path / "once-0", 4)
    job = cleaner.prepare(cleaned_once, T0)
    assert job is not None
    output = cleaner.run(job, 1000)
    assert output is not None and cleaner.install(output)
    cleaned_once.roll(T0)
    batch = make_batch([Record(b"new", key=b"a")], base_timestamp=T0)
    cleaned_once.append_as_leader([memoryview(batch)], 0, T0)
    cleaned_once.high_watermark = cleaned_once.log_end_offset
    logs = {"once": cleaned_once, "dirty": dirty}
    picked = make_cleaner(logs, tmp_path).pick()
    assert picked is not None and picked[0] == "dirty"
    # max.compaction.lag.ms passed for the less dirty one: it goes first
    cleaned_once.update_config(cleaned_once.config.__class__(**{**COMPACT, "max_compaction_lag_ms": 1}))
    overdue = make_cleaner(logs, tmp_path)
    overdue._now_ms = lambda: T0 + 10_000  # type: ignore[method-assign]
    picked = overdue.pick()
    assert picked is not None and picked[0] == "once" and picked[1].plan.overdue


def test_a_pass_cleans_and_the_next_finds_nothing(tmp_path: Path) -> None:
    log = compacted_log(tmp_path / "t-0", 4)
    task = make_cleaner({"t": log}, tmp_path)
    assert asyncio.run(task.clean_once())
    assert task.passes == 1 and len(log.segments) == 2
    assert LOG_CLEANER_LAST_PASS._value.get() == T0 / 1000
    assert not asyncio.run(task.clean_once())


def test_a_failing_log_is_left_alone_for_ten_backoffs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = compacted_log(tmp_path / "t-0", 4)
    now = [T0]
    task = LogCleaner(lambda: {"t": log}.items(), lambda: now[0], lambda: CleanerConfig(backoff_ms=100), str(tmp_path))

    def broken(job: cleaner.CleaningJob, entries: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(cleaner, "run", broken)
    assert not asyncio.run(task.clean_once())
    assert task.pick() is None  # backing off
    assert LOG_CLEANER_UNCLEANABLE._value.get() == 1 and LOG_CLEANER_DIRTIEST_RATIO._value.get() == 0.0
    now[0] += 1000
    assert task.pick() is not None
    assert LOG_CLEANER_UNCLEANABLE._value.get() == 0 and LOG_CLEANER_DIRTIEST_RATIO._value.get() == 1.0


def test_settings_are_read_at_every_pass(tmp_path: Path) -> None:
    """A dynamic log.cleaner.dedupe.buffer.size applies from the next pass: a map too small for one
    batch's two keys fails the pass (the log backs off), the larger one cleans it."""
    log = compacted_log(tmp_path / "t-0", 4)
    now = [T0]
    settings = [CleanerConfig(dedupe_buffer_size=128, backoff_ms=100)]  # one key: no batch fits
    task = LogCleaner(lambda: {"t": log}.items(), lambda: now[0], lambda: settings[0], str(tmp_path))
    assert not asyncio.run(task.clean_once())
    assert task.passes == 0 and len(log.segments) == 5
    settings[0] = CleanerConfig()
    now[0] += 10 * 100  # the failed log's backoff
    assert asyncio.run(task.clean_once())
    assert task.passes == 1 and len(log.segments) == 2

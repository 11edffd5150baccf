"""The broker's log cleaner: compacts its hosted ``cleanup.policy=compact`` logs, one at a time.

Kafka's LogCleaner with ``log.cleaner.threads=1``: every pass takes the log that most needs it
(overdue for ``max.compaction.lag.ms`` first, then the highest dirty ratio over
``min.cleanable.dirty.ratio``), rewrites it in a worker thread and installs the result on the
event loop (``log/cleaner.py`` says why that is safe); when no log needs cleaning it waits
``log.cleaner.backoff.ms``. Every replica cleans its own copy, leader or follower, as in Kafka.
A log whose pass fails is logged and left alone for ten backoffs (Kafka marks it uncleanable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from diskless.log import cleaner
from diskless.log.config import CleanerConfig
from diskless.log.partition_log import PartitionLog
from diskless.metrics import (
    LOG_CLEANER_BYTES,
    LOG_CLEANER_DIRTIEST_RATIO,
    LOG_CLEANER_LAST_PASS,
    LOG_CLEANER_PASSES,
    LOG_CLEANER_UNCLEANABLE,
)

log = structlog.get_logger(__name__)

_FAILURE_BACKOFFS = 10


class LogCleaner:
    def __init__(
        self,
        logs: Callable[[], Iterable[tuple[Any, PartitionLog]]],
        now_ms: Callable[[], int],
        settings: Callable[[], CleanerConfig],
        log_dir: str,
    ) -> None:
        """``settings`` is asked at every pass: the dynamic log.cleaner.* values apply from the next."""
        self._logs = logs
        self._now_ms = now_ms
        self._settings = settings
        self._log_dir = log_dir
        self._failed_until: dict[Any, int] = {}  # partition key -> when to try it again
        self.passes = 0

    async def run_forever(self) -> None:
        cleaner.remove_scratch(self._log_dir)
        while True:
            try:
                cleaned = await self.clean_once()
            except Exception:  # a bug must not stop compaction for every log of the broker
                log.exception("log cleaner pass failed")
                cleaned = False
            if not cleaned:
                await asyncio.sleep(self._settings().backoff_ms / 1000)

    def pick(self) -> tuple[Any, cleaner.CleaningJob] | None:
        """The log that most needs cleaning now, with its job (Kafka's grabFilthiestCompactedLog)."""
        now = self._now_ms()
        best: tuple[Any, cleaner.CleaningJob] | None = None
        for key, plog in self._logs():
            if not plog.config.compact or self._failed_until.get(key, 0) > now:
                continue
            job = cleaner.prepare(plog, now)
            if job is None:
                continue
            urgency = (job.plan.overdue, job.plan.dirty_ratio)
            if best is None or urgency > (best[1].plan.overdue, best[1].plan.dirty_ratio):
                best = (key, job)
        LOG_CLEANER_DIRTIEST_RATIO.set(best[1].plan.dirty_ratio if best is not None else 0.0)
        LOG_CLEANER_UNCLEANABLE.set(sum(1 for until in self._failed_until.values() if until > now))
        return best

    async def clean_once(self) -> bool:
        """Clean the log that most needs it; False when none did (or its pass gave up)."""
        picked = self.pick()
        if picked is None:
            return False
        key, job = picked
        settings = self._settings()
        job.io_max_bytes_per_second = settings.io_max_bytes_per_second
        try:
            output = await asyncio.to_thread(cleaner.run, job, max(1, settings.max_map_entries))
        except asyncio.CancelledError:
            job.cancelled = True  # the worker stops at its next batch
            raise
        except Exception:
            log.exception("cleaning failed; the log is left alone for a while", partition=key)
            self._failed_until[key] = self._now_ms() + _FAILURE_BACKOFFS * settings.backoff_ms
            LOG_CLEANER_PASSES.labels("failed").inc()
            return False
        if output is None:
            LOG_CLEANER_PASSES.labels("gave_up").inc()
            return False
        if not cleaner.install(output):
            LOG_CLEANER_PASSES.labels("log_changed").inc()
            return False
        self.passes += 1
        LOG_CLEANER_PASSES.labels("installed").inc()
        LOG_CLEANER_LAST_PASS.set(self._now_ms() / 1000)
        LOG_CLEANER_BYTES.labels("read").inc(output.bytes_before)
        LOG_CLEANER_BYTES.labels("written").inc(output.bytes_after)
        log.info(
            "cleaned log",
            partition=key,
            segments=output.replaced,
            into=len(output.segments),
            bytes_before=output.bytes_before,
            bytes_after=output.bytes_after,
            dirty_ratio=round(job.plan.dirty_ratio, 3),
            next_dirty_offset=output.map_end,
        )
        return True

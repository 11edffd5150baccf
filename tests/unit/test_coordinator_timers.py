"""A coordinator timer pass that raises is tried again shortly: neither left unarmed (no session or
transaction timeout would fire until some request came) nor re-armed at a deadline it did not
move (a busy loop)."""

from __future__ import annotations

import asyncio
import time

import pytest

from diskless.broker import coordinator_shell
from diskless.broker.coordinator_shell import CoordinatorShell
from diskless.broker.group_shell import GroupShell


class OverdueCore:
    """A core whose earliest deadline has passed: every pass is due at once."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.ticks = 0

    def next_deadline_ms(self) -> int | None:
        return 0 if self.ticks <= self.failures else None

    def tick(self, now_ms: int) -> None:
        self.ticks += 1
        if self.ticks <= self.failures:
            raise RuntimeError("a bug in a timeout")


class Shell(CoordinatorShell[OverdueCore]):
    def tick(self, now_ms: int) -> None:
        GroupShell.tick(self, now_ms)  # type: ignore[arg-type]


async def test_a_failed_timer_pass_is_retried_after_a_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_shell, "FAILED_TICK_RETRY_S", 0.05)
    shell = Shell(broker=None)  # type: ignore[arg-type]
    failing, healthy = OverdueCore(failures=2), OverdueCore(failures=0)
    shell.cores = {0: failing, 1: healthy}
    started = time.monotonic()
    shell.wake()
    deadline = time.monotonic() + 5
    while failing.ticks < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)

    assert failing.ticks == 3  # two failed passes, then one that worked: retried, not dropped
    assert time.monotonic() - started >= 0.1  # after a pause each time, not at once
    assert healthy.ticks >= 1  # the other coordinator's timers ran despite the failing one
    assert shell._timer is None  # nothing due any more

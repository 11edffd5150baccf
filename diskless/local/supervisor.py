"""Supervision decisions for ``diskless dev``: when a dead process is restarted, or left down.

Sans-IO: the launcher reports what happened (a process started, became ready, exited, failed to
start; a user stopped or started it) with the time, and asks which processes are due a restart.
A process that keeps dying soon after it starts is restarted with exponential backoff and, after
``max_failures`` such failures in a row, given up on (reported, left down) so a broken process
does not spin. One that stayed up ``stable_after_s`` starts the count afresh: a crash after hours
is not the fifth failure of a streak. A user's ``stop`` is not a crash (nothing restarts it), and
a user's ``start`` forgets past failures.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class State(enum.Enum):
    STARTING = "starting"  # spawned, not yet ready
    RUNNING = "running"
    BACKOFF = "backoff"  # dead, restart scheduled
    DOWN = "down"  # dead and kept down: stopped by the user, or --no-restart
    GAVE_UP = "gave up"  # dead after too many quick failures


@dataclass(frozen=True)
class RestartPolicy:
    restart: bool = True
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    multiplier: float = 2.0
    stable_after_s: float = 30.0
    max_failures: int = 6


@dataclass(frozen=True)
class Event:
    """What the launcher should report after a death or failed start."""

    name: str
    state: State
    restart_at: float | None
    message: str


@dataclass
class _Process:
    state: State = State.STARTING
    held: bool = False  # the user stopped it: its exit is expected and it stays down
    failures: int = 0  # quick failures in a row
    up_since: float | None = None
    restart_at: float | None = None


class Supervisor:
    def __init__(self, names: Iterable[str], policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self._procs = {name: _Process() for name in names}

    def state(self, name: str) -> State:
        return self._procs[name].state

    def names(self) -> list[str]:
        return list(self._procs)

    def held(self, name: str) -> bool:
        return self._procs[name].held

    def failures(self, name: str) -> int:
        return self._procs[name].failures

    def add(self, name: str) -> None:
        self._procs.setdefault(name, _Process())

    # --- what happened ---------------------------------------------------------------------------

    def started(self, name: str, now: float) -> None:
        proc = self._procs[name]
        proc.state = State.STARTING
        proc.restart_at = None
        proc.up_since = now

    def ready(self, name: str, now: float) -> None:
        proc = self._procs[name]
        proc.state = State.RUNNING
        if proc.up_since is None:
            proc.up_since = now

    def exited(self, name: str, now: float, code: int | None) -> Event:
        proc = self._procs[name]
        how = f"exited with code {code}" if code is None or code >= 0 else f"killed by signal {-code}"
        if proc.held:
            return self._down(name, f"{name} stopped ({how})")
        if proc.up_since is not None and now - proc.up_since >= self.policy.stable_after_s:
            proc.failures = 0
        return self._failed(name, now, how)

    def start_failed(self, name: str, now: float, reason: str) -> Event:
        proc = self._procs[name]
        if proc.held:
            return self._down(name, f"{name} did not start ({reason}); stopped")
        return self._failed(name, now, f"did not start: {reason}")

    # --- what the user asked ---------------------------------------------------------------------

    def hold(self, name: str) -> None:
        """``diskless dev stop``: the coming exit is expected, and nothing restarts it."""
        proc = self._procs[name]
        proc.held = True
        if proc.state is State.BACKOFF:
            proc.state = State.DOWN
            proc.restart_at = None

    def release(self, name: str, now: float) -> None:
        """``diskless dev start``: a dead process is due now, with its failures forgotten."""
        proc = self._procs[name]
        proc.held = False
        proc.failures = 0
        if proc.state in (State.DOWN, State.GAVE_UP, State.BACKOFF):
            proc.state = State.BACKOFF
            proc.restart_at = now

    # --- what to do ------------------------------------------------------------------------------

    def due(self, now: float) -> list[str]:
        """Processes whose restart time has come; each is handed out once (now STARTING)."""
        out = []
        for name, proc in self._procs.items():
            if proc.state is State.BACKOFF and proc.restart_at is not None and proc.restart_at <= now:
                proc.state = State.STARTING
                proc.restart_at = None
                proc.up_since = None
                out.append(name)
        return out

    def next_wakeup(self) -> float | None:
        times = [p.restart_at for p in self._procs.values() if p.state is State.BACKOFF and p.restart_at is not None]
        return min(times) if times else None

    # --- internals -------------------------------------------------------------------------------

    def _down(self, name: str, message: str) -> Event:
        proc = self._procs[name]
        proc.state = State.DOWN
        proc.restart_at = None
        proc.up_since = None
        return Event(name, State.DOWN, None, message)

    def _failed(self, name: str, now: float, how: str) -> Event:
        proc = self._procs[name]
        proc.up_since = None
        if not self.policy.restart:
            return self._down(name, f"{name} {how}; kept down (--no-restart; `diskless dev start {name}`)")
        proc.failures += 1
        if proc.failures > self.policy.max_failures:
            proc.state = State.GAVE_UP
            proc.restart_at = None
            message = f"{name} {how}; giving up after {proc.failures} failures (`diskless dev start {name}`)"
            return Event(name, State.GAVE_UP, None, message)
        policy = self.policy
        wait = min(policy.max_backoff_s, policy.initial_backoff_s * policy.multiplier ** (proc.failures - 1))
        proc.state = State.BACKOFF
        proc.restart_at = now + wait
        return Event(name, State.BACKOFF, proc.restart_at, f"{name} {how}; restarting in {wait:.1f}s")

"""``diskless bench --profile``: py-spy samples every broker while one topic kind runs, and the hot spots.

py-spy attaches to the broker processes from outside (``--nonblocking``: the brokers are never
paused, so the latencies measured meanwhile stay honest) and writes collapsed stacks ("raw"
format: ``frame;frame;frame count`` per line). ``hot_spots`` reads them back: per function, the
share of samples where it is on top of the stack (self) and anywhere on it (inclusive), with idle
samples (the event loop waiting in ``select``/``epoll``) counted apart.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections import Counter
from pathlib import Path
from typing import Any

# Frames that, on top of a stack, mean the thread waits rather than computes (py-spy in nonblocking
# mode samples waiting threads too): the event loop in epoll, pool workers on their queue, threads
# blocked in a socket read or on a lock.
IDLE = re.compile(
    r"Selector\.select \(selectors\.py\)|^_run_once \(asyncio/base_events\.py\)|^_worker \(futures/thread\.py\)"
    r"|^SocketIO\.readinto \(socket\.py\)|^(Condition\.|Event\.)?wait \(threading\.py\)"
)
PROJECT = ("(diskless/", "(wal_manager/", "(kio/")
ENTRY_POINTS = re.compile(r"^(main|_run_broker|<module>|run) \(diskless/(cli|__main__)\.py\)$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^)]*)(?::\d+)?\)$")


class Profiler:
    """One py-spy process per broker, started and stopped with the phases it should cover."""

    def __init__(self, out: Path, rate: int = 50) -> None:
        self.out = out
        self.rate = rate
        self.procs: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}

    @staticmethod
    def binary() -> str | None:
        """py-spy beside this interpreter (the venv's scripts), else on PATH."""
        here = os.pathsep.join([sysconfig.get_path("scripts"), os.path.dirname(sys.executable)])
        return shutil.which("py-spy", path=here) or shutil.which("py-spy")

    def start(self, pids: dict[int, int]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for node, pid in pids.items():
            path = self.out / f"broker-{node}.collapsed"
            cmd = [self.binary() or "py-spy", "record", "--pid", str(pid), "--rate", str(self.rate), "--nonblocking"]
            cmd += ["--format", "raw", "--output", str(path), "--threads"]
            log = open(self.out / f"py-spy-{node}.log", "wb")  # noqa: SIM115 - lives as long as the process
            self.procs[node] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), path)

    def stop(self) -> dict[int, Path]:
        """SIGINT makes py-spy write what it sampled so far."""
        out = {}
        for node, (proc, path) in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if path.exists():
                out[node] = path
        self.procs.clear()
        return out


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py)``: lines differ per sample, functions do not."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    file = match["file"].split(":")[0]
    parts = file.replace("\\", "/").split("/")
    where = "/".join(parts[-2:]) if len(parts) > 1 else file
    return f"{match['func']} ({where})"


def hot_spots(paths: list[Path], top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function over all brokers' collapsed stacks."""
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = idle = loop_busy = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            raw = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
            if not raw:
                continue
            frames = [_short(f) for f in raw]
            total += count
            if IDLE.search(frames[-1]):
                idle += count
                continue
            loop = any("run_forever" in f for f in frames)
            if loop:
                loop_busy += count
            self_counts[frames[-1]] += count
            # Inclusive: the project's own functions (and kio's), where a fix would go.
            for frame in {_short(f) for f in raw if any(part in f for part in PROJECT)}:
                if not ENTRY_POINTS.match(frame):
                    inclusive[frame] += count
    busy = max(total - idle, 1)

    def table(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "share_of_busy": round(n / busy, 4), "samples": n} for f, n in counter.most_common(top)]

    return {
        "samples": total,
        "idle_samples": idle,
        # Busy samples on the event loop's thread: the share of the broker's work that serialises.
        "event_loop_busy_samples": loop_busy,
        "self": table(self_counts),
        "inclusive": table(inclusive),
    }

"""One broker process on a free loopback port with its own data directory, for the standalone
benchmarks in this folder (``produce_fetch.py``, ``request_cost.py``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from diskless.local.servers import stop_process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def standalone_broker(profile: str | None = None, start_timeout: float = 60) -> Iterator[tuple[str, int]]:
    """(bootstrap address, pid) of a broker started for the ``with`` block and stopped after it
    (SIGTERM, then SIGKILL); ``profile``: run it under cProfile, stats written there on shutdown."""
    workdir = Path(tempfile.mkdtemp(prefix="diskless-bench-"))
    port = free_port()
    ready = workdir / "ready"
    python = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
    cmd = [*python, "-m", "diskless", "broker", "--listeners", f"PLAINTEXT://127.0.0.1:{port}"]
    cmd += ["--log-dirs", str(workdir / "data"), "--ready-file", str(ready), "--log-level", "WARNING"]
    broker = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + start_timeout
        while not (ready.exists() and ready.read_text().strip()):
            if time.monotonic() > deadline or broker.poll() is not None:
                raise RuntimeError("broker did not start")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}", broker.pid
    finally:
        stop_process(broker, 30)
        shutil.rmtree(workdir, ignore_errors=True)

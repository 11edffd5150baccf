"""Test harness: real broker processes on ports chosen at run time, and condition waits.

Nothing here sleeps for synchronisation: ``wait_until`` polls a condition against a deadline.
Every process started is tracked and killed at teardown so no test leaves servers behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 15.0, interval: float = 0.05, message: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(message or f"condition not met within {timeout}s")
        time.sleep(interval)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BrokerProcess:
    """One ``diskless broker`` OS process with a fixed port, so it can be killed and restarted."""

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None, host: str = "127.0.0.1") -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = free_port(host)
        self.overrides = dict(overrides or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        ready = self.data_dir.parent / f"{self.data_dir.name}.ready"
        ready.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "diskless", "broker",
            "--listeners", f"PLAINTEXT://{self.host}:{self.port}",
            "--log-dirs", str(self.data_dir),
            "--ready-file", str(ready),
        ]  # fmt: skip
        for name, value in self.overrides.items():
            cmd += ["--override", f"{name}={value}"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        log.close()
        try:
            wait_until(lambda: ready.exists() and ready.read_text().strip(), timeout, message=self._tail())
        except TimeoutError:
            self.kill()
            raise TimeoutError(f"broker did not start:\n{self._tail()}") from None
        return self

    def _tail(self) -> str:
        try:
            return self.log_path.read_text()[-3000:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no flushes: the crash case."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        code = self.proc.returncode
        self.proc = None
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

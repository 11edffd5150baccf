"""``diskless dev`` supervises its processes: a SIGKILLed broker is reported and restarted while
clients keep working, and ``diskless dev kill|stop|start <name>`` drive faults from a shell.

The launcher runs as a real subprocess exactly as a user starts it; the control commands run as
separate ``diskless dev`` invocations talking to it through its data directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from diskless.local.servers import stop_process

pytestmark = pytest.mark.integration

STARTUP_DEADLINE_S = 120


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class Launcher:
    def __init__(self, data_dir: Path, output: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.output_path = output
        cmd = [sys.executable, "-m", "diskless", "dev", "--brokers", "3", "--azs", "3", "--no-demo"]
        cmd += ["--data-dir", str(data_dir), "--port", "0", *extra]
        with open(output, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def description(self) -> dict[str, Any]:
        return dict(json.loads((self.data_dir / "cluster.json").read_text()))

    def pid_of(self, name: str) -> int | None:
        for process in self.description()["processes"]:
            own = process.get("name") or (f"broker-{process['node_id']}" if "node_id" in process else process["role"])
            if own == name:
                return int(process["pid"]) if process.get("pid") else None
        raise KeyError(name)

    def control(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "diskless", "dev", *args, "--data-dir", str(self.data_dir)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    def wait_up(self) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited with {self.proc.returncode}:\n{self.output()}")
            return (self.data_dir / "cluster.json").exists() and "is running" in self.output()

        wait_until(up, STARTUP_DEADLINE_S, interval=0.1, message=f"launcher not up:\n{self.output()}")

    def cleanup(self) -> None:
        stop_process(self.proc, 60)
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if str(self.data_dir).encode() in (entry / "cmdline").read_bytes():
                        os.kill(int(entry.name), signal.SIGKILL)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    started = Launcher(tmp_path / "dev", tmp_path / "launcher.out")
    try:
        yield started
    finally:
        started.cleanup()


def produce_and_count(bootstrap: str, topic: str, count: int) -> int:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    delivered = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), on_delivery=on_delivery)
    producer.flush(60)
    return delivered


def test_sigkilled_broker_is_restarted_while_clients_keep_working(launcher: Launcher) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    launcher.wait_up()
    bootstrap = launcher.description()["all_bootstrap_servers"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"supervised-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 3, 3, config={"diskless.enabled": "true"})])[topic].result(30)
    assert produce_and_count(bootstrap, topic, 100) == 100

    victim = launcher.pid_of("broker-1")
    assert victim is not None
    os.kill(victim, signal.SIGKILL)

    # The launcher stays up, says what happened, and the other brokers keep serving.
    wait_until(lambda: "broker-1" in launcher.output() and "killed by signal 9" in launcher.output(), 20)
    assert launcher.proc.poll() is None, launcher.output()
    assert produce_and_count(bootstrap, topic, 100) == 100

    # broker-1 comes back: a new pid, registered with the cluster again.
    def back() -> bool:
        pid = launcher.pid_of("broker-1")
        return pid is not None and pid != victim and alive(pid)

    wait_until(back, 60, interval=0.2, message=launcher.output())
    wait_until(lambda: 1 in admin.list_topics(timeout=5).brokers, 30, interval=0.2)
    assert "broker-1 is back" in launcher.output()
    assert produce_and_count(bootstrap, topic, 100) == 100

    # Faults from a shell: stop keeps a process down until start; kill is a crash it recovers from.
    result = launcher.control("stop", "broker-2")
    assert result.returncode == 0, result.stderr + result.stdout
    stopped = launcher.description()
    assert next(p for p in stopped["processes"] if p["name"] == "broker-2")["state"] == "down"
    status = launcher.control("status")
    assert status.returncode == 0 and "broker-2" in status.stdout and "down" in status.stdout
    assert produce_and_count(bootstrap, topic, 50) == 50
    result = launcher.control("start", "broker-2")
    assert result.returncode == 0, result.stderr + result.stdout
    wait_until(lambda: launcher.pid_of("broker-2") is not None, 30, interval=0.2)
    wait_until(lambda: 2 in admin.list_topics(timeout=5).brokers, 30, interval=0.2)

    before = launcher.pid_of("wal-manager")
    result = launcher.control("kill", "wal-manager")
    assert result.returncode == 0, result.stderr + result.stdout
    wait_until(lambda: launcher.pid_of("wal-manager") not in (None, before), 30, interval=0.2)
    assert launcher.control("kill", "no-such-process").returncode != 0

    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.proc.wait(60) == 0, launcher.output()
    started = time.monotonic()
    assert not (launcher.data_dir / "control.sock").exists()
    assert time.monotonic() - started < 1

"""Test harness: real broker processes on ports chosen at run time, and condition waits.

Nothing here sleeps for synchronisation: ``wait_until`` polls a condition against a deadline.
Every process started is tracked and killed at teardown so no test leaves servers behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from diskless.local.servers import free_ports, stop_process

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


class PolledConsumer:
    """A confluent-kafka consumer polled on its own thread until ``close``: ``on_message`` gets each
    message (records and errors alike), on that thread."""

    def __init__(self, config: dict[str, Any], topics: list[str], on_message: Callable[[Any], None]) -> None:
        from confluent_kafka import Consumer  # only the tests that drive librdkafka pay for it

        self.consumer = Consumer(config)
        self.consumer.subscribe(topics)
        self.on_message = on_message
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None:
                self.on_message(message)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()


class BackgroundProducer:
    """A confluent-kafka producer on its own thread, writing ``value-0``, ``value-1``, ... round-robin
    over the topic's partitions (acks=all) until closed: load that keeps a group busy while a test
    moves things under it."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from confluent_kafka import Producer  # only the tests that drive librdkafka pay for it

        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        self.topic, self.partitions = topic, partitions
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            self.producer.produce(self.topic, value=f"value-{i}".encode(), partition=i % self.partitions)
            self.producer.poll(0.01)
            i += 1
        self.producer.flush(10)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]  # below the ephemeral range: see diskless.local.servers


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
        code = stop_process(self.proc, timeout, kill_wait=5)
        self.proc = None
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """etcd plus N brokers spread over AZs, each AZ on its own loopback network (127.0.<az>.x)."""

    def __init__(
        self,
        root: Path,
        brokers: int,
        azs: int,
        overrides: dict[str, str],
        s3: bool = False,
        s3_front: Callable[[str], str] | None = None,
    ) -> None:
        from diskless.local.servers import BrokerServer, EtcdServer, S3Server

        self.root = root
        self.s3_front = s3_front  # the endpoint brokers get from the server's (a fault proxy in front)
        self.etcd = EtcdServer(root / "etcd")
        self.s3 = S3Server(root / "s3") if s3 else None
        self.brokers = []
        for node_id in range(brokers):
            az = node_id % azs
            host = f"127.0.{az + 1}.{node_id // azs + 1}"
            self.brokers.append(
                BrokerServer(node_id, root / f"broker-{node_id}", host, f"az-{az + 1}", None, dict(overrides))
            )

    def start(self) -> LocalCluster:
        # etcd and S3 start side by side (the S3 server takes ~1 s); brokers need both.
        with ThreadPoolExecutor(2) as pool:
            servers = [pool.submit(self.etcd.start)]
            if self.s3 is not None:
                servers.append(pool.submit(self.s3.start))
            for future in servers:
                future.result()
        for broker in self.brokers:
            broker.etcd = self.etcd.endpoint
            if self.s3 is not None:
                front = self.s3_front(self.s3.endpoint) if self.s3_front else self.s3.endpoint
                broker.overrides.setdefault("diskless.s3.endpoint", front)
        # Broker 0 alone first, so it becomes the controller as tests expect; the rest in
        # parallel: most of a broker's start-up is importing, ~1.7 s each on an idle machine.
        first, *rest = self.brokers
        first.start()
        for broker in rest:
            broker.spawn()
        # Together they share the CPU: allow the time they would have had one after another.
        for broker in rest:
            broker.wait_ready(30.0 * len(rest))
        return self

    def bootstrap_in(self, az: str) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.rack == az and b.alive())

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.alive())

    def rack_of(self, node_id: int) -> str:
        rack = self.brokers[node_id].rack
        assert rack is not None
        return rack

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        self.etcd.stop()
        if self.s3 is not None:
            self.s3.stop()

    def kill_all(self) -> None:
        for broker in self.brokers:
            broker.kill()
        self.etcd.kill()
        if self.s3 is not None:
            self.s3.kill()

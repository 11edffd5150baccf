"""``diskless dev``: a local cluster for trying diskless out, used by ``make run``.

Starts broker processes on loopback, writes ``DIR/cluster.json`` describing how to reach them,
runs a short end-to-end demo (create a topic, produce, consume) and keeps the cluster up until
Ctrl-C or SIGTERM, then stops every process it started. Until the cluster issue lands this runs a
single broker; the object store and etcd join here with it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from diskless.logs import configure_logging


def _wait_ready(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with code {proc.returncode}")
        if path.exists() and path.read_text().strip():
            return int(path.read_text().strip())
        time.sleep(0.05)
    raise TimeoutError("broker did not become ready")


async def _demo(bootstrap: str, topic: str) -> tuple[int, float]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    count = 1000
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="zstd")
    await producer.start()
    started = time.monotonic()
    try:
        for i in range(count):
            await producer.send(topic, key=f"key-{i}".encode(), value=f"hello diskless #{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    seen = 0
    try:
        deadline = time.monotonic() + 30
        while seen < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            seen += sum(len(v) for v in batches.values())
    finally:
        await consumer.stop()
    return seen, time.monotonic() - started


def run_dev(data_dir: str, brokers: int, port: int, demo: bool) -> int:
    configure_logging("WARNING")
    if brokers != 1:
        print("diskless dev: multi-broker clusters arrive with the cluster work; starting 1 broker", file=sys.stderr)
    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    ready = root / "broker-0.ready"
    ready.unlink(missing_ok=True)
    log_file = open(root / "broker-0.log", "ab")  # noqa: SIM115 - owned by the child
    cmd = [
        sys.executable, "-m", "diskless", "broker",
        "--node-id", "0",
        "--listeners", f"PLAINTEXT://127.0.0.1:{port}",
        "--log-dirs", str(root / "broker-0"),
        "--ready-file", str(ready),
        "--override", "metrics.port=0",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
    log_file.close()
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        bound = _wait_ready(ready, proc)
        bootstrap = f"127.0.0.1:{bound}"
        info = {"bootstrap_servers": {"local": bootstrap}, "brokers": [{"node_id": 0, "pid": proc.pid, "port": bound}]}
        (root / "cluster.json").write_text(json.dumps(info, indent=2))
        print(f"diskless is running: bootstrap.servers={bootstrap}")
        print(f"  cluster description: {root / 'cluster.json'}")
        print(f"  broker log:          {root / 'broker-0.log'}")
        if demo:
            topic = "diskless-demo"
            seen, took = asyncio.run(_demo(bootstrap, topic))
            print(f"  demo: produced 1000 records to '{topic}' (acks=all, zstd) and consumed {seen} in {took:.2f}s")
        print(f"  try: kcat -b {bootstrap} -L      |  Ctrl-C stops the cluster")
        while not stop and proc.poll() is None:
            time.sleep(0.2)
        return 0 if proc.poll() is None else 1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        print("diskless stopped")

"""``diskless dev`` (what ``make run`` starts): S3, etcd and 3 brokers in 3 AZs, a demo, a clean stop.

The launcher runs as a real subprocess exactly as a user would start it. The test reads the
cluster description it writes, talks to every process it lists, checks the demo's output and the
placement of the demo topic's replicas across AZs, then stops it with SIGTERM and checks that no
process it started is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from diskless.local.servers import stop_process

STARTUP_DEADLINE_S = 120
STOP_DEADLINE_S = 60


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; it only waits for its parent to reap it.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def processes_mentioning(text: str) -> list[int]:
    """Like ``pgrep -f text``: pids whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:  # an HTTP answer, even an error, means the server is there
        return int(exc.code)


class Launcher:
    def __init__(self, data_dir: Path, output: Path) -> None:
        self.data_dir = data_dir
        self.output_path = output
        cmd = [sys.executable, "-m", "diskless", "dev", "--brokers", "3", "--azs", "3"]
        cmd += ["--data-dir", str(data_dir), "--port", "0"]
        with open(output, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def cleanup(self) -> None:
        """Only after a failure: stop the launcher, then anything it may have left."""
        stop_process(self.proc, STOP_DEADLINE_S)
        for pid in processes_mentioning(str(self.data_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    started = Launcher(tmp_path / "dev", tmp_path / "launcher.out")
    try:
        yield started
    finally:
        started.cleanup()


def test_dev_launcher_runs_three_azs_demo_and_stops_cleanly(launcher: Launcher) -> None:
    from confluent_kafka.admin import AdminClient

    description = launcher.data_dir / "cluster.json"

    def up() -> bool:
        if launcher.proc.poll() is not None:
            raise AssertionError(f"launcher exited with {launcher.proc.returncode}:\n{launcher.output()}")
        return description.exists() and "is running" in launcher.output()

    began = time.monotonic()
    wait_until(up, STARTUP_DEADLINE_S, interval=0.1, message=f"launcher not up:\n{launcher.output()}")
    print(f"diskless dev up (demo included) in {time.monotonic() - began:.1f}s")
    output = launcher.output()
    cluster: dict[str, Any] = json.loads(description.read_text())

    # Three AZs, each on its own loopback network.
    assert sorted(cluster["bootstrap_servers"]) == ["az-1", "az-2", "az-3"]
    for index, az in enumerate(["az-1", "az-2", "az-3"], start=1):
        assert re.fullmatch(rf"127\.0\.{index}\.\d+:\d+", cluster["bootstrap_servers"][az]), cluster
    brokers = {int(node): info for node, info in cluster["brokers"].items()}
    assert sorted(info["az"] for info in brokers.values()) == ["az-1", "az-2", "az-3"]
    # Per-AZ listeners: an AZ's clients bootstrap from its brokers' listener for that AZ; "all" is the
    # brokers' inter-broker listener.
    assert sorted(cluster["all_bootstrap_servers"].split(",")) == sorted(info["address"] for info in brokers.values())
    for az in ["az-1", "az-2", "az-3"]:
        own = [info["listeners"][az] for info in brokers.values() if info["az"] == az]
        assert cluster["bootstrap_servers"][az] == ",".join(own), cluster

    # The S3 server answers HTTP and has the bucket; etcd is healthy.
    s3 = cluster["s3"]
    assert s3["bucket"] == "diskless" and s3["kind"] in ("seaweedfs", "minio")
    assert 200 <= http_status(s3["endpoint"]) < 500
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=s3["endpoint"],
        aws_access_key_id=s3["access_key"],
        aws_secret_access_key=s3["secret_key"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    )
    client.head_bucket(Bucket=s3["bucket"])
    with urllib.request.urlopen(f"{cluster['etcd']['url']}/health", timeout=5) as response:
        assert json.loads(response.read())["health"] == "true"

    # Every process is listed with a live pid and a role.
    roles = sorted(p["role"] for p in cluster["processes"])
    assert roles == ["broker", "broker", "broker", "etcd", "s3", "wal-manager"]
    pids = [int(p["pid"]) for p in cluster["processes"]]
    assert all(alive(pid) for pid in pids)

    # The demo produced with acks=all and read back all 1000 records.
    consumed = re.search(r"consumed (\d+)", output)
    assert consumed is not None and int(consumed.group(1)) == 1000, output
    assert "produced 1000 records" in output, output
    assert f"kcat -b {cluster['bootstrap_servers']['az-1']}" in output

    # Each partition of the demo topic has a replica in every AZ, and brokers advertise the listed addresses.
    metadata = AdminClient({"bootstrap.servers": cluster["all_bootstrap_servers"]}).list_topics(
        "diskless-demo", timeout=15
    )
    assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == {
        node: info["address"] for node, info in brokers.items()
    }
    partitions = metadata.topics["diskless-demo"].partitions
    assert len(partitions) == 6
    for partition in partitions.values():
        assert sorted(brokers[r]["az"] for r in partition.replicas) == ["az-1", "az-2", "az-3"], partition
    del metadata
    # A client that bootstraps through az-2's addresses sees every broker at its az-2 listener, and
    # the diskless topic led in az-2 (zone alignment by listener, no client setting).
    metadata = AdminClient({"bootstrap.servers": cluster["bootstrap_servers"]["az-2"]}).list_topics(
        "diskless-demo", timeout=15
    )
    assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == {
        node: info["listeners"]["az-2"] for node, info in brokers.items()
    }
    assert {brokers[p.leader]["az"] for p in metadata.topics["diskless-demo"].partitions.values()} == {"az-2"}
    del metadata

    # SIGTERM: the launcher stops everything and exits 0.
    stopping = time.monotonic()
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.proc.wait(STOP_DEADLINE_S) == 0, launcher.output()
    print(f"diskless dev stopped in {time.monotonic() - stopping:.1f}s")
    print(launcher.output().split("stopping:", 1)[-1])
    assert "diskless dev stopped" in launcher.output()
    still = [pid for pid in pids if alive(pid)]
    assert not still, f"left behind: {still}"
    assert not processes_mentioning(str(launcher.data_dir)), "a process using the data dir is left behind"

"""``diskless dev`` with its security defaults, tried as a new user would: the cluster secret it
generated is in cluster.json, an ordinary connection that sends CommitBatches to a broker gets
CLUSTER_AUTHORIZATION_FAILED and no pointer is appended, and kcat connects over the SASL_SSL
listener (certificates from the launcher's local CA) with the SCRAM user cluster.json names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from diskless.local.servers import stop_process
from diskless.protocol import internal
from diskless.protocol.client import KafkaClientConnection

pytestmark = pytest.mark.integration

CLUSTER_AUTHORIZATION_FAILED = 31


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[dict[str, Any]]:
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "diskless", "dev", "--brokers", "1", "--azs", "1", "--no-demo"]
    cmd += ["--data-dir", str(data), "--port", "0"]
    with open(tmp_path / "dev.out", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    description = data / "cluster.json"
    try:

        def ready() -> dict[str, Any] | None:
            assert proc.poll() is None, (tmp_path / "dev.out").read_text()
            return json.loads(description.read_text()) if description.exists() else None

        yield wait_until(ready, 120, 0.2, "diskless dev never wrote cluster.json")
    finally:
        stop_process(proc, 60)
        time.sleep(0)  # nothing to wait for: the launcher stopped its processes before exiting


def kcat(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kcat", *args], capture_output=True, text=True, timeout=60)


async def test_dev_cluster_is_secure_by_default(dev: dict[str, Any]) -> None:
    assert len(dev["cluster_secret"]) >= 32
    tls = dev["tls"]
    assert Path(tls["ca"]).exists()
    sasl = [
        "-X", "security.protocol=SASL_SSL", "-X", f"sasl.mechanisms={tls['sasl_mechanism']}",
        "-X", f"sasl.username={tls['username']}", "-X", f"sasl.password={tls['password']}",
        "-X", f"ssl.ca.location={tls['ca']}",
    ]  # fmt: skip
    bootstrap = tls["bootstrap_servers"]
    produced = kcat(
        ["-b", bootstrap, "-t", "secured", "-P", *sasl],
    )
    assert produced.returncode == 0, produced.stderr
    listed = kcat(["-b", bootstrap, "-L", "-t", "secured", *sasl])
    assert listed.returncode == 0 and "secured" in listed.stdout, listed.stderr

    # The new user: a plain connection that sends CommitBatches to the broker.
    host, _, port = dev["all_bootstrap_servers"].split(",")[0].rpartition(":")
    conn = KafkaClientConnection(host, int(port), "curious-user")
    await conn.connect()
    body = {
        "key": "wal/2026/01/01/00/0-az-1-0-nothing.wal",
        "created_ms": int(time.time() * 1000),
        "entries": [
            {"topic": "secured", "topic_id": "x", "partition": 0, "header": b"\0" * 61, "position": 0, "acks": 1}
        ],
    }
    try:
        answer = await conn.wait(conn.send_internal(internal.INTERNAL_COMMIT_BATCHES, body))
    finally:
        await conn.close()
    assert answer == {"error_code": CLUSTER_AUTHORIZATION_FAILED}

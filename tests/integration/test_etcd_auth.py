"""etcd with authentication: a broker takes its etcd user and password from its environment,
keeps its lease alive (the keepalive thread authenticates too), serves clients, and its log never
shows the password."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_until

from diskless.local.servers import BrokerServer, EtcdServer

pytestmark = pytest.mark.integration

PASSWORD = "etcd-Pa55word-for-root"


def etcdctl(endpoint: str, *args: str) -> str:
    binary = str(Path(EtcdServer.binary()).with_name("etcdctl"))
    done = subprocess.run([binary, f"--endpoints=http://{endpoint}", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def secured_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    etcd = EtcdServer(tmp_path / "etcd")
    try:
        etcd.start()
        etcdctl(etcd.endpoint, "user", "add", f"root:{PASSWORD}")
        etcdctl(etcd.endpoint, "auth", "enable")
        yield etcd
    finally:
        etcd.kill()


def test_broker_with_etcd_credentials_from_its_environment(
    secured_etcd: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISKLESS_METADATA_ETCD_USERNAME", "root")
    monkeypatch.setenv("DISKLESS_METADATA_ETCD_PASSWORD", PASSWORD)
    overrides = {"broker.session.timeout.ms": "6000"}  # a 6 s lease, refreshed every 2 s
    broker = BrokerServer(0, tmp_path / "broker-0", "127.0.0.1", "az-1", secured_etcd.endpoint, overrides)
    try:
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("t", 1, 1)])["t"].result(30)
        # The keepalive thread refreshes the lease with its own token: the lease's remaining TTL
        # goes back up (twice) instead of running out.
        lease = lease_of_broker(secured_etcd.endpoint)
        for _ in range(2):
            seen = [ttls(secured_etcd.endpoint, lease)[0]]

            def went_up(seen: list[int] = seen) -> bool:
                seen.append(ttls(secured_etcd.endpoint, lease)[0])
                return seen[-1] > seen[-2]

            wait_until(went_up, 10, 0.05, "the broker's lease was never refreshed")
        assert broker_key_alive(secured_etcd.endpoint), "the broker's lease expired"
        outcome: list[object] = []
        producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10000})
        producer.produce("t", b"v", on_delivery=lambda err, msg: outcome.append(err))
        assert producer.flush(20) == 0 and outcome == [None]
        assert broker.alive()
    finally:
        broker.kill()
    log = broker.log_path.read_text()
    assert "lease refresh failed" not in log
    assert PASSWORD not in log


def broker_key_alive(endpoint: str) -> bool:
    out = etcdctl(endpoint, "--user", f"root:{PASSWORD}", "get", "--prefix", "--keys-only", "/diskless/")
    return any(line.endswith("/brokers/0") for line in out.split())


def lease_of_broker(endpoint: str) -> int:
    out = etcdctl(endpoint, "--user", f"root:{PASSWORD}", "get", "--prefix", "/diskless/", "-w", "json")
    kvs = json.loads(out)["kvs"]
    (lease,) = [kv["lease"] for kv in kvs if base64.b64decode(kv["key"]).decode().endswith("/brokers/0")]
    return int(lease)


def ttls(endpoint: str, lease: int) -> tuple[int, int]:
    """(remaining, granted) seconds of ``lease``."""
    out = etcdctl(endpoint, "--user", f"root:{PASSWORD}", "lease", "timetolive", f"{lease:x}", "-w", "json")
    answer = json.loads(out)
    return int(answer["ttl"]), int(answer.get("granted-ttl", answer.get("grantedTTL", 0)))

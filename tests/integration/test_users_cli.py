"""``diskless users``: the first SCRAM user of a cluster, written into etcd before any client can
log in (Kafka's ``kafka-storage format --add-scram``), then listed and deleted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient
from rawclient import RawClient, metadata_request

from diskless.local.servers import BrokerServer, EtcdServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[EtcdServer, BrokerServer]]:
    etcd = EtcdServer(tmp_path / "etcd")
    overrides = {"listener.security.protocol.map": "AZ_1:SASL_PLAINTEXT"}
    broker = BrokerServer(0, tmp_path / "broker-0", "127.0.0.1", "az-1", None, overrides, client_azs=["az-1"])
    try:
        etcd.start()
        broker.etcd = etcd.endpoint
        broker.start()
        yield etcd, broker
    finally:
        broker.kill()
        etcd.kill()


def users(etcd: EtcdServer, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "diskless",
        "users",
        *args,
        "--override",
        f"metadata.etcd.endpoints={etcd.endpoint}",
    ]
    env = {**os.environ, "DISKLESS_SCRAM_PASSWORD": "admin-pw"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def can_log_in(broker: BrokerServer) -> bool:
    errors: list[KafkaError] = []
    admin = AdminClient(
        {
            "bootstrap.servers": broker.bootstrap_for("az-1"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": "admin-pw",
            "error_cb": errors.append,
        }
    )
    try:
        admin.list_topics(timeout=5)
        return True
    except Exception:
        admin.poll(1)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
        return False


def test_users_add_list_delete(cluster: tuple[EtcdServer, BrokerServer]) -> None:
    etcd, broker = cluster
    assert not can_log_in(broker)
    added = users(etcd, "add", "--user", "admin", "--mechanism", "SCRAM-SHA-512")
    assert added.returncode == 0, added.stderr
    assert "admin-pw" not in added.stdout + added.stderr
    assert can_log_in(broker)
    listed = users(etcd, "list")
    assert listed.returncode == 0 and "admin  SCRAM-SHA-512  iterations=8192" in listed.stdout, listed
    deleted = users(etcd, "delete", "--user", "admin", "--mechanism", "SCRAM-SHA-512")
    assert deleted.returncode == 0, deleted.stderr
    assert not can_log_in(broker)
    missing = users(etcd, "delete", "--user", "admin", "--mechanism", "SCRAM-SHA-512")
    assert missing.returncode == 1 and "no SCRAM-SHA-512 credential" in missing.stderr


def test_sasl_listener_serves_nothing_before_authentication(cluster: tuple[EtcdServer, BrokerServer]) -> None:
    """Kafka's SaslServerAuthenticator: a request other than ApiVersions/SaslHandshake/
    SaslAuthenticate before authentication closes the connection, unanswered."""
    _, broker = cluster
    with RawClient(broker.bootstrap_for("az-1")) as raw:
        raw.send(metadata_request(None))
        assert raw.wait_closed(10)
    # On the PLAINTEXT inter-broker listener of the same broker, the same request is answered.
    with RawClient(broker.bootstrap) as raw:
        assert raw.request(metadata_request(None)).brokers

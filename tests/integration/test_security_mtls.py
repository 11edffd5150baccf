"""SSL listener with client certificates (ssl.client.auth=required): the principal is the
certificate's subject (User:CN=...), ACLs apply to it, and a client without a certificate from
the truststore's CA cannot connect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from diskless.local.servers import BrokerServer
from diskless.security.tls import DevCerts, issue_client_cert, make_dev_certs

pytestmark = pytest.mark.integration

HOST = "127.0.1.1"
TOPIC = "signed"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[BrokerServer, DevCerts]]:
    certs = make_dev_certs(tmp_path / "certs", [HOST])
    overrides = {
        "listener.security.protocol.map": "BROKER:PLAINTEXT,AZ_1:SSL",
        "ssl.keystore.location": str(certs.keystore),
        "ssl.truststore.location": str(certs.ca),
        "ssl.client.auth": "required",
        "authorizer.class.name": "diskless",
        "super.users": "User:CN=admin",
        "auto.create.topics.enable": "false",
    }
    server = BrokerServer(0, tmp_path / "broker-0", HOST, "az-1", None, overrides, client_azs=["az-1"])
    try:
        server.start()
        yield server, certs
    finally:
        server.kill()


def ssl_config(server: BrokerServer, certs: DevCerts, name: str | None) -> dict[str, Any]:
    config = {
        "bootstrap.servers": server.bootstrap_for("az-1"),
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs.ca),
    }
    if name is not None:
        cert, key = issue_client_cert(certs, name)
        config |= {"ssl.certificate.location": str(cert), "ssl.key.location": str(key)}
    return config


def produce(config: dict[str, Any]) -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 10000, "enable.idempotence": False})
    producer.produce(TOPIC, b"v", on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(20)
    return outcome[0] if outcome else KafkaError(KafkaError._MSG_TIMED_OUT)


def test_certificate_subjects_are_principals(broker: tuple[BrokerServer, DevCerts]) -> None:
    server, certs = broker
    admin = AdminClient(ssl_config(server, certs, "admin"))
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    grant = AclBinding(
        ResourceType.TOPIC,
        TOPIC,
        ResourcePatternType.LITERAL,
        "User:CN=alice",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    admin.create_acls([grant])[grant].result(30)
    assert produce(ssl_config(server, certs, "alice")) is None
    denied = produce(ssl_config(server, certs, "mallory"))
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, denied
    no_certificate = produce(ssl_config(server, certs, None))
    assert no_certificate is not None and no_certificate.code() != KafkaError.NO_ERROR

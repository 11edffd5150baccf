"""An SSL inter-broker listener: brokers replicate, commit and answer each other over TLS (their
own connections verify the listener's certificate against ``ssl.truststore.location`` and prove
the cluster secret inside the TLS session), while clients use a PLAINTEXT listener.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from diskless.local.servers import BrokerServer, EtcdServer
from diskless.security.tls import make_dev_certs

pytestmark = pytest.mark.integration

TOPIC = "replicated"


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[list[BrokerServer]]:
    hosts = ["127.0.1.1", "127.0.2.1"]
    certs = make_dev_certs(tmp_path / "certs", hosts)
    etcd = EtcdServer(tmp_path / "etcd")
    overrides = {
        "listener.security.protocol.map": "BROKER:SSL,AZ_1:PLAINTEXT",
        "ssl.keystore.location": str(certs.keystore),
        "ssl.truststore.location": str(certs.ca),
        "broker.session.timeout.ms": "3000",
        "replica.lag.time.max.ms": "5000",
    }
    started = [
        BrokerServer(i, tmp_path / f"broker-{i}", host, f"az-{i + 1}", None, overrides, client_azs=["az-1"])
        for i, host in enumerate(hosts)
    ]
    try:
        etcd.start()
        for broker in started:
            broker.etcd = etcd.endpoint
            broker.start()
        yield started
    finally:
        for broker in started:
            broker.kill()
        etcd.kill()


def test_replication_over_an_ssl_inter_broker_listener(brokers: list[BrokerServer]) -> None:
    bootstrap = brokers[0].bootstrap_for("az-1")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 2, config={"min.insync.replicas": "2"})])[TOPIC].result(30)
    outcome: list[object] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 20000})
    for i in range(20):
        producer.produce(TOPIC, f"v{i}".encode(), on_delivery=lambda err, msg: outcome.append(err))
    assert producer.flush(30) == 0
    assert outcome == [None] * 20  # acks=all with min.insync.replicas=2: the follower replicated over TLS
    consumer = Consumer(
        {"bootstrap.servers": brokers[1].bootstrap_for("az-1"), "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])  # no group: only the data path is under test
        values: list[bytes] = []
        for _ in range(60):
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) == 20:
                break
        assert values == [f"v{i}".encode() for i in range(20)]
    finally:
        consumer.close()

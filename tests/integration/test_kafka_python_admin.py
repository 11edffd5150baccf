"""kafka-python 3's KafkaAdminClient against a real 3-AZ cluster (etcd, S3, 3 brokers): the calls
an operator makes on classic and diskless topics answer as Kafka 4.0 would, and the APIs this
broker does not serve fail at once with the client's clean "not supported" error.

One cluster for the module: each test uses topics and groups of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic, OffsetSpec
from kafka.errors import IncompatibleBrokerVersion
from support import LocalCluster, wait_until

pytestmark = pytest.mark.integration

OVERRIDES = {"broker.session.timeout.ms": "3000", "replica.lag.time.max.ms": "5000", "metrics.port": "0"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, _server_environment: None) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("kp-admin")
    started = LocalCluster(root, 3, 3, OVERRIDES, s3=True)
    try:
        yield started.start()
    finally:
        started.kill_all()


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=15000)
    yield client
    client.close()


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, value=b"v%d" % i, partition=p)
        producer.flush(timeout=15)
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize("diskless", [False, True], ids=["classic", "diskless"])
def test_delete_records_answers_once_every_replica_serves_the_new_start(cluster, admin, diskless) -> None:
    """Kafka's DelayedDeleteRecords: the answer waits for every live replica's log start, so an
    EARLIEST asked right after, of any broker a client is sent to (diskless topics: the one of the
    client's AZ), is the new start. Before, a follower answered the old start for up to a second."""
    topic = name("dr")
    admin.create_topics([NewTopic(topic, 3, 3, topic_configs={"diskless.enabled": str(diskless).lower()})])
    admin.wait_for_topics([topic])
    produce(cluster.bootstrap, topic, 3, 10)
    tps = [TopicPartition(topic, p) for p in range(3)]
    answer = admin.delete_records({tp: -1 for tp in tps})
    assert {tp: r["low_watermark"] for tp, r in answer.items()} == {tp: 10 for tp in tps}
    for az in ("az-1", "az-2", "az-3"):
        local = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_in(az), request_timeout_ms=15000)
        try:
            earliest = local.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in tps})
        finally:
            local.close()
        assert {tp: o.offset for tp, o in earliest.items()} == {tp: 10 for tp in tps}, az


def test_describe_features_reports_the_consumer_protocol(admin) -> None:
    features = admin.describe_features()
    assert features["group.version"]["supported"] == (0, 1)
    assert features["group.version"]["finalized"] == (1, 1)
    assert features["transaction.version"]["supported"] == (0, 0)
    assert "finalized" not in features["transaction.version"]


def test_list_groups_filters_by_type_and_state(cluster, admin) -> None:
    topic, group = name("lg"), name("g")
    admin.create_topics([NewTopic(topic, 1, 3)])
    admin.wait_for_topics([topic])
    consumer = KafkaConsumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        wait_until(lambda: consumer.poll(200) is not None and consumer.assignment(), message="no assignment")
        ids = lambda **f: {g["group_id"] for g in admin.list_groups(**f)}  # noqa: E731
        assert group in ids(types_filter=["classic"], states_filter=["Stable"])
        assert group not in ids(types_filter=["consumer"])
        assert group not in ids(states_filter=["Empty"])
    finally:
        consumer.close()


def test_unserved_apis_fail_at_once_as_not_supported(admin) -> None:
    """UpdateFeatures (features are fixed by the broker's software), DescribeQuorum (metadata is in
    etcd, not a KRaft quorum) and ListConfigResources (v0 lists KIP-714 client metrics, not
    served; v1 is Kafka 4.1) are not advertised: the client refuses before sending."""
    with pytest.raises(IncompatibleBrokerVersion):
        admin.update_features({"group.version": 1}, validate_only=True)
    with pytest.raises(IncompatibleBrokerVersion):
        admin.describe_metadata_quorum()
    with pytest.raises(IncompatibleBrokerVersion):
        admin.list_config_resources()

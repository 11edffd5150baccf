"""Topics with many partitions on a real 3-broker cluster (etcd, three broker processes).

etcd refuses a transaction of more than 128 operations by default (``--max-txn-ops``), so a
topic's creation must not be one operation per partition; and every broker must bring up its
replicas of a big topic quickly enough that the topic takes writes right after CreateTopics.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_until


def create(bootstrap: str, topic: str, partitions: int) -> float:
    """Create through the real admin client; returns the seconds CreateTopics took."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    admin.create_topics([NewTopic(topic, partitions, 3)], request_timeout=120)[topic].result(120)
    return time.monotonic() - started


def produce_to_every_partition(bootstrap: str, topic: str, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "enable.idempotence": True})
    errors: list[str] = []

    def delivered(err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            errors.append(str(err))

    for p in range(partitions):
        producer.produce(topic, value=f"value-{p}".encode(), partition=p, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert errors == []


def read_back(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, list[bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "scale-check", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    got: dict[int, list[bytes]] = {p: [] for p in partitions}
    deadline = time.monotonic() + 90
    try:
        while any(not values for values in got.values()) and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                assert message.error() is None, message.error()
                got[message.partition()].append(message.value())
    finally:
        consumer.close()
    return got


# Kafka's defaults rather than the harness's short ones: this test is about size, not fencing, and
# three brokers bringing up 1,000 replicas each on a shared two-core machine can miss a 3 s lease.
SLOW_MACHINE = {"broker.session.timeout.ms": "18000", "replica.lag.time.max.ms": "30000"}


def test_topic_with_1000_partitions_rf3_takes_writes(cluster_factory) -> None:
    cluster = cluster_factory(overrides=SLOW_MACHINE)
    seconds = create(cluster.bootstrap, "wide", 1000)
    assert seconds < 30, f"CreateTopics took {seconds:.1f}s"
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics("wide", timeout=30)
    parts = md.topics["wide"].partitions
    assert len(parts) == 1000
    assert all(len(p.replicas) == 3 and p.leader >= 0 for p in parts.values())
    produce_to_every_partition(cluster.bootstrap, "wide", 1000)
    sample = [0, 1, 127, 128, 129, 500, 998, 999]
    got = read_back(cluster.bootstrap, "wide", sample)
    assert got == {p: [f"value-{p}".encode()] for p in sample}
    # Every follower replica caught up: the ISR of every partition is still all three brokers.
    wait_until(
        lambda: all(
            len(p.isrs) == 3
            for p in AdminClient({"bootstrap.servers": cluster.bootstrap})
            .list_topics("wide", timeout=30)
            .topics["wide"]
            .partitions.values()
        ),
        60,
        message="ISR shrank on a 1000-partition topic",
    )

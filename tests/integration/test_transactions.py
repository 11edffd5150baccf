"""Transactions on a 3-broker cluster with diskless topics: a consume-transform-produce loop with
exactly-once output across a broker kill, aborted transactions hidden from read_committed, and
aiokafka's transactional producer."""

from __future__ import annotations

import time

from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
}
PARTITIONS = 3


def create(cluster, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(t, PARTITIONS, 3, config={"diskless.enabled": "true"}) for t in topics])
    for future in futures.values():
        future.result(30)


def read_all(bootstrap: str, topic: str, isolation: str, expected: int, timeout: float = 60) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{isolation}-{time.monotonic_ns()}",
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    idle_until = None
    while time.monotonic() < deadline:
        batch = consumer.consume(1000, 0.5)
        values.extend(m.value() for m in batch if m.error() is None)
        if len(values) >= expected:
            # Keep reading briefly: anything beyond what we expect would be a duplicate.
            idle_until = idle_until or time.monotonic() + 2
            if time.monotonic() > idle_until:
                break
    consumer.close()
    return values


def test_aborted_transactions_are_invisible_to_read_committed(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    create(cluster, "txn-visibility")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "visibility"})
    producer.init_transactions(30)
    for round_, commit in enumerate([True, False, True, False, True]):
        producer.begin_transaction()
        for i in range(50):
            producer.produce("txn-visibility", value=f"{'c' if commit else 'a'}-{round_}-{i}".encode())
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    committed = read_all(cluster.bootstrap, "txn-visibility", "read_committed", 150)
    everything = read_all(cluster.bootstrap, "txn-visibility", "read_uncommitted", 250)
    assert sorted(committed) == sorted(f"c-{r}-{i}".encode() for r in (0, 2, 4) for i in range(50))
    assert len(everything) == 250 and {v[:1] for v in everything} == {b"c", b"a"}


def test_consume_transform_produce_is_exactly_once_across_a_broker_kill(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    create(cluster, "ctp-in", "ctp-out")
    total = 3000
    feeder = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(total):
        feeder.produce("ctp-in", key=str(i).encode(), value=f"in-{i}".encode())
    assert feeder.flush(60) == 0

    def make_loop() -> tuple[Consumer, Producer]:
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": "transformer",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(["ctp-in"])
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "transactional.id": "transformer-1",
                "transaction.timeout.ms": 10000,
            }
        )
        producer.init_transactions(60)
        return consumer, producer

    consumer, producer = make_loop()
    processed = 0
    killed = False
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        messages = [m for m in consumer.consume(200, 1.0) if m.error() is None]
        if not messages:
            if processed >= total:
                break
            continue
        try:
            producer.begin_transaction()
            for m in messages:
                producer.produce("ctp-out", key=m.key(), value=m.value().replace(b"in-", b"out-"))
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(60)
            processed += len(messages)
        except KafkaException as exc:
            # A fatal or abortable error mid-transaction (the broker kill): abort if possible and
            # restart the loop from the last committed offsets, as an application would.
            error = exc.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction(60)
            consumer.close()
            consumer, producer = make_loop()
            continue
        if not killed and processed >= total // 3:
            victim = next(b for b in cluster.brokers if b.alive() and b.node_id != 0)
            victim.kill()
            killed = True
    consumer.close()
    assert killed, "the loop finished before the broker could be killed"

    out = read_all(cluster.bootstrap, "ctp-out", "read_committed", total, timeout=90)
    assert len(out) == len(set(out)), "an input record was output twice"
    assert sorted(out) == sorted(f"out-{i}".encode() for i in range(total)), "an input record was lost"


async def test_aiokafka_transactional_producer(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    create(cluster, "aio-txn")
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id="aio-1")
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(20):
                await producer.send("aio-txn", value=f"kept-{i}".encode())
        await producer.begin_transaction()
        for i in range(20):
            await producer.send("aio-txn", value=f"dropped-{i}".encode())
        await producer.abort_transaction()
    finally:
        await producer.stop()
    committed = read_all(cluster.bootstrap, "aio-txn", "read_committed", 20)
    assert sorted(committed) == sorted(f"kept-{i}".encode() for i in range(20))

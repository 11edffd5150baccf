"""A diskless produce whose WAL object PUT stalls is answered by the PUT's hedge (storage/hedging.py).

Real processes: etcd, SeaweedFS behind the chaos proxy (``diskless/chaos/s3proxy.py``), one broker
with its default hedging settings. After enough produces for the broker to know its PUT latencies,
the proxy holds the next PUT for 30 s. The produce must be acknowledged long before that (by
the hedge, which the broker's metrics show), and every record must be readable exactly once.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_until
from test_diskless_faults import metric

from diskless.chaos.s3proxy import S3FaultProxy

pytestmark = pytest.mark.integration

HELD_S = 30.0
WARM_UP = 25  # produces before the held one: the policy needs 20 latencies of the size class
# A warm-up PUT slower than the 0.95 quantile may be hedged too (a loaded CI machine): the budget
# must leave room for the held one's hedge.
OVERRIDES = {"diskless.wal.linger.ms": "20", "diskless.s3.hedge.max.ratio": "0.2"}


def hedges(broker: Any) -> tuple[float, float]:
    samples = broker.metrics()
    return (
        metric(samples, "diskless_object_store_hedges_total", operation="put"),
        metric(samples, "diskless_object_store_hedge_wins_total", operation="put"),
    )


def produce_one(producer: Producer, topic: str, value: bytes, timeout: float) -> float:
    """Produce ``value`` and wait for its acknowledgement; seconds it took."""
    errors: list[Any] = []
    started = time.monotonic()
    producer.produce(topic, value=value, partition=0, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(timeout) == 0, f"{value!r} not acknowledged within {timeout} s"
    assert errors == [None], errors
    return time.monotonic() - started


def test_a_stalled_wal_put_is_answered_by_its_hedge(cluster_factory: Any) -> None:
    proxies: list[S3FaultProxy] = []

    def through_proxy(endpoint: str) -> str:
        proxies.append(S3FaultProxy(endpoint, seed=5).start())
        return proxies[-1].endpoint

    try:
        cluster = cluster_factory(brokers=1, azs=1, s3=True, s3_front=through_proxy, overrides=OVERRIDES)
        (proxy,) = proxies
        (broker,) = cluster.brokers
        topic = "hedged"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config={"diskless.enabled": "true"})])[topic].result(30)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
        values = [f"record-{i:03d}".encode() for i in range(WARM_UP + 1)]
        for value in values[:-1]:
            produce_one(producer, topic, value, 30)
        sent, won = hedges(broker)

        proxy.delay_next(HELD_S, method="PUT")
        took = produce_one(producer, topic, values[-1], HELD_S - 10)
        assert took < HELD_S - 10
        assert proxy.stats["slow"] == 1
        sent_now, won_now = hedges(broker)
        assert sent_now >= sent + 1 and won_now >= won + 1  # the held PUT's hedge, and it answered

        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "hedged", "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []

        def read_all() -> bool:
            got.extend(m.value() for m in consumer.consume(100, 0.5) if m.error() is None)
            return len(got) >= len(values)

        wait_until(read_all, 30, 0, "the records never came back")
        consumer.close()
        assert got == values  # each once, in order
    finally:
        for proxy in proxies:
            proxy.stop()

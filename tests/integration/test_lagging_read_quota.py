"""diskless.fetch.lagging.max.bytes.per.second on a real broker (etcd, S3, confluent-kafka).

A consumer reading a diskless topic from its start, with every read a cache miss (a cache too small
to hold a WAL object), is held to the quota: it cannot read faster than the rate plus the bucket's
burst and one fetch, and it still gets every record once, in order (a partition answered
without batches is asked for again from the same offset). Without the quota the same read takes
well under a second on this machine, so the lower bound below fails on code without it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from diskless.fetch.read_quota import BURST_S

pytestmark = pytest.mark.integration

TOPIC = "lagging-quota"
RECORDS = 1000
RECORD_BYTES = 1024
QUOTA = 200 * 1024  # bytes per second
PARTITION_FETCH = 64 * 1024  # the consumer's max.partition.fetch.bytes: one read's upper bound


def test_a_reader_missing_the_cache_is_held_to_the_quota_and_gets_every_record(cluster_factory: Any) -> None:
    cluster = cluster_factory(
        brokers=1,
        azs=1,
        s3=True,
        overrides={
            "diskless.cache.max.bytes": "1",  # nothing fits: every read of old data misses
            "diskless.fetch.lagging.max.bytes.per.second": str(QUOTA),
        },
    )
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config={"diskless.enabled": "true"})])[TOPIC].result(30)
    # Batches of 10 records (~10 KiB): many reads, each far smaller than the quota.
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20, "batch.num.messages": 10}
    )
    for i in range(RECORDS):
        producer.produce(TOPIC, key=str(i).encode(), value=bytes(RECORD_BYTES))
    assert producer.flush(60) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "lagging-quota",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": PARTITION_FETCH,
            "fetch.wait.max.ms": 500,
        }
    )
    consumer.subscribe([TOPIC])
    keys: list[int] = []
    started = None
    deadline = time.monotonic() + 90
    try:
        while len(keys) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            started = started or time.monotonic()
            keys.append(int(msg.key()))
        took = time.monotonic() - (started or time.monotonic())
    finally:
        consumer.close()

    assert keys == list(range(RECORDS))  # every record once, in order
    # Read from object storage after the first fetch: at most rate * t + one burst + one fetch;
    # the last fetch, reaching the partition's end, is the tail's and free.
    least = (RECORDS * RECORD_BYTES - QUOTA * BURST_S - 3 * PARTITION_FETCH) / QUOTA
    assert took >= least, (took, least)

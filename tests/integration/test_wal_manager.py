"""The WAL file manager on a real cluster and S3 server: retention makes objects unreferenced and
they disappear while retained data still reads; an orphan goes after the grace period; a killed
active manager is replaced by the standby.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid

import boto3
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from botocore.config import Config
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic
from rawclient import build_batch
from support import wait_until

from diskless.local.servers import WalManagerServer
from diskless.storage.wal_format import WalObjectWriter, wal_object_key

GRACE_MS = 5000
TIMINGS = {
    "diskless.wal.commit.timeout.ms": "2000",
    "wal.manager.clock.skew.ms": "1000",
    "wal.manager.grace.ms": str(GRACE_MS),
    "wal.manager.confirm.ms": "2500",  # >= the follower read staleness (2 s)
    "wal.manager.check.interval.ms": "300",
    "wal.manager.scan.interval.ms": "1000",
    "broker.session.timeout.ms": "2000",
}


def bucket_keys(cluster) -> set[str]:
    s3 = boto3.client(
        "s3",
        endpoint_url=cluster.s3.endpoint,
        aws_access_key_id=cluster.s3.access_key,
        aws_secret_access_key=cluster.s3.secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    keys: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="diskless", Prefix="wal/"):
        keys.update(o["Key"] for o in page.get("Contents", []))
    return keys


def put_object(cluster, key: str, data: bytes) -> None:
    s3 = boto3.client(
        "s3",
        endpoint_url=cluster.s3.endpoint,
        aws_access_key_id=cluster.s3.access_key,
        aws_secret_access_key=cluster.s3.secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    s3.put_object(Bucket="diskless", Key=key, Body=data)


@pytest.fixture
def start_managers(tmp_path):
    """Start an active and a standby manager for a cluster; both are killed at teardown, pass or fail."""
    started: list[WalManagerServer] = []

    def start(cluster, count: int = 2) -> list[WalManagerServer]:
        for i in range(count):
            manager = WalManagerServer(
                f"wal-manager-{i}", tmp_path / "managers", cluster.etcd.endpoint, cluster.s3.endpoint
            )
            manager.overrides.update(TIMINGS)
            started.append(manager)
            manager.start()
        return started[-count:]

    yield start
    for manager in started:
        manager.kill()


async def produce(bootstrap: str, topic: str, values: list[bytes], timestamp_ms: int | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, partition=0, timestamp_ms=timestamp_ms) for v in values]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str) -> list[bytes]:
    # earliest: a read from the start racing retention (a follower that has not yet heard the
    # leader's new log start) gets OFFSET_OUT_OF_RANGE and must start again at the new start, not
    # jump to the end as aiokafka's default reset (latest) would, reading nothing.
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    out: list[bytes] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + 30
        while (await consumer.position(tp)) < end and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(m.value for m in messages)
    finally:
        await consumer.stop()
    return out


async def test_retention_deletes_wal_objects_and_keeps_retained_data(cluster_factory, start_managers) -> None:
    cluster = cluster_factory(s3=True, overrides={**TIMINGS, "log.retention.check.interval.ms": "300"})
    start_managers(cluster)
    topic = "expiring"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    # segment.ms: the first current record (two hours newer than the old ones) rolls a new segment,
    # so no segment mixes old and new pointers.
    configs = {"diskless.enabled": "true", "segment.bytes": "2000", "segment.ms": "1000", "retention.ms": "600000"}
    admin.create_topics([NewTopic(topic, 1, 3, config=configs)])[topic].result(30)

    # Old records (timestamps two hours back) in their own WAL objects, then current ones.
    old = [f"old-{i}".encode() for i in range(300)]
    for chunk in range(3):
        await produce(
            cluster.bootstrap, topic, old[chunk * 100 : (chunk + 1) * 100], int(time.time() * 1000) - 7_200_000
        )
    old_objects = bucket_keys(cluster)
    assert old_objects, "no WAL objects were written"
    new = [f"new-{i}".encode() for i in range(200)]
    await produce(cluster.bootstrap, topic, new, None)
    new_objects = bucket_keys(cluster) - old_objects

    # Retention drops the old pointers; the manager then deletes exactly the objects they used.
    await asyncio.to_thread(wait_until, lambda: not (bucket_keys(cluster) & old_objects), 60, 0.2)
    assert new_objects <= bucket_keys(cluster), "an object still referenced was deleted"
    retained = await read_all(cluster.bootstrap, topic)
    assert retained[-len(new) :] == new
    assert all(v.startswith(b"new-") for v in retained), "expired records still readable"


async def test_orphans_go_after_grace_and_the_standby_takes_over(cluster_factory, start_managers) -> None:
    cluster = cluster_factory(s3=True, overrides=TIMINGS)
    managers = start_managers(cluster)
    topic = "orphans"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"diskless.enabled": "true"})])[topic].result(30)
    await produce(cluster.bootstrap, topic, [b"committed"], None)
    committed = bucket_keys(cluster)
    kafka_uuid = admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id
    mask = 2**64 - 1
    msb, lsb = kafka_uuid.get_most_significant_bits(), kafka_uuid.get_least_significant_bits()
    topic_id = uuid.UUID(int=((msb & mask) << 64) | (lsb & mask))

    def orphan() -> tuple[str, float]:
        """A WAL object uploaded but never committed (its representative died before committing)."""
        writer = WalObjectWriter()
        writer.add(topic_id, 0, build_batch([(b"k", b"never committed")]))
        created = int(time.time() * 1000)
        key = wal_object_key(created, "az-1", 0)
        put_object(cluster, key, writer.finish(created, 0, "az-1").data)
        return key, time.monotonic()

    key, put_at = orphan()
    await asyncio.to_thread(wait_until, lambda: key not in bucket_keys(cluster), 60, 0.2)
    waited = time.monotonic() - put_at
    assert waited >= GRACE_MS / 1000 - 0.5, f"orphan deleted after {waited:.1f}s, before the grace period"
    assert committed <= bucket_keys(cluster)

    # Kill the active manager; the standby takes the etcd key and keeps deleting.
    etcdctl = os.path.join(os.path.dirname(cluster.etcd.binary()), "etcdctl")
    manager_key = "/diskless/diskless-cluster-0000000/wal-manager"

    def active_instance() -> str | None:
        command = [etcdctl, "--endpoints", cluster.etcd.endpoint, "get", "--print-value-only", manager_key]
        text = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
        return json.loads(text)["instance"] if text else None

    first = wait_until(active_instance, 10)
    victim = next(m for m in managers if first in m.tail(100_000))
    victim.kill()
    second = wait_until(lambda: (active_instance() or first) != first and active_instance(), 20)
    assert second and second != first
    key, put_at = orphan()
    await asyncio.to_thread(wait_until, lambda: key not in bucket_keys(cluster), 60, 0.2)
    assert committed <= bucket_keys(cluster)

"""Tiering on a real cluster, real S3 server and a real local Spark session (issue 12, small size).

A diskless topic is produced (with headers, several flushes), the tier job turns its committed
ranges into segment objects, and then: every client reads every record in order with its offset,
timestamp and headers; pointer bytes on every broker drop by at least 90%; after the WAL
manager's grace the WAL objects left are only those newer than the tiered range. A driver killed
halfway and rerun ends the same; a transaction open across the boundary is not split.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from botocore.config import Config
from confluent_kafka import Consumer, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from support import wait_until

from diskless.local.servers import WalManagerServer
from diskless.spark.tier_job import TierSettings, run_once, settings_from_args
from diskless.storage.segment_object import parse_segment_key

GRACE_MS = 4000
TIMINGS = {
    "diskless.wal.commit.timeout.ms": "2000",
    "wal.manager.clock.skew.ms": "500",
    "wal.manager.grace.ms": str(GRACE_MS),
    "wal.manager.confirm.ms": "2500",  # >= the follower read staleness (2 s)
    "wal.manager.check.interval.ms": "300",
    "wal.manager.scan.interval.ms": "500",
    "diskless.tier.commit.timeout.ms": "20000",
}
PARTITIONS = 3
PER_PARTITION = 400


def s3_client(cluster):
    return boto3.client(
        "s3",
        endpoint_url=cluster.s3.endpoint,
        aws_access_key_id=cluster.s3.access_key,
        aws_secret_access_key=cluster.s3.secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


def keys(cluster, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in s3_client(cluster).get_paginator("list_objects_v2").paginate(Bucket="diskless", Prefix=prefix):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return out


def tier_settings(cluster) -> TierSettings:
    overrides = {"diskless.s3.endpoint": cluster.s3.endpoint, "metadata.etcd.endpoints": cluster.etcd.endpoint}
    return settings_from_args(cluster.bootstrap, None, overrides, None)


async def tier_ranges(cluster) -> list:
    from diskless.spark.tier_job import Driver, resolve_secret

    settings = tier_settings(cluster)
    settings = dataclasses.replace(settings, secret=await resolve_secret(settings, settings.config()))
    driver = Driver(settings)
    try:
        await driver.discover()
        return await driver.ranges()
    finally:
        await driver.close()


def pointer_bytes(cluster, topic: str) -> dict[int, int]:
    """Bytes of pointer segment files of ``topic`` on each broker's disk."""
    out = {}
    for broker in cluster.brokers:
        total = 0
        for path in Path(broker.data_dir).rglob("*.plog"):
            if path.parent.name.startswith(f"{topic}-"):
                total += path.stat().st_size
        out[broker.node_id] = total
    return out


def expected(partition: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [
        (f"k{partition}-{i}".encode(), f"v{partition}-{i}".encode() * 5, [("h", f"{i}".encode())])
        for i in range(PER_PARTITION)
    ]


def produce(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """Every expected record, acks=all, several flushes; returns (partition, offset) -> timestamp."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.num.messages": 50})
    sent: dict[tuple[int, int], int] = {}

    def done(err, msg) -> None:
        assert err is None, err
        sent[(msg.partition(), msg.offset())] = msg.timestamp()[1]

    for i in range(PER_PARTITION):
        for p in range(PARTITIONS):
            key, value, headers = expected(p)[i]
            producer.produce(topic, value, key, partition=p, headers=headers, on_delivery=done)
        if i % 100 == 99:
            producer.flush(30)
    assert producer.flush(30) == 0
    return sent


def check_confluent(bootstrap: str, topic: str, sent: dict[tuple[int, int], int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.time()}", "enable.auto.commit": False})
    from confluent_kafka import TopicPartition as CTP

    consumer.assign([CTP(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
        for msg in consumer.consume(500, 1.0):
            assert msg.error() is None, msg.error()
            got[msg.partition()].append((msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), msg.headers()))
    consumer.close()
    for p in range(PARTITIONS):
        want = expected(p)
        assert [(k, v, h) for _, _, k, v, h in got[p]] == want, f"confluent-kafka partition {p}"
        assert [(o, ts) for o, ts, *_ in got[p]] == sorted((o, sent[(p, o)]) for (pp, o) in sent if pp == p)


async def check_aiokafka(bootstrap: str, topic: str, sent: dict[tuple[int, int], int]) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, max_partition_fetch_bytes=64 * 1024)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            for tp, messages in (await consumer.getmany(timeout_ms=500)).items():
                got[tp.partition].extend((m.offset, m.timestamp, m.key, m.value, list(m.headers)) for m in messages)
    finally:
        await consumer.stop()
    for p in range(PARTITIONS):
        assert [(k, v, h) for _, _, k, v, h in got[p]] == expected(p), f"aiokafka partition {p}"
        assert [(o, ts) for o, ts, *_ in got[p]] == sorted((o, sent[(p, o)]) for (pp, o) in sent if pp == p)


def check_kafka_python(bootstrap: str, topic: str, sent: dict[tuple[int, int], int]) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    tps = [KTP(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    got: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
        for tp, messages in consumer.poll(timeout_ms=500).items():
            got[tp.partition].extend((m.offset, m.timestamp, m.key, m.value, list(m.headers)) for m in messages)
    consumer.close()
    for p in range(PARTITIONS):
        assert [(k, v, h) for _, _, k, v, h in got[p]] == expected(p), f"kafka-python partition {p}"
        assert [(o, ts) for o, ts, *_ in got[p]] == sorted((o, sent[(p, o)]) for (pp, o) in sent if pp == p)


def check_kcat(bootstrap: str, topic: str, sent: dict[tuple[int, int], int]) -> None:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat is not None, "kcat is not installed"
    for p in range(PARTITIONS):
        out = (
            subprocess.run(
                [
                    kcat,
                    "-C",
                    "-b",
                    bootstrap,
                    "-t",
                    topic,
                    "-p",
                    str(p),
                    "-o",
                    "beginning",
                    "-e",
                    "-q",
                    "-f",
                    "%o|%T|%k|%s|%h\\n",
                ],
                capture_output=True,
                timeout=60,
                check=True,
            )
            .stdout.decode()
            .splitlines()
        )
        want = [
            f"{o}|{sent[(p, o)]}|{k.decode()}|{v.decode()}|h={h[0][1].decode()}"
            for o, (k, v, h) in zip(sorted(o for pp, o in sent if pp == p), expected(p), strict=True)
        ]
        assert out == want, f"kcat partition {p}"


def check_offsets_for_times(bootstrap: str, topic: str, sent: dict[tuple[int, int], int]) -> None:
    """ListOffsets by timestamp finds records in tiered ranges (their pointer entries are gone)."""
    from confluent_kafka import TopicPartition as CTP

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "times"})
    offsets = sorted(o for p, o in sent if p == 0)
    for o in (offsets[1], offsets[len(offsets) // 2], offsets[-1]):
        ts = sent[(0, o)]
        want = min(x for x in offsets if sent[(0, x)] >= ts)
        (found,) = consumer.offsets_for_times([CTP(topic, 0, ts)], 30)
        assert found.offset == want, (ts, found.offset, want)
    consumer.close()


@pytest.fixture
def wal_manager(tmp_path):
    started: list[WalManagerServer] = []

    def start(cluster) -> WalManagerServer:
        manager = WalManagerServer("wal-manager", tmp_path / "manager", cluster.etcd.endpoint, cluster.s3.endpoint)
        manager.overrides.update(TIMINGS)
        started.append(manager)
        manager.start()
        return manager

    yield start
    for manager in started:
        manager.kill()


def make_topic(cluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {"diskless.enabled": "true", "segment.bytes": "20000"}
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config=configs)])[topic].result(30)


def test_tier_then_every_client_reads_everything(cluster_factory, wal_manager, spark) -> None:
    cluster = cluster_factory(s3=True, overrides=TIMINGS)
    wal_manager(cluster)
    topic = "tiered"
    make_topic(cluster, topic)
    # An orphan segment (a job killed before its TierCommit): gone after grace plus the tier
    # commit timeout; the committed segments stay.
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    wire = admin.describe_topics(TopicCollection([topic]))[topic].result(30).topic_id
    msb, lsb = wire.get_most_significant_bits() % 2**64, wire.get_least_significant_bits() % 2**64
    topic_id = str(uuid.UUID(int=(msb << 64) | lsb))
    orphan = f"segments/{topic_id}/0/{10**6:020d}-{10**6 + 99:020d}.log"
    s3_client(cluster).put_object(Bucket="diskless", Key=orphan, Body=b"x" * 100)
    sent = produce(cluster.bootstrap, topic)
    wal_before = keys(cluster, "wal/")
    pointers_before = pointer_bytes(cluster, topic)
    assert all(pointers_before.values()), pointers_before

    started = time.monotonic()
    report = run_once(spark, tier_settings(cluster))
    assert not report.refused, report.line()
    assert report.committed == PARTITIONS and report.partitions == PARTITIONS, report.line()
    print(report.line(), f"({time.monotonic() - started:.1f} s)")
    segments = keys(cluster, "segments/")
    segments.pop(orphan, None)
    assert len(segments) == 2 * PARTITIONS, segments

    # Pointer bytes drop by >= 90% on every broker, followers included (once they learn the HW).
    wait_until(
        lambda: all(pointer_bytes(cluster, topic)[b] <= pointers_before[b] / 10 for b in pointers_before),
        30,
        message=f"pointer bytes {pointer_bytes(cluster, topic)} vs {pointers_before}",
    )
    # The WAL objects of the tiered range go after the grace period; nothing else does.
    wait_until(lambda: not (keys(cluster, "wal/").keys() & wal_before.keys()), 60, 0.3, "tiered WAL objects left")
    wait_until(lambda: orphan not in keys(cluster, "segments/"), 60, 0.3, "orphan segment left")
    assert keys(cluster, "segments/") == segments

    check_confluent(cluster.bootstrap, topic, sent)
    asyncio.run(check_aiokafka(cluster.bootstrap, topic, sent))
    check_kafka_python(cluster.bootstrap, topic, sent)
    check_kcat(cluster.bootstrap, topic, sent)
    check_offsets_for_times(cluster.bootstrap, topic, sent)

    # A rerun with nothing new tiers nothing and changes nothing.
    again = run_once(spark, tier_settings(cluster))
    assert again.committed == 0 and not again.refused, again.line()


# The driver in its own process, killed by SIGKILL right after its first TierCommit was answered.
KILLED_DRIVER = """
import os, signal, sys
from diskless.spark import tier_job
from diskless.spark.session import build_session

import asyncio
original = tier_job.Driver.commit
calls = 0

async def commit_then_die(self, segment, info):
    global calls
    calls += 1
    if calls == 1:
        await original(self, segment, info)
        os.kill(os.getpid(), signal.SIGKILL)
    await asyncio.sleep(3600)  # the other partitions' commits are never sent

tier_job.Driver.commit = commit_then_die
settings = tier_job.settings_from_args(sys.argv[1], None, dict(a.split("=", 1) for a in sys.argv[2:]), None)
tier_job.run_once(build_session("local[1]"), settings)
"""


def test_driver_killed_halfway_then_rerun(cluster_factory, spark) -> None:
    cluster = cluster_factory(s3=True, overrides=TIMINGS)
    topic = "killed"
    make_topic(cluster, topic)
    sent = produce(cluster.bootstrap, topic)

    # Killed before any TierCommit: segments written, nothing tiered.
    class Crash(Exception):
        pass

    def crash(_: object) -> None:
        raise Crash

    with pytest.raises(Crash):
        run_once(spark, tier_settings(cluster), after_segments=crash)
    written = keys(cluster, "segments/")
    assert len(written) == 2 * PARTITIONS

    # Killed by SIGKILL after its first commit.
    overrides = [f"diskless.s3.endpoint={cluster.s3.endpoint}", f"metadata.etcd.endpoints={cluster.etcd.endpoint}"]
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_DRIVER, cluster.bootstrap, *overrides], capture_output=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]

    report = run_once(spark, tier_settings(cluster))
    assert not report.refused, report.line()
    assert report.committed == PARTITIONS - 1, report.line()  # one was committed before the kill
    # The same ranges written again, under the rerun's own keys; the killed runs' objects stay
    # until the WAL manager finds them unreferenced past their hold.
    rewritten = keys(cluster, "segments/")
    assert written.keys() <= rewritten.keys()
    assert {parse_segment_key(k) for k in rewritten} == {parse_segment_key(k) for k in written}
    ranges = asyncio.run(tier_ranges(cluster))
    assert [(r.partition, r.segment_objects, r.tiered_end) for r in ranges] == [
        (p, 1, PER_PARTITION) for p in range(PARTITIONS)
    ]
    check_confluent(cluster.bootstrap, topic, sent)
    asyncio.run(check_aiokafka(cluster.bootstrap, topic, sent))


def check_bad_commits_change_nothing(cluster, spark) -> None:
    """TierCommits for a stale epoch, from a non-leader, with a wrong digest or not contiguous are
    refused with a clear error and change nothing."""
    from diskless.spark.tier_job import Driver, Segment, resolve_secret
    from diskless.storage.segment_object import SegmentInfo

    written: list[dict] = []

    class Stop(Exception):
        pass

    def keep(results: list[dict]) -> None:
        written.extend(results)
        raise Stop

    with pytest.raises(Stop):
        run_once(spark, tier_settings(cluster), after_segments=keep)
    (result,) = written
    info = SegmentInfo.from_dict(result["segment"])
    (r,) = asyncio.run(tier_ranges(cluster))

    async def send(r, info: SegmentInfo) -> dict:
        settings = tier_settings(cluster)
        settings = dataclasses.replace(settings, secret=await resolve_secret(settings, settings.config()))
        driver = Driver(settings)
        try:
            await driver.discover()
            return await driver.commit(Segment(r, info.base_offset, info.last_offset, b"", 0), info)
        finally:
            await driver.close()

    other = next(b.node_id for b in cluster.brokers if b.node_id != r.broker)
    cases = {
        "fenced_leader_epoch": (dataclasses.replace(r, leader_epoch=r.leader_epoch - 1), info)
        if r.leader_epoch > 0
        else (dataclasses.replace(r, leader_epoch=r.leader_epoch + 1), info),
        "not_leader_or_follower": (dataclasses.replace(r, broker=other), info),
        "corrupt_message": (r, dataclasses.replace(info, digest=info.digest ^ 1)),
    }
    if r.leader_epoch == 0:
        cases["unknown_leader_epoch"] = cases.pop("fenced_leader_epoch")
    for expected, (where, what) in cases.items():
        answer = asyncio.run(send(where, what))
        assert answer["error_code"] == ErrorCode[expected], (expected, answer)
        assert answer.get("error_message"), answer
    (after,) = asyncio.run(tier_ranges(cluster))
    assert (after.tiered_end, after.segment_objects, after.start) == (0, 0, r.start)


def test_open_transaction_is_not_split(cluster_factory, spark) -> None:
    from confluent_kafka import TopicPartition as CTP

    cluster = cluster_factory(s3=True, overrides=TIMINGS)
    topic = "txns"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {"diskless.enabled": "true"}
    # One replica: consumers in the other AZs read through brokers without one (FetchPointers
    # answers the tiered range's segment, which they read from S3 themselves).
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)
    plain = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    txn = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "tier-txn"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(5):
        txn.produce(topic, f"aborted-{i}".encode(), partition=0)
    txn.flush(30)  # in the log before the abort (abort_transaction purges unsent records)
    txn.abort_transaction(30)
    for i in range(20):
        plain.produce(topic, f"before-{i}".encode(), partition=0)
    assert plain.flush(30) == 0
    txn.begin_transaction()
    for i in range(5):
        txn.produce(topic, f"open-{i}".encode(), partition=0)
    txn.flush(30)
    for i in range(20):
        plain.produce(topic, f"during-{i}".encode(), partition=0)
    assert plain.flush(30) == 0

    check_bad_commits_change_nothing(cluster, spark)
    first = run_once(spark, tier_settings(cluster))
    assert first.committed == 1, first.line()
    # The open transaction's first record is at 5 aborted + 1 marker + 20 = 26: nothing from there on
    # (in the objects of either run: the one stopped before its commit, and this one).
    for segment in keys(cluster, "segments/"):
        parsed = parse_segment_key(segment)
        assert parsed is not None and parsed[2] == 0 and parsed[3] < 26, segment

    txn.commit_transaction(30)
    second = run_once(spark, tier_settings(cluster))
    assert second.committed == 1 and not second.refused, second.line()

    (r,) = asyncio.run(tier_ranges(cluster))
    elsewhere = next(cluster.rack_of(b.node_id) for b in cluster.brokers if b.node_id != r.broker)

    def read(isolation: str) -> list[bytes]:
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": f"g-{isolation}",
                "isolation.level": isolation,
                "client.id": f"diskless_az={elsewhere}",
            }
        )
        consumer.assign([CTP(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(out) < 45 and time.monotonic() < deadline:
            out += [m.value() for m in consumer.consume(100, 1.0) if m.error() is None]
        consumer.close()
        return out

    before = [f"before-{i}".encode() for i in range(20)]
    during = [f"during-{i}".encode() for i in range(20)]
    opened = [f"open-{i}".encode() for i in range(5)]
    assert read("read_committed") == before + opened + during
    assert read("read_uncommitted")[:5] == [f"aborted-{i}".encode() for i in range(5)]


def test_replica_back_from_downtime_adopts_the_tiers(cluster_factory, spark) -> None:
    """A follower that was down while its partition was tiered finds the leader's pointer entries
    gone: it takes the leader's tier state, resumes after it, and serves the tiered range."""
    cluster = cluster_factory(s3=True, overrides=TIMINGS)
    topic = "downtime"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"diskless.enabled": "true", "segment.bytes": "20000"})])[
        topic
    ].result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(topic, f"early-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    (r,) = asyncio.run(tier_ranges(cluster))
    away = next(b for b in cluster.brokers if b.node_id != r.broker)
    away.stop()
    for i in range(200):
        producer.produce(topic, f"late-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    report = run_once(spark, tier_settings(cluster))
    assert report.committed == 1 and not report.refused, report.line()
    producer.produce(topic, b"after", partition=0)
    assert producer.flush(30) == 0

    away.start()
    wait_until(
        lambda: next(Path(away.data_dir).rglob("tier-manifest"), None) is not None,
        60,
        message="the returning replica never took the tier state",
    )
    manifest = next(Path(away.data_dir).rglob("tier-manifest"))
    assert "took the leader's tier state" in away.log_path.read_text()
    wait_until(
        lambda: min(int(p.name.split(".")[0]) for p in manifest.parent.glob("*.plog")) >= 300,
        60,
        message="the returning replica still holds pointer entries of the tiered range",
    )

    # A consumer in the returning broker's AZ is served by it (zone-aligned follower reads).
    from confluent_kafka import TopicPartition as CTP

    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": "downtime", "client.id": f"diskless_az={away.rack}"}
    )
    consumer.assign([CTP(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < 301 and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(100, 1.0) if m.error() is None]
    consumer.close()
    want = [f"early-{i}".encode() for i in range(100)] + [f"late-{i}".encode() for i in range(200)] + [b"after"]
    assert got == want
    # Per-partition gauges on the returning broker's metrics endpoint.
    from diskless.bench.collect import metric_sum

    metrics = away.metrics()
    assert metric_sum(metrics, "diskless_partition_segment_objects", topic=topic, partition="0") == 1
    assert metric_sum(metrics, "diskless_partition_tiered_bytes", topic=topic, partition="0") > 0

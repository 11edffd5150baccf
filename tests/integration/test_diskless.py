"""Diskless topics on a real cluster: 3 brokers in 3 AZs, etcd, and the embedded S3 server.

Everything measured here comes from the brokers themselves (their Prometheus endpoints count
bytes per connection by the peer's AZ, object storage requests, flushes and commit RPCs) or from
their data directories, never from estimates.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog

AZS = ["az-1", "az-2", "az-3"]
RECORDS = 200_000
PARTITIONS = 12
VALUE_SIZE = 200


def create_topic(bootstrap: str, topic: str, partitions: int, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3, config=configs)])[topic].result(30)


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def cross_az_bytes(samples: dict[str, float]) -> float:
    total = 0.0
    for key, value in samples.items():
        if not key.startswith("diskless_connection_bytes_total{"):
            continue
        labels = dict(part.split("=", 1) for part in key[key.index("{") + 1 : -1].split(","))
        if labels["local_az"] != labels["peer_az"]:
            total += value
    return total


def segment_bytes(data_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for d in data_dir.glob(f"{topic}-*") for f in d.iterdir() if f.is_file())


async def produce_from(az: str, bootstrap: str, topic: str, count: int) -> dict[tuple[int, int], bytes]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=f"producer-{az} diskless_az={az}",
        acks="all",
        linger_ms=100,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    acked: dict[tuple[int, int], bytes] = {}
    try:
        futures = []
        for i in range(count):
            value = f"{az}-{i:08d}-".encode().ljust(VALUE_SIZE, b"x")
            futures.append((value, await producer.send(topic, key=f"{az}-{i}".encode(), value=value)))
        for value, future in futures:
            meta = await future
            acked[(meta.partition, meta.offset)] = value
    finally:
        await producer.stop()
    return acked


async def consume_in(az: str, bootstrap: str, topic: str, expected: int) -> dict[int, list[tuple[int, bytes]]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=f"consumer-{az} diskless_az={az}",
        group_id=None,
        enable_auto_commit=False,
    )
    await consumer.start()
    got: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        seen = 0
        deadline = time.monotonic() + 120
        while seen < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000, max_records=20000)
            for tp, messages in batches.items():
                got[tp.partition].extend((m.offset, m.value) for m in messages)
                seen += len(messages)
    finally:
        await consumer.stop()
    return got


async def test_zone_aligned_diskless_produce_and_consume(cluster_factory) -> None:
    cluster = cluster_factory(s3=True)
    topic = "events"
    create_topic(cluster.bootstrap, topic, PARTITIONS, {"diskless.enabled": "true"})
    before = [b.metrics() for b in cluster.brokers]

    per_az = RECORDS // len(AZS)
    results = await asyncio.gather(*(produce_from(az, cluster.bootstrap_in(az), topic, per_az) for az in AZS))
    acked: dict[tuple[int, int], bytes] = {}
    for part in results:
        assert not acked.keys() & part.keys(), "two records acknowledged at one offset"
        acked.update(part)
    assert len(acked) == per_az * len(AZS)
    produced_bytes = sum(len(v) + len(f"{v[:4].decode()}") for v in acked.values())

    consumed = await asyncio.gather(*(consume_in(az, cluster.bootstrap_in(az), topic, len(acked)) for az in AZS))
    for az, got in zip(AZS, consumed, strict=True):
        for partition, messages in got.items():
            offsets = [o for o, _ in messages]
            assert offsets == list(range(len(offsets))), f"{az}: partition {partition} out of order or with gaps"
        flat = {(p, o): v for p, messages in got.items() for o, v in messages}
        assert flat == acked, f"consumer in {az} did not read exactly what was acknowledged"
    consumed_bytes = produced_bytes * len(AZS)

    after = [b.metrics() for b in cluster.brokers]
    delta = [{k: a.get(k, 0.0) - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)]

    # Only metadata crosses zones: commits, pointer replication, metadata requests.
    crossing = sum(cross_az_bytes(d) for d in delta)
    share = crossing / (produced_bytes + consumed_bytes)
    print(f"cross-AZ bytes {crossing:.0f} = {share:.4%} of {produced_bytes + consumed_bytes} payload bytes")
    assert share < 0.01

    # Pointer logs are tiny next to the data they describe.
    for broker in cluster.brokers:
        on_disk = segment_bytes(broker.data_dir, topic)
        print(f"broker {broker.node_id}: {on_disk} bytes of diskless segments = {on_disk / produced_bytes:.3%}")
        assert on_disk < 0.02 * produced_bytes

    objects = sum(metric(d, "diskless_flush_seconds_count") for d in delta)
    for d, broker in zip(delta, cluster.brokers, strict=True):
        flushes = metric(d, "diskless_flush_seconds_count")
        puts = metric(d, "diskless_object_store_requests_total", operation="put")
        commits = metric(d, "diskless_commit_rpcs_total")
        gets = metric(d, "diskless_object_store_requests_total", operation="get")
        print(f"broker {broker.node_id}: flushes={flushes} puts={puts} commit_rpcs={commits} gets={gets} of {objects}")
        assert puts == flushes, "one PUT per flush"
        assert commits <= 3 * flushes, "at most one commit RPC per leader broker per WAL object"
        # Each AZ fetches each object about once (its own uploads it already holds in memory).
        assert gets <= objects * 1.1 + 2


async def produce_steadily(bootstrap: str, topic: str, count: int, progress: list[int]) -> dict[tuple[int, int], bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    acked: dict[tuple[int, int], bytes] = {}
    try:
        for start in range(0, count, 100):
            futures = []
            for i in range(start, min(start + 100, count)):
                value = f"record-{i:06d}".encode()
                futures.append((value, await producer.send(topic, key=str(i).encode(), value=value)))
            for value, future in futures:
                meta = await future
                acked[(meta.partition, meta.offset)] = value
            progress[0] = len(acked)
    finally:
        await producer.stop()
    return acked


def set_diskless(bootstrap: str, topic: str, enabled: bool) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("diskless.enabled", "true" if enabled else "false", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)


async def test_switching_a_topic_to_diskless_and_back_while_producing(cluster_factory) -> None:
    cluster = cluster_factory(s3=True)
    topic = "switching"
    create_topic(cluster.bootstrap, topic, 3, {})
    progress = [0]
    task = asyncio.create_task(produce_steadily(cluster.bootstrap, topic, 10_000, progress))

    async def reach(n: int) -> None:
        deadline = time.monotonic() + 60
        while progress[0] < n and not task.done():
            assert time.monotonic() < deadline, "producer stalled"
            await asyncio.sleep(0.05)

    await reach(3_000)
    await asyncio.to_thread(set_diskless, cluster.bootstrap, topic, True)
    await reach(6_500)
    await asyncio.to_thread(set_diskless, cluster.bootstrap, topic, False)
    acked = await task
    assert len(acked) == 10_000

    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=None)
    await consumer.start()
    got: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(3)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while len(got) < len(acked) and time.monotonic() < deadline:
            for tp, messages in (await consumer.getmany(timeout_ms=1000)).items():
                got.update({(tp.partition, m.offset): m.value for m in messages})
    finally:
        await consumer.stop()
    assert got == acked
    for partition in range(3):
        offsets = sorted(o for p, o in got if p == partition)
        assert offsets == list(range(len(offsets))), f"partition {partition} has gaps"

    # Every replica holds the three eras in order, classic, diskless, classic again, with one
    # continuous offset space: the kinds of its non-empty segments, consecutive repeats (rolls)
    # merged, are exactly records, pointers, records.
    cluster.stop()
    for partition in range(3):
        layouts = []
        for broker in cluster.brokers:
            log = PartitionLog(str(broker.data_dir / f"{topic}-{partition}"), LogConfig(), 0)
            layout = []
            expected_base = log.segments[0].base_offset
            for segment in log.segments:
                assert segment.base_offset == expected_base, "offsets jump between segments"
                expected_base = segment.next_offset
                layout.append((segment.kind, [(h.base_offset, h.crc) for _, h in segment.iter_headers()]))
            layouts.append([(kind, batches) for kind, batches in layout if batches])
            log.close(clean=False)
        assert layouts[0] == layouts[1] == layouts[2], f"replicas of partition {partition} differ"
        eras: list[str] = []
        for kind, _ in layouts[0]:
            if not eras or eras[-1] != kind:
                eras.append(kind)
        assert eras == ["records", "pointers", "records"], f"partition {partition}: segment kinds {eras}"


async def test_an_az_without_a_replica_still_serves_reads(cluster_factory) -> None:
    """RF=1: two of the three AZs hold no replica; their brokers fetch pointers from the leader
    and the data from object storage, answer ListOffsets and forward DeleteRecords."""
    cluster = cluster_factory(s3=True)
    topic = "single-replica"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1, config={"diskless.enabled": "true"})])[topic].result(30)
    acked = await produce_from("az-1", cluster.bootstrap_in("az-1"), topic, 3_000)
    for az in AZS:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.bootstrap_in(az), client_id=f"c diskless_az={az}", group_id=None
        )
        await consumer.start()
        try:
            partitions = [TopicPartition(topic, p) for p in range(3)]
            consumer.assign(partitions)
            await consumer.seek_to_beginning()
            got: dict[tuple[int, int], bytes] = {}
            deadline = time.monotonic() + 60
            while len(got) < len(acked) and time.monotonic() < deadline:
                for tp, messages in (await consumer.getmany(timeout_ms=1000)).items():
                    got.update({(tp.partition, m.offset): m.value for m in messages})
            assert got == acked, f"consumer in {az} read something else"
            ends = await consumer.end_offsets(partitions)
            assert sum(ends.values()) == len(acked)
            # Everything this consumer talked to was in its own AZ.
            metadata = consumer._client.cluster
            for p in range(3):
                leader = metadata.leader_for_partition(TopicPartition(topic, p))
                assert cluster.rack_of(leader) == az
        finally:
            await consumer.stop()

    from confluent_kafka import TopicPartition as ConfluentPartition

    remote_admin = AdminClient(
        {"bootstrap.servers": cluster.bootstrap_in("az-3"), "client.id": "admin diskless_az=az-3"}
    )
    futures = remote_admin.delete_records([ConfluentPartition(topic, p, 10) for p in range(3)])
    for tp, future in futures.items():
        assert future.result(30).low_watermark == 10, f"partition {tp.partition}"

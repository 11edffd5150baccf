"""The per-key form of cluster metadata in etcd: a topic is one record carrying every partition's
assignment (however many partitions), partition records carry later states of one incarnation."""

from __future__ import annotations

import json

from diskless.cluster.metadata import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    apply_record,
    initial_state,
    partition_record,
    topic_record,
)


def cluster() -> ClusterMetadata:
    meta = ClusterMetadata("c")
    for i in range(3):
        meta.brokers[i] = BrokerInfo(i, "h", 9092, f"az-{i}")
    return meta


def test_a_topic_of_10000_partitions_is_one_small_record() -> None:
    writer = cluster()
    topic = writer.create_topic("wide", 10_000, 3, {}, validate_only=True)
    record = topic_record(topic)
    assert len(record) < 200_000  # far below etcd's 1.5 MiB request limit

    reader = cluster()
    changes = apply_record(reader, "topics/wide", record)
    assert changes[0] == ("topic", "wide")
    assert changes[1:] == [("partition", "wide", str(i)) for i in range(10_000)]
    assert reader.topics["wide"].partitions == topic.partitions
    assert all(p == initial_state(p.replicas) for p in reader.topics["wide"].partitions)


def test_partition_records_override_and_survive_topic_record_rewrites() -> None:
    writer = cluster()
    topic = writer.create_topic("t", 4, 3, {}, validate_only=True)
    reader = cluster()
    apply_record(reader, "topics/t", topic_record(topic))
    moved = PartitionState(topic.partitions[2].replicas, topic.partitions[2].replicas[1], 1, [1, 2])
    assert apply_record(reader, "partitions/t/2", partition_record(moved, topic.topic_id)) == [("partition", "t", "2")]
    assert reader.topics["t"].partitions[2] == moved

    # A config change rewrites the topic record: known partitions keep their later state.
    topic.configs = {"retention.ms": "1000"}
    assert apply_record(reader, "topics/t", topic_record(topic)) == [("topic", "t")]
    assert reader.topics["t"].partitions[2] == moved
    assert reader.topics["t"].configs == {"retention.ms": "1000"}

    # Added partitions arrive with the record and are reported.
    grown = writer._assign(2, 3, 4)
    topic.partitions = [*topic.partitions, *grown]
    changes = apply_record(reader, "topics/t", topic_record(topic))
    assert changes == [("topic", "t"), ("partition", "t", "4"), ("partition", "t", "5")]
    assert reader.topics["t"].partitions[4:] == grown


def test_a_partition_state_of_another_incarnation_is_ignored() -> None:
    writer = cluster()
    topic = writer.create_topic("t", 1, 3, {}, validate_only=True)
    reader = cluster()
    apply_record(reader, "topics/t", topic_record(topic))
    stale = PartitionState(topic.partitions[0].replicas, -1, 7, [])
    assert apply_record(reader, "partitions/t/0", partition_record(stale, "an-older-topic-id")) == []
    assert reader.topics["t"].partitions[0] == initial_state(topic.partitions[0].replicas)


def test_records_written_before_assignments_lived_in_the_topic_record() -> None:
    reader = cluster()
    old = {"name": "t", "topic_id": "id-1", "configs": {}, "internal": False, "partitions": 2}
    apply_record(reader, "topics/t", json.dumps(old).encode())
    assert reader.topics["t"].partitions[0].replicas == []
    state = PartitionState([0, 1], 0, 0, [0, 1])
    apply_record(
        reader,
        "partitions/t/1",
        json.dumps({"replicas": [0, 1], "leader": 0, "leader_epoch": 0, "isr": [0, 1]}).encode(),
    )
    assert reader.topics["t"].partitions[1] == state

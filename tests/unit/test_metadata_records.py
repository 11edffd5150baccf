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


def test_fields_a_newer_version_adds_to_its_records_are_ignored() -> None:
    """Mid-upgrade, a newer broker registers (or a newer controller writes a partition state) with
    a field this version does not know. Before, ``BrokerInfo(**raw)`` raised TypeError and the
    record, and on a full load every record after it, was lost."""
    reader = cluster()
    newer = json.dumps({"node_id": 7, "host": "h7", "port": 9092, "rack": "az-1", "cpu_class": "arm"}).encode()
    assert apply_record(reader, "brokers/7", newer) == [("broker", "7")]
    assert reader.brokers[7] == BrokerInfo(7, "h7", 9092, "az-1")

    topic = cluster().create_topic("t", 1, 3, {}, validate_only=True)
    apply_record(reader, "topics/t", topic_record(topic))
    state = json.loads(partition_record(topic.partitions[0], topic.topic_id))
    state["elr"] = [1]  # KIP-966's eligible leader replicas, say
    apply_record(reader, "partitions/t/0", json.dumps(state).encode())
    assert reader.topics["t"].partitions[0] == topic.partitions[0]


def test_a_record_it_cannot_read_is_refused_alone() -> None:
    import pytest

    from diskless.cluster.metadata import UnreadableRecord

    reader = cluster()
    for path, value in [("brokers/9", b"{not json"), ("brokers/9", b'{"host": "h"}'), ("controller", b"[]")]:
        with pytest.raises(UnreadableRecord, match=path):
            apply_record(reader, path, value)
    assert sorted(reader.brokers) == [0, 1, 2]


async def test_a_load_skips_a_record_it_cannot_read_and_keeps_the_rest() -> None:
    """A full load clears the local copy, then applies every record: one bad record stopped it
    half-way, leaving the broker without the brokers and topics after it."""
    from types import SimpleNamespace

    from diskless.cluster.etcd_store import EtcdMetadataStore

    topic = cluster().create_topic("t", 2, 3, {}, validate_only=True)
    stored = {
        "brokers/0": json.dumps({"node_id": 0, "host": "h0", "port": 9092}).encode(),
        "brokers/1": b"{damaged",
        "brokers/2": json.dumps({"node_id": 2, "host": "h2", "port": 9092}).encode(),
        "topics/t": topic_record(topic),
    }
    metadata = ClusterMetadata("c")
    store = EtcdMetadataStore("127.0.0.1:2379", "c", metadata)

    class Result(list):  # type: ignore[type-arg]
        """What aetcd's get_prefix gives: the key-values, and the revision they were read at."""

        header = SimpleNamespace(revision=5)

    async def get_prefix(prefix: bytes) -> Result:
        return Result(
            SimpleNamespace(key=prefix + path.encode(), value=value, mod_revision=5, create_revision=5)
            for path, value in stored.items()
        )

    store.client = SimpleNamespace(get_prefix=get_prefix)  # type: ignore[assignment]
    assert await store._load() == 5
    assert sorted(metadata.brokers) == [0, 2]
    assert metadata.topics["t"].partitions == topic.partitions

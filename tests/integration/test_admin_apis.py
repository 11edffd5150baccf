"""Admin and offset APIs through real clients: ListOffsets, DeleteRecords, retention, configs, topics.

confluent_kafka's AdminClient and kafka-python's KafkaAdminClient/KafkaConsumer drive the broker;
a raw kio request is used only for OffsetForLeaderEpoch, which no client library exposes, and for
Metadata without auto-creation.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType as KPConfigResourceType
from kafka.errors import MessageSizeTooLargeError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from kio.schema.errors import ErrorCode
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from rawclient import Session
from support import wait_until

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


# --- helpers -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_handler_crashes(tmp_path):
    """Whatever the input, the broker answers or closes cleanly: no handler may blow up."""
    yield
    for log_file in tmp_path.glob("*.log"):
        text = log_file.read_text(errors="replace")
        assert "Traceback" not in text, f"{log_file.name}:\n{text[-3000:]}"


def now_ms() -> int:
    return int(time.time() * 1000)


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(client: AdminClient, topic: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    client.create_topics([NewTopic(topic, partitions, 1, config=config or {})], operation_timeout=10)[topic].result(
        timeout=10
    )


def create_topic_error(client: AdminClient, new_topic: NewTopic, **kwargs) -> int:
    """The Kafka error code the broker answers a CreateTopics request with."""
    future = client.create_topics([new_topic], operation_timeout=10, **kwargs)[new_topic.topic]
    with pytest.raises(KafkaException) as info:
        future.result(timeout=10)
    return info.value.args[0].code()


def topic_configs(client: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return client.describe_configs([resource])[resource].result(timeout=10)


def incremental_alter(client: AdminClient, topic: str, entries: list[ConfigEntry]) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    client.incremental_alter_configs([resource])[resource].result(timeout=10)


def set_op(name: str, value: str) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


def delete_op(name: str) -> ConfigEntry:
    return ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)


def kafka_error_code(future) -> int:
    with pytest.raises(KafkaException) as info:
        future.result(timeout=10)
    return info.value.args[0].code()


def list_offset(client: AdminClient, topic: str, spec: OffsetSpec, partition: int = 0) -> tuple[int, int]:
    tp = CTopicPartition(topic, partition)
    result = client.list_offsets({tp: spec})[tp].result(timeout=10)
    return result.offset, result.timestamp


def produce_one_by_one(bootstrap: str, topic: str, rows: list[tuple[bytes, int | None]], partition: int = 0) -> list:
    """Each (value, timestamp) as its own batch, acks=all; returns the RecordMetadata list."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        return [
            producer.send(topic, value=value, timestamp_ms=ts, partition=partition).get(timeout=10)
            for value, ts in rows
        ]
    finally:
        producer.close(timeout=5)


def consumer_for(bootstrap: str, **config) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **config)


def poll_until(consumer: KafkaConsumer, tp: TopicPartition, count: int, timeout: float = 15.0) -> list:
    records: list = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        assert time.monotonic() < deadline, f"only {len(records)} of {count} records consumed"
        records += consumer.poll(timeout_ms=500).get(tp, [])
    return records


# --- ListOffsets -----------------------------------------------------------------------------------


def test_list_offsets_earliest_latest_and_by_timestamp(broker):
    topic = "offsets-by-time"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    base = now_ms() - HOUR_MS
    # Timestamps are not monotonic in offset order; the max timestamp sits in the middle.
    timestamps = [base, base + 100, base + 300, base + 200, base + 900, base + 400, base + 500, base + 600]
    # The first four go out as one batch, the rest one batch each.
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=200)
    futures = [producer.send(topic, value=f"v{i}".encode(), timestamp_ms=ts) for i, ts in enumerate(timestamps[:4])]
    producer.flush(timeout=10)
    offsets = [f.get(timeout=10).offset for f in futures]
    producer.close(timeout=5)
    metas = produce_one_by_one(
        broker.bootstrap, topic, [(f"v{i + 4}".encode(), ts) for i, ts in enumerate(timestamps[4:])]
    )
    offsets += [m.offset for m in metas]
    assert offsets == list(range(8))

    consumer = consumer_for(broker.bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 8}
        expected = {
            base - 1000: (0, base),  # before everything: the first record
            base: (0, base),  # exact match
            base + 150: (2, base + 300),  # first offset with ts >= target, not the closest timestamp
            base + 250: (2, base + 300),
            base + 301: (4, base + 900),  # skips offset 3 (ts 200) and lands on the big one
            base + 450: (4, base + 900),
            base + 900: (4, base + 900),
        }
        for target, (offset, ts) in expected.items():
            found = consumer.offsets_for_times({tp: target})[tp]
            assert (found.offset, found.timestamp) == (offset, ts), f"target {target - base}"
        assert consumer.offsets_for_times({tp: base + 901}) == {tp: None}
        assert consumer.offsets_for_times({tp: now_ms() + HOUR_MS}) == {tp: None}
    finally:
        consumer.close()

    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 0
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 8
    assert list_offset(client, topic, OffsetSpec.for_timestamp(base + 150)) == (2, base + 300)
    assert list_offset(client, topic, OffsetSpec.for_timestamp(base + 901))[0] == -1
    assert list_offset(client, topic, OffsetSpec.max_timestamp()) == (4, base + 900)


def test_list_offsets_max_timestamp_inside_a_batch_and_empty_topic(broker):
    topic = "offsets-max-ts"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    # Empty partition: earliest == latest == 0, no max timestamp.
    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 0
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 0
    assert list_offset(client, topic, OffsetSpec.max_timestamp())[0] == -1
    base = now_ms() - HOUR_MS
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=200)
    futures = [
        producer.send(topic, value=b"x", timestamp_ms=ts) for ts in (base, base + 50, base + 700, base + 10, base + 20)
    ]
    producer.flush(timeout=10)
    assert [f.get(timeout=10).offset for f in futures] == [0, 1, 2, 3, 4]
    producer.close(timeout=5)
    assert list_offset(client, topic, OffsetSpec.max_timestamp()) == (2, base + 700)


# --- DeleteRecords ---------------------------------------------------------------------------------


def test_delete_records_moves_low_watermark(broker):
    topic = "delete-records"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    produce_one_by_one(broker.bootstrap, topic, [(f"v{i}".encode(), None) for i in range(10)])

    tp = CTopicPartition(topic, 0, 4)
    deleted = client.delete_records([tp])[tp].result(timeout=10)
    assert deleted.low_watermark == 4
    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 4
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 10

    # kafka-python's admin client moves it further.
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = kp_admin.delete_records({TopicPartition(topic, 0): 6})
        assert result[TopicPartition(topic, 0)]["low_watermark"] == 6
        # Deleting below the current start is a no-op that reports the current start.
        result = kp_admin.delete_records({TopicPartition(topic, 0): 2})
        assert result[TopicPartition(topic, 0)]["low_watermark"] == 6
    finally:
        kp_admin.close()

    # Beyond the high watermark: OFFSET_OUT_OF_RANGE, nothing moves.
    beyond = CTopicPartition(topic, 0, 11)
    assert kafka_error_code(client.delete_records([beyond])[beyond]) == ErrorCode.offset_out_of_range
    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 6
    # A partition the topic does not have (sent straight to the broker, bypassing client checks).
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        with pytest.raises(UnknownTopicOrPartitionError):
            kp_admin.delete_records({TopicPartition(topic, 3): 1}, partition_leader_id=0)
    finally:
        kp_admin.close()

    # A consumer starting from earliest starts at the low watermark.
    consumer = consumer_for(broker.bootstrap, auto_offset_reset="earliest")
    try:
        ktp = TopicPartition(topic, 0)
        consumer.assign([ktp])
        records = poll_until(consumer, ktp, 4)
        assert [(r.offset, r.value) for r in records] == [(i, f"v{i}".encode()) for i in range(6, 10)]
    finally:
        consumer.close()
    # Reading below the low watermark is out of range.
    with Session(broker.bootstrap) as session:
        assert session.fetch(topic, 0, 3).error_code == ErrorCode.offset_out_of_range
        assert [r.offset for r in session.fetch_all(topic, 0, 6)] == [6, 7, 8, 9]

    # Lookups by timestamp never answer below the low watermark.
    consumer = consumer_for(broker.bootstrap)
    try:
        ktp = TopicPartition(topic, 0)
        assert consumer.offsets_for_times({ktp: 0})[ktp].offset == 6
    finally:
        consumer.close()

    # Offset -1 means "up to the high watermark": everything goes; producing carries on.
    everything = CTopicPartition(topic, 0, -1)
    assert client.delete_records([everything])[everything].result(timeout=10).low_watermark == 10
    assert produce_one_by_one(broker.bootstrap, topic, [(b"after", None)])[0].offset == 10
    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 10


def test_delete_records_survives_restart(broker):
    topic = "delete-records-restart"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    produce_one_by_one(broker.bootstrap, topic, [(f"v{i}".encode(), None) for i in range(5)])
    tp = CTopicPartition(topic, 0, 3)
    assert client.delete_records([tp])[tp].result(timeout=10).low_watermark == 3
    broker.kill()
    broker.start()
    client = admin(broker.bootstrap)
    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 3
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 5


# --- retention ---------------------------------------------------------------------------------------


def test_retention_bytes_deletes_old_segments(broker_factory):
    broker = broker_factory(overrides={"log.retention.check.interval.ms": "200"})
    topic = "retention-bytes"
    client = admin(broker.bootstrap)
    create_topic(client, topic, config={"segment.bytes": "1024", "retention.bytes": "2048"})
    values = [f"{i:04d}".encode() * 50 for i in range(40)]  # 200-byte values: a few batches per segment
    metas = produce_one_by_one(broker.bootstrap, topic, [(v, None) for v in values])
    assert [m.offset for m in metas] == list(range(40))

    def earliest() -> int:
        return list_offset(client, topic, OffsetSpec.earliest())[0]

    start = wait_until(lambda: earliest() or None, timeout=10, message="retention.bytes never deleted a segment")
    # What is left is bounded by retention.bytes plus at most the segment being written.
    log_dir = Path(broker.data_dir) / f"{topic}-0"
    wait_until(lambda: sum(p.stat().st_size for p in log_dir.glob("*.log")) <= 2048 + 1024, timeout=10)
    start = earliest()
    assert 0 < start < 40
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 40

    with Session(broker.bootstrap) as session:
        assert session.fetch(topic, 0, 0).error_code == ErrorCode.offset_out_of_range
        remaining = session.fetch_all(topic, 0, start)
        assert [r.offset for r in remaining] == list(range(start, 40))
        assert [r.value for r in remaining] == values[start:]

    consumer = consumer_for(broker.bootstrap, auto_offset_reset="none")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=500)
        consumer.seek(tp, 39)
        newest = poll_until(consumer, tp, 1)
        assert (newest[0].offset, newest[0].value) == (39, values[39])
    finally:
        consumer.close()


def test_retention_ms_deletes_segments_with_old_timestamps(broker_factory):
    broker = broker_factory(overrides={"log.retention.check.interval.ms": "200"})
    topic = "retention-ms"
    client = admin(broker.bootstrap)
    # Every batch (> 300 bytes) fills a segment of its own.
    create_topic(client, topic, config={"segment.bytes": "300"})
    old = now_ms() - 2 * HOUR_MS
    rows = [(f"old-{i}".encode() * 40, old + i) for i in range(5)]
    rows += [(f"new-{i}".encode() * 40, None) for i in range(3)]
    metas = produce_one_by_one(broker.bootstrap, topic, rows)
    assert [m.offset for m in metas] == list(range(8))
    # The default retention (7 days) keeps everything; an hour's retention expires the old records.
    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 0
    incremental_alter(client, topic, [set_op("retention.ms", str(HOUR_MS))])

    wait_until(
        lambda: list_offset(client, topic, OffsetSpec.earliest())[0] == 5,
        timeout=10,
        message="segments older than retention.ms were not deleted",
    )
    with Session(broker.bootstrap) as session:
        assert session.fetch(topic, 0, 4).error_code == ErrorCode.offset_out_of_range
        remaining = session.fetch_all(topic, 0, 5)
        assert [(r.offset, r.value) for r in remaining] == [(5 + i, rows[5 + i][0]) for i in range(3)]
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 8


def test_retention_can_empty_a_partition_and_producing_continues(broker_factory):
    broker = broker_factory(overrides={"log.retention.check.interval.ms": "200"})
    topic = "retention-all"
    client = admin(broker.bootstrap)
    create_topic(client, topic, config={"retention.ms": str(HOUR_MS)})
    old = now_ms() - 2 * HOUR_MS
    produce_one_by_one(broker.bootstrap, topic, [(f"old-{i}".encode(), old + i) for i in range(4)])
    # Even the segment being written expires: the log rolls and starts over at the log end.
    wait_until(lambda: list_offset(client, topic, OffsetSpec.earliest())[0] == 4, timeout=10)
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 4
    assert produce_one_by_one(broker.bootstrap, topic, [(b"fresh", None)])[0].offset == 4
    broker.kill()
    broker.start()
    client = admin(broker.bootstrap)
    assert list_offset(client, topic, OffsetSpec.earliest())[0] == 4
    with Session(broker.bootstrap) as session:
        assert [(r.offset, r.value) for r in session.fetch_all(topic, 0, 4)] == [(4, b"fresh")]
    assert produce_one_by_one(broker.bootstrap, topic, [(b"fresher", None)])[0].offset == 5


# --- configs -----------------------------------------------------------------------------------------

KAFKA_DEFAULTS = {
    "retention.ms": "604800000",
    "cleanup.policy": "delete",
    "max.message.bytes": "1048588",
    "segment.bytes": "1073741824",
    "min.insync.replicas": "1",
    "retention.bytes": "-1",
    "message.timestamp.type": "CreateTime",
    "compression.type": "producer",
}


def test_describe_configs_returns_kafka_defaults_and_sources(broker):
    topic = "describe-configs"
    client = admin(broker.bootstrap)
    create_topic(client, topic, config={"retention.ms": "3600000"})
    configs = topic_configs(client, topic)
    for name, value in KAFKA_DEFAULTS.items():
        if name == "retention.ms":
            continue
        assert configs[name].value == value, name
        assert configs[name].source == ConfigSource.DEFAULT_CONFIG.value, name
        assert configs[name].is_default, name
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not configs["retention.ms"].is_default

    # kafka-python asks for specific keys only and gets exactly those.
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = kp_admin.describe_configs(
            [
                KPConfigResource(
                    KPConfigResourceType.TOPIC, topic, configs={"retention.ms": None, "segment.bytes": None}
                )
            ],
            config_filter="all",
        )
        described = result["topic"][topic]
        assert set(described) == {"retention.ms", "segment.bytes"}
        assert described["retention.ms"]["value"] == "3600000"
        assert described["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert described["segment.bytes"]["value"] == "1073741824"
        assert described["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"
    finally:
        kp_admin.close()

    # An unknown topic is an error, not an empty answer.
    resource = ConfigResource(ResourceType.TOPIC, "no-such-topic")
    future = client.describe_configs([resource])[resource]
    assert kafka_error_code(future) == ErrorCode.unknown_topic_or_partition


def test_describe_configs_reports_broker_level_defaults(broker_factory):
    broker = broker_factory(overrides={"log.retention.ms": "86400000", "message.max.bytes": "2000000"})
    topic = "broker-defaults"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    configs = topic_configs(client, topic)
    assert configs["retention.ms"].value == "86400000"
    assert configs["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["max.message.bytes"].value == "2000000"
    assert configs["max.message.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value


def test_alter_and_incremental_alter_configs(broker):
    topic = "alter-configs"
    client = admin(broker.bootstrap)
    create_topic(client, topic)

    # validate_only checks the request and changes nothing.
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[set_op("retention.ms", "5")])
    client.incremental_alter_configs([resource], validate_only=True)[resource].result(timeout=10)
    assert topic_configs(client, topic)["retention.ms"].is_default

    incremental_alter(client, topic, [set_op("retention.ms", "1000"), set_op("segment.bytes", "2097152")])
    configs = topic_configs(client, topic)
    assert (configs["retention.ms"].value, configs["segment.bytes"].value) == ("1000", "2097152")
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    incremental_alter(client, topic, [delete_op("segment.bytes"), set_op("cleanup.policy", "delete")])
    configs = topic_configs(client, topic)
    assert configs["segment.bytes"].value == "1073741824"
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["retention.ms"].value == "1000"
    assert configs["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    # Legacy AlterConfigs replaces the whole set: overrides not named revert to defaults.
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"max.message.bytes": "5000"})
    with pytest.warns(DeprecationWarning):
        futures = client.alter_configs([resource])
    futures[resource].result(timeout=10)
    configs = topic_configs(client, topic)
    assert configs["max.message.bytes"].value == "5000"
    assert configs["retention.ms"].value == "604800000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value

    # kafka-python: set, then reset (IncrementalAlterConfigs DELETE).
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = kp_admin.alter_configs(
            [
                KPConfigResource(
                    KPConfigResourceType.TOPIC, topic, configs={"min.insync.replicas": "1", "retention.bytes": "123456"}
                )
            ]
        )
        assert result["topic"][topic] == "OK"
        assert topic_configs(client, topic)["retention.bytes"].value == "123456"
        kp_admin.reset_configs([KPConfigResource(KPConfigResourceType.TOPIC, topic, configs=["retention.bytes"])])
        assert topic_configs(client, topic)["retention.bytes"].value == "-1"
    finally:
        kp_admin.close()

    # The altered max.message.bytes is enforced on produce.
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", max_request_size=10_000_000, retries=0)
    try:
        with pytest.raises(MessageSizeTooLargeError):
            producer.send(topic, value=b"x" * 6000).get(timeout=10)
        assert producer.send(topic, value=b"x" * 100).get(timeout=10).offset == 0
    finally:
        producer.close(timeout=5)


def test_invalid_and_unknown_configs_are_refused(broker):
    topic = "bad-configs"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    bad = [
        [set_op("retention.ms", "not-a-number")],
        [set_op("cleanup.policy", "compact-ish")],
        [set_op("min.insync.replicas", "0")],
        [set_op("segment.bytes", "99999999999")],  # beyond int range
        [set_op("no.such.config", "1")],
    ]
    for entries in bad:
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        code = kafka_error_code(client.incremental_alter_configs([resource])[resource])
        assert code == ErrorCode.invalid_config, entries[0].name
    # Nothing was changed by the refused requests.
    configs = topic_configs(client, topic)
    # diskless.enabled is the one override every topic has: its kind, pinned at creation.
    assert all(c.is_default for name, c in configs.items() if name != "diskless.enabled")
    assert configs["diskless.enabled"].value == "false"
    assert "no.such.config" not in configs

    # CreateTopics validates configs the same way.
    code = create_topic_error(client, NewTopic("bad-configs-2", 1, 1, config={"retention.ms": "soon"}))
    assert code == ErrorCode.invalid_config
    code = create_topic_error(client, NewTopic("bad-configs-3", 1, 1, config={"no.such.config": "1"}))
    assert code == ErrorCode.invalid_config
    # Altering a topic that does not exist.
    resource = ConfigResource(ResourceType.TOPIC, "never-created", incremental_configs=[set_op("retention.ms", "1")])
    code = kafka_error_code(client.incremental_alter_configs([resource])[resource])
    assert code == ErrorCode.unknown_topic_or_partition
    assert "bad-configs-2" not in client.list_topics(timeout=10).topics


# --- topics ------------------------------------------------------------------------------------------


def test_create_partitions_grows_topic(broker):
    topic = "grow"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    client.create_partitions([NewPartitions(topic, 5)], validate_only=True)[topic].result(timeout=10)
    assert sorted(client.list_topics(timeout=10).topics[topic].partitions) == [0]
    client.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=10)
    assert sorted(client.list_topics(timeout=10).topics[topic].partitions) == [0, 1, 2]
    for partition in (1, 2):
        meta = produce_one_by_one(broker.bootstrap, topic, [(f"p{partition}".encode(), None)], partition=partition)
        assert (meta[0].partition, meta[0].offset) == (partition, 0)
    # The new partitions and their data outlive a crash.
    broker.kill()
    broker.start()
    client = admin(broker.bootstrap)
    assert sorted(client.list_topics(timeout=10).topics[topic].partitions) == [0, 1, 2]
    with Session(broker.bootstrap) as session:
        for partition in (1, 2):
            assert [r.value for r in session.fetch_all(topic, partition)] == [f"p{partition}".encode()]
    # Shrinking, or "growing" to the same count, is refused.
    assert kafka_error_code(client.create_partitions([NewPartitions(topic, 2)])[topic]) == ErrorCode.invalid_partitions
    assert kafka_error_code(client.create_partitions([NewPartitions(topic, 3)])[topic]) == ErrorCode.invalid_partitions
    missing = "grow-missing"
    code = kafka_error_code(client.create_partitions([NewPartitions(missing, 3)])[missing])
    assert code == ErrorCode.unknown_topic_or_partition


def test_delete_topic_removes_it(broker):
    topic = "doomed"
    client = admin(broker.bootstrap)
    create_topic(client, topic)
    produce_one_by_one(broker.bootstrap, topic, [(b"old", None)] * 3)
    client.delete_topics([topic], operation_timeout=10)[topic].result(timeout=10)

    assert topic not in client.list_topics(timeout=10).topics
    with Session(broker.bootstrap) as session:
        md = session.metadata([topic], allow_auto_create=False)
        assert md.topics[0].error_code == ErrorCode.unknown_topic_or_partition
        assert session.fetch(topic, 0, 0).error_code == ErrorCode.unknown_topic_or_partition
    assert not (Path(broker.data_dir) / f"{topic}-0").exists()
    # Deleting again: unknown topic.
    assert kafka_error_code(client.delete_topics([topic])[topic]) == ErrorCode.unknown_topic_or_partition

    # Re-created under the same name it starts empty, and that survives a restart.
    create_topic(client, topic)
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 0
    broker.kill()
    broker.start()
    client = admin(broker.bootstrap)
    assert list_offset(client, topic, OffsetSpec.latest())[0] == 0
    assert produce_one_by_one(broker.bootstrap, topic, [(b"new", None)])[0].offset == 0


def test_create_topics_errors(broker):
    client = admin(broker.bootstrap)
    create_topic(client, "exists")
    assert create_topic_error(client, NewTopic("exists", 1, 1)) == ErrorCode.topic_already_exists
    assert create_topic_error(client, NewTopic("rf3", 1, 3)) == ErrorCode.invalid_replication_factor
    assert create_topic_error(client, NewTopic("zero-partitions", 0, 1)) == ErrorCode.invalid_partitions
    for name in ("bad name", "bad/name", "x" * 250, ".."):
        assert create_topic_error(client, NewTopic(name, 1, 1)) == ErrorCode.invalid_topic_exception, name
    # validate_only checks without creating.
    client.create_topics([NewTopic("dry-run", 2, 1)], validate_only=True)["dry-run"].result(timeout=10)
    assert create_topic_error(client, NewTopic("exists", 1, 1), validate_only=True) == ErrorCode.topic_already_exists
    topics = client.list_topics(timeout=10).topics
    assert "exists" in topics
    assert not {"rf3", "zero-partitions", "dry-run"} & set(topics)

    # kafka-python: an explicit partition count and replication factor of -1 take broker defaults.
    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = kp_admin.create_topics({"defaults": {}}, raise_errors=False)
        entry = result["topics"][0]
        assert (entry["error_code"], entry["num_partitions"], entry["replication_factor"]) == (0, 1, 1)
    finally:
        kp_admin.close()


def test_describe_cluster(broker):
    client = admin(broker.bootstrap)
    cluster = client.describe_cluster().result(timeout=10)
    assert cluster.cluster_id == "diskless-cluster-0000000"
    assert cluster.controller.id == 0
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, broker.host, broker.port)]

    kp_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        described = kp_admin.describe_cluster()
        assert described["cluster_id"] == cluster.cluster_id
        assert described["controller_id"] == 0
        assert [(b["broker_id"], b["host"], b["port"]) for b in described["brokers"]] == [(0, broker.host, broker.port)]
    finally:
        kp_admin.close()


def test_log_append_time_replaces_producer_timestamps(broker):
    topic = "log-append-time"
    client = admin(broker.bootstrap)
    create_topic(client, topic, config={"message.timestamp.type": "LogAppendTime"})
    created_at = now_ms() - 5 * HOUR_MS
    before = now_ms()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=100)
    futures = [producer.send(topic, value=f"v{i}".encode(), timestamp_ms=created_at + i) for i in range(5)]
    producer.flush(timeout=10)
    metas = [f.get(timeout=10) for f in futures]
    producer.close(timeout=5)
    after = now_ms()
    # The produce response carries the broker's append time.
    assert all(before <= m.timestamp <= after for m in metas), [m.timestamp for m in metas]

    consumer = consumer_for(broker.bootstrap, auto_offset_reset="earliest")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        records = poll_until(consumer, tp, 5)
    finally:
        consumer.close()
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(5)]
    for record in records:
        assert record.timestamp_type == 1  # LogAppendTime
        assert before <= record.timestamp <= after
    # A CreateTime topic keeps the producer's timestamps.
    create_topic(client, "create-time")
    meta = produce_one_by_one(broker.bootstrap, "create-time", [(b"x", created_at)])[0]
    assert meta.timestamp == created_at
    with Session(broker.bootstrap) as session:
        assert [r.timestamp for r in session.fetch_all("create-time", 0)] == [created_at]


def test_offset_for_leader_epoch(broker):
    topic = "leader-epoch"
    client = admin(broker.bootstrap)
    create_topic(client, topic, partitions=2)
    produce_one_by_one(broker.bootstrap, topic, [(f"v{i}".encode(), None) for i in range(7)])

    def query(partition: int, leader_epoch: int, current_leader_epoch: int = -1, name: str = topic):
        request = OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=(
                OffsetForLeaderTopic(
                    topic=name,
                    partitions=(
                        OffsetForLeaderPartition(
                            partition=partition, current_leader_epoch=current_leader_epoch, leader_epoch=leader_epoch
                        ),
                    ),
                ),
            ),
        )
        with Session(broker.bootstrap) as session:
            response = session.request(request)
        result = response.topics[0].partitions[0]
        return result.error_code, result.leader_epoch, result.end_offset

    # Epoch 0 is the current epoch: its end is the log end offset.
    assert query(0, 0) == (ErrorCode.none, 0, 7)
    assert query(0, 0, current_leader_epoch=0) == (ErrorCode.none, 0, 7)
    # Partition 1 is empty: its leader epoch 0 starts (and ends) at offset 0.
    assert query(1, 0) == (ErrorCode.none, 0, 0)
    # An epoch newer than any known: undefined.
    assert query(0, 5) == (ErrorCode.none, -1, -1)
    # The client's idea of the current epoch is checked against the leader's.
    assert query(0, 0, current_leader_epoch=3)[0] == ErrorCode.unknown_leader_epoch
    assert query(2, 0)[0] == ErrorCode.unknown_topic_or_partition
    assert query(0, 0, name="no-such-topic")[0] == ErrorCode.unknown_topic_or_partition

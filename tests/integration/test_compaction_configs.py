"""Compacted topics through real clients, before any cleaner runs: creation with every spelling of
``cleanup.policy``, DescribeConfigs (values, types, sources, synonyms), the refusals of compacted
diskless topics (create and alter, INVALID_CONFIG), and produce of records without a key refused
INVALID_RECORD while keyed records of the same topic are appended.

confluent-kafka's AdminClient / Producer and kafka-python's KafkaAdminClient / KafkaProducer /
KafkaConsumer drive one broker process shared by the module (topics are fresh per test). The
cleaner itself is proven by tests/integration/test_log_compaction.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType as KPConfigResourceType
from kafka.admin import NewTopic as KPNewTopic
from kafka.errors import InvalidConfigurationError, InvalidRecordError
from kafka.errors import KafkaError as KPKafkaError
from support import BrokerProcess

pytestmark = pytest.mark.integration

INVALID_CONFIG = 40
INVALID_RECORD = 87
# Broker-level synonyms, so that sources other than the topic's and the default show.
OVERRIDES = {"log.cleaner.min.cleanable.ratio": "0.3", "log.cleaner.backoff.ms": "100"}
MESSAGE = "Compacted topic cannot accept message without key in topic partition {}-0"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("compaction-configs") / "broker", OVERRIDES)
    proc.start()
    try:
        yield proc
    finally:
        _ADMINS.pop(proc.bootstrap, None)  # before the broker goes: no reconnect attempts logged
        proc.kill()


@pytest.fixture(autouse=True)
def no_handler_crashes(broker: BrokerProcess) -> Iterator[None]:
    """Whatever the request, the broker answers: no handler may blow up."""
    yield
    text = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]


_ADMINS: dict[str, AdminClient] = {}


def admin(broker: BrokerProcess) -> AdminClient:
    """One client per broker for the module: a client dropped while a request is in flight fails
    it (librdkafka destroys the handle), so helpers must not use a temporary one."""
    if broker.bootstrap not in _ADMINS:
        _ADMINS[broker.bootstrap] = AdminClient({"bootstrap.servers": broker.bootstrap})
    return _ADMINS[broker.bootstrap]


def create(broker: BrokerProcess, topic: str, config: dict[str, str]) -> None:
    admin(broker).create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(timeout=15)


def create_error(broker: BrokerProcess, topic: str, config: dict[str, str]) -> KafkaError:
    future = admin(broker).create_topics([NewTopic(topic, 1, 1, config=config)])[topic]
    with pytest.raises(KafkaException) as info:
        future.result(timeout=15)
    return info.value.args[0]


def described(broker: BrokerProcess, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin(broker).describe_configs([resource])[resource].result(timeout=15)


def alter_error(broker: BrokerProcess, topic: str, entries: list[ConfigEntry]) -> KafkaError:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    future = admin(broker).incremental_alter_configs([resource])[resource]
    with pytest.raises(KafkaException) as info:
        future.result(timeout=15)
    return info.value.args[0]


def set_op(name: str, value: str) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


def kp_admin(broker: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)


# --- creation and DescribeConfigs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "shown"),
    [
        ("compact", "compact"),
        ("compact,delete", "compact,delete"),
        ("delete,compact", "delete,compact"),
        ("delete, compact", "delete,compact"),
        ("delete", "delete"),
        ("", ""),
    ],
)
def test_create_topic_with_every_policy_spelling(broker: BrokerProcess, policy: str, shown: str) -> None:
    topic = f"policy-{abs(hash(policy))}"
    create(broker, topic, {"cleanup.policy": policy})
    entry = described(broker, topic)["cleanup.policy"]
    assert (entry.value, entry.source) == (shown, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert [(s.name, s.source) for s in entry.synonyms.values()] == [
        ("cleanup.policy", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.cleanup.policy", ConfigSource.DEFAULT_CONFIG.value),
    ]


def test_kafka_python_creates_and_describes_a_compacted_topic(broker: BrokerProcess) -> None:
    client = kp_admin(broker)
    try:
        client.create_topics(
            [
                KPNewTopic(
                    "kp-compacted", 1, 1, topic_configs={"cleanup.policy": "compact", "delete.retention.ms": "100"}
                )
            ]
        )
        names = {
            "cleanup.policy": None,
            "delete.retention.ms": None,
            "min.cleanable.dirty.ratio": None,
            "min.compaction.lag.ms": None,
            "max.compaction.lag.ms": None,
        }
        result = client.describe_configs(
            [KPConfigResource(KPConfigResourceType.TOPIC, "kp-compacted", configs=names)], config_filter="all"
        )["topic"]["kp-compacted"]
    finally:
        client.close()
    assert {name: (e["value"], e["config_type"], e["config_source"]) for name, e in result.items()} == {
        "cleanup.policy": ("compact", "LIST", "DYNAMIC_TOPIC_CONFIG"),
        "delete.retention.ms": ("100", "LONG", "DYNAMIC_TOPIC_CONFIG"),
        "min.cleanable.dirty.ratio": ("0.3", "DOUBLE", "STATIC_BROKER_CONFIG"),
        "min.compaction.lag.ms": ("0", "LONG", "DEFAULT_CONFIG"),
        "max.compaction.lag.ms": (str(2**63 - 1), "LONG", "DEFAULT_CONFIG"),
    }


def test_describe_compaction_configs_with_sources_and_synonyms(broker: BrokerProcess) -> None:
    create(broker, "described", {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.010"})
    configs = described(broker, "described")
    ratio = configs["min.cleanable.dirty.ratio"]
    assert (ratio.value, ratio.source, ratio.is_default) == ("0.01", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, False)
    # The whole chain (confluent-kafka keys synonyms by name, so it keeps one of a name): kafka-python.
    client = kp_admin(broker)
    try:
        chain = client.describe_configs(
            [KPConfigResource(KPConfigResourceType.TOPIC, "described", configs={"min.cleanable.dirty.ratio": None})],
            include_synonyms=True,
        )["topic"]["described"]["min.cleanable.dirty.ratio"]["synonyms"]
    finally:
        client.close()
    assert [(c["name"], c["value"], c["source"]) for c in chain] == [
        ("min.cleanable.dirty.ratio", "0.01", "DYNAMIC_TOPIC_CONFIG"),
        ("log.cleaner.min.cleanable.ratio", "0.3", "STATIC_BROKER_CONFIG"),
        ("log.cleaner.min.cleanable.ratio", "0.5", "DEFAULT_CONFIG"),
    ]
    for name, value in {"delete.retention.ms": "86400000", "min.compaction.lag.ms": "0"}.items():
        entry = configs[name]
        assert (entry.value, entry.source, entry.is_default) == (value, ConfigSource.DEFAULT_CONFIG.value, True)
    # Delete the override: the broker's synonym shows through.
    resource = ConfigResource(
        ResourceType.TOPIC,
        "described",
        incremental_configs=[
            ConfigEntry("min.cleanable.dirty.ratio", None, incremental_operation=AlterConfigOpType.DELETE)
        ],
    )
    admin(broker).incremental_alter_configs([resource])[resource].result(timeout=15)
    ratio = described(broker, "described")["min.cleanable.dirty.ratio"]
    assert (ratio.value, ratio.source) == ("0.3", ConfigSource.STATIC_BROKER_CONFIG.value)


def test_describe_cleaner_broker_configs(broker: BrokerProcess) -> None:
    client = kp_admin(broker)
    try:
        raw = client.describe_configs([KPConfigResource(KPConfigResourceType.BROKER, "0")], config_filter="all")
    finally:
        client.close()
    entries = raw["broker"]["0"]
    expected = {
        "log.cleaner.enable": ("true", "BOOLEAN", True),
        "log.cleaner.threads": ("1", "INT", False),
        "log.cleaner.dedupe.buffer.size": ("33554432", "LONG", False),
        "log.cleaner.io.buffer.size": ("524288", "INT", False),
        "log.cleaner.io.buffer.load.factor": ("0.9", "DOUBLE", False),
        "log.cleaner.io.max.bytes.per.second": ("1.7976931348623157E308", "DOUBLE", False),
        "log.cleaner.backoff.ms": ("100", "LONG", False),
        "log.cleaner.min.cleanable.ratio": ("0.3", "DOUBLE", False),
        "log.cleaner.delete.retention.ms": ("86400000", "LONG", False),
        "log.cleaner.min.compaction.lag.ms": ("0", "LONG", False),
        "log.cleaner.max.compaction.lag.ms": (str(2**63 - 1), "LONG", False),
        "log.cleanup.policy": ("delete", "LIST", False),
    }
    for name, (value, kind, read_only) in expected.items():
        entry = entries[name]
        assert (entry["value"], entry["config_type"], entry["read_only"]) == (value, kind, read_only), name


# --- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_compacted_diskless_topic_cannot_be_created(broker: BrokerProcess, policy: str) -> None:
    error = create_error(broker, "diskless-compacted", {"cleanup.policy": policy, "diskless.enabled": "true"})
    assert error.code() == INVALID_CONFIG
    assert "Diskless topics cannot be compacted" in error.str()
    error = create_error(broker, "diskless-compacted", {"cleanup.policy": policy, "diskless.enable": "true"})
    assert error.code() == INVALID_CONFIG
    # kafka-python too.
    client = kp_admin(broker)
    try:
        with pytest.raises(InvalidConfigurationError):
            client.create_topics(
                [
                    KPNewTopic(
                        "diskless-compacted", 1, 1, topic_configs={"cleanup.policy": policy, "diskless.enabled": "true"}
                    )
                ]
            )
    finally:
        client.close()
    assert "diskless-compacted" not in admin(broker).list_topics(timeout=10).topics


def test_diskless_topic_cannot_be_altered_to_compact(broker: BrokerProcess) -> None:
    create(broker, "diskless-alter", {"diskless.enabled": "true"})
    error = alter_error(broker, "diskless-alter", [set_op("cleanup.policy", "compact")])
    assert error.code() == INVALID_CONFIG and "Diskless topics cannot be compacted" in error.str()
    append = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)
    assert alter_error(broker, "diskless-alter", [append]).code() == INVALID_CONFIG
    # Legacy AlterConfigs (kafka-python's default) alike.
    client = kp_admin(broker)
    try:
        result = client.alter_configs(
            [
                KPConfigResource(
                    KPConfigResourceType.TOPIC,
                    "diskless-alter",
                    configs={"cleanup.policy": "compact", "diskless.enabled": "true"},
                )
            ]
        )
    except InvalidConfigurationError:
        result = None
    finally:
        client.close()
    assert result is None or result["topic"]["diskless-alter"] != "OK"
    entry = described(broker, "diskless-alter")["cleanup.policy"]
    assert (entry.value, entry.source) == ("delete", ConfigSource.DEFAULT_CONFIG.value)


def test_compacted_classic_topic_cannot_become_diskless(broker: BrokerProcess) -> None:
    create(broker, "classic-compacted", {"cleanup.policy": "compact", "diskless.enabled": "false"})
    error = alter_error(broker, "classic-compacted", [set_op("diskless.enabled", "true")])
    assert error.code() == INVALID_CONFIG and "cannot become diskless" in error.str()
    assert described(broker, "classic-compacted")["diskless.enabled"].value == "false"


def test_min_compaction_lag_above_max_is_invalid_config(broker: BrokerProcess) -> None:
    error = create_error(broker, "lags", {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert error.code() == INVALID_CONFIG and "conflict topic config setting" in error.str()
    for bad in ({"min.cleanable.dirty.ratio": "1.5"}, {"max.compaction.lag.ms": "0"}, {"cleanup.policy": "Compact"}):
        assert create_error(broker, "lags", bad).code() == INVALID_CONFIG, bad


# --- produce: records without a key ----------------------------------------------------------------------


def consume_all(broker: BrokerProcess, topic: str, count: int) -> list[tuple[bytes | None, bytes | None, int]]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    out: list[tuple[bytes | None, bytes | None, int]] = []
    deadline = time.monotonic() + 15
    try:
        while len(out) < count and time.monotonic() < deadline:
            out += [(r.key, r.value, r.offset) for r in consumer.poll(timeout_ms=500).get(tp, [])]
    finally:
        consumer.close()
    return out


def test_confluent_keyless_record_is_invalid_record(broker: BrokerProcess) -> None:
    topic = "keys-confluent"
    create(broker, topic, {"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
    reports: list[tuple[bytes | None, KafkaError | None]] = []

    def send(key: bytes | None, value: bytes) -> None:
        producer.produce(topic, key=key, value=value, on_delivery=lambda err, msg: reports.append((msg.key(), err)))
        assert producer.flush(15) == 0

    send(b"k1", b"v1")
    send(None, b"keyless")
    send(b"k2", b"v2")
    assert [(key, err.code() if err else None) for key, err in reports] == [
        (b"k1", None),
        (None, INVALID_RECORD),
        (b"k2", None),
    ]
    assert consume_all(broker, topic, 2) == [(b"k1", b"v1", 0), (b"k2", b"v2", 1)]


def test_kafka_python_keyless_record_in_a_batch_is_named(broker: BrokerProcess) -> None:
    """One batch of three records, the middle one without a key: the batch is refused; the
    client maps record_errors to the keyless record (Kafka's message) and fails the others as
    "part of a batch which had one or more invalid records"."""
    topic = "keys-kafka-python"
    create(broker, topic, {"cleanup.policy": "compact,delete"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=1000, retries=0)
    try:
        futures = [producer.send(topic, key=k, value=b"v", partition=0) for k in (b"a", None, b"b")]
        producer.flush(timeout=15)
        errors = []
        for future in futures:
            with pytest.raises(KPKafkaError) as info:
                future.get(timeout=15)
            errors.append(info.value)
        assert isinstance(errors[1], InvalidRecordError)
        assert MESSAGE.format(topic) in str(errors[1])
        assert not isinstance(errors[0], InvalidRecordError) and "invalid records" in str(errors[0])
        # Keyed records of the same topic are taken.
        assert producer.send(topic, key=b"a", value=b"ok", partition=0).get(timeout=15).offset == 0
    finally:
        producer.close(timeout=5)
    assert consume_all(broker, topic, 1) == [(b"a", b"ok", 0)]


def test_topics_not_compacted_take_keyless_records(broker: BrokerProcess) -> None:
    create(broker, "keys-delete", {"cleanup.policy": "delete"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    try:
        assert producer.send("keys-delete", value=b"no key").get(timeout=15).offset == 0
    finally:
        producer.close(timeout=5)

"""Cluster metadata changes and their Kafka error codes; topic config validation."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, MetadataError, validate_topic_name
from diskless.log.config import TOPIC_CONFIGS, ConfigError, LogConfig, effective_values, validate_overrides

LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def cluster(brokers: int = 3, racks: list[str | None] | None = None) -> ClusterMetadata:
    meta = ClusterMetadata("cluster-1")
    for i in range(brokers):
        rack = racks[i] if racks else None
        meta.brokers[i + 1] = BrokerInfo(i + 1, "127.0.0.1", 9092 + i, rack)
    return meta


def code_of(fn, *args, **kwargs) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(MetadataError) as exc:
        fn(*args, **kwargs)
    return exc.value.code


# --- topic names -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "orders", "A.b_c-9", "x" * 249, "..a", "_internal"])
def test_legal_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    "name", ["", ".", "..", "x" * 250, "with space", "slash/name", "tab\t", "ü", "abc\n", "\nabc", "a:b", "a*"]
)
def test_illegal_topic_names(name: str) -> None:
    assert code_of(validate_topic_name, name) == ErrorCode.invalid_topic_exception


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=260) | st.from_regex(LEGAL, fullmatch=True))
def test_topic_name_rule(name: str) -> None:
    legal = LEGAL.fullmatch(name) is not None and name not in (".", "..")
    if legal:
        validate_topic_name(name)
    else:
        assert code_of(validate_topic_name, name) == ErrorCode.invalid_topic_exception


# --- create / delete / add partitions / alter configs -------------------------------------------------


def test_create_topic_round_robin() -> None:
    meta = cluster(3)
    topic = meta.create_topic("t", 4, 2, {"retention.ms": "1000"})
    assert meta.topics["t"] is topic
    assert [p.replicas for p in topic.partitions] == [[1, 2], [2, 3], [3, 1], [1, 2]]
    assert all(p.leader == p.replicas[0] and p.isr == p.replicas and p.leader_epoch == 0 for p in topic.partitions)
    assert topic.configs == {"retention.ms": "1000"}
    assert meta.topic_by_id(topic.topic_id) is topic
    assert meta.partition("t", 3) is topic.partitions[3]
    assert meta.partition("t", 4) is None and meta.partition("t", -1) is None and meta.partition("u", 0) is None


def test_replicas_alternate_racks() -> None:
    meta = cluster(4, racks=["az-a", "az-a", "az-b", "az-b"])
    topic = meta.create_topic("t", 4, 2, {})
    rack = {b.node_id: b.rack for b in meta.brokers.values()}
    for p in topic.partitions:
        assert len({rack[r] for r in p.replicas}) == 2


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("t", 0, 1, {}), ErrorCode.invalid_partitions),
        (("t", -1, 1, {}), ErrorCode.invalid_partitions),
        (("t", 1, 0, {}), ErrorCode.invalid_replication_factor),
        (("t", 1, 4, {}), ErrorCode.invalid_replication_factor),
        (("bad name", 1, 1, {}), ErrorCode.invalid_topic_exception),
        (("t", 1, 1, {"retention.ms": "soon"}), ErrorCode.invalid_config),
        (("t", 1, 1, {"no.such.config": "1"}), ErrorCode.invalid_config),
        (("t", 1, 1, {"retention.ms": None}), ErrorCode.invalid_config),
        (("t", 1, 1, {"cleanup.policy": "compacted"}), ErrorCode.invalid_config),
        (("t", 1, 1, {"cleanup.policy": "compact", "diskless.enabled": "true"}), ErrorCode.invalid_config),
    ],
)
def test_create_topic_errors(args: tuple, code: ErrorCode) -> None:
    meta = cluster(3)
    assert code_of(meta.create_topic, *args) == code
    assert meta.topics == {}


def test_create_topic_with_assignments() -> None:
    meta = cluster(3)
    topic = meta.create_topic("t", -1, -1, {}, assignments=[[3, 1], [2, 3]])
    assert [p.replicas for p in topic.partitions] == [[3, 1], [2, 3]]
    assert [p.leader for p in topic.partitions] == [3, 2]
    assert code_of(meta.create_topic, "u", 2, -1, {}, assignments=[[1]]) == ErrorCode.invalid_request
    assert code_of(meta.create_topic, "u", -1, -1, {}, assignments=[[1, 1]]) == ErrorCode.invalid_replica_assignment
    assert code_of(meta.create_topic, "u", -1, -1, {}, assignments=[[]]) == ErrorCode.invalid_replica_assignment
    assert code_of(meta.create_topic, "u", -1, -1, {}, assignments=[[1, 9]]) == ErrorCode.invalid_replica_assignment
    assert set(meta.topics) == {"t"}


def test_create_existing_and_validate_only() -> None:
    meta = cluster(1)
    meta.create_topic("t", 1, 1, {})
    assert code_of(meta.create_topic, "t", 1, 1, {}) == ErrorCode.topic_already_exists
    dry = meta.create_topic("dry", 2, 1, {"diskless.enable": "true"}, validate_only=True)
    assert "dry" not in meta.topics
    assert dry.configs == {"diskless.enabled": "true"}


def test_delete_topic() -> None:
    meta = cluster(1)
    meta.create_topic("t", 1, 1, {})
    assert meta.delete_topic("t").name == "t"
    assert code_of(meta.delete_topic, "t") == ErrorCode.unknown_topic_or_partition
    meta.create_topic("t", 1, 1, {})  # can be created again


def test_add_partitions() -> None:
    meta = cluster(3)
    meta.create_topic("t", 2, 2, {})
    assert code_of(meta.add_partitions, "nope", 3) == ErrorCode.unknown_topic_or_partition
    assert code_of(meta.add_partitions, "t", 2) == ErrorCode.invalid_partitions
    assert code_of(meta.add_partitions, "t", 1) == ErrorCode.invalid_partitions
    meta.add_partitions("t", 5, validate_only=True)
    assert len(meta.topics["t"].partitions) == 2
    meta.add_partitions("t", 5)
    parts = meta.topics["t"].partitions
    assert len(parts) == 5 and all(len(p.replicas) == 2 for p in parts)
    assert [p.replicas for p in parts[2:]] == [[3, 1], [1, 2], [2, 3]]


def test_alter_topic_configs() -> None:
    meta = cluster(1)
    meta.create_topic("t", 1, 1, {"retention.ms": "1000", "segment.bytes": "2048"})
    assert code_of(meta.alter_topic_configs, "nope", {"retention.ms": "1"}) == ErrorCode.unknown_topic_or_partition
    assert code_of(meta.alter_topic_configs, "t", {"retention.ms": "-7"}) == ErrorCode.invalid_config
    assert code_of(meta.alter_topic_configs, "t", {"bogus": "1"}) == ErrorCode.invalid_config
    assert meta.topics["t"].configs == {"retention.ms": "1000", "segment.bytes": "2048"}
    meta.alter_topic_configs("t", {"retention.ms": "5"}, validate_only=True)
    assert meta.topics["t"].configs["retention.ms"] == "1000"
    meta.alter_topic_configs("t", {"retention.ms": None, "diskless.enable": "TRUE", "max.message.bytes": " 100 "})
    assert meta.topics["t"].configs == {"segment.bytes": "2048", "diskless.enabled": "true", "max.message.bytes": "100"}
    meta.alter_topic_configs("t", {"diskless.enabled": None})
    assert "diskless.enabled" not in meta.topics["t"].configs


def test_json_round_trip() -> None:
    meta = cluster(3)
    meta.create_topic("a", 3, 2, {"retention.ms": "10"})
    meta.create_topic("b", 1, 1, {})
    other = ClusterMetadata("cluster-1")
    other.load_json(meta.to_json())
    assert other.topics == meta.topics


# --- topic config validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("retention.ms", "abc"),
        ("retention.ms", "-2"),
        ("retention.ms", "1.5"),
        ("retention.ms", "1_000"),
        ("retention.ms", ""),
        ("segment.bytes", "13"),
        ("segment.bytes", str(2**31)),
        ("segment.ms", "0"),
        ("min.insync.replicas", "0"),
        ("unclean.leader.election.enable", "yes"),
        ("diskless.enable", "1"),
        ("message.timestamp.type", "createtime"),
        ("compression.type", "brotli"),
        ("cleanup.policy", "delete,"),
        ("cleanup.policy", "Compact"),
        ("retention.ms", None),
    ],
)
def test_bad_config_values(name: str, value: str | None) -> None:
    with pytest.raises(ConfigError):
        validate_overrides({name: value})


def test_unknown_config_name() -> None:
    with pytest.raises(ConfigError, match=r"Unknown topic config name: retention\.millis"):
        validate_overrides({"retention.millis": "1"})


def test_good_config_values_are_normalised() -> None:
    assert validate_overrides(
        {
            "retention.ms": "-1",
            "retention.bytes": " 1024 ",
            "unclean.leader.election.enable": "True",
            "diskless.enable": "false",
            "compression.type": "zstd",
            "cleanup.policy": "delete",
            "message.timestamp.type": "LogAppendTime",
        }
    ) == {
        "retention.ms": "-1",
        "retention.bytes": "1024",
        "unclean.leader.election.enable": "true",
        "diskless.enabled": "false",
        "compression.type": "zstd",
        "cleanup.policy": "delete",
        "message.timestamp.type": "LogAppendTime",
    }


def test_effective_values_and_log_config() -> None:
    broker = {"log.retention.ms": "5000", "log.roll.ms": "100"}
    values = effective_values({"retention.ms": "7", "diskless.enabled": "true"}, broker.get)
    assert values["retention.ms"] == (7, "topic")
    assert values["segment.ms"] == (100, "broker")
    assert values["segment.bytes"] == (TOPIC_CONFIGS["segment.bytes"].default, "default")
    config = LogConfig.from_values({name: value for name, (value, _) in values.items()})
    assert config.retention_ms == 7 and config.segment_ms == 100 and config.diskless_enabled is True
    assert config.segment_bytes == 1073741824 and config.message_timestamp_type == "CreateTime"

"""DeleteTopics / CreatePartitions / DescribeConfigs / legacy AlterConfigs against Kafka
(ControllerApis.deleteTopics, ControllerApis.createPartitions, ConfigHelper.describeConfigs,
ConfigAdminManager.preprocess(AlterConfigsRequestData)). Handlers driven on an in-memory broker."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

from admin_broker import FakeBroker, broker_with_topic
from kio.schema.errors import ErrorCode

from diskless.broker.admin_apis import AdminApis
from diskless.broker.config_apis import ConfigApis


def test_delete_topics_name_and_stale_id_is_invalid_request() -> None:
    """Kafka (DeleteTopics v6): a topic given by name AND id -> INVALID_REQUEST "You may not specify
    both topic name and topic id.", nothing deleted. Diskless ignores the id and deletes whatever
    incarnation has the name now: a delete aimed at an old incarnation (its id) removes the new one."""
    broker = broker_with_topic({"retention.ms": "1000"})
    stale = uuid.uuid4()  # not the id of the current "t"
    assert str(stale) != broker.metadata.topics["t"].topic_id
    request = SimpleNamespace(topics=[SimpleNamespace(name="t", topic_id=stale)])
    out = asyncio.run(AdminApis(broker).delete_topics(None, request))["responses"]  # type: ignore[arg-type]
    assert out[0]["error_code"] == ErrorCode.invalid_request
    assert "t" in broker.metadata.topics


def test_delete_topics_duplicate_name_is_invalid_request() -> None:
    """Kafka: a name given twice -> one INVALID_REQUEST "Duplicate topic name." and no deletion.
    Diskless deletes the topic, then answers the second UNKNOWN_TOPIC_OR_PARTITION."""
    broker = broker_with_topic({"retention.ms": "1000"})
    request = SimpleNamespace(topic_names=["t", "t"])
    out = asyncio.run(AdminApis(broker).delete_topics(None, request))["responses"]  # type: ignore[arg-type]
    assert [r["error_code"] for r in out if r["name"] == "t"] == [ErrorCode.invalid_request]
    assert "t" in broker.metadata.topics


def test_create_partitions_duplicate_topic_is_invalid_request() -> None:
    """Kafka ControllerApis.createPartitions: a topic named twice -> INVALID_REQUEST "Duplicate
    topic name.", no growth. Diskless applies both entries (here: grows the topic to 3 partitions)."""
    broker = broker_with_topic({"retention.ms": "1000"})
    request = SimpleNamespace(
        topics=[
            SimpleNamespace(name="t", count=2, assignments=None),
            SimpleNamespace(name="t", count=3, assignments=None),
        ],
        validate_only=False,
    )
    out = asyncio.run(AdminApis(broker).create_partitions(None, request))["results"]  # type: ignore[arg-type]
    assert ErrorCode.invalid_request in [r["error_code"] for r in out]
    assert len(broker.metadata.topics["t"].partitions) == 1


def test_create_partitions_duplicate_topic_is_answered_once() -> None:
    """Kafka ControllerApis.createPartitions answers a duplicated name once (a set of names), and
    only the other topics count towards the partitions the request asks for. Diskless answered
    each occurrence (two results for one name)."""
    broker = broker_with_topic({"retention.ms": "1000"})
    broker.metadata.create_topic("u", 1, 1, {})
    request = SimpleNamespace(
        topics=[
            SimpleNamespace(name="t", count=2, assignments=None),
            SimpleNamespace(name="u", count=2, assignments=None),
            SimpleNamespace(name="t", count=3, assignments=None),
        ],
        validate_only=False,
    )
    out = asyncio.run(AdminApis(broker).create_partitions(None, request))["results"]  # type: ignore[arg-type]
    assert [(r["name"], r["error_code"], r["error_message"]) for r in out] == [
        ("t", ErrorCode.invalid_request, "Duplicate topic name."),
        ("u", ErrorCode.none, None),
    ]
    assert (len(broker.metadata.topics["t"].partitions), len(broker.metadata.topics["u"].partitions)) == (1, 2)


def describe(broker: FakeBroker, resource_type: int, name: str, keys: Any) -> dict[str, Any]:
    request = SimpleNamespace(
        resources=[SimpleNamespace(resource_type=resource_type, resource_name=name, configuration_keys=keys)],
        include_synonyms=False,
        include_documentation=False,
    )
    return ConfigApis(broker).describe_configs(None, request)["results"][0]  # type: ignore[arg-type]


def test_describe_configs_empty_key_list_means_all_topic_configs() -> None:
    """ConfigHelper.describeConfigs: ``configurationKeys == null || configurationKeys.isEmpty`` ->
    every config. Diskless answers an empty key list with no configs at all."""
    broker = broker_with_topic({"retention.ms": "1000"})
    all_configs = describe(broker, 2, "t", None)["configs"]
    assert all_configs
    assert len(describe(broker, 2, "t", ())["configs"]) == len(all_configs)


def test_legacy_alter_configs_null_value_is_invalid_request() -> None:
    """ConfigAdminManager.preprocess(AlterConfigsRequestData): any null value -> INVALID_REQUEST
    "Null value not supported for : retention.ms". Diskless treats null as "remove the override"
    and answers success (retention.ms silently falls back to the 7-day default)."""
    broker = broker_with_topic({"retention.ms": "1000"})
    res = SimpleNamespace(
        resource_type=2, resource_name="t", configs=[SimpleNamespace(name="retention.ms", value=None)]
    )
    request = SimpleNamespace(resources=[res], validate_only=False)
    out = asyncio.run(ConfigApis(broker).alter_configs(None, request))["responses"]  # type: ignore[arg-type]
    assert out[0]["error_code"] == ErrorCode.invalid_request
    assert broker.metadata.topics["t"].configs == {"retention.ms": "1000"}


def test_describe_configs_illegal_topic_name_is_invalid_topic() -> None:
    """ConfigHelper.describeConfigs runs Topic.validate before looking the topic up: an illegal
    name ("bad/name", empty, over 249 characters, "..") -> INVALID_TOPIC_EXCEPTION for that
    resource. Diskless answered UNKNOWN_TOPIC_OR_PARTITION, which a client treats as retriable."""
    broker = broker_with_topic()
    for name in ("bad/name", "", "x" * 250, ".."):
        entry = describe(broker, 2, name, None)
        assert entry["error_code"] == ErrorCode.invalid_topic_exception, name
        assert entry["configs"] == []
    assert describe(broker, 2, "missing", None)["error_code"] == ErrorCode.unknown_topic_or_partition
    assert describe(broker, 2, "x" * 249, None)["error_code"] == ErrorCode.unknown_topic_or_partition

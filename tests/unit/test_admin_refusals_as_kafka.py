"""CreateTopics / IncrementalAlterConfigs / AlterConfigs / ApiVersions validation against Kafka
(ReplicationControlManager.createTopics, ConfigAdminManager.preprocess, KafkaApis.handleApiVersionsRequest)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from admin_broker import FakeBroker, broker_with_topic
from kio.schema.errors import ErrorCode

from diskless.broker.admin_apis import AdminApis
from diskless.broker.apis import KafkaApis
from diskless.broker.config_apis import ConfigApis


def create(
    broker: FakeBroker, name: str, assignments: list[tuple[int, list[int]]] = (), n: int = -1, rf: int = -1
) -> Any:
    topic = SimpleNamespace(
        name=name,
        num_partitions=n,
        replication_factor=rf,
        assignments=[SimpleNamespace(partition_index=i, broker_ids=b) for i, b in assignments],
        configs=[],
    )
    request = SimpleNamespace(topics=[topic], validate_only=False)
    return asyncio.run(AdminApis(broker).create_topics(None, request))["topics"][0]  # type: ignore[arg-type]


def test_create_topics_inconsistent_assignment_replication_factor() -> None:
    # Kafka validateManualPartitionAssignment: "...a partition with 2 replica(s), but this is not
    # consistent with previous partitions, which have 1 replica(s)" -> INVALID_REPLICA_ASSIGNMENT.
    broker = FakeBroker()
    entry = create(broker, "t", [(0, [0]), (1, [0, 1])])
    assert entry["error_code"] == ErrorCode.invalid_replica_assignment
    assert "t" not in broker.metadata.topics


def test_create_topics_non_consecutive_partition_indexes() -> None:
    # Kafka: "partitions should be a consecutive 0-based integer sequence" -> INVALID_REPLICA_ASSIGNMENT.
    broker = FakeBroker()
    entry = create(broker, "t", [(0, [0]), (5, [1])])
    assert entry["error_code"] == ErrorCode.invalid_replica_assignment


def test_create_topics_duplicate_partition_index() -> None:
    # Kafka: "Found multiple manual partition assignments for partition 0" -> INVALID_REPLICA_ASSIGNMENT.
    broker = FakeBroker()
    entry = create(broker, "t", [(0, [0]), (0, [1])])
    assert entry["error_code"] == ErrorCode.invalid_replica_assignment


def test_create_topics_collision_chars() -> None:
    # Kafka validateNewTopicNames: "Topic 'a_b' collides with existing topic: a.b" -> INVALID_TOPIC_EXCEPTION.
    broker = FakeBroker()
    assert create(broker, "a.b", n=1, rf=1)["error_code"] == ErrorCode.none
    assert create(broker, "a_b", n=1, rf=1)["error_code"] == ErrorCode.invalid_topic_exception


def incremental(broker: FakeBroker, configs: list[tuple[str, int, str | None]], resources: int = 1) -> list[Any]:
    res = SimpleNamespace(
        resource_type=2,
        resource_name="t",
        configs=[SimpleNamespace(name=n, config_operation=op, value=v) for n, op, v in configs],
    )
    request = SimpleNamespace(resources=[res] * resources, validate_only=False)
    return asyncio.run(ConfigApis(broker).incremental_alter_configs(None, request))["responses"]  # type: ignore[arg-type]


def test_incremental_alter_duplicate_config_keys_is_invalid_request() -> None:
    # Kafka ConfigAdminManager.preprocess: "Error due to duplicate config keys" -> INVALID_REQUEST;
    # diskless silently applies the last one.
    broker = broker_with_topic()
    out = incremental(broker, [("retention.ms", 0, "1000"), ("retention.ms", 0, "2000")])
    assert out[0]["error_code"] == ErrorCode.invalid_request
    assert broker.metadata.topics["t"].configs == {}


def test_incremental_alter_null_set_is_invalid_request() -> None:
    # Kafka ConfigAdminManager.preprocess: "Null value not supported for : retention.ms" -> INVALID_REQUEST.
    out = incremental(broker_with_topic(), [("retention.ms", 0, None)])
    assert out[0]["error_code"] == ErrorCode.invalid_request


def test_incremental_alter_duplicate_resource_is_invalid_request() -> None:
    # Kafka: "Each resource must appear at most once." -> INVALID_REQUEST for the duplicated resource.
    out = incremental(broker_with_topic(), [("retention.ms", 0, "1000")], resources=2)
    assert [r["error_code"] for r in out] == [ErrorCode.invalid_request] * 2


def test_api_versions_v3_invalid_client_software_name() -> None:
    # Kafka KafkaApis.handleApiVersionsRequest: !apiVersionRequest.isValid -> INVALID_REQUEST
    # (name/version must match [a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?).
    request = SimpleNamespace(client_software_name="bad name!", client_software_version="1.0")
    header = SimpleNamespace(api_key=18, api_version=3)
    body = KafkaApis.api_versions(None, header, request)  # type: ignore[arg-type]
    assert body["error_code"] == ErrorCode.invalid_request

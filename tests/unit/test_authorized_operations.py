"""Authorized operations (KIP-430): the bit set, ``1 << AclOperation code`` per operation, of what the
principal may do on a topic, group or the cluster, shown where Kafka shows it: Metadata v8+ and
DescribeCluster (include_*_authorized_operations), DescribeGroups v3+ and ConsumerGroupDescribe
(include_authorized_operations), DescribeTopicPartitions (always). Only the operations Kafka
supports for the resource type count (AclEntry.supportedOperations), implied ones included; with
no authorizer every supported operation is shown. Not asked: -2**31. Before, every answer said
-2**31 whatever the request asked.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from diskless.broker.apis import KafkaApis
from diskless.broker.logdir_apis import LogDirApis
from diskless.broker.metadata_apis import MetadataApis
from diskless.broker.security_apis import SecurityApis
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.groups.handlers import _described
from diskless.protocol import messages as m
from diskless.security import acl as a
from diskless.security.session import CURRENT_SESSION, SecuritySession

NOT_ASKED = -(2**31)
# Bits by AclOperation code: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12.
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 8, 16, 32, 64, 128, 256
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 512, 1024, 2048, 4096
ALL_TOPIC = READ | WRITE | CREATE | DELETE | ALTER | DESCRIBE | DESCRIBE_CONFIGS | ALTER_CONFIGS  # 3576
ALL_GROUP = READ | DESCRIBE | DELETE | DESCRIBE_CONFIGS | ALTER_CONFIGS  # 3400
ALL_CLUSTER = CREATE | CLUSTER_ACTION | DESCRIBE_CONFIGS | ALTER_CONFIGS | IDEMPOTENT_WRITE | ALTER | DESCRIBE  # 8096

Handler = Callable[[Any], Awaitable[dict[str, Any] | None]]


def _broker(authorizer: bool = True, **config: Any) -> SimpleNamespace:
    topics = {
        "orders": TopicMetadata("orders", "00000000-0000-0000-0000-0000000000a1", [PartitionState([1], 1, 0, [1])]),
        "payroll": TopicMetadata("payroll", "00000000-0000-0000-0000-0000000000a2", [PartitionState([1], 1, 0, [1])]),
    }
    meta = SimpleNamespace(topics=topics, brokers={}, cluster_id="c1", controller_id=1, topic_by_id=lambda _id: None)
    if authorizer:
        config["authorizer_class_name"] = "diskless"
    return SimpleNamespace(config=BrokerConfig(**config), metadata=meta, node_id=1, is_diskless=lambda _t: False)


def _security(*bindings: a.AclBinding, **config: Any) -> SecurityApis:
    apis = SecurityApis(_broker(**config))  # type: ignore[arg-type]
    assert apis.authorizer is not None
    apis.authorizer.replace(bindings)
    return apis


def _acl(resource_type: int, name: str, operation: int, permission: int = a.ALLOW, principal: str = "User:alice"):
    pattern = a.PREFIXED if name.endswith("-") else a.LITERAL
    return a.AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def _run(apis: SecurityApis, api_key: int, version: int, request: Any, handle: Handler, who: str = "User:alice"):
    async def main() -> Any:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.5", who, authenticated=True))
        return await apis.handle_authorized(m.RequestHeader(api_key, version, 1, "c"), request, handle)

    return asyncio.run(main())


def _metadata(apis: SecurityApis, version: int, names: list[str], who: str = "User:alice", **flags: bool) -> Any:
    schema = load_request_schema(m.API_METADATA, version)
    topic_cls = schema.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
    by_name = {"topic_id": uuid.UUID(int=0)} if "topic_id" in topic_cls.__dataclass_fields__ else {}
    request = schema(
        topics=tuple(topic_cls(name=n, **by_name) for n in names), allow_auto_topic_creation=False, **flags
    )
    handler = MetadataApis(apis.broker)
    header = m.RequestHeader(m.API_METADATA, version, 1, "c")
    body = _run(apis, m.API_METADATA, version, request, lambda allowed: handler.metadata(header, allowed), who)
    # As the client reads it: a field the answer leaves out is encoded as its default.
    answer = m.build(m._response_type(m.API_METADATA, version), body)
    return {t.name: t.topic_authorized_operations for t in answer.topics}, answer


def _describe_cluster(apis: SecurityApis, include: bool, who: str = "User:alice") -> Any:
    request = load_request_schema(m.API_DESCRIBE_CLUSTER, 1)(include_cluster_authorized_operations=include)
    handler = MetadataApis(apis.broker)
    header = m.RequestHeader(m.API_DESCRIBE_CLUSTER, 1, 1, "c")

    async def handle(allowed: Any) -> dict[str, Any]:
        return handler.describe_cluster(header, allowed)

    return _run(apis, m.API_DESCRIBE_CLUSTER, 1, request, handle, who)


# --- the bit set --------------------------------------------------------------------------------


def test_bit_sets_count_implied_operations_within_the_supported_ones() -> None:
    apis = _security(
        _acl(a.TOPIC, "orders", a.READ),
        _acl(a.TOPIC, "orders", a.ALTER_CONFIGS),
        _acl(a.GROUP, "g1", a.ALL),
        _acl(a.TOPIC, "payroll", a.ALL),
        _acl(a.TOPIC, "payroll", a.WRITE, a.DENY),
    )

    async def main() -> tuple[int, ...]:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.5", "User:alice", authenticated=True))
        return (
            apis.authorized_operations(a.TOPIC, "orders"),
            apis.authorized_operations(a.TOPIC, "payroll"),
            apis.authorized_operations(a.GROUP, "g1"),
            apis.authorized_operations(a.TOPIC, "other"),
        )

    orders, payroll, group, other = asyncio.run(main())
    # READ implies DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS.
    assert orders == READ | DESCRIBE | ALTER_CONFIGS | DESCRIBE_CONFIGS == 3336
    assert payroll == ALL_TOPIC & ~WRITE == 3560  # ALL, but WRITE denied
    assert group == ALL_GROUP == 3400  # ALL on a group: only the group's supported operations
    assert other == 0


# --- Metadata -----------------------------------------------------------------------------------


def test_metadata_v10_fills_topic_and_cluster_operations_when_asked() -> None:
    apis = _security(
        _acl(a.TOPIC, "orders", a.READ),
        _acl(a.CLUSTER, a.CLUSTER_NAME, a.DESCRIBE),
        _acl(a.CLUSTER, a.CLUSTER_NAME, a.IDEMPOTENT_WRITE),
    )
    ops, body = _metadata(
        apis,
        10,
        ["orders", "payroll"],
        include_topic_authorized_operations=True,
        include_cluster_authorized_operations=True,
    )
    assert ops == {"orders": READ | DESCRIBE, "payroll": NOT_ASKED}  # payroll: TOPIC_AUTHORIZATION_FAILED
    assert body.cluster_authorized_operations == DESCRIBE | IDEMPOTENT_WRITE == 4352


def test_metadata_cluster_operations_are_zero_without_describe_on_the_cluster() -> None:
    """Kafka shows 0, not the CREATE it may do, to a principal that may not DESCRIBE the cluster."""
    apis = _security(_acl(a.TOPIC, "orders", a.READ), _acl(a.CLUSTER, a.CLUSTER_NAME, a.CREATE))
    _, body = _metadata(
        apis, 9, ["orders"], include_topic_authorized_operations=False, include_cluster_authorized_operations=True
    )
    assert body.cluster_authorized_operations == 0


def test_metadata_not_asked_keeps_the_default() -> None:  # control: passed before too
    apis = _security(_acl(a.TOPIC, "orders", a.READ), _acl(a.CLUSTER, a.CLUSTER_NAME, a.DESCRIBE))
    ops, body = _metadata(
        apis, 10, ["orders"], include_topic_authorized_operations=False, include_cluster_authorized_operations=False
    )
    assert ops == {"orders": NOT_ASKED}
    assert body.cluster_authorized_operations == NOT_ASKED


def test_metadata_v12_fills_topics_including_a_describable_unknown_one() -> None:
    """Kafka fills every topic it describes, one that does not exist too (UNKNOWN_TOPIC_OR_PARTITION)."""
    apis = _security(_acl(a.TOPIC, "team-", a.WRITE))
    apis.broker.metadata.topics["team-a"] = TopicMetadata(
        "team-a", "00000000-0000-0000-0000-0000000000b1", [PartitionState([1], 1, 0, [1])]
    )
    ops, _ = _metadata(apis, 12, ["team-a", "team-missing"], include_topic_authorized_operations=True)
    assert ops == {"team-a": WRITE | DESCRIBE, "team-missing": WRITE | DESCRIBE}


def test_metadata_without_an_authorizer_shows_every_supported_operation() -> None:
    apis = SecurityApis(_broker(authorizer=False))  # type: ignore[arg-type]
    ops, body = _metadata(
        apis, 10, ["orders"], include_topic_authorized_operations=True, include_cluster_authorized_operations=True
    )
    assert ops == {"orders": ALL_TOPIC}
    assert body.cluster_authorized_operations == ALL_CLUSTER


def test_metadata_to_a_super_user_shows_every_supported_operation() -> None:
    apis = _security(super_users="User:root")
    ops, body = _metadata(
        apis,
        10,
        ["payroll"],
        who="User:root",
        include_topic_authorized_operations=True,
        include_cluster_authorized_operations=True,
    )
    assert ops == {"payroll": ALL_TOPIC}
    assert body.cluster_authorized_operations == ALL_CLUSTER


def test_broker_without_authorizer_fills_the_operations_through_the_request_path() -> None:
    """KafkaApis.handle with no authorizer used to skip the security layer entirely."""
    broker = _broker(authorizer=False)
    security = SecurityApis(broker)  # type: ignore[arg-type]
    handler = MetadataApis(broker)  # type: ignore[arg-type]
    fake = SimpleNamespace(security=security, _handlers={m.API_DESCRIBE_CLUSTER: handler.describe_cluster})
    request = load_request_schema(m.API_DESCRIBE_CLUSTER, 0)(include_cluster_authorized_operations=True)
    body = asyncio.run(KafkaApis.handle(fake, m.RequestHeader(m.API_DESCRIBE_CLUSTER, 0, 1, "c"), request))  # type: ignore[arg-type]
    assert body["cluster_authorized_operations"] == ALL_CLUSTER


# --- DescribeCluster ----------------------------------------------------------------------------


def test_describe_cluster_operations_when_asked() -> None:
    apis = _security(_acl(a.CLUSTER, a.CLUSTER_NAME, a.DESCRIBE), _acl(a.CLUSTER, a.CLUSTER_NAME, a.ALTER_CONFIGS))
    assert _describe_cluster(apis, include=True)["cluster_authorized_operations"] == (
        DESCRIBE | ALTER_CONFIGS | DESCRIBE_CONFIGS
    )
    # Without DESCRIBE on the cluster: answered, with 0 operations.
    assert _describe_cluster(apis, include=True, who="User:bob")["cluster_authorized_operations"] == 0


# --- groups -------------------------------------------------------------------------------------


def _group_answer(*described: dict[str, Any]) -> Handler:
    async def handle(allowed: Any) -> dict[str, Any]:
        return {"throttle_time": 0, "groups": [dict(d) for d in described]}

    return handle


def _ok_group(group_id: str) -> dict[str, Any]:
    return {**_described(group_id, ErrorCode.none), "group_state": "Stable"}


def test_describe_groups_fills_the_described_groups_when_asked() -> None:
    apis = _security(_acl(a.GROUP, "g1", a.READ), _acl(a.GROUP, "g2", a.ALL))
    schema = load_request_schema(m.API_DESCRIBE_GROUPS, 5)
    answer = _group_answer(_ok_group("g1"), _ok_group("g2"), _described("g2", ErrorCode.coordinator_not_available))
    body = _run(apis, m.API_DESCRIBE_GROUPS, 5, schema(groups=("g1", "g2"), include_authorized_operations=True), answer)
    assert [g["authorized_operations"] for g in body["groups"]] == [READ | DESCRIBE, ALL_GROUP, NOT_ASKED]
    body = _run(apis, m.API_DESCRIBE_GROUPS, 5, schema(groups=("g1",), include_authorized_operations=False), answer)
    assert {g["authorized_operations"] for g in body["groups"]} == {NOT_ASKED}


def test_consumer_group_describe_fills_the_described_groups_when_asked() -> None:
    apis = _security(_acl(a.GROUP, "g1", a.DELETE), _acl(a.GROUP, "g1", a.DESCRIBE_CONFIGS))
    schema = load_request_schema(m.API_CONSUMER_GROUP_DESCRIBE, 0)
    answer = _group_answer(_ok_group("g1"))
    body = _run(
        apis, m.API_CONSUMER_GROUP_DESCRIBE, 0, schema(group_ids=("g1",), include_authorized_operations=True), answer
    )
    assert [g["authorized_operations"] for g in body["groups"]] == [DELETE | DESCRIBE | DESCRIBE_CONFIGS]


# --- DescribeTopicPartitions --------------------------------------------------------------------


def test_describe_topic_partitions_always_fills_the_described_topics() -> None:
    """DescribeTopicPartitions has no flag: Kafka's handler fills every topic it describes."""
    apis = _security(_acl(a.TOPIC, "orders", a.WRITE), _acl(a.TOPIC, "orders", a.ALTER_CONFIGS))
    handler = LogDirApis(apis.broker)  # type: ignore[arg-type]
    header = m.RequestHeader(75, 0, 1, "c")
    request = load_request_schema(75, 0)(topics=(), response_partition_limit=2000, cursor=None)

    async def handle(allowed: Any) -> dict[str, Any]:
        return handler.describe_topic_partitions(header, allowed)

    body = _run(apis, 75, 0, request, handle)
    ops = {t["name"]: t["topic_authorized_operations"] for t in body["topics"]}
    assert ops == {"orders": WRITE | DESCRIBE | ALTER_CONFIGS | DESCRIBE_CONFIGS}  # 3344

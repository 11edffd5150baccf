"""What a principal may learn through requests it is allowed to send (the security review's
findings, each a failure before the fix): DescribeTopicPartitions of all topics, OffsetFetch, broker
DescribeConfigs credentials, and Metadata by topic id answer only what Kafka would disclose."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from diskless.broker.logdir_apis import LogDirApis
from diskless.broker.security_apis import SecurityApis
from diskless.cluster import broker_configs as bc
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.protocol import messages as m
from diskless.security import acl as a
from diskless.security.session import CURRENT_SESSION, SecuritySession

SECRET_ID = uuid.UUID(int=0x5EC2E7)


def _broker(**config: Any) -> SimpleNamespace:
    topics = {
        "secret-payroll": TopicMetadata("secret-payroll", str(SECRET_ID), [PartitionState([1], 1, 3, [1])]),
        "public": TopicMetadata("public", str(uuid.UUID(int=7)), [PartitionState([1], 1, 0, [1])]),
    }
    meta = SimpleNamespace(topics=topics, brokers={1: object()})
    return SimpleNamespace(config=BrokerConfig(authorizer_class_name="diskless", **config), metadata=meta)


def _run(apis: SecurityApis, principal: str, api_key: int, version: int, request: Any, handler: Any) -> Any:
    async def main() -> Any:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.9", principal, authenticated=True))
        header = m.RequestHeader(api_key, version, 1, "mallory-client")
        return await apis.handle_authorized(header, request, handler)

    return asyncio.run(main())


def test_describe_topic_partitions_all_topics_leaks_to_principal_without_acls() -> None:
    """DescribeTopicPartitions (key 75) with an empty topic list means "all topics". A principal
    with no ACL at all must see none of them (Kafka's DescribeTopicPartitionsRequestHandler keeps
    only DESCRIBE-authorized topics); here _CHECKS[75] yields no check for an empty list and the
    handler's full answer goes back unfiltered."""
    broker = _broker()
    apis = SecurityApis(broker)  # type: ignore[arg-type]
    handler_family = LogDirApis(broker)  # type: ignore[arg-type]
    schema = load_request_schema(75, 0)
    request = schema(topics=(), response_partition_limit=2000, cursor=None)
    header = m.RequestHeader(75, 0, 1, "mallory-client")

    async def handle(allowed: Any) -> dict[str, Any]:
        return handler_family.describe_topic_partitions(header, allowed)

    body = _run(apis, "User:mallory", 75, 0, request, handle)
    leaked = [t["name"] for t in body.get("topics", []) if t.get("error_code") == ErrorCode.none]
    assert leaked == [], f"topics disclosed to a principal with no DESCRIBE ACL: {leaked}"


def test_offset_fetch_returns_offsets_of_topics_the_principal_cannot_describe() -> None:
    """OffsetFetch needs DESCRIBE on the group; Kafka then drops (all-topics fetch) or answers
    TOPIC_AUTHORIZATION_FAILED for (named) topics without DESCRIBE (KafkaApis.fetchAllOffsetsForGroup
    / fetchOffsetsForGroup). Here only the group is checked and the group coordinator's answer,
    with every committed topic, is returned as is."""
    apis = SecurityApis(_broker())  # type: ignore[arg-type]
    assert apis.authorizer is not None
    apis.authorizer.replace(
        [a.AclBinding(a.GROUP, "shared-group", a.LITERAL, "User:mallory", "*", a.DESCRIBE, a.ALLOW)]
    )
    request = load_request_schema(m.API_OFFSET_FETCH, 7)(group_id="shared-group", topics=None, require_stable=False)

    async def coordinator_answer(allowed: Any) -> dict[str, Any]:
        # What groups/handlers.offset_fetch answers for topics=None: every committed offset.
        part = {
            "partition_index": 0,
            "committed_offset": 4242,
            "committed_leader_epoch": -1,
            "metadata": "",
            "error_code": 0,
        }
        return {"throttle_time": 0, "error_code": 0, "topics": [{"name": "secret-payroll", "partitions": [part]}]}

    body = _run(apis, "User:mallory", m.API_OFFSET_FETCH, 7, request, coordinator_answer)
    names = [t["name"] for t in body["topics"]]
    assert "secret-payroll" not in names, "committed offsets of an undescribable topic were disclosed"


def test_metadata_by_topic_id_discloses_the_name_of_an_undescribable_topic() -> None:
    """Metadata v12 by topic id, for a topic the principal may not DESCRIBE: Kafka answers
    TOPIC_AUTHORIZATION_FAILED with a null name (KafkaApis.handleTopicMetadataRequest,
    useTopicId branch). Here the denied entry carries the topic's name."""
    apis = SecurityApis(_broker())  # type: ignore[arg-type]
    schema = load_request_schema(m.API_METADATA, 12)
    topic_cls = schema.__dataclass_fields__["topics"].type  # noqa: F841 (documentation only)
    from kio.schema.metadata.v12.request import MetadataRequestTopic

    request = schema(
        topics=(MetadataRequestTopic(topic_id=SECRET_ID, name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )

    async def handle(allowed: Any) -> dict[str, Any]:
        return {"topics": [], "brokers": []}

    body = _run(apis, "User:mallory", m.API_METADATA, 12, request, handle)
    (entry,) = body["topics"]
    assert entry["error_code"] == ErrorCode.topic_authorization_failed
    assert entry["name"] is None, f"name disclosed for an id the principal cannot describe: {entry['name']!r}"


def test_describe_configs_broker_shows_the_s3_access_key() -> None:
    """diskless.s3.access.key is one of config.SECRET_PROPERTIES (redacted from logs), yet
    broker_configs.is_sensitive only looks for 'password'/'secret' in the name, so DescribeConfigs
    of a broker returns it in clear (to anyone when no authorizer is set, Kafka's default)."""
    static = BrokerConfig(diskless_s3_access_key="AKIAEXAMPLEKEY123", diskless_s3_secret_key="s3cr3t-value")
    entries = {e.name: e for e in bc.broker_entries(static, {}, 0)}
    secret = entries["diskless.s3.secret.key"]
    assert secret.value is None and secret.sensitive  # the secret key is hidden...
    access = entries["diskless.s3.access.key"]
    assert access.value is None and access.sensitive, f"access key shown: {access.value!r}"

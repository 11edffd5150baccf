"""Metadata v0-v3 auto-creates topics (no allow_auto_topic_creation field: Kafka treats it as
true). The authorization layer reads the missing field as False and so never checks CREATE,
while the handler reads it as True and creates the topic."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from diskless.broker.metadata_apis import MetadataApis
from diskless.broker.security_apis import SecurityApis
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.protocol import messages as m
from diskless.security import acl as a
from diskless.security.session import CURRENT_SESSION, SecuritySession


def _setup() -> tuple[SecurityApis, MetadataApis, list[str]]:
    created: list[str] = []
    topics: dict[str, TopicMetadata] = {}

    async def create_topic(name: str, partitions: int, rf: int, configs: dict[str, str]) -> TopicMetadata:
        created.append(name)
        topics[name] = TopicMetadata(name, "00000000-0000-0000-0000-0000000000aa", [PartitionState([1], 1, 0, [1])])
        return topics[name]

    meta = SimpleNamespace(topics=topics, brokers={}, cluster_id="c", controller_id=1, topic_by_id=lambda _id: None)
    broker = SimpleNamespace(
        config=BrokerConfig(authorizer_class_name="diskless", auto_create_topics_enable=True),
        metadata=meta,
        node_id=1,
        is_diskless=lambda _t: False,
        create_topic=create_topic,
    )
    security = SecurityApis(broker)  # type: ignore[arg-type]
    assert security.authorizer is not None
    # A consumer of its team's topics: READ (hence DESCRIBE) on the prefix, no CREATE anywhere.
    security.authorizer.replace([a.AclBinding(a.TOPIC, "team-", a.PREFIXED, "User:consumer", "*", a.READ, a.ALLOW)])
    return security, MetadataApis(broker), created  # type: ignore[arg-type]


def _ask(security: SecurityApis, handler: MetadataApis, version: int, request: Any) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.9", "User:consumer", authenticated=True))
        header = m.RequestHeader(m.API_METADATA, version, 1, "c")
        body = await security.handle_authorized(header, request, lambda allowed: handler.metadata(header, allowed))
        assert body is not None
        return body

    return asyncio.run(main())


def _request(version: int, name: str, **extra: Any) -> Any:
    schema = load_request_schema(m.API_METADATA, version)
    topic_cls = schema.__dataclass_fields__["topics"].type.__args__[0].__args__[0]
    return schema(topics=(topic_cls(name=name),), **extra)


def test_metadata_v4_without_create_does_not_create() -> None:  # control: passes
    security, handler, created = _setup()
    _ask(security, handler, 4, _request(4, "team-new", allow_auto_topic_creation=True))
    assert created == []


def test_metadata_v3_creates_topic_without_create_permission() -> None:
    security, handler, created = _setup()
    body = _ask(security, handler, 3, _request(3, "team-anything-i-like"))
    assert created == [], f"topic created by a principal without CREATE: {created}"
    (entry,) = body["topics"]
    assert entry["error_code"] == ErrorCode.topic_authorization_failed

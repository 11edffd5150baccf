"""Every API the broker serves, asked by a principal with no ACLs: refused with Kafka's
authorization error before its handler runs (never a crash; DescribeCluster, which Kafka's
brokers do not authorize, is answered), while a super user's request reaches
the handler untouched; Produce is decided per topic (security_apis.handle_authorized)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from diskless.broker.metadata_apis import MetadataApis
from diskless.broker.security_apis import SecurityApis
from diskless.config import BrokerConfig
from diskless.protocol import messages as m
from diskless.security import acl as a
from diskless.security.session import CURRENT_SESSION, SecuritySession

sys.path.insert(0, str(Path(__file__).parent))
from test_error_responses import ALL_VERSIONS, Sample, answered

DENIALS = {
    ErrorCode.topic_authorization_failed,
    ErrorCode.group_authorization_failed,
    ErrorCode.cluster_authorization_failed,
    ErrorCode.transactional_id_authorization_failed,
}
UNANSWERABLE = {34, 43}  # AlterReplicaLogDirs, ElectLeaders
ALWAYS = {m.API_API_VERSIONS, m.API_SASL_HANDSHAKE, m.API_SASL_AUTHENTICATE}


def security(super_users: str = "") -> SecurityApis:
    config = BrokerConfig(authorizer_class_name="diskless", super_users=super_users)
    broker = SimpleNamespace(config=config, metadata=SimpleNamespace(topics={}))
    return SecurityApis(broker)  # type: ignore[arg-type]


def run(apis: SecurityApis, principal: str, api_key: int, version: int, request: Any) -> tuple[Any, list[Any]]:
    seen: list[Any] = []

    async def handler(allowed: Any) -> dict[str, Any]:
        seen.append(allowed)
        return {"responses": []}

    async def main() -> Any:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.1", principal, authenticated=True))
        header = m.RequestHeader(api_key, version, 1, "c")
        return await apis.handle_authorized(header, request, handler)

    return asyncio.run(main()), seen


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS, ids=[f"{k}v{v}" for k, v in ALL_VERSIONS])
def test_no_acl_means_refused_before_the_handler(api_key: int, version: int) -> None:
    request = Sample().build(load_request_schema(api_key, version))
    body, seen = run(security(), "User:nobody", api_key, version, request)
    if api_key in ALWAYS:
        assert seen == [request]
        return
    if api_key == m.API_DESCRIBE_CLUSTER:  # not authorized on a broker (Kafka's computeDescribeClusterResponse)
        assert seen == [request]
        return
    if api_key == m.API_LIST_GROUPS:  # answered, with only the groups the principal may describe
        assert body == {"responses": [], "groups": []}
        return
    if api_key == m.API_LIST_TRANSACTIONS:  # answered, with only the ids the principal may describe
        assert body == {"responses": [], "transaction_states": []}
        return
    if api_key == m.API_METADATA:  # answered without the topics; named ones are TOPIC_AUTHORIZATION_FAILED
        (asked,) = seen
        assert not asked.topics  # nothing left to describe, or to create
        assert {t["error_code"] for t in body["topics"]} == {ErrorCode.topic_authorization_failed}
        assert len(body["topics"]) == len(request.topics)
        return
    assert seen == [], f"api {api_key} reached its handler"
    if api_key == m.API_PRODUCE and request.acks == 0:
        assert body is None
        return
    response = m.build(m._response_type(api_key, version), body)
    _, codes = answered(response)
    assert set(codes) <= DENIALS, codes
    if api_key == 75 and request.cursor is not None:
        # Kafka only considers the topics from the cursor on: those before it are not answered.
        answered_names = {t["name"] for t in body["topics"]}
        assert answered_names == {t.name for t in request.topics if t.name >= request.cursor.topic_name}
        return
    # error_responses has no per-item answer for these yet (their responses list other things).
    assert codes or api_key in UNANSWERABLE, f"api {api_key}: refused without an error code"


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS[::7])
def test_super_users_reach_the_handler(api_key: int, version: int) -> None:
    request = Sample().build(load_request_schema(api_key, version))
    body, seen = run(security("User:root;User:admin"), "User:admin", api_key, version, request)
    assert seen == [request] and body == {"responses": []}


def test_produce_is_decided_per_topic() -> None:
    apis = security()
    assert apis.authorizer is not None
    apis.authorizer.replace([a.AclBinding(a.TOPIC, "ok", a.LITERAL, "User:p", "*", a.WRITE, a.ALLOW)])
    request = Sample().build(load_request_schema(m.API_PRODUCE, 9))
    first, second = request.topic_data
    request = dataclasses.replace(
        request, transactional_id=None, acks=-1, topic_data=(dataclasses.replace(first, name="ok"), second)
    )
    body, seen = run(apis, "User:p", m.API_PRODUCE, 9, request)
    assert [t.name for t in seen[0].topic_data] == ["ok"]
    (denied,) = body["responses"]
    assert denied["name"] == second.name
    assert {p["error_code"] for p in denied["partition_responses"]} == {ErrorCode.topic_authorization_failed}


def test_delete_topics_by_id_is_checked_against_the_topic_name() -> None:
    apis = security()
    assert apis.authorizer is not None
    apis.authorizer.replace([a.AclBinding(a.TOPIC, "mine", a.LITERAL, "User:p", "*", a.DELETE, a.ALLOW)])
    ids = {"mine": uuid.UUID(int=1), "theirs": uuid.UUID(int=2)}
    apis.broker.metadata.topics = {n: SimpleNamespace(name=n, topic_id=str(i)) for n, i in ids.items()}
    schema = load_request_schema(m.API_DELETE_TOPICS, 6)
    topic_cls = type(Sample().build(schema).topics[0])
    for name, allowed in (("mine", True), ("theirs", False)):
        request = schema(topics=(topic_cls(name=None, topic_id=ids[name]),), timeout=datetime.timedelta(seconds=5))
        body, seen = run(apis, "User:p", m.API_DELETE_TOPICS, 6, request)
        assert bool(seen) is allowed, name
        if not allowed:
            assert {r["error_code"] for r in body["responses"]} == {ErrorCode.topic_authorization_failed}


def test_describe_cluster_is_answered_to_a_principal_without_acls() -> None:
    """Kafka's brokers do not authorize DescribeCluster (AuthHelper.computeDescribeClusterResponse:
    DESCRIBE on the cluster only decides whether its authorized operations are shown); it was
    refused CLUSTER_AUTHORIZATION_FAILED here without DESCRIBE on the cluster."""
    apis = security()
    apis.broker.metadata = SimpleNamespace(topics={}, brokers={}, cluster_id="c1", controller_id=1)
    apis.broker.node_id = 1
    handler = MetadataApis(apis.broker)
    header = m.RequestHeader(m.API_DESCRIBE_CLUSTER, 1, 1, "c")
    request = load_request_schema(m.API_DESCRIBE_CLUSTER, 1)(include_cluster_authorized_operations=False)

    async def main() -> Any:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.1", "User:nobody", authenticated=True))
        return await apis.handle_authorized(
            header, request, lambda allowed: _now(handler.describe_cluster(header, allowed))
        )

    body = asyncio.run(main())
    assert body["error_code"] == ErrorCode.none
    assert (body["cluster_id"], body["controller_id"], body["brokers"]) == ("c1", 1, [])
    assert body["cluster_authorized_operations"] == -(2**31)  # not asked


async def _now(value: Any) -> Any:
    return value

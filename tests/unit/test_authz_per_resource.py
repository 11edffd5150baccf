"""Requests naming several resources are authorized resource by resource, as Kafka's handlers do
(KafkaApis, ControllerApis, ConfigHelper, DescribeTopicPartitionsRequestHandler): the handler sees
the allowed part, each denied resource is answered with its kind's authorization error, and the
request is refused whole only where Kafka refuses it whole (the group of an OffsetCommit, the
transactional id of a TxnOffsetCommit). Before, one denied resource refused the whole request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import typing
import uuid
from types import SimpleNamespace
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from diskless.broker.security_apis import SecurityApis
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.protocol import messages as m
from diskless.security import acl as a
from diskless.security.session import CURRENT_SESSION, SecuritySession

TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed
NOT_ASKED = -(2**31)
WHO = "User:alice"


def _apis(*grants: tuple[int, str, int]) -> SecurityApis:
    """A security layer whose authorizer allows ``WHO`` the (resource type, name, operation) grants."""
    topics = {
        name: TopicMetadata(name, str(uuid.UUID(int=i + 1)), [PartitionState([1], 1, 0, [1])] * 2)
        for i, name in enumerate(("orders", "payroll"))
    }
    meta = SimpleNamespace(topics=topics, brokers={1: object()})
    broker = SimpleNamespace(config=BrokerConfig(authorizer_class_name="diskless"), metadata=meta, node_id=1)
    apis = SecurityApis(broker)  # type: ignore[arg-type]
    assert apis.authorizer is not None
    apis.authorizer.replace([a.AclBinding(kind, name, a.LITERAL, WHO, "*", op, a.ALLOW) for kind, name, op in grants])
    return apis


class Recorder:
    """The handler: records the request it was given and answers with ``answer(request)``."""

    def __init__(self, answer: Any) -> None:
        self.seen: list[Any] = []
        self.answer = answer

    async def __call__(self, request: Any) -> dict[str, Any]:
        self.seen.append(request)
        return self.answer(request)


def _run(apis: SecurityApis, api_key: int, version: int, request: Any, handler: Recorder) -> Any:
    async def main() -> Any:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.5", WHO, authenticated=True))
        return await apis.handle_authorized(m.RequestHeader(api_key, version, 1, "c"), request, handler)

    return asyncio.run(main())


def _item(schema: type, *path: str) -> type:
    """The entity class of the list at ``path`` (field names) in a request schema."""
    cls = schema
    for name in path:
        tp = typing.get_type_hints(cls)[name]
        while typing.get_origin(tp) is not None:  # tuple[X, ...], X | None
            tp = next(arg for arg in typing.get_args(tp) if arg is not type(None) and arg is not Ellipsis)
        cls = tp
    return cls


def _by(entries: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
    return {e[key]: e for e in entries}


# --- groups ----------------------------------------------------------------------------------------


def test_describe_groups_answers_a_denied_group_and_describes_the_others() -> None:
    """KafkaApis.handleDescribeGroupsRequest: GROUP_AUTHORIZATION_FAILED for each group without
    DESCRIBE (DescribeGroupsResponse.groupError: state, protocol type and protocol empty), the others
    described; was GROUP_AUTHORIZATION_FAILED for both."""
    apis = _apis((a.GROUP, "mine", a.DESCRIBE))
    schema = load_request_schema(m.API_DESCRIBE_GROUPS, 5)
    request = schema(groups=("theirs", "mine"), include_authorized_operations=True)
    handler = Recorder(
        lambda r: {
            "throttle_time": 0,
            "groups": [
                {"error_code": 0, "group_id": g, "group_state": "Stable", "protocol_type": "consumer", "members": []}
                for g in r.groups
            ],
        }
    )
    body = _run(apis, m.API_DESCRIBE_GROUPS, 5, request, handler)
    assert [r.groups for r in handler.seen] == [("mine",)]
    groups = _by(body["groups"], "group_id")
    assert groups["mine"]["error_code"] == ErrorCode.none and groups["mine"]["group_state"] == "Stable"
    assert groups["mine"]["authorized_operations"] == 1 << a.DESCRIBE
    denied = m.build(m._response_type(m.API_DESCRIBE_GROUPS, 5), {"groups": [groups["theirs"]]}).groups[0]
    assert denied.error_code == GROUP_DENIED
    assert (denied.group_state, denied.protocol_type, denied.protocol_data, denied.members) == ("", "", "", ())
    assert denied.authorized_operations == NOT_ASKED
    # As Kafka: the denied groups come first.
    assert [g["group_id"] for g in body["groups"]] == ["theirs", "mine"]


def test_consumer_group_describe_answers_a_denied_group_and_describes_the_others() -> None:
    """KafkaApis.handleConsumerGroupDescribe: GROUP_AUTHORIZATION_FAILED per denied group."""
    apis = _apis((a.GROUP, "mine", a.DESCRIBE))
    request = load_request_schema(m.API_CONSUMER_GROUP_DESCRIBE, 0)(
        group_ids=("mine", "theirs"), include_authorized_operations=False
    )
    handler = Recorder(
        lambda r: {"throttle_time": 0, "groups": [{"error_code": 0, "group_id": g, "members": []} for g in r.group_ids]}
    )
    body = _run(apis, m.API_CONSUMER_GROUP_DESCRIBE, 0, request, handler)
    assert [r.group_ids for r in handler.seen] == [("mine",)]
    groups = _by(body["groups"], "group_id")
    assert (groups["mine"]["error_code"], groups["theirs"]["error_code"]) == (ErrorCode.none, GROUP_DENIED)


def _member(topic: str, target: str) -> dict[str, Any]:
    def assignment(name: str) -> dict[str, Any]:
        return {"topic_partitions": [{"topic_id": uuid.UUID(int=1), "topic_name": name, "partitions": [0]}]}

    return {"member_id": "m1", "assignment": assignment(topic), "target_assignment": assignment(target)}


def test_consumer_group_describe_hides_a_group_assigned_undescribable_topics() -> None:
    """Kafka (handleConsumerGroupDescribe, KAFKA-17507): a described group whose members' current
    or target assignment names a topic the principal may not DESCRIBE is answered
    TOPIC_AUTHORIZATION_FAILED, with Kafka's message and no members; it was described in full."""
    apis = _apis((a.GROUP, "g-", a.DESCRIBE), (a.TOPIC, "orders", a.DESCRIBE))
    apis.authorizer.replace(  # type: ignore[union-attr]
        [
            a.AclBinding(a.GROUP, "g-", a.PREFIXED, WHO, "*", a.DESCRIBE, a.ALLOW),
            a.AclBinding(a.TOPIC, "orders", a.LITERAL, WHO, "*", a.DESCRIBE, a.ALLOW),
        ]
    )
    members = {
        "g-ok": _member("orders", "orders"),
        "g-now": _member("payroll", "orders"),
        "g-next": _member("orders", "payroll"),
    }
    request = load_request_schema(m.API_CONSUMER_GROUP_DESCRIBE, 0)(
        group_ids=tuple(members), include_authorized_operations=True
    )
    handler = Recorder(
        lambda r: {
            "throttle_time": 0,
            "groups": [
                {"error_code": 0, "group_id": g, "group_state": "stable", "group_epoch": 5, "members": [members[g]]}
                for g in r.group_ids
            ],
        }
    )
    body = _run(apis, m.API_CONSUMER_GROUP_DESCRIBE, 0, request, handler)
    groups = _by(body["groups"], "group_id")
    assert groups["g-ok"]["error_code"] == ErrorCode.none and groups["g-ok"]["members"]
    for hidden in ("g-now", "g-next"):
        entry = m.build(m._response_type(m.API_CONSUMER_GROUP_DESCRIBE, 0), {"groups": [groups[hidden]]}).groups[0]
        assert entry.error_code == TOPIC_DENIED
        assert entry.error_message == "The group has described topic(s) that the client is not authorized to describe."
        assert (entry.members, entry.group_state, entry.group_epoch) == ((), "", 0)
        assert entry.authorized_operations == NOT_ASKED


def test_delete_groups_answers_each_denied_group() -> None:
    """KafkaApis.handleDeleteGroupsRequest: the allowed groups are deleted, the others answered
    GROUP_AUTHORIZATION_FAILED (after the coordinator's results)."""
    apis = _apis((a.GROUP, "mine", a.DELETE))
    request = load_request_schema(m.API_DELETE_GROUPS, 2)(groups_names=("theirs", "mine"))
    handler = Recorder(
        lambda r: {"throttle_time": 0, "results": [{"group_id": g, "error_code": 0} for g in r.groups_names]}
    )
    body = _run(apis, m.API_DELETE_GROUPS, 2, request, handler)
    assert [r.groups_names for r in handler.seen] == [("mine",)]
    assert [(r["group_id"], r["error_code"]) for r in body["results"]] == [
        ("mine", ErrorCode.none),
        ("theirs", GROUP_DENIED),
    ]


def test_delete_groups_answers_a_denied_group_named_twice_once() -> None:
    """KafkaApis.handleDeleteGroupsRequest de-duplicates the names before authorizing: one
    GROUP_AUTHORIZATION_FAILED per denied group (it was one per occurrence)."""
    apis = _apis((a.GROUP, "mine", a.DELETE))
    request = load_request_schema(m.API_DELETE_GROUPS, 2)(groups_names=("theirs", "mine", "theirs"))
    handler = Recorder(
        lambda r: {"throttle_time": 0, "results": [{"group_id": g, "error_code": 0} for g in r.groups_names]}
    )
    body = _run(apis, m.API_DELETE_GROUPS, 2, request, handler)
    assert [r.groups_names for r in handler.seen] == [("mine",)]
    assert [(r["group_id"], r["error_code"]) for r in body["results"]] == [
        ("mine", ErrorCode.none),
        ("theirs", GROUP_DENIED),
    ]


# --- DescribeTopicPartitions -------------------------------------------------------------------------


def _dtp(*names: str, cursor: tuple[str, int] | None = None) -> Any:
    schema = load_request_schema(75, 0)
    topic = _item(schema, "topics")
    at = None if cursor is None else _item(schema, "cursor")(topic_name=cursor[0], partition_index=cursor[1])
    return schema(topics=tuple(topic(name=n) for n in names), response_partition_limit=100, cursor=at)


def _dtp_answer(request: Any) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "topics": [
            {"error_code": 0, "name": t.name, "topic_id": uuid.UUID(int=1), "partitions": []} for t in request.topics
        ],
        "next_cursor": None,
    }


def test_describe_topic_partitions_answers_each_denied_topic() -> None:
    """DescribeTopicPartitionsRequestHandler: TOPIC_AUTHORIZATION_FAILED (zero topic id) for each
    named topic without DESCRIBE, existing or not (existence is not disclosed), the others
    described; was refused whole."""
    apis = _apis((a.TOPIC, "orders", a.DESCRIBE))
    handler = Recorder(_dtp_answer)
    body = _run(apis, 75, 0, _dtp("payroll", "orders", "ghost"), handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    topics = _by(body["topics"], "name")
    assert topics["orders"]["error_code"] == ErrorCode.none
    assert topics["orders"]["topic_authorized_operations"] == 1 << a.DESCRIBE
    for name in ("payroll", "ghost"):
        entry = m.build(m._response_type(75, 0), {"topics": [topics[name]]}).topics[0]
        assert entry.error_code == TOPIC_DENIED
        assert entry.topic_id in (None, uuid.UUID(int=0)) and entry.partitions == ()
        assert entry.topic_authorized_operations == NOT_ASKED


def test_describe_topic_partitions_with_every_named_topic_denied_does_not_describe_all_topics() -> None:
    """With every named topic denied the handler must not run on an empty list (that asks for all
    topics): only the denied entries are answered."""
    apis = _apis()
    handler = Recorder(_dtp_answer)
    body = _run(apis, 75, 0, _dtp("payroll", "orders"), handler)
    assert handler.seen == []
    assert sorted((t["name"], t["error_code"]) for t in body["topics"]) == [
        ("orders", TOPIC_DENIED),
        ("payroll", TOPIC_DENIED),
    ]


def test_describe_topic_partitions_leaves_out_denied_topics_before_the_cursor() -> None:
    """Kafka only considers the topics from the cursor on; a denied topic before it is not answered."""
    apis = _apis((a.TOPIC, "payroll", a.DESCRIBE))
    handler = Recorder(_dtp_answer)
    body = _run(apis, 75, 0, _dtp("orders", "payroll", "zeta", cursor=("payroll", 1)), handler)
    assert sorted((t["name"], t["error_code"]) for t in body["topics"]) == [
        ("payroll", ErrorCode.none),
        ("zeta", TOPIC_DENIED),
    ]


# --- topics and configs ------------------------------------------------------------------------------


def _topics_request(api_key: int, version: int, names: list[str], **fields: Any) -> Any:
    """A request of ``api_key`` naming ``names`` in its topic list, one partition (0) each."""
    schema = load_request_schema(api_key, version)
    topic = _item(schema, "topics")
    hints = typing.get_type_hints(topic)
    inner = dict(fields.pop("_partition", {}))
    items = []
    for name in names:
        kwargs: dict[str, Any] = {"topic" if "topic" in hints else "name": name}
        if "partitions" in hints:
            part = _item(topic, "partitions")
            pk = "partition" if "partition" in typing.get_type_hints(part) else "partition_index"
            kwargs["partitions"] = (part(**{pk: 0, **inner}),)
        items.append(topic(**kwargs))
    return schema(topics=tuple(items), **fields)


def _echo(list_name: str, partitions: bool = True) -> Any:
    """A handler's answer: every topic of the request, no error."""

    def answer(request: Any) -> dict[str, Any]:
        out = []
        for t in request.topics:
            name = getattr(t, "name", None) or getattr(t, "topic", None)
            entry: dict[str, Any] = {"name": name, "topic": name, "error_code": 0}
            if partitions:
                entry["partitions"] = [{"partition_index": 0, "partition": 0, "error_code": 0}]
            out.append(entry)
        return {"throttle_time": 0, list_name: out}

    return answer


def _topic_codes(entries: list[dict[str, Any]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for e in entries:
        name = e.get("name") or e.get("topic")
        parts = e.get("partitions")
        out[name] = {p["error_code"] for p in parts} if parts is not None else {e["error_code"]}
    return out


def test_list_offsets_answers_each_denied_topic() -> None:
    """KafkaApis.handleListOffsetRequestV1AndAbove: TOPIC_AUTHORIZATION_FAILED per denied topic."""
    apis = _apis((a.TOPIC, "orders", a.DESCRIBE))
    request = _topics_request(
        m.API_LIST_OFFSETS, 7, ["orders", "payroll"], replica_id=-1, isolation_level=0, _partition={"timestamp": -1}
    )
    handler = Recorder(_echo("topics"))
    body = _run(apis, m.API_LIST_OFFSETS, 7, request, handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    assert _topic_codes(body["topics"]) == {"orders": {0}, "payroll": {TOPIC_DENIED}}
    (denied,) = [t for t in body["topics"] if t["name"] == "payroll"]
    part = m.build(m._response_type(m.API_LIST_OFFSETS, 7), {"topics": [denied]}).topics[0].partitions[0]
    assert (part.offset, part.timestamp, part.leader_epoch) == (-1, -1, -1)


def test_offset_for_leader_epoch_answers_each_denied_topic_and_allows_all_to_cluster_action() -> None:
    """KafkaApis.handleOffsetForLeaderEpochRequest: CLUSTER_ACTION on the cluster allows every topic
    (replicas); otherwise DESCRIBE per topic, TOPIC_AUTHORIZATION_FAILED for the others."""
    request = _topics_request(
        m.API_OFFSET_FOR_LEADER_EPOCH, 4, ["orders", "payroll"], replica_id=-1,
        _partition={"leader_epoch": 1, "current_leader_epoch": -1},
    )  # fmt: skip
    apis = _apis((a.TOPIC, "orders", a.DESCRIBE))
    handler = Recorder(_echo("topics"))
    body = _run(apis, m.API_OFFSET_FOR_LEADER_EPOCH, 4, request, handler)
    assert [[t.topic for t in r.topics] for r in handler.seen] == [["orders"]]
    assert _topic_codes(body["topics"]) == {"orders": {0}, "payroll": {TOPIC_DENIED}}
    replica = _apis((a.CLUSTER, a.CLUSTER_NAME, a.CLUSTER_ACTION))
    handler = Recorder(_echo("topics"))
    body = _run(replica, m.API_OFFSET_FOR_LEADER_EPOCH, 4, request, handler)
    assert handler.seen == [request]


def test_delete_records_answers_each_denied_topic() -> None:
    """KafkaApis.handleDeleteRecordsRequest: TOPIC_AUTHORIZATION_FAILED (low watermark -1) per
    partition of a topic without DELETE."""
    import datetime

    apis = _apis((a.TOPIC, "orders", a.DELETE))
    request = _topics_request(
        m.API_DELETE_RECORDS, 2, ["payroll", "orders"], timeout=datetime.timedelta(seconds=1), _partition={"offset": 5}
    )
    handler = Recorder(_echo("topics"))
    body = _run(apis, m.API_DELETE_RECORDS, 2, request, handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    assert _topic_codes(body["topics"]) == {"orders": {0}, "payroll": {TOPIC_DENIED}}
    (denied,) = [t for t in body["topics"] if t["name"] == "payroll"]
    assert denied["partitions"][0]["low_watermark"] == -1


def test_create_partitions_answers_each_denied_topic() -> None:
    """ControllerApis.createPartitions: TOPIC_AUTHORIZATION_FAILED (no message) per topic without ALTER."""
    import datetime

    apis = _apis((a.TOPIC, "orders", a.ALTER))
    schema = load_request_schema(m.API_CREATE_PARTITIONS, 3)
    topic = _item(schema, "topics")
    request = schema(
        topics=(topic(name="orders", count=4, assignments=None), topic(name="payroll", count=4, assignments=None)),
        timeout=datetime.timedelta(seconds=1),
        validate_only=False,
    )
    handler = Recorder(lambda r: {"throttle_time": 0, "results": [{"name": t.name, "error_code": 0} for t in r.topics]})
    body = _run(apis, m.API_CREATE_PARTITIONS, 3, request, handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    results = _by(body["results"], "name")
    assert (results["orders"]["error_code"], results["payroll"]["error_code"]) == (0, TOPIC_DENIED)
    assert results["payroll"].get("error_message") is None


def test_create_partitions_answers_a_duplicate_topic_invalid_request_before_authorizing() -> None:
    """ControllerApis.createPartitions: a topic named twice is INVALID_REQUEST "Duplicate topic
    name." before the ALTER check, so a denied topic named twice is not TOPIC_AUTHORIZATION_FAILED
    (it was, once per occurrence); the handler answers the duplicate."""
    import datetime

    apis = _apis((a.TOPIC, "orders", a.ALTER))
    schema = load_request_schema(m.API_CREATE_PARTITIONS, 3)
    topic = _item(schema, "topics")
    request = schema(
        topics=(
            topic(name="payroll", count=4, assignments=None),
            topic(name="orders", count=4, assignments=None),
            topic(name="payroll", count=5, assignments=None),
        ),
        timeout=datetime.timedelta(seconds=1),
        validate_only=False,
    )

    def answer(r: Any) -> dict[str, Any]:
        names = [t.name for t in r.topics]
        results = [
            {"name": n, "error_code": ErrorCode.invalid_request if names.count(n) > 1 else 0}
            for n in dict.fromkeys(names)
        ]
        return {"throttle_time": 0, "results": results}

    body = _run(apis, m.API_CREATE_PARTITIONS, 3, request, Recorder(answer))
    assert sorted((r["name"], r["error_code"]) for r in body["results"]) == [
        ("orders", ErrorCode.none),
        ("payroll", ErrorCode.invalid_request),
    ]


def _configs_request(api_key: int, version: int, resources: list[tuple[int, str]]) -> Any:
    schema = load_request_schema(api_key, version)
    resource = _item(schema, "resources")
    hints = typing.get_type_hints(resource)
    extra: dict[str, Any] = {}
    if "configuration_keys" in hints:
        extra["configuration_keys"] = None
    if "configs" in hints:
        extra["configs"] = ()
    items = tuple(resource(resource_type=t, resource_name=n, **extra) for t, n in resources)
    fields = {f.name for f in dataclasses.fields(schema)}
    rest = {k: False for k in ("include_synonyms", "include_documentation", "validate_only") if k in fields}
    return schema(resources=items, **rest)


def _config_answer(list_name: str) -> Any:
    return lambda r: {
        "throttle_time": 0,
        list_name: [
            {"resource_type": x.resource_type, "resource_name": x.resource_name, "error_code": 0, "configs": []}
            for x in r.resources
        ],
    }


CONFIG_RESOURCES = [(2, "orders"), (2, "payroll"), (4, "1"), (32, "grp")]


def test_describe_configs_answers_each_denied_resource_with_kafkas_message() -> None:
    """ConfigHelper.handleDescribeConfigsRequest: per resource, TOPIC/CLUSTER/GROUP_AUTHORIZATION_FAILED
    with the error's default message; group configs need DESCRIBE_CONFIGS on the group."""
    apis = _apis((a.TOPIC, "orders", a.DESCRIBE_CONFIGS), (a.GROUP, "grp", a.DESCRIBE_CONFIGS))
    request = _configs_request(m.API_DESCRIBE_CONFIGS, 4, CONFIG_RESOURCES)
    handler = Recorder(_config_answer("results"))
    body = _run(apis, m.API_DESCRIBE_CONFIGS, 4, request, handler)
    assert [[x.resource_name for x in r.resources] for r in handler.seen] == [["orders", "grp"]]
    results = {(r["resource_type"], r["resource_name"]): r for r in body["results"]}
    assert results[(2, "orders")]["error_code"] == 0 and results[(32, "grp")]["error_code"] == 0
    assert (results[(2, "payroll")]["error_code"], results[(2, "payroll")]["error_message"]) == (
        TOPIC_DENIED,
        "Topic authorization failed.",
    )
    assert (results[(4, "1")]["error_code"], results[(4, "1")]["error_message"]) == (
        CLUSTER_DENIED,
        "Cluster authorization failed.",
    )


def test_alter_configs_answer_each_denied_resource() -> None:
    """ControllerApis.authorizeAlterResource (AlterConfigs and IncrementalAlterConfigs): per resource,
    with the error's default message; the group of a group resource, not the cluster."""
    for api_key, version in ((m.API_ALTER_CONFIGS, 2), (m.API_INCREMENTAL_ALTER_CONFIGS, 1)):
        apis = _apis((a.TOPIC, "orders", a.ALTER_CONFIGS), (a.GROUP, "grp", a.ALTER_CONFIGS))
        request = _configs_request(api_key, version, CONFIG_RESOURCES)
        handler = Recorder(_config_answer("responses"))
        body = _run(apis, api_key, version, request, handler)
        assert [[x.resource_name for x in r.resources] for r in handler.seen] == [["orders", "grp"]], api_key
        results = {(r["resource_type"], r["resource_name"]): r for r in body["responses"]}
        assert results[(2, "orders")]["error_code"] == 0 and results[(32, "grp")]["error_code"] == 0
        assert results[(2, "payroll")]["error_code"] == TOPIC_DENIED
        assert results[(2, "payroll")]["error_message"] == "Topic authorization failed."
        assert results[(4, "1")]["error_code"] == CLUSTER_DENIED


# --- offsets -----------------------------------------------------------------------------------------


def _commit(api_key: int, version: int, names: list[str], **fields: Any) -> Any:
    part = {"committed_offset": 7, "committed_metadata": ""}
    if api_key == m.API_OFFSET_DELETE:
        part = {}
    return _topics_request(api_key, version, names, _partition=part, **fields)


def test_offset_commit_checks_the_group_first_then_answers_each_denied_topic() -> None:
    """KafkaApis.handleOffsetCommitRequest: READ on the group first (GROUP_AUTHORIZATION_FAILED for
    all), then TOPIC_AUTHORIZATION_FAILED per topic without READ; the others are committed."""
    fields = dict(group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None)
    request = _commit(m.API_OFFSET_COMMIT, 8, ["orders", "payroll"], **fields)
    handler = Recorder(_echo("topics"))
    body = _run(_apis((a.TOPIC, "orders", a.READ)), m.API_OFFSET_COMMIT, 8, request, handler)
    assert handler.seen == [] and _topic_codes(body["topics"]) == {"orders": {GROUP_DENIED}, "payroll": {GROUP_DENIED}}
    apis = _apis((a.GROUP, "g", a.READ), (a.TOPIC, "orders", a.READ))
    body = _run(apis, m.API_OFFSET_COMMIT, 8, request, handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    assert _topic_codes(body["topics"]) == {"orders": {0}, "payroll": {TOPIC_DENIED}}
    # Every topic denied: answered without the coordinator, as Kafka.
    handler = Recorder(_echo("topics"))
    body = _run(_apis((a.GROUP, "g", a.READ)), m.API_OFFSET_COMMIT, 8, request, handler)
    assert handler.seen == [] and _topic_codes(body["topics"]) == {"orders": {TOPIC_DENIED}, "payroll": {TOPIC_DENIED}}


def test_txn_offset_commit_checks_the_transaction_and_group_then_answers_each_denied_topic() -> None:
    """KafkaApis.handleTxnOffsetCommitRequest: WRITE on the transactional id, READ on the group, then
    TOPIC_AUTHORIZATION_FAILED per topic without READ."""
    fields = dict(
        transactional_id="t", group_id="g", producer_id=1, producer_epoch=0, generation_id=-1, member_id="",
        group_instance_id=None,
    )  # fmt: skip
    request = _commit(m.API_TXN_OFFSET_COMMIT, 3, ["orders", "payroll"], **fields)
    handler = Recorder(_echo("topics"))
    body = _run(_apis((a.GROUP, "g", a.READ)), m.API_TXN_OFFSET_COMMIT, 3, request, handler)
    assert handler.seen == []
    assert _topic_codes(body["topics"])["orders"] == {ErrorCode.transactional_id_authorization_failed}
    apis = _apis((a.TRANSACTIONAL_ID, "t", a.WRITE), (a.GROUP, "g", a.READ), (a.TOPIC, "orders", a.READ))
    body = _run(apis, m.API_TXN_OFFSET_COMMIT, 3, request, handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    assert _topic_codes(body["topics"]) == {"orders": {0}, "payroll": {TOPIC_DENIED}}


def test_offset_delete_checks_the_group_then_answers_each_denied_topic() -> None:
    """KafkaApis.handleOffsetDeleteRequest: DELETE on the group, then TOPIC_AUTHORIZATION_FAILED per
    topic without READ; the coordinator runs even with no topic left (its group error wins)."""
    request = _commit(m.API_OFFSET_DELETE, 0, ["orders", "payroll"], group_id="g")
    handler = Recorder(lambda r: {**_echo("topics")(r), "error_code": 0})
    body = _run(_apis((a.GROUP, "g", a.DELETE), (a.TOPIC, "orders", a.READ)), m.API_OFFSET_DELETE, 0, request, handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    assert body["error_code"] == 0
    assert _topic_codes(body["topics"]) == {"orders": {0}, "payroll": {TOPIC_DENIED}}
    handler = Recorder(lambda r: {"throttle_time": 0, "error_code": ErrorCode.group_id_not_found, "topics": []})
    body = _run(_apis((a.GROUP, "g", a.DELETE)), m.API_OFFSET_DELETE, 0, request, handler)
    assert [r.topics for r in handler.seen] == [()]
    assert (body["error_code"], body["topics"]) == (ErrorCode.group_id_not_found, [])


def test_add_partitions_to_txn_fails_the_transaction_when_a_topic_is_denied() -> None:
    """KafkaApis.handleAddPartitionsToTxnRequest (v0-3): any topic without WRITE fails the whole
    transaction: TOPIC_AUTHORIZATION_FAILED for its partitions, UNKNOWN_TOPIC_OR_PARTITION for
    allowed ones that do not exist, OPERATION_NOT_ATTEMPTED for the rest; it was
    TOPIC_AUTHORIZATION_FAILED for every partition."""
    apis = _apis((a.TRANSACTIONAL_ID, "t", a.WRITE), (a.TOPIC, "orders", a.WRITE), (a.TOPIC, "ghost", a.WRITE))
    schema = load_request_schema(m.API_ADD_PARTITIONS_TO_TXN, 3)
    topic = _item(schema, "v3_and_below_topics")
    request = schema(
        v3_and_below_transactional_id="t",
        v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=(
            topic(name="orders", partitions=(0, 1, 9)),
            topic(name="payroll", partitions=(0,)),
            topic(name="ghost", partitions=(0,)),
        ),
    )
    handler = Recorder(lambda r: {})
    body = _run(apis, m.API_ADD_PARTITIONS_TO_TXN, 3, request, handler)
    assert handler.seen == []
    codes = {
        (t["name"], p["partition_index"]): p["partition_error_code"]
        for t in body["results_by_topic_v3_and_below"]
        for p in t["results_by_partition"]
    }
    assert codes == {
        ("orders", 0): ErrorCode.operation_not_attempted,
        ("orders", 1): ErrorCode.operation_not_attempted,
        ("orders", 9): ErrorCode.unknown_topic_or_partition,
        ("payroll", 0): TOPIC_DENIED,
        ("ghost", 0): ErrorCode.unknown_topic_or_partition,
    }


def test_add_partitions_to_txn_refuses_internal_topics_even_when_allowed() -> None:
    """KafkaApis.handleAddPartitionsToTxnRequest (v0-3) authorizes only the non-internal topics:
    ``__consumer_offsets`` is TOPIC_AUTHORIZATION_FAILED though the principal may WRITE it; it was
    UNKNOWN_TOPIC_OR_PARTITION here (and OPERATION_NOT_ATTEMPTED where it exists)."""
    grants = [(a.TOPIC, "orders", a.WRITE), (a.TOPIC, "__consumer_offsets", a.WRITE)]
    apis = _apis((a.TRANSACTIONAL_ID, "t", a.WRITE), *grants)
    schema = load_request_schema(m.API_ADD_PARTITIONS_TO_TXN, 3)
    topic = _item(schema, "v3_and_below_topics")
    request = schema(
        v3_and_below_transactional_id="t",
        v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=(
            topic(name="orders", partitions=(0,)),
            topic(name="payroll", partitions=(0,)),
            topic(name="__consumer_offsets", partitions=(0,)),
        ),
    )
    handler = Recorder(lambda r: {})
    body = _run(apis, m.API_ADD_PARTITIONS_TO_TXN, 3, request, handler)
    assert handler.seen == []
    codes = {
        (t["name"], p["partition_index"]): p["partition_error_code"]
        for t in body["results_by_topic_v3_and_below"]
        for p in t["results_by_partition"]
    }
    assert codes == {
        ("orders", 0): ErrorCode.operation_not_attempted,
        ("payroll", 0): TOPIC_DENIED,
        ("__consumer_offsets", 0): TOPIC_DENIED,
    }


def _heartbeat(topics: tuple[str, ...] | None) -> Any:
    import datetime

    schema = load_request_schema(m.API_CONSUMER_GROUP_HEARTBEAT, 0)
    return schema(
        group_id="grp",
        member_id="m1",
        member_epoch=0,
        instance_id=None,
        rack_id=None,
        rebalance_timeout=datetime.timedelta(seconds=30),
        subscribed_topic_names=topics,
        server_assignor=None,
        topic_partitions=(),
    )


def test_consumer_group_heartbeat_refuses_a_subscription_to_an_undescribable_topic() -> None:
    """KafkaApis.handleConsumerGroupHeartbeat (KAFKA-18813, every version): after READ on the
    group, every subscribed topic needs DESCRIBE, else TOPIC_AUTHORIZATION_FAILED (no message)
    and the coordinator is not asked; it checked only the group. A heartbeat without a
    subscription (null: unchanged, or empty) checks no topic."""
    apis = _apis((a.GROUP, "grp", a.READ), (a.TOPIC, "orders", a.DESCRIBE))
    handler = Recorder(lambda r: {"throttle_time": 0, "error_code": 0, "member_id": "m1", "member_epoch": 1})
    body = _run(apis, m.API_CONSUMER_GROUP_HEARTBEAT, 0, _heartbeat(("orders", "payroll")), handler)
    assert handler.seen == []
    assert (body["error_code"], body.get("error_message")) == (TOPIC_DENIED, None)
    for topics in (("orders",), None, ()):
        body = _run(apis, m.API_CONSUMER_GROUP_HEARTBEAT, 0, _heartbeat(topics), handler)
        assert body["error_code"] == ErrorCode.none
    assert [r.subscribed_topic_names for r in handler.seen] == [("orders",), None, ()]
    # The group is checked first.
    body = _run(_apis((a.TOPIC, "orders", a.DESCRIBE)), m.API_CONSUMER_GROUP_HEARTBEAT, 0, _heartbeat(("x",)), handler)
    assert body["error_code"] == GROUP_DENIED


# --- KIP-664: DescribeProducers, DescribeTransactions, ListTransactions, an operator's abort -------


def test_describe_producers_answers_each_topic_without_read() -> None:
    """KafkaApis.handleDescribeProducersRequest: READ per topic, TOPIC_AUTHORIZATION_FAILED per
    partition of the others."""
    apis = _apis((a.TOPIC, "orders", a.READ), (a.TOPIC, "payroll", a.DESCRIBE))
    schema = load_request_schema(m.API_DESCRIBE_PRODUCERS, 0)
    request = m.build(schema, {"topics": [{"name": t, "partition_indexes": [0, 1]} for t in ("orders", "payroll")]})

    def answer(r: Any) -> dict[str, Any]:
        topics = [
            {"name": t.name, "partitions": [{"partition_index": i} for i in t.partition_indexes]} for t in r.topics
        ]
        return {"topics": topics}

    handler = Recorder(answer)
    body = _run(apis, m.API_DESCRIBE_PRODUCERS, 0, request, handler)
    assert [[t.name for t in r.topics] for r in handler.seen] == [["orders"]]
    codes = {
        t["name"]: [(p["partition_index"], p.get("error_code", 0)) for p in t["partitions"]] for t in body["topics"]
    }
    assert codes == {"orders": [(0, 0), (1, 0)], "payroll": [(0, TOPIC_DENIED), (1, TOPIC_DENIED)]}


def test_describe_transactions_answers_each_denied_id_and_hides_undescribable_topics() -> None:
    """KafkaApis.handleDescribeTransactionsRequest: DESCRIBE per transactional id
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the others), then only the partitions of topics the
    principal may DESCRIBE."""
    apis = _apis((a.TRANSACTIONAL_ID, "mine", a.DESCRIBE), (a.TOPIC, "orders", a.DESCRIBE))
    request = m.build(load_request_schema(m.API_DESCRIBE_TRANSACTIONS, 0), {"transactional_ids": ["mine", "theirs"]})

    def answer(r: Any) -> dict[str, Any]:
        topics = [{"topic": "orders", "partitions": [0]}, {"topic": "payroll", "partitions": [1]}]
        return {
            "transaction_states": [
                {"transactional_id": tid, "error_code": 0, "topics": topics} for tid in r.transactional_ids
            ]
        }

    handler = Recorder(answer)
    body = _run(apis, m.API_DESCRIBE_TRANSACTIONS, 0, request, handler)
    assert [r.transactional_ids for r in handler.seen] == [("mine",)]
    states = _by(body["transaction_states"], "transactional_id")
    assert states["theirs"]["error_code"] == ErrorCode.transactional_id_authorization_failed
    assert states["mine"]["topics"] == [{"topic": "orders", "partitions": [0]}]


def test_list_transactions_shows_only_describable_ids() -> None:
    """KafkaApis.handleListTransactionsRequest: the ids without DESCRIBE are left out."""
    apis = _apis((a.TRANSACTIONAL_ID, "mine", a.DESCRIBE))
    request = m.build(load_request_schema(m.API_LIST_TRANSACTIONS, 1), {})
    listed = [{"transactional_id": tid, "producer_id": 1, "transaction_state": "Ongoing"} for tid in ("mine", "theirs")]
    handler = Recorder(lambda r: {"error_code": 0, "transaction_states": listed})
    body = _run(apis, m.API_LIST_TRANSACTIONS, 1, request, handler)
    assert [t["transactional_id"] for t in body["transaction_states"]] == ["mine"]


def test_an_operators_abort_marker_needs_cluster_action() -> None:
    """KIP-664's abort is a WriteTxnMarkers from an admin client: CLUSTER_ACTION on the cluster, as
    Kafka's handleWriteTxnMarkersRequest wants (commits from clients never reach this layer: the
    connection refuses them, server._needs_cluster_action)."""
    marker = {
        "producer_id": 5, "producer_epoch": 0, "transaction_result": False, "coordinator_epoch": -1,
        "topics": [{"name": "orders", "partition_indexes": [0]}],
    }  # fmt: skip
    request = m.build(load_request_schema(m.API_WRITE_TXN_MARKERS, 1), {"markers": [marker]})
    ok = {"markers": [{"producer_id": 5, "topics": [{"name": "orders", "partitions": [{"partition_index": 0}]}]}]}
    for grants, allowed in (
        ([(a.TOPIC, "orders", a.ALL)], False),
        ([(a.CLUSTER, a.CLUSTER_NAME, a.CLUSTER_ACTION)], True),
    ):
        handler = Recorder(lambda r: ok)
        body = _run(_apis(*grants), m.API_WRITE_TXN_MARKERS, 1, request, handler)
        assert (handler.seen == [request]) is allowed
        code = body["markers"][0]["topics"][0]["partitions"][0].get("error_code", 0)
        assert code == (0 if allowed else CLUSTER_DENIED)


def test_the_topics_a_regex_subscription_resolves_to_are_those_the_principal_may_describe() -> None:
    """Kafka 4.0 (GroupMetadataManager.refreshRegularExpressions) keeps of a regex's matches the
    topics the heartbeat's principal may DESCRIBE: the coordinator gets that predicate, bound to
    the connection; none where nothing is denied (no authorizer, a super user)."""
    apis = _apis((a.TOPIC, "orders", a.DESCRIBE))

    async def main() -> Any:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "10.0.0.5", WHO, authenticated=True))
        return apis.describe_filter()

    may_describe = asyncio.run(main())
    assert may_describe is not None and may_describe("orders") and not may_describe("payroll")
    assert apis.describe_filter() is None  # the broker itself (no connection)
    apis.authorizer.super_users = frozenset({WHO})  # type: ignore[union-attr]
    assert asyncio.run(main()) is None

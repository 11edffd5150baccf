"""Security APIs and request authorization: SASL (SaslHandshake, SaslAuthenticate), SCRAM users
(DescribeUserScramCredentials, AlterUserScramCredentials), ACLs (CreateAcls, DescribeAcls,
DeleteAcls), and the ACL check every other request passes before its handler runs.

SASL state is per connection (``security/session.py``); credentials and ACLs live in the
security store (``security/store.py``: etcd, or a file for a standalone broker). Authorization
is on when ``authorizer.class.name`` is set, as in Kafka, and follows Kafka's rules per API:
Produce, Fetch and Metadata are decided per topic (denied topics are answered
TOPIC_AUTHORIZATION_FAILED, or left out of an all-topics Metadata, and the handler sees only
the others); so are the APIs Kafka authorizes item by item (``_PER_ITEM``: DescribeGroups,
ConsumerGroupDescribe, DeleteGroups, DescribeTopicPartitions, ListOffsets, OffsetForLeaderEpoch,
DeleteRecords, CreatePartitions, the config APIs, OffsetCommit, TxnOffsetCommit, OffsetDelete,
AddPartitionsToTxn): each denied item is answered with its resource kind's error, after the
request-wide checks Kafka makes first (a commit's group, its transactional id); any other request
is refused whole, with the error code of the resource kind that was denied, when any resource it
names is denied. An API this table does not know needs ALTER
on the cluster (fail closed). Connections that proved the cluster secret are super users.

Answers that carry authorized operations (KIP-430: Metadata, DescribeCluster, DescribeGroups,
ConsumerGroupDescribe when the request asks for them, DescribeTopicPartitions always) get them
filled here, after the handler, from one function (``authorized_operations``): handlers leave
the fields at Kafka's "not asked" value (-2**31).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import INTERNAL_TOPICS
from diskless.protocol import error_responses
from diskless.protocol import messages as m
from diskless.security import acl as a
from diskless.security.acl import AclBinding, AclFilter, Authorizer, validate_binding
from diskless.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_IDS,
    MECHANISM_NAMES,
    MECHANISMS,
    MIN_ITERATIONS,
    AuthenticationFailed,
    ScramServer,
    credential_from_salted,
    parse_plain,
    verify_plain,
)
from diskless.security.session import CLUSTER_PRINCIPAL, CLUSTER_USER, SecuritySession, current_session
from diskless.security.store import EtcdSecurityStore, LocalSecurityStore, SecurityStore

from .api_base import ApiFamily

if TYPE_CHECKING:
    from .broker import Broker

log = structlog.get_logger(__name__)

API_SASL_HANDSHAKE = 17
API_SASL_AUTHENTICATE = 36
API_DESCRIBE_ACLS = 29
API_CREATE_ACLS = 30
API_DELETE_ACLS = 31
API_DESCRIBE_USER_SCRAM_CREDENTIALS = 50
API_ALTER_USER_SCRAM_CREDENTIALS = 51
API_DESCRIBE_TOPIC_PARTITIONS = 75

_DENIED = {
    a.TOPIC: ErrorCode.topic_authorization_failed,
    a.GROUP: ErrorCode.group_authorization_failed,
    a.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
    a.CLUSTER: ErrorCode.cluster_authorization_failed,
}
Check = tuple[int, int, str]  # (operation, resource type, resource name)


def _names(items: Any, *fields: str) -> list[str]:
    out = []
    for item in items or ():
        for f in fields:
            value = item if f == "" else getattr(item, f, None)
            if isinstance(value, str):
                out.append(value)
                break
    return out


def _cluster(op: int) -> list[Check]:
    return [(op, a.CLUSTER, a.CLUSTER_NAME)]


def _topics(op: int, names: list[str]) -> list[Check]:
    return [(op, a.TOPIC, n) for n in names]


def _group(op: int, group: Any) -> list[Check]:
    return [(op, a.GROUP, group)] if isinstance(group, str) and group else []


def _txn(txn_id: Any) -> list[Check]:
    return [(a.WRITE, a.TRANSACTIONAL_ID, txn_id)] if isinstance(txn_id, str) and txn_id else []


# ConfigResource types with a resource of their own; brokers, broker loggers and client metrics
# are the cluster's (ConfigHelper, ControllerApis.authorizeAlterResource).
_CONFIG_RESOURCE_KINDS = {2: a.TOPIC, 32: a.GROUP}


def _config_check(op: int) -> Callable[[Any], Check]:
    def check(resource: Any) -> Check:
        kind = _CONFIG_RESOURCE_KINDS.get(resource.resource_type, a.CLUSTER)
        return (op, kind, a.CLUSTER_NAME if kind == a.CLUSTER else resource.resource_name)

    return check


def _find_coordinator(r: Any) -> list[Check]:
    keys = list(getattr(r, "coordinator_keys", None) or ()) or [getattr(r, "key", "")]
    kind = a.TRANSACTIONAL_ID if getattr(r, "key_type", 0) == 1 else a.GROUP
    return [(a.DESCRIBE, kind, k) for k in keys if k]


def _offset_fetch(r: Any) -> list[Check]:
    groups = list(getattr(r, "groups", None) or ())
    if groups:
        return [(a.DESCRIBE, a.GROUP, g.group_id) for g in groups]
    return _group(a.DESCRIBE, getattr(r, "group_id", None))


def _topic_check(op: int) -> Callable[[Any], Check]:
    return lambda item: (op, a.TOPIC, getattr(item, "name", None) or getattr(item, "topic", ""))


def _group_check(op: int) -> Callable[[Any], Check]:
    return lambda group_id: (op, a.GROUP, group_id)


def _after_cursor(request: Any, item: Any) -> bool:
    cursor = getattr(request, "cursor", None)
    return cursor is None or item.name >= cursor.topic_name


def _named_twice(request: Any, item: Any) -> bool:
    return sum(other.name == item.name for other in request.topics) > 1


@dataclasses.dataclass(frozen=True)
class _PerItem:
    """How Kafka authorizes an API item by item (its handlers' partitionSeqByAuthorized and
    filterByAuthorized): the handler sees the request with only the allowed items of its list
    ``items``; each denied item is answered in the answer's list ``answer`` with its resource
    kind's authorization error, the entry ``error_responses`` builds for a failed request naming
    only that item."""

    items: str
    answer: str
    check: Callable[[Any], Check]
    # Checked first, all or nothing, as Kafka checks them before the items (a commit's group, ...).
    whole: Callable[[Any], list[Check]] = lambda r: []
    # Where Kafka's answer has the denied entries: before the handler's (DescribeGroups, the
    # response builders of the commits, the controller's config and partition answers), or after.
    denied_first: bool = False
    # The handler runs with nothing allowed too: its answer carries the group's own error (OffsetDelete).
    always: bool = False
    # Denied entries carry the error's default message (the config APIs: Kafka's ApiError(error)).
    message: bool = False
    # When allowed, this allows every item (OffsetForLeaderEpoch: CLUSTER_ACTION, for replicas).
    unless: Check | None = None
    # Items Kafka leaves out before authorizing (DescribeTopicPartitions: those before the cursor).
    considered: Callable[[Any, Any], bool] = lambda request, item: True
    # One denied item fails the request: the allowed ones are answered OPERATION_NOT_ATTEMPTED (or
    # UNKNOWN_TOPIC_OR_PARTITION where the partition does not exist), the handler does not run
    # (AddPartitionsToTxn v0-3: the transaction is not changed).
    fails_whole: bool = False
    # Items denied whatever the ACLs (AddPartitionsToTxn: internal topics, which Kafka leaves out of
    # those it authorizes). Super users bypass this layer: the handler refuses them too.
    refused: Callable[[Any], bool] = lambda item: False
    # Items Kafka answers before authorizing, left to the handler whatever the ACLs (CreatePartitions:
    # a topic named twice is INVALID_REQUEST, not TOPIC_AUTHORIZATION_FAILED).
    unchecked: Callable[[Any, Any], bool] = lambda request, item: False
    # A resource named twice is one item (DeleteGroups: Kafka authorizes ``groupsNames.distinct``).
    distinct: bool = False


# The APIs Kafka authorizes per item.
_PER_ITEM: dict[int, _PerItem] = {
    m.API_LIST_OFFSETS: _PerItem("topics", "topics", _topic_check(a.DESCRIBE)),
    m.API_OFFSET_FOR_LEADER_EPOCH: _PerItem(
        "topics", "topics", _topic_check(a.DESCRIBE), unless=(a.CLUSTER_ACTION, a.CLUSTER, a.CLUSTER_NAME)
    ),
    m.API_DELETE_RECORDS: _PerItem("topics", "topics", _topic_check(a.DELETE)),
    m.API_CREATE_PARTITIONS: _PerItem(
        "topics", "results", _topic_check(a.ALTER), denied_first=True, unchecked=_named_twice
    ),
    m.API_DESCRIBE_CONFIGS: _PerItem("resources", "results", _config_check(a.DESCRIBE_CONFIGS), message=True),
    m.API_ALTER_CONFIGS: _PerItem(
        "resources", "responses", _config_check(a.ALTER_CONFIGS), denied_first=True, message=True
    ),
    m.API_INCREMENTAL_ALTER_CONFIGS: _PerItem(
        "resources", "responses", _config_check(a.ALTER_CONFIGS), denied_first=True, message=True
    ),
    m.API_OFFSET_COMMIT: _PerItem(
        "topics", "topics", _topic_check(a.READ), whole=lambda r: _group(a.READ, r.group_id), denied_first=True
    ),
    m.API_OFFSET_DELETE: _PerItem(
        "topics",
        "topics",
        _topic_check(a.READ),
        whole=lambda r: _group(a.DELETE, r.group_id),
        denied_first=True,
        always=True,
    ),
    m.API_TXN_OFFSET_COMMIT: _PerItem(
        "topics",
        "topics",
        _topic_check(a.READ),
        whole=lambda r: _txn(r.transactional_id) + _group(a.READ, r.group_id),
        denied_first=True,
    ),
    m.API_ADD_PARTITIONS_TO_TXN: _PerItem(
        "v3_and_below_topics",
        "results_by_topic_v3_and_below",
        _topic_check(a.WRITE),
        whole=lambda r: _txn(r.v3_and_below_transactional_id),
        fails_whole=True,
        refused=lambda item: item.name in INTERNAL_TOPICS,
    ),
    m.API_DESCRIBE_GROUPS: _PerItem("groups", "groups", _group_check(a.DESCRIBE), denied_first=True),
    m.API_CONSUMER_GROUP_DESCRIBE: _PerItem("group_ids", "groups", _group_check(a.DESCRIBE), denied_first=True),
    m.API_DELETE_GROUPS: _PerItem("groups_names", "results", _group_check(a.DELETE), distinct=True),
    # KIP-664: a partition's producers are READ's to see (KafkaApis.handleDescribeProducersRequest);
    # a transaction's state DESCRIBE's on its id, and its partitions of topics the principal may not
    # DESCRIBE are left out afterwards (the handler's answer filtered).
    m.API_DESCRIBE_PRODUCERS: _PerItem("topics", "topics", _topic_check(a.READ)),
    m.API_DESCRIBE_TRANSACTIONS: _PerItem(
        "transactional_ids", "transaction_states", lambda tid: (a.DESCRIBE, a.TRANSACTIONAL_ID, tid)
    ),
    # Named topics only: all topics (an empty list) is _describe_all_topic_partitions.
    API_DESCRIBE_TOPIC_PARTITIONS: _PerItem("topics", "topics", _topic_check(a.DESCRIBE), considered=_after_cursor),
}

# Kafka's default message of each authorization error (Errors), where an answer carries it.
_DENIED_MESSAGE = {
    a.TOPIC: "Topic authorization failed.",
    a.GROUP: "Group authorization failed.",
    a.TRANSACTIONAL_ID: "Transactional Id authorization failed.",
    a.CLUSTER: "Cluster authorization failed.",
}

# Every other request but Produce, Fetch and Metadata: the resources it needs, all or nothing.
_CHECKS: dict[int, Callable[[Any], list[Check]]] = {
    m.API_CREATE_TOPICS: lambda r: [],  # CREATE on the cluster or each topic: create_topics_checks
    m.API_DELETE_TOPICS: lambda r: [],  # by name or by id: delete_topics_checks
    m.API_FIND_COORDINATOR: _find_coordinator,
    m.API_JOIN_GROUP: lambda r: _group(a.READ, r.group_id),
    m.API_SYNC_GROUP: lambda r: _group(a.READ, r.group_id),
    m.API_HEARTBEAT: lambda r: _group(a.READ, r.group_id),
    m.API_LEAVE_GROUP: lambda r: _group(a.READ, r.group_id),
    m.API_OFFSET_FETCH: _offset_fetch,
    m.API_LIST_GROUPS: lambda r: [],  # filtered per group afterwards
    m.API_LIST_TRANSACTIONS: lambda r: [],  # filtered per transactional id afterwards
    # After the group, DESCRIBE on every subscribed topic (KAFKA-18813: a client may not learn about
    # topics it cannot describe through its assignment); the topics a regex resolves to are filtered
    # by the coordinator, which keeps those the heartbeat's principal may DESCRIBE (as Kafka 4.0).
    m.API_CONSUMER_GROUP_HEARTBEAT: lambda r: (
        _group(a.READ, r.group_id) + _topics(a.DESCRIBE, list(dict.fromkeys(r.subscribed_topic_names or ())))
    ),
    m.API_ADD_OFFSETS_TO_TXN: lambda r: _txn(r.transactional_id) + _group(a.READ, r.group_id),
    m.API_END_TXN: lambda r: _txn(r.transactional_id),
    # Not authorized, as Kafka's brokers (AuthHelper.computeDescribeClusterResponse): any principal
    # learns the brokers and the cluster id (Metadata tells them anyway); DESCRIBE on the cluster only decides
    # whether its authorized operations are shown (_cluster_authorized_operations).
    m.API_DESCRIBE_CLUSTER: lambda r: [],
    m.API_WRITE_TXN_MARKERS: lambda r: _cluster(a.CLUSTER_ACTION),
    API_DESCRIBE_ACLS: lambda r: _cluster(a.DESCRIBE),
    API_CREATE_ACLS: lambda r: _cluster(a.ALTER),
    API_DELETE_ACLS: lambda r: _cluster(a.ALTER),
    API_DESCRIBE_USER_SCRAM_CREDENTIALS: lambda r: _cluster(a.DESCRIBE),
    API_ALTER_USER_SCRAM_CREDENTIALS: lambda r: _cluster(a.ALTER),
    m.API_DESCRIBE_CLIENT_QUOTAS: lambda r: _cluster(a.DESCRIBE_CONFIGS),
    m.API_ALTER_CLIENT_QUOTAS: lambda r: _cluster(a.ALTER_CONFIGS),
    # Operations APIs (admin tooling), by key: ElectLeaders, AlterPartitionReassignments,
    # ListPartitionReassignments, AlterReplicaLogDirs, DescribeLogDirs, DescribeTopicPartitions.
    43: lambda r: _cluster(a.ALTER),
    45: lambda r: _cluster(a.ALTER),
    46: lambda r: _cluster(a.DESCRIBE),
    34: lambda r: _cluster(a.ALTER),
    35: lambda r: _cluster(a.DESCRIBE),
}
_ALWAYS = frozenset({m.API_API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE})
# The APIs whose answers carry authorized operations (``_fill_authorized_operations``).
AUTHORIZED_OPERATIONS_APIS = frozenset(
    {
        m.API_METADATA,
        m.API_DESCRIBE_CLUSTER,
        m.API_DESCRIBE_GROUPS,
        m.API_CONSUMER_GROUP_DESCRIBE,
        API_DESCRIBE_TOPIC_PARTITIONS,
    }
)


@dataclasses.dataclass(frozen=True)
class _Token:
    auth_bytes: bytes


class SecurityApis(ApiFamily):
    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        config = broker.config
        self.mechanisms = [x.strip() for x in config.sasl_enabled_mechanisms.split(",") if x.strip()]
        self.authorizer: Authorizer | None = None
        if config.authorizer_class_name:
            supers = config.super_user_set | {CLUSTER_PRINCIPAL}
            self.authorizer = Authorizer(supers, config.allow_everyone_if_no_acl_found)
        self.store: SecurityStore | None = None
        self._watch: asyncio.Task[None] | None = None

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            API_SASL_HANDSHAKE: self.sasl_handshake,
            API_SASL_AUTHENTICATE: self.sasl_authenticate,
            API_DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
            API_ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
            API_CREATE_ACLS: self.create_acls,
            API_DESCRIBE_ACLS: self.describe_acls,
            API_DELETE_ACLS: self.delete_acls,
        }

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self, etcd_client: Any | None) -> None:
        """Open the store (the metadata store's etcd client, else a file) and load the ACLs."""
        config = self.broker.config
        if etcd_client is not None:
            self.store = EtcdSecurityStore(etcd_client, config.cluster_id)
        else:
            import os

            self.store = LocalSecurityStore(os.path.join(config.log_dirs, "security.json"))
        if self.authorizer is not None:
            await self.reload_acls()
            self._watch = asyncio.create_task(self.store.watch("acls/", self.reload_acls))

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    async def reload_acls(self) -> None:
        if self.authorizer is not None and self.store is not None:
            self.authorizer.replace(await self.store.acls())

    def _store(self) -> SecurityStore:
        if self.store is None:
            raise RuntimeError("security store not started")
        return self.store

    # --- authorization --------------------------------------------------------------------------

    def _session(self) -> SecuritySession | None:
        return current_session()

    def allowed(self, op: int, resource_type: int, name: str) -> bool:
        session = self._session()
        if self.authorizer is None or session is None:
            return True  # no authorizer, or the broker itself (no connection)
        return self.authorizer.authorize(session.principal, session.host, op, resource_type, name)

    def describe_filter(self) -> Callable[[str], bool] | None:
        """Whether this connection's principal may DESCRIBE a topic, as a predicate bound to the
        connection (it may be called outside the request's context); None when nothing is denied."""
        session = self._session()
        authorizer = self.authorizer
        if authorizer is None or session is None or session.principal in authorizer.super_users:
            return None
        principal, host = session.principal, session.host
        return lambda topic: authorizer.authorize(principal, host, a.DESCRIBE, a.TOPIC, topic)

    def metadata_shared(self) -> bool:
        """Whether this connection's Metadata answers may come from (and go to) the shared cache."""
        return self._bypass()

    def _bypass(self) -> bool:
        session = self._session()
        return self.authorizer is None or session is None or session.principal in self.authorizer.super_users

    def authorized_operations(self, resource_type: int, name: str) -> int:
        """The bit set of the operations this connection's principal may do on the resource, of
        those Kafka supports for its type (AuthHelper.authorizedOperations), implied ones counted
        as the authorizer counts them (READ implies DESCRIBE, ...). The one computation behind
        every authorized-operations field. With no authorizer, a super user or the broker
        itself: every supported operation (nothing is denied to them)."""
        supported = a.SUPPORTED_OPERATIONS[resource_type]
        if self._bypass():
            return a.operations_bit_field(supported)
        return a.operations_bit_field(op for op in supported if self.allowed(op, resource_type, name))

    def _cluster_authorized_operations(self) -> int:
        """The cluster's authorized operations as Metadata v8-10 and DescribeCluster show them: 0
        to a principal that may not DESCRIBE the cluster, whatever else it may do on it (Kafka)."""
        if not self.allowed(a.DESCRIBE, a.CLUSTER, a.CLUSTER_NAME):
            return 0
        return self.authorized_operations(a.CLUSTER, a.CLUSTER_NAME)

    def _fill_authorized_operations(self, header: m.RequestHeader, request: Any, body: dict[str, Any]) -> None:
        """Fill the authorized-operations fields of an answer, where Kafka fills them: only when the
        request asks (DescribeTopicPartitions has no flag: always), and only in the entries that
        describe the resource (no error, or, for topics, any but an authorization failure: a
        topic the principal may describe but that does not exist gets them too, as in Kafka)."""
        key = header.api_key
        if key == m.API_METADATA:
            if header.api_version < 8:
                return  # no such fields before v8
            if getattr(request, "include_topic_authorized_operations", False):
                self._fill_topics(body.get("topics", ()))
            # v11 dropped the cluster's (DescribeCluster tells it): the flag is only in v8-10.
            if getattr(request, "include_cluster_authorized_operations", False):
                body["cluster_authorized_operations"] = self._cluster_authorized_operations()
        elif key == API_DESCRIBE_TOPIC_PARTITIONS:
            self._fill_topics(body.get("topics", ()))
        elif key == m.API_DESCRIBE_CLUSTER:
            if getattr(request, "include_cluster_authorized_operations", False) and body.get("error_code") == 0:
                body["cluster_authorized_operations"] = self._cluster_authorized_operations()
        elif key in (m.API_DESCRIBE_GROUPS, m.API_CONSUMER_GROUP_DESCRIBE) and getattr(
            request,
            "include_authorized_operations",
            False,  # DescribeGroups: from v3 (absent before)
        ):
            for group in body.get("groups", ()):
                if group.get("error_code") == 0:
                    group["authorized_operations"] = self.authorized_operations(a.GROUP, group["group_id"])

    def _fill_topics(self, topics: Any) -> None:
        for topic in topics:
            name = topic.get("name")
            # Denied topics (and unknown ids, which have no name) keep -2**31, as in Kafka.
            if name is not None and topic.get("error_code") != ErrorCode.topic_authorization_failed:
                topic["topic_authorized_operations"] = self.authorized_operations(a.TOPIC, name)

    async def handle_authorized(
        self, header: m.RequestHeader, request: Any, handle: Callable[[Any], Awaitable[dict[str, Any] | None]]
    ) -> dict[str, Any] | None:
        """Run ``handle`` on the part of ``request`` this connection's principal may do; answer the
        rest with Kafka's authorization errors. The answer's authorized operations are filled in."""
        body = await self._handle_authorized(header, request, handle)
        if body is not None:
            self._fill_authorized_operations(header, request, body)
        return body

    async def _handle_authorized(
        self, header: m.RequestHeader, request: Any, handle: Callable[[Any], Awaitable[dict[str, Any] | None]]
    ) -> dict[str, Any] | None:
        key = header.api_key
        if key in _ALWAYS or self._bypass():
            return await handle(request)
        if key == m.API_PRODUCE:
            return await self._per_topic(header, request, "topic_data", a.WRITE, handle, self._produce_checks)
        if key == m.API_FETCH:
            return await self._per_topic(header, request, "topics", a.READ, handle, None)
        if key == m.API_METADATA:
            return await self._metadata(request, handle)
        if key == m.API_INIT_PRODUCER_ID:
            return await self._init_producer_id(header, request, handle)
        if key == API_DESCRIBE_TOPIC_PARTITIONS and not request.topics:
            return await self._describe_all_topic_partitions(request, handle)
        per_item = _PER_ITEM.get(key)
        if per_item is not None:
            body = await self._per_item(header, request, per_item, handle)
            if key == m.API_CONSUMER_GROUP_DESCRIBE and body is not None:
                self._hide_undescribable_assignments(body)
            if key == m.API_DESCRIBE_TRANSACTIONS and body is not None:
                for state in body.get("transaction_states", []):
                    state["topics"] = [t for t in state.get("topics", []) if self._describable(t["topic"])]
            return body
        if key == m.API_DELETE_TOPICS:
            checks = self._delete_topics_checks(request)
        elif key == m.API_CREATE_TOPICS:
            checks = (
                []
                if self.allowed(a.CREATE, a.CLUSTER, a.CLUSTER_NAME)
                else _topics(a.CREATE, _names(request.topics, "name"))
            )
        else:
            rule = _CHECKS.get(key)
            checks = rule(request) if rule is not None else _cluster(a.ALTER)
        refused = self._refused(header, request, checks)
        if refused is not None:
            return refused
        body = await handle(request)
        if key == m.API_LIST_GROUPS and body is not None and not self.allowed(a.DESCRIBE, a.CLUSTER, a.CLUSTER_NAME):
            body["groups"] = [g for g in body.get("groups", []) if self.allowed(a.DESCRIBE, a.GROUP, g["group_id"])]
        if key == m.API_LIST_TRANSACTIONS and body is not None:
            body["transaction_states"] = [
                t
                for t in body.get("transaction_states", [])
                if self.allowed(a.DESCRIBE, a.TRANSACTIONAL_ID, t["transactional_id"])
            ]
        if key == m.API_OFFSET_FETCH and body is not None:
            self._filter_offset_fetch(request, body)
        return body

    def _refused(self, header: m.RequestHeader, request: Any, checks: list[Check]) -> dict[str, Any] | None:
        """The whole request's refusal, with the error of the first resource denied, or None."""
        for op, kind, name in checks:
            if not self.allowed(op, kind, name):
                log.info("request denied", principal=self._principal(), api=header.api_key, operation=op, resource=name)
                return error_responses.error_response(header.api_key, header.api_version, request, _DENIED[kind])
        return None

    async def _per_item(
        self,
        header: m.RequestHeader,
        request: Any,
        rule: _PerItem,
        handle: Callable[[Any], Awaitable[dict[str, Any] | None]],
    ) -> dict[str, Any] | None:
        """Run ``handle`` on the allowed items of the request and answer the denied ones, as ``rule`` says."""
        key, version = header.api_key, header.api_version
        refused = self._refused(header, request, rule.whole(request))
        if refused is not None:
            return refused
        every = rule.unless is not None and self.allowed(*rule.unless)
        items = tuple(getattr(request, rule.items) or ())
        if rule.distinct:
            first: dict[str, Any] = {}
            for item in items:
                first.setdefault(rule.check(item)[2], item)
            items = tuple(first.values())
            request = dataclasses.replace(request, **{rule.items: items})
        allowed: list[Any] = []
        denied: list[tuple[Any, int]] = []
        for item in items:
            op, kind, name = rule.check(item)
            if rule.unchecked(request, item) or (not rule.refused(item) and (every or self.allowed(op, kind, name))):
                allowed.append(item)
            elif rule.considered(request, item):
                denied.append((item, kind))
        if len(allowed) == len(items):
            return await handle(request)
        log.info("resources denied", principal=self._principal(), api=key, count=len(items) - len(allowed))

        def answered(items: list[Any], code: ErrorCode, message: str | None) -> list[dict[str, Any]]:
            one = dataclasses.replace(request, **{rule.items: tuple(items)})
            return list(error_responses.error_response(key, version, one, code, message).get(rule.answer, []))

        entries: list[dict[str, Any]] = []
        for item, kind in denied:
            entries += answered([item], _DENIED[kind], _DENIED_MESSAGE[kind] if rule.message else None)
        rest = dataclasses.replace(request, **{rule.items: tuple(allowed)})
        if rule.fails_whole:
            body = error_responses.error_response(key, version, dataclasses.replace(request, **{rule.items: ()}), 0)
            others = self._not_attempted(answered(allowed, ErrorCode.operation_not_attempted, None))
            body[rule.answer] = [*entries, *others]
            return body
        if allowed or rule.always:
            body = await handle(rest)
            if body is None:
                return None
            if body.get("error_code"):
                return body  # a top-level error: Kafka's response builders keep it alone (OffsetDelete)
        else:
            # Nothing left to ask: answered without the handler, as Kafka (and an empty
            # DescribeTopicPartitions list would ask for all topics).
            body = error_responses.error_response(key, version, rest, ErrorCode.none)
        mine = list(body.get(rule.answer) or [])
        body[rule.answer] = [*entries, *mine] if rule.denied_first else [*mine, *entries]
        return body

    def _not_attempted(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """AddPartitionsToTxn's OPERATION_NOT_ATTEMPTED entries, UNKNOWN_TOPIC_OR_PARTITION where the
        partition does not exist (Kafka checks existence before giving up on the rest)."""
        for topic in entries:
            meta = self._meta.topics.get(topic.get("name"))
            count = len(meta.partitions) if meta is not None else 0
            for part in topic.get("results_by_partition", []):
                if not 0 <= part["partition_index"] < count:
                    part["partition_error_code"] = ErrorCode.unknown_topic_or_partition
        return entries

    def _hide_undescribable_assignments(self, body: dict[str, Any]) -> None:
        """ConsumerGroupDescribe: a described group whose members' current or target assignment
        names a topic the principal may not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED with no
        members, as Kafka's handleConsumerGroupDescribe does (KAFKA-17507)."""
        groups = body.get("groups", [])
        for i, group in enumerate(groups):
            if group.get("error_code"):
                continue
            topics = {
                tp.get("topic_name")
                for member in group.get("members", [])
                for assignment in (member.get("assignment"), member.get("target_assignment"))
                for tp in (assignment or {}).get("topic_partitions", [])
            }
            if any(name is not None and not self._describable(name) for name in topics):
                groups[i] = {
                    "group_id": group["group_id"],
                    "error_code": ErrorCode.topic_authorization_failed,
                    "error_message": "The group has described topic(s) that the client is not authorized to describe.",
                    "members": [],
                }

    def _filter_offset_fetch(self, request: Any, body: dict[str, Any]) -> None:
        """Committed offsets of topics the principal may not DESCRIBE: left out of an all-topics
        fetch, TOPIC_AUTHORIZATION_FAILED for named ones (KafkaApis.fetchAllOffsetsForGroup and
        fetchOffsetsForGroup). Only the group was checked before the handler ran."""

        def filtered(topics: list[dict[str, Any]], named: bool) -> list[dict[str, Any]]:
            out = []
            for topic in topics:
                if self._describable(topic["name"]):
                    out.append(topic)
                elif named:
                    for part in topic.get("partitions", []):
                        part.update(committed_offset=-1, metadata=None, error_code=ErrorCode.topic_authorization_failed)
                    out.append(topic)
            return out

        if "groups" in body:
            asked = {g.group_id: getattr(g, "topics", None) is not None for g in getattr(request, "groups", ()) or ()}
            for group in body["groups"]:
                group["topics"] = filtered(group.get("topics", []), asked.get(group.get("group_id"), False))
        else:
            body["topics"] = filtered(body.get("topics", []), getattr(request, "topics", None) is not None)

    async def _describe_all_topic_partitions(
        self, request: Any, handle: Callable[[Any], Awaitable[dict[str, Any] | None]]
    ) -> dict[str, Any] | None:
        """DescribeTopicPartitions of all topics: of those the principal may DESCRIBE, chosen
        before the page is cut (a cursor must not name a topic the principal cannot see)."""
        from kio.schema.describe_topic_partitions.v0.request import TopicRequest

        names = [name for name in sorted(self._meta.topics) if self._describable(name)]
        if names:
            return await handle(dataclasses.replace(request, topics=tuple(TopicRequest(name=n) for n in names)))
        body = await handle(dataclasses.replace(request, cursor=None))
        if body is not None:
            body.update(topics=[], next_cursor=None)
        return body

    def _delete_topics_checks(self, request: Any) -> list[Check]:
        """DELETE on each topic, named or given by id (an id no topic has is checked as itself, so
        only a principal allowed on every topic, or on that string, gets UNKNOWN_TOPIC_ID)."""
        names = _names(getattr(request, "topic_names", None), "")
        for item in getattr(request, "topics", None) or ():
            names.append(self._topic_name(item) or str(getattr(item, "topic_id", "")))
        return _topics(a.DELETE, names)

    def _principal(self) -> str:
        session = self._session()
        return session.principal if session is not None else CLUSTER_PRINCIPAL

    def _produce_checks(self, request: Any) -> ErrorCode | None:
        txn = getattr(request, "transactional_id", None)
        if txn and not self.allowed(a.WRITE, a.TRANSACTIONAL_ID, txn):
            return ErrorCode.transactional_id_authorization_failed
        return None

    def _topic_name(self, item: Any) -> str | None:
        name = getattr(item, "name", None) or getattr(item, "topic", None)
        if name:
            return str(name)
        topic_id = getattr(item, "topic_id", None)
        if topic_id is not None:
            for meta in self._meta.topics.values():
                if meta.topic_id == str(topic_id):
                    return str(meta.name)
        return None

    async def _per_topic(
        self,
        header: m.RequestHeader,
        request: Any,
        field: str,
        op: int,
        handle: Callable[[Any], Awaitable[dict[str, Any] | None]],
        whole: Callable[[Any], ErrorCode | None] | None,
    ) -> dict[str, Any] | None:
        if whole is not None:
            code = whole(request)
            if code is not None:
                return error_responses.error_response(header.api_key, header.api_version, request, code)
        items = tuple(getattr(request, field))
        allowed = []
        denied = []
        for item in items:
            name = self._topic_name(item)
            (allowed if name is not None and self.allowed(op, a.TOPIC, name) else denied).append(item)
        if not denied:
            return await handle(request)
        log.info("topics denied", principal=self._principal(), api=header.api_key, count=len(denied))
        refused = error_responses.error_response(
            header.api_key,
            header.api_version,
            dataclasses.replace(request, **{field: tuple(denied)}),
            ErrorCode.topic_authorization_failed,
        )
        if not allowed:
            if header.api_key == m.API_PRODUCE and getattr(request, "acks", -1) == 0:
                return None
            return refused
        body = await handle(dataclasses.replace(request, **{field: tuple(allowed)}))
        if body is None:
            return None
        body["responses"] = [*body.get("responses", []), *refused.get("responses", [])]
        return body

    async def _metadata(
        self, request: Any, handle: Callable[[Any], Awaitable[dict[str, Any] | None]]
    ) -> dict[str, Any] | None:
        """Metadata: topics the principal may not DESCRIBE are answered TOPIC_AUTHORIZATION_FAILED
        (by id: without their name, which is what is protected); a topic the request would create
        (auto-creation is on before v4, which has no field for it) needs CREATE on the cluster or
        on the topic, as Kafka's handleTopicMetadataRequest."""
        requested = getattr(request, "topics", None)
        denied: list[dict[str, Any]] = []
        if requested is not None:
            auto_create = (
                getattr(request, "allow_auto_topic_creation", True) and self.broker.config.auto_create_topics_enable
            )
            may_create_any = self.allowed(a.CREATE, a.CLUSTER, a.CLUSTER_NAME)
            keep = []
            for item in requested:
                name = self._topic_name(item)
                by_id = not (getattr(item, "name", None) or getattr(item, "topic", None))
                refused = name is not None and not self.allowed(a.DESCRIBE, a.TOPIC, name)
                if not refused and name is not None and auto_create and name not in self._meta.topics:
                    refused = not (may_create_any or self.allowed(a.CREATE, a.TOPIC, name))
                if refused:
                    topic_id = getattr(item, "topic_id", None)
                    denied.append(
                        {
                            "error_code": ErrorCode.topic_authorization_failed,
                            "name": None if by_id else name,
                            **({"topic_id": topic_id} if topic_id is not None else {}),
                            "partitions": [],
                        }
                    )
                else:
                    keep.append(item)
            if denied:
                request = dataclasses.replace(request, topics=tuple(keep))
        body = await handle(request)
        if body is None:
            return None
        topics = [t for t in body.get("topics", []) if t.get("name") is None or self._describable(t["name"])]
        body["topics"] = topics + denied
        return body

    def _describable(self, name: str) -> bool:
        return self.allowed(a.DESCRIBE, a.TOPIC, name)

    async def _init_producer_id(
        self, header: m.RequestHeader, request: Any, handle: Callable[[Any], Awaitable[dict[str, Any] | None]]
    ) -> dict[str, Any] | None:
        txn = getattr(request, "transactional_id", None)
        if txn:
            ok, code = self.allowed(a.WRITE, a.TRANSACTIONAL_ID, txn), ErrorCode.transactional_id_authorization_failed
        else:
            # Idempotent producers: IDEMPOTENT_WRITE on the cluster, or WRITE on any topic (KIP-679).
            ok = self.allowed(a.IDEMPOTENT_WRITE, a.CLUSTER, a.CLUSTER_NAME) or self._writes_some_topic()
            code = ErrorCode.cluster_authorization_failed
        if not ok:
            return error_responses.error_response(header.api_key, header.api_version, request, code)
        return await handle(request)

    def _writes_some_topic(self) -> bool:
        assert self.authorizer is not None
        session = self._session()
        assert session is not None
        kind = session.principal.partition(":")[0]
        principals = (session.principal, f"{kind}:*")
        grants = [
            b
            for b in self.authorizer.bindings()
            if b.resource_type == a.TOPIC
            and b.principal in principals
            and b.operation in (a.WRITE, a.ALL)
            and b.host in ("*", session.host)
        ]
        # Kafka's authorizeByResourceType: a DENY on every topic (the literal wildcard) wins.
        if any(b.permission_type == a.DENY and b.resource_name == "*" and b.pattern_type == a.LITERAL for b in grants):
            return False
        if any(b.permission_type == a.ALLOW for b in grants):
            return True
        return self.authorizer.allow_everyone_if_no_acl_found and not self.authorizer.bindings()

    # --- SASL -----------------------------------------------------------------------------------

    def sasl_handshake(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        session = self._session()
        if session is None or not session.sasl or session.authenticated:
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": self.mechanisms}
        if request.mechanism not in self.mechanisms:
            session.close_after_answer = True
            return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": self.mechanisms}
        session.mechanism = request.mechanism
        session.raw_tokens = header.api_version == 0
        return {"error_code": ErrorCode.none, "mechanisms": self.mechanisms}

    async def raw_sasl_token(self, token: bytes) -> bytes | None:
        """One bare SASL token after SaslHandshake v0: the answer token, or None (close, as Kafka)."""
        header = m.RequestHeader(API_SASL_AUTHENTICATE, 0, 0, None)
        answer = await self.sasl_authenticate(header, _Token(token))
        return None if answer["error_code"] != ErrorCode.none else bytes(answer["auth_bytes"])

    async def sasl_authenticate(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        session = self._session()
        if session is None or session.mechanism is None or session.authenticated:
            if session is not None:
                session.close_after_answer = True
            return self._sasl_answer(ErrorCode.illegal_sasl_state, "SaslAuthenticate before SaslHandshake")
        mechanism = session.mechanism
        try:
            if mechanism == "PLAIN":
                user, password = parse_plain(bytes(request.auth_bytes))
                if user == CLUSTER_USER or not await self._plain_ok(user, password):
                    raise AuthenticationFailed(f"invalid PLAIN credentials for user {user!r}")
                session.became(f"User:{user}")
                return self._sasl_answer(ErrorCode.none, None)
            if session.scram is None:
                scram = ScramServer(mechanism)
                user = scram.client_first(bytes(request.auth_bytes))
                if user == CLUSTER_USER:
                    raise AuthenticationFailed(f"user {user!r} is the cluster's own principal")
                session.scram = scram
                credential = await self._store().credential(user, mechanism)
                return self._sasl_answer(ErrorCode.none, None, scram.server_first(credential))
            final = session.scram.client_final(bytes(request.auth_bytes))
            session.became(f"User:{session.scram.username}")
            return self._sasl_answer(ErrorCode.none, None, final)
        except AuthenticationFailed as exc:
            log.warning("SASL authentication failed", mechanism=mechanism, reason=str(exc), peer=session.host)
            session.close_after_answer = True
            # As Kafka: the failure is answered late, so guessing passwords costs time per try.
            await asyncio.sleep(self.broker.config.connection_failed_authentication_delay_ms / 1000)
            message = (
                "Authentication failed during authentication due to invalid credentials with SASL mechanism "
                + mechanism
            )
            return self._sasl_answer(ErrorCode.sasl_authentication_failed, message)

    async def _plain_ok(self, user: str, password: str) -> bool:
        for mechanism in MECHANISMS:
            credential = await self._store().credential(user, mechanism)
            if credential is not None:
                # PBKDF2 of the password: off the event loop (thousands of iterations).
                return await asyncio.to_thread(verify_plain, password, credential)
        return False

    @staticmethod
    def _sasl_answer(code: ErrorCode, message: str | None, auth: bytes = b"") -> dict[str, Any]:
        return {"error_code": code, "error_message": message, "auth_bytes": auth, "session_lifetime": 0}

    # --- SCRAM users ----------------------------------------------------------------------------

    async def describe_user_scram_credentials(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        everyone = await self._store().credentials()
        wanted = None if request.users is None else [u.name for u in request.users]
        results = []
        names = wanted if wanted else sorted(everyone)
        counts = {n: names.count(n) for n in names}
        for name in dict.fromkeys(names):
            if counts[name] > 1:
                results.append(self._user_result(name, ErrorCode.duplicate_resource, "Cannot describe a user twice"))
            elif name not in everyone:
                results.append(
                    self._user_result(
                        name, ErrorCode.resource_not_found, f"Attempt to describe nonexistent user {name}"
                    )
                )
            else:
                infos = [
                    {"mechanism": MECHANISM_IDS[c.mechanism], "iterations": c.iterations}
                    for c in sorted(everyone[name], key=lambda c: MECHANISM_IDS[c.mechanism])
                ]
                results.append({**self._user_result(name, ErrorCode.none, None), "credential_infos": infos})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "results": results}

    @staticmethod
    def _user_result(user: str, code: ErrorCode, message: str | None) -> dict[str, Any]:
        return {"user": user, "error_code": code, "error_message": message, "credential_infos": []}

    async def alter_user_scram_credentials(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        store = self._store()
        errors: dict[str, tuple[ErrorCode, str]] = {}
        seen: dict[tuple[str, int], int] = {}
        for change in (*request.deletions, *request.upsertions):
            seen[(change.name, change.mechanism)] = seen.get((change.name, change.mechanism), 0) + 1
        order = list(dict.fromkeys(c.name for c in (*request.deletions, *request.upsertions)))
        for (name, mechanism), count in seen.items():
            if not name:
                errors.setdefault(name, (ErrorCode.unacceptable_credential, "Username must not be empty"))
            elif name == CLUSTER_USER:
                errors.setdefault(name, (ErrorCode.unacceptable_credential, f"Username {name} is reserved"))
            elif count > 1:
                errors.setdefault(name, (ErrorCode.duplicate_resource, "A user credential cannot be altered twice"))
            elif mechanism not in MECHANISM_NAMES:
                errors.setdefault(name, (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"))
        for upsert in request.upsertions:
            if upsert.name not in errors and not MIN_ITERATIONS <= upsert.iterations <= MAX_ITERATIONS:
                errors[upsert.name] = (
                    ErrorCode.unacceptable_credential,
                    f"Iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}",
                )
        for delete in request.deletions:
            if delete.name in errors:
                continue
            if await store.credential(delete.name, MECHANISM_NAMES[delete.mechanism]) is None:
                errors[delete.name] = (
                    ErrorCode.resource_not_found,
                    "Attempt to delete a user credential that does not exist",
                )
        for delete in request.deletions:
            if delete.name not in errors:
                await store.delete_credential(delete.name, MECHANISM_NAMES[delete.mechanism])
        for upsert in request.upsertions:
            if upsert.name not in errors:
                mechanism = MECHANISM_NAMES[upsert.mechanism]
                credential = credential_from_salted(
                    mechanism, bytes(upsert.salted_password), bytes(upsert.salt), upsert.iterations
                )
                await store.put_credential(upsert.name, credential)
                log.info("SCRAM credential set", user=upsert.name, mechanism=mechanism, by=self._principal())
        results = [
            {
                "user": name,
                "error_code": errors.get(name, (ErrorCode.none, None))[0],
                "error_message": errors.get(name, (None, None))[1],
            }
            for name in order
        ]
        return {"throttle_time": 0, "results": results}

    # --- ACLs -----------------------------------------------------------------------------------

    def _security_disabled(self) -> bool:
        return self.authorizer is None

    async def create_acls(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        results = []
        added = False
        for c in request.creations:
            if self._security_disabled():
                results.append(
                    {"error_code": ErrorCode.security_disabled, "error_message": "No authorizer is configured"}
                )
                continue
            binding = AclBinding(
                c.resource_type,
                c.resource_name,
                c.resource_pattern_type,
                c.principal,
                c.host,
                c.operation,
                c.permission_type,
            )
            problem = validate_binding(binding)
            if problem is not None:
                results.append({"error_code": ErrorCode.invalid_request, "error_message": problem})
                continue
            await self._store().add_acl(binding)
            added = True
            log.info("ACL created", acl=str(binding), by=self._principal())
            results.append({"error_code": ErrorCode.none, "error_message": None})
        if added:
            await self.reload_acls()  # this broker at once; the others through their watch
        return {"throttle_time": 0, "results": results}

    async def describe_acls(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        if self._security_disabled():
            return {
                "throttle_time": 0,
                "error_code": ErrorCode.security_disabled,
                "error_message": "No authorizer is configured",
                "resources": [],
            }
        flt = AclFilter(
            request.resource_type_filter,
            request.resource_name_filter,
            request.pattern_type_filter,
            request.principal_filter,
            request.host_filter,
            request.operation,
            request.permission_type,
        )
        grouped: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for b in await self._store().acls():
            if flt.matches(b):
                grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
                    {
                        "principal": b.principal,
                        "host": b.host,
                        "operation": b.operation,
                        "permission_type": b.permission_type,
                    }
                )
        resources = [
            {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
            for (t, n, p), acls in sorted(grouped.items())
        ]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "resources": resources}

    async def delete_acls(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        results = []
        bindings = [] if self._security_disabled() else await self._store().acls()
        deleted = False
        for f in request.filters:
            if self._security_disabled():
                results.append(
                    {
                        "error_code": ErrorCode.security_disabled,
                        "error_message": "No authorizer is configured",
                        "matching_acls": [],
                    }
                )
                continue
            flt = AclFilter(
                f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                f.principal_filter, f.host_filter, f.operation, f.permission_type,
            )  # fmt: skip
            matching = []
            for b in bindings:
                if flt.matches(b):
                    await self._store().delete_acl(b)
                    deleted = True
                    log.info("ACL deleted", acl=str(b), by=self._principal())
                    matching.append(
                        {
                            "error_code": ErrorCode.none,
                            "error_message": None,
                            "resource_type": b.resource_type,
                            "resource_name": b.resource_name,
                            "pattern_type": b.pattern_type,
                            "principal": b.principal,
                            "host": b.host,
                            "operation": b.operation,
                            "permission_type": b.permission_type,
                        }
                    )
            results.append({"error_code": ErrorCode.none, "error_message": None, "matching_acls": matching})
        if deleted:
            await self.reload_acls()
        return {"throttle_time": 0, "filter_results": results}

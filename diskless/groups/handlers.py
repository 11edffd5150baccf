"""Kafka API handlers of classic consumer groups, version-agnostic like ``diskless.broker.apis``.

Each handler takes ``(facade, header, request)``: the broker seen through ``GroupFacade``, the
request header, and the kio request entity of whatever version the client sent (fields an older
version lacks are read with ``getattr`` defaults). It returns a plain dict that
``diskless.protocol.messages.build`` fits to the client's response version.

Every handler first asks ``facade.coordinator(group_id)`` for the core of the group's
``__consumer_offsets`` partition; an ErrorCode instead (NOT_COORDINATOR,
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE) is the answer, adjusted per API as
Kafka does (SyncGroup turns "loading" into REBALANCE_IN_PROGRESS, Heartbeat into NONE).

JoinGroup, SyncGroup and ConsumerGroupHeartbeat may be answered later: they pass the core a
reply callback that resolves a future, and await it (a SyncGroup also waits for the group record
the shell stores for the core, a ConsumerGroupHeartbeat for its group's records). Handlers call
``facade.wake()`` after anything that may move the core's timers, so the shell re-arms its tick
from ``core.next_deadline_ms()``.

Offset writes go through the log before they become visible: OffsetCommit validates, persists
the records (``facade.persist``), and only then applies them to the core; DeleteGroups and
OffsetDelete persist tombstones before forgetting. ``persist`` must complete the writes of one
partition in log order, so that the core applies them in the order a replay would.

Not done here (the broker's metadata knows, the facade does not): answering
UNKNOWN_TOPIC_OR_PARTITION for commits or deletes of topics that do not exist.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from diskless.protocol.messages import RequestHeader

from . import records
from .consumer_protocol import HeartbeatRequest, HeartbeatResult
from .coordinator import GroupCoordinatorCore, GroupState, JoinResult, OffsetAndMetadata, SyncResult, TopicPartition

API_OFFSET_COMMIT = 8
API_OFFSET_FETCH = 9
API_JOIN_GROUP = 11
API_HEARTBEAT = 12
API_LEAVE_GROUP = 13
API_SYNC_GROUP = 14
API_DESCRIBE_GROUPS = 15
API_LIST_GROUPS = 16
API_DELETE_GROUPS = 42
API_OFFSET_DELETE = 47
API_CONSUMER_GROUP_HEARTBEAT = 68
API_CONSUMER_GROUP_DESCRIBE = 69

NO_AUTHORIZED_OPERATIONS = -(2**31)


class GroupFacade(Protocol):
    """What the group handlers need from the broker."""

    def coordinator(self, group_id: str) -> GroupCoordinatorCore | ErrorCode:
        """The core coordinating ``group_id`` on this broker, or the error to answer with."""
        ...

    async def persist(self, group_id: str, records: list[tuple[bytes, bytes | None]]) -> ErrorCode:
        """Append records to the group's ``__consumer_offsets`` partition; NONE once durable."""
        ...

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with a transactional offset commit whose transaction has not ended."""
        ...

    def now_ms(self) -> int: ...

    def wake(self) -> None:
        """Timers may have moved: re-arm the tick from the cores' ``next_deadline_ms()``."""
        ...

    def all_cores(self) -> list[GroupCoordinatorCore]:
        """Every core this broker currently coordinates (ListGroups)."""
        ...

    def topic_id_of(self, topic: str) -> uuid.UUID | None:
        """The id of an existing topic (KIP-848 APIs name topics by id)."""
        ...

    def topic_name_of(self, topic_id: uuid.UUID) -> str | None: ...

    def may_describe_topic(self) -> Callable[[str], bool] | None:
        """Which topics the requesting principal may DESCRIBE (None: all): a regex keeps only those."""
        ...


Handler = Callable[[GroupFacade, RequestHeader, Any], Awaitable[dict[str, Any]]]


def _ms(value: Any) -> int:
    """kio decodes millisecond durations as timedelta; accept ints too."""
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def _persist_error(code: ErrorCode) -> ErrorCode:
    """Kafka's translation of log append errors into errors group clients understand."""
    if code in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
    ):
        return ErrorCode.coordinator_not_available
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.invalid_commit_offset_size
    return code


def group_store_error(code: ErrorCode) -> ErrorCode:
    """Kafka's translation (GroupMetadataManager.storeGroup) of a group record's append error into
    what the members waiting for it get: a timeout sends them back to JoinGroup."""
    if code is ErrorCode.request_timed_out:
        return ErrorCode.rebalance_in_progress
    if code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.unknown_server_error
    return _persist_error(code)


def consumer_store_error(code: ErrorCode) -> ErrorCode:
    """Kafka's translation (CoordinatorOperationExceptionHelper) of a KIP-848 group's failed write
    into the ConsumerGroupHeartbeat answer: a timeout is COORDINATOR_NOT_AVAILABLE (the member
    looks the coordinator up again and retries with the same epoch)."""
    if code is ErrorCode.request_timed_out:
        return ErrorCode.coordinator_not_available
    if code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.unknown_server_error
    return _persist_error(code)


def _reply_future() -> tuple[asyncio.Future[Any], Callable[[Any], None]]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def reply(result: Any) -> None:
        # The request may have been cancelled (connection closed) while it was parked.
        if not future.done():
            future.set_result(result)

    return future, reply


# --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ----------------------------------------------


def _join_response(version: int, result: JoinResult) -> dict[str, Any]:
    protocol_name = result.protocol_name
    if protocol_name is None and version < 7:
        protocol_name = ""  # nullable only from v7
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        "protocol_name": protocol_name,
        "leader": result.leader_id,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata}
            for m in result.members
        ],
    }


async def join_group(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    version = header.api_version
    core = facade.coordinator(request.group_id)
    if isinstance(core, ErrorCode):
        return _join_response(version, JoinResult(core, request.member_id))
    session_timeout = _ms(request.session_timeout)
    # v0 has no rebalance timeout: Kafka uses the session timeout for both.
    rebalance_timeout = _ms(getattr(request, "rebalance_timeout", -1))
    if rebalance_timeout < 0:
        rebalance_timeout = session_timeout
    future, reply = _reply_future()
    core.join_group(
        request.group_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        request.protocol_type,
        [(p.name, p.metadata) for p in request.protocols],
        session_timeout,
        rebalance_timeout,
        facade.now_ms(),
        reply,
        require_known_member_id=version >= 4,
        support_skip_assignment=version >= 9,
        client_id=header.client_id or "",
        client_host=getattr(header, "client_host", "") or "",
    )
    facade.wake()
    return _join_response(version, await future)


def _sync_response(result: SyncResult) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


async def sync_group(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    core = facade.coordinator(request.group_id)
    if isinstance(core, ErrorCode):
        # A loading coordinator lost the rebalance in progress: REBALANCE_IN_PROGRESS sends the
        # member back to JoinGroup without a coordinator lookup, and every client version knows it.
        error = ErrorCode.rebalance_in_progress if core is ErrorCode.coordinator_load_in_progress else core
        return _sync_response(SyncResult(error))
    future, reply = _reply_future()
    core.sync_group(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None),
        {a.member_id: a.assignment for a in request.assignments},
        facade.now_ms(),
        reply,
    )
    facade.wake()
    return _sync_response(await future)


async def heartbeat(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    core = facade.coordinator(request.group_id)
    if isinstance(core, ErrorCode):
        # While loading, Kafka answers heartbeats blindly: the member finds out at its next join.
        error = ErrorCode.none if core is ErrorCode.coordinator_load_in_progress else core
        return {"throttle_time": 0, "error_code": error}
    error = core.heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        facade.now_ms(),
    )
    facade.wake()
    return {"throttle_time": 0, "error_code": error}


async def leave_group(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    batched = hasattr(request, "members")  # v3+: several members, possibly by instance id alone
    members = request.members if batched else [request]
    leaving = [(m.member_id, getattr(m, "group_instance_id", None)) for m in members]
    core = facade.coordinator(request.group_id)
    if isinstance(core, ErrorCode):
        top_error, results = core, []
    else:
        top_error, results = core.leave_group(request.group_id, leaving, facade.now_ms())
        facade.wake()
    if not batched:
        # v0-2 have one error code: the top-level one, else the member's.
        member_error = next((r.error for r in results if r.error is not ErrorCode.none), ErrorCode.none)
        return {"throttle_time": 0, "error_code": top_error if top_error is not ErrorCode.none else member_error}
    return {
        "throttle_time": 0,
        "error_code": top_error,
        "members": [
            {"member_id": r.member_id, "group_instance_id": r.group_instance_id, "error_code": r.error} for r in results
        ],
    }


# --- ConsumerGroupHeartbeat / ConsumerGroupDescribe (KIP-848) ------------------------------------


def _assignment_entries(facade: GroupFacade, assignment: dict[str, frozenset[int]]) -> list[dict[str, Any]]:
    out = []
    for topic, partitions in sorted(assignment.items()):
        topic_id = facade.topic_id_of(topic)
        if topic_id is not None:
            out.append({"topic_id": topic_id, "partitions": sorted(partitions)})
    return out


def _heartbeat_response(facade: GroupFacade, result: HeartbeatResult) -> dict[str, Any]:
    assignment = None
    if result.assignment is not None:
        assignment = {"topic_partitions": _assignment_entries(facade, result.assignment)}
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "error_message": result.error_message,
        "member_id": result.member_id,
        "member_epoch": result.member_epoch,
        "heartbeat_interval": result.heartbeat_interval_ms,
        "assignment": assignment,
    }


async def consumer_group_heartbeat(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    core = facade.coordinator(request.group_id)
    if isinstance(core, ErrorCode):
        return _heartbeat_response(facade, HeartbeatResult(core))
    owned: dict[str, frozenset[int]] | None = None
    if request.topic_partitions is not None:
        owned = {}
        for tp in request.topic_partitions:
            name = facade.topic_name_of(tp.topic_id) if tp.topic_id is not None else None
            if name is not None:  # a deleted topic's partitions are owned by nobody
                owned[name] = frozenset(owned.get(name, frozenset()) | set(tp.partitions))
    rebalance_timeout = _ms(request.rebalance_timeout)
    member_id = request.member_id
    if not member_id and request.member_epoch == 0 and header.api_version == 0:
        member_id = str(uuid.uuid4())  # v0: the coordinator may generate the member id
    # Answered once the group's records are durable (at once if nothing is being stored).
    future, reply = _reply_future()
    core.consumer_group_heartbeat(
        HeartbeatRequest(
            group_id=request.group_id,
            member_id=member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=rebalance_timeout,
            subscribed_topic_names=(
                tuple(request.subscribed_topic_names) if request.subscribed_topic_names is not None else None
            ),
            subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
            server_assignor=request.server_assignor,
            owned=owned,
            client_id=header.client_id or "",
            client_host=getattr(header, "client_host", "") or "",
            may_describe=facade.may_describe_topic(),
        ),
        facade.now_ms(),
        reply,
    )
    facade.wake()
    return _heartbeat_response(facade, await future)


def _described_assignment(facade: GroupFacade, assignment: dict[str, frozenset[int]]) -> dict[str, Any]:
    return {
        "topic_partitions": [
            {"topic_id": facade.topic_id_of(topic), "topic_name": topic, "partitions": sorted(parts)}
            for topic, parts in sorted(assignment.items())
        ]
    }


async def consumer_group_describe(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    described = []
    for group_id in request.group_ids:
        entry: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "group_id": group_id,
            "group_state": "",
            "group_epoch": 0,
            "assignment_epoch": 0,
            "assignor_name": "",
            "members": [],
            "authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }
        core = facade.coordinator(group_id)
        group = None if isinstance(core, ErrorCode) else core.consumer.group(group_id)
        if isinstance(core, ErrorCode):
            entry["error_code"] = core
        elif group is None:
            # As Kafka: GROUP_ID_NOT_FOUND for a classic group too, the message telling it apart.
            classic = core.group_state(group_id) not in (None, GroupState.DEAD)
            entry["error_code"] = ErrorCode.group_id_not_found
            entry["error_message"] = f"Group {group_id} " + ("is not a consumer group." if classic else "not found.")
        else:
            entry.update(
                group_state=group.state.value,
                group_epoch=group.group_epoch,
                assignment_epoch=group.assignment_epoch,
                assignor_name=group.assignor(core.consumer.config.assignors[0]),
                members=[
                    {
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": list(m.subscribed_topics),
                        "subscribed_topic_regex": m.subscribed_regex,
                        "assignment": _described_assignment(facade, m.assigned),
                        "target_assignment": _described_assignment(facade, group.target.get(m.member_id, {})),
                    }
                    for m in group.members.values()
                ],
            )
        described.append(entry)
    return {"throttle_time": 0, "groups": described}


# --- offsets -------------------------------------------------------------------------------------


def _commit_response(topics: Iterable[Any], errors: dict[TopicPartition, ErrorCode]) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "topics": [
            {
                "name": t.name,
                "partitions": [
                    {"partition_index": p.partition_index, "error_code": errors[(t.name, p.partition_index)]}
                    for p in t.partitions
                ],
            }
            for t in topics
        ],
    }


async def offset_commit(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """OffsetCommit v2+. ``retention_time`` (v2-4) is ignored, as Kafka does since KIP-211:
    offsets expire by offsets.retention.ms once their group is empty."""
    group_id = request.group_id
    keys = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    core = facade.coordinator(group_id)
    if isinstance(core, ErrorCode):
        return _commit_response(request.topics, dict.fromkeys(keys, core))
    now = facade.now_ms()
    error = core.validate_commit(
        group_id,
        getattr(request, "generation_id_or_member_epoch", -1),
        request.member_id,
        getattr(request, "group_instance_id", None),
        now,
        api_version=header.api_version,
    )
    facade.wake()
    if error is not ErrorCode.none:
        return _commit_response(request.topics, dict.fromkeys(keys, error))
    errors: dict[TopicPartition, ErrorCode] = {}
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for t in request.topics:
        for p in t.partitions:
            metadata = p.committed_metadata or ""
            if len(metadata.encode()) > core.config.offset_metadata_max_bytes:
                errors[(t.name, p.partition_index)] = ErrorCode.offset_metadata_too_large
                continue
            offsets[(t.name, p.partition_index)] = OffsetAndMetadata(
                p.committed_offset, getattr(p, "committed_leader_epoch", -1), metadata, now
            )
    if offsets:
        batch = [records.encode_offset(group_id, topic, part, om) for (topic, part), om in offsets.items()]
        stored = _persist_error(await facade.persist(group_id, batch))
        if stored is ErrorCode.none:
            core.apply_offsets(group_id, offsets)
        errors.update(dict.fromkeys(offsets, stored))
    return _commit_response(request.topics, errors)


def _fetch_group(
    facade: GroupFacade,
    group_id: str,
    topics: Any,
    member: tuple[str | None, int] | None = None,
    require_stable: bool = False,
) -> tuple[ErrorCode, list[dict[str, Any]]]:
    """(group error, topics) of one group's OffsetFetch; ``topics`` None means all partitions.

    ``member`` is v9's (member id, member epoch), checked for consumer-protocol groups. With
    ``require_stable`` (KIP-447) a partition whose offset a transaction may still change answers
    UNSTABLE_OFFSET_COMMIT: a consumer taking it over retries rather than start from the offset
    the transaction is about to move."""
    core = facade.coordinator(group_id)
    if isinstance(core, ErrorCode):
        return core, []
    if member is not None:
        error = core.validate_fetch(group_id, member[0], member[1])
        if error is not ErrorCode.none:
            return error, []
    if topics is None:
        committed = core.fetch_offsets(group_id, None)
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(committed):
            by_topic.setdefault(topic, []).append(partition)
        wanted = list(by_topic.items())
    else:
        wanted = [(t.name, list(t.partition_indexes)) for t in topics]
        committed = core.fetch_offsets(group_id, [(name, p) for name, parts in wanted for p in parts])
    unstable = facade.pending_partitions(group_id) if require_stable else set()
    result = []
    for name, parts in wanted:
        entries = []
        for p in parts:
            om = committed.get((name, p))
            if (name, p) in unstable:
                om = None
            entries.append(
                {
                    "partition_index": p,
                    # No committed offset: -1 and no error, whatever the topic.
                    "committed_offset": om.offset if om else -1,
                    "committed_leader_epoch": om.leader_epoch if om else -1,
                    "metadata": om.metadata if om else "",
                    "error_code": ErrorCode.unstable_offset_commit if (name, p) in unstable else ErrorCode.none,
                }
            )
        result.append({"name": name, "partitions": entries})
    return ErrorCode.none, result


async def offset_fetch(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """OffsetFetch v1+; v7+ may require stable offsets; v8+ batches groups."""
    require_stable = bool(getattr(request, "require_stable", False))
    if hasattr(request, "groups"):
        groups = []
        for g in request.groups:
            member = (g.member_id, g.member_epoch) if hasattr(g, "member_epoch") else None
            error, topics = _fetch_group(facade, g.group_id, g.topics, member, require_stable)
            groups.append({"group_id": g.group_id, "topics": topics, "error_code": error})
        return {"throttle_time": 0, "groups": groups}
    error, topics = _fetch_group(facade, request.group_id, request.topics, require_stable=require_stable)
    if error is not ErrorCode.none and header.api_version < 2:
        # v0-1 have no top-level error: Kafka reports it on every requested partition.
        topics = [
            {
                "name": t.name,
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": error,
                    }
                    for p in t.partition_indexes
                ],
            }
            for t in request.topics or ()
        ]
    return {"throttle_time": 0, "topics": topics, "error_code": error}


async def offset_delete(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    group_id = request.group_id
    keys = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    core = facade.coordinator(group_id)
    if isinstance(core, ErrorCode):
        return {"throttle_time": 0, "error_code": core, "topics": []}
    group_error, errors = core.check_delete_offsets(group_id, keys)
    if group_error is not ErrorCode.none:
        return {"throttle_time": 0, "error_code": group_error, "topics": []}
    deletable = [tp for tp, error in errors.items() if error is ErrorCode.none]
    if deletable:
        tombstones = [records.encode_offset_tombstone(group_id, topic, part) for topic, part in deletable]
        stored = _persist_error(await facade.persist(group_id, tombstones))
        if stored is ErrorCode.none:
            # Unconditionally: the tombstones are in the log, whatever happened to the group since.
            core.remove_offsets(group_id, deletable)
        else:
            errors.update(dict.fromkeys(deletable, stored))
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "topics": [
            {
                "name": t.name,
                "partitions": [
                    {"partition_index": p.partition_index, "error_code": errors[(t.name, p.partition_index)]}
                    for p in t.partitions
                ],
            }
            for t in request.topics
        ],
    }


# --- ListGroups / DescribeGroups / DeleteGroups --------------------------------------------------


async def list_groups(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """ListGroups; ``states_filter`` (v4+) and ``types_filter`` (v5+) are case-insensitive.
    KIP-848 groups are of type "consumer", the others "classic", as in Kafka."""
    states = list(getattr(request, "states_filter", ()) or ())
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    groups: list[dict[str, Any]] = []
    for core in facade.all_cores():
        for g in core.list_groups(states or None):
            if not types or g.group_type in types:
                groups.append(
                    {
                        "group_id": g.group_id,
                        "protocol_type": g.protocol_type,
                        "group_state": g.state,
                        "group_type": g.group_type,
                    }
                )
    return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": groups}


def _described(group_id: str, error: ErrorCode, message: str | None = None) -> dict[str, Any]:
    return {
        "error_code": error,
        "error_message": message,
        "group_id": group_id,
        "group_state": "",
        "protocol_type": "",
        "protocol_data": "",
        "members": [],
        "authorized_operations": NO_AUTHORIZED_OPERATIONS,
    }


async def describe_groups(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """DescribeGroups. An unknown group, or one that is not a classic group (KIP-848), is "Dead"
    with no error up to v5 and GROUP_ID_NOT_FOUND from v6 (KIP-1043), as Kafka answers."""
    described = []
    for group_id in request.groups:
        core = facade.coordinator(group_id)
        if isinstance(core, ErrorCode):
            described.append(_described(group_id, core))
            continue
        d = core.describe_group(group_id)
        if not d.exists and header.api_version >= 6:
            entry = _described(group_id, ErrorCode.group_id_not_found, d.error_message)
            entry["group_state"] = d.state
            described.append(entry)
            continue
        entry = _described(group_id, ErrorCode.none)
        entry.update(
            group_state=d.state,
            protocol_type=d.protocol_type,
            protocol_data=d.protocol_data,
            members=[
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata,
                    "member_assignment": m.assignment,
                }
                for m in d.members
            ],
        )
        described.append(entry)
    return {"throttle_time": 0, "groups": described}


async def delete_groups(facade: GroupFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """DeleteGroups: only Empty groups. The group turns Dead while its tombstones are written,
    so no member can join and no offset can be committed in between. A group named twice is
    answered once, as Kafka (``groupsNames.distinct``)."""
    results = []
    for group_id in dict.fromkeys(request.groups_names):
        core = facade.coordinator(group_id)
        if isinstance(core, ErrorCode):
            results.append({"group_id": group_id, "error_code": core})
            continue
        error = core.prepare_delete_group(group_id)
        if error is ErrorCode.none:
            # A KIP-848 group's keys first (each its tombstone, for a compacted log), then the offsets'
            # and the group tombstone.
            tombstones = [records.encode_consumer(r) for r in core.consumer_deletion_records(group_id)]
            tombstones += records.group_deletion_records(group_id, sorted(core.fetch_offsets(group_id)))
            error = _persist_error(await facade.persist(group_id, tombstones))
            if error is ErrorCode.none:
                core.complete_delete_group(group_id)
            else:
                core.abort_delete_group(group_id)
        results.append({"group_id": group_id, "error_code": error})
    return {"throttle_time": 0, "results": results}


HANDLERS: dict[int, Handler] = {
    API_OFFSET_COMMIT: offset_commit,
    API_OFFSET_FETCH: offset_fetch,
    API_JOIN_GROUP: join_group,
    API_HEARTBEAT: heartbeat,
    API_LEAVE_GROUP: leave_group,
    API_SYNC_GROUP: sync_group,
    API_DESCRIBE_GROUPS: describe_groups,
    API_LIST_GROUPS: list_groups,
    API_DELETE_GROUPS: delete_groups,
    API_OFFSET_DELETE: offset_delete,
    API_CONSUMER_GROUP_HEARTBEAT: consumer_group_heartbeat,
    API_CONSUMER_GROUP_DESCRIBE: consumer_group_describe,
}

# Version ranges the handlers serve (each tested at its bounds), for messages.SUPPORTED_VERSIONS.
# OffsetCommit v9+ and OffsetFetch v9+ carry KIP-848 member epochs.
VERSIONS: dict[int, tuple[int, int]] = {
    API_OFFSET_COMMIT: (2, 9),
    API_OFFSET_FETCH: (1, 9),
    API_JOIN_GROUP: (0, 9),
    API_HEARTBEAT: (0, 4),
    API_LEAVE_GROUP: (0, 5),
    API_SYNC_GROUP: (0, 5),
    API_DESCRIBE_GROUPS: (0, 6),
    API_LIST_GROUPS: (0, 5),
    API_DELETE_GROUPS: (0, 2),
    API_OFFSET_DELETE: (0, 0),
    API_CONSUMER_GROUP_HEARTBEAT: (0, 1),
    API_CONSUMER_GROUP_DESCRIBE: (0, 1),
}

"""Group API handlers driven with real kio requests against an in-memory facade.

Every response dict goes through ``messages.build`` and kio's writer and reader at the version the
client asked for, which proves it fits that version's schema.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import struct
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from diskless.groups import handlers as h
from diskless.groups import records
from diskless.groups.consumer_protocol import ConsumerGroupTombstone, HeartbeatRequest
from diskless.groups.coordinator import GroupConfig, GroupCoordinatorCore, GroupState, OffsetAndMetadata
from diskless.protocol import messages as m

E = ErrorCode
G = "group"


class FakeFacade:
    """The broker as the handlers see it: one core, a log, a clock the test moves."""

    def __init__(self) -> None:
        counter = itertools.count(1)
        self.core = GroupCoordinatorCore(
            GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=1),
            member_id_factory=lambda prefix: f"{prefix}-{next(counter)}",
        )
        self.clock = 1_000
        self.log: list[tuple[bytes, bytes | None]] = []
        self.persist_error = E.none
        self.errors: dict[str, ErrorCode] = {}
        self.wakes = 0

    def coordinator(self, group_id: str) -> GroupCoordinatorCore | ErrorCode:
        return self.errors.get(group_id, self.core)

    async def persist(self, group_id: str, records: list[tuple[bytes, bytes | None]]) -> ErrorCode:
        await asyncio.sleep(0)  # a real append takes a while: let others run meanwhile
        if self.persist_error is not E.none:
            return self.persist_error
        self.log.extend(records)
        return E.none

    def now_ms(self) -> int:
        return self.clock

    def wake(self) -> None:
        self.wakes += 1

    def all_cores(self) -> list[GroupCoordinatorCore]:
        return [self.core]

    def tick(self) -> None:
        self.core.tick(self.clock)


def fit(api_key: int, version: int, response: dict[str, Any]) -> Any:
    """The response as the client would decode it: build, write and read back at ``version``."""
    cls = load_response_schema(api_key, version)
    entity = m.build(cls, response)
    out = io.BytesIO()
    entity_writer(cls)(out, entity)
    decoded, size = entity_reader(cls)(memoryview(out.getvalue()), 0)
    assert size == len(out.getvalue())
    assert decoded == entity
    return decoded


async def call(facade: FakeFacade, api_key: int, version: int, body: dict[str, Any]) -> Any:
    request = m.build(load_request_schema(api_key, version), body)
    header = m.RequestHeader(api_key, version, 7, "client")
    return fit(api_key, version, await h.HANDLERS[api_key](facade, header, request))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def join_body(member_id: str = "", instance: str | None = None, metadata: bytes = b"meta") -> dict[str, Any]:
    return {
        "group_id": G,
        "session_timeout": 10_000,
        "rebalance_timeout": 20_000,
        "member_id": member_id,
        "group_instance_id": instance,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": metadata}],
        "reason": None,
    }


async def join(facade: FakeFacade, version: int, instance: str | None = None, metadata: bytes = b"meta") -> Any:
    first = await call(facade, h.API_JOIN_GROUP, version, join_body("", instance, metadata))
    if first.error_code is not E.member_id_required:
        return first
    return await call(facade, h.API_JOIN_GROUP, version, join_body(first.member_id, instance, metadata))


async def form(facade: FakeFacade, join_v: int, sync_v: int, n: int = 2) -> list[Any]:
    """n members join (concurrently) and sync; returns their JoinGroup responses, leader first."""
    tasks = [asyncio.create_task(join(facade, join_v)) for _ in range(n)]
    await settle()
    assert not any(t.done() for t in tasks)  # parked until the rebalance completes
    facade.tick()
    joined = sorted([await t for t in tasks], key=lambda r: r.leader != r.member_id)
    leader = joined[0]
    syncs = [
        asyncio.create_task(sync(facade, sync_v, r, {} if r is not leader else None, [j.member_id for j in joined]))
        for r in joined
    ]
    results = [await s for s in syncs]
    for r, s in zip(joined, results, strict=True):
        assert s.error_code is E.none
        assert s.assignment == f"to-{r.member_id}".encode()
    return joined


async def sync(
    facade: FakeFacade, version: int, joined: Any, assignments: dict[str, bytes] | None, members: list[str]
) -> Any:
    if assignments is None:
        assignments = {mid: f"to-{mid}".encode() for mid in members}
    body = {
        "group_id": G,
        "generation_id": joined.generation_id,
        "member_id": joined.member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocol_name": "range",
        "assignments": [{"member_id": k, "assignment": v} for k, v in assignments.items()],
    }
    return await call(facade, h.API_SYNC_GROUP, version, body)


async def heartbeat(facade: FakeFacade, version: int, joined: Any, instance: str | None = None) -> Any:
    body = {"group_id": G, "generation_id": joined.generation_id, "member_id": joined.member_id}
    return await call(facade, h.API_HEARTBEAT, version, body | {"group_instance_id": instance})


# --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup --------------------------------------------


@pytest.mark.parametrize(
    ("join_v", "sync_v", "hb_v", "leave_v"),
    [(0, 0, 0, 0), (1, 1, 1, 1), (3, 2, 2, 2), (4, 3, 3, 3), (5, 4, 4, 4), (6, 5, 4, 5), (7, 5, 4, 5), (9, 5, 4, 5)],
)
async def test_group_lifecycle(join_v: int, sync_v: int, hb_v: int, leave_v: int) -> None:
    facade = FakeFacade()
    leader, follower = await form(facade, join_v, sync_v)
    assert leader.generation_id == follower.generation_id == 1
    assert leader.protocol_name == follower.protocol_name == "range"
    assert [x.member_id for x in leader.members] == [leader.member_id, follower.member_id]
    assert follower.members == ()
    assert leader.member_id == "client-1"  # client id from the request header
    if join_v >= 7:
        assert leader.protocol_type == "consumer"
    assert facade.wakes > 0
    assert (await heartbeat(facade, hb_v, follower)).error_code is E.none
    if leave_v < 3:
        left = await call(facade, h.API_LEAVE_GROUP, leave_v, {"group_id": G, "member_id": follower.member_id})
    else:
        body = {"group_id": G, "members": [{"member_id": follower.member_id, "group_instance_id": None}]}
        left = await call(facade, h.API_LEAVE_GROUP, leave_v, body)
        assert [(x.member_id, x.error_code) for x in left.members] == [(follower.member_id, E.none)]
    assert left.error_code is E.none
    assert (await heartbeat(facade, hb_v, leader)).error_code is E.rebalance_in_progress
    again = await call(facade, h.API_JOIN_GROUP, join_v, join_body(leader.member_id))
    assert again.generation_id == 2 and again.leader == leader.member_id  # the only member left


@pytest.mark.parametrize("leave_v", [0, 2])
async def test_old_leave_reports_member_error(leave_v: int) -> None:
    facade = FakeFacade()
    await form(facade, 4, 3)
    left = await call(facade, h.API_LEAVE_GROUP, leave_v, {"group_id": G, "member_id": "ghost"})
    assert left.error_code is E.unknown_member_id


async def test_member_id_required_from_v4_only() -> None:
    facade = FakeFacade()
    first = await call(facade, h.API_JOIN_GROUP, 4, join_body())
    assert first.error_code is E.member_id_required and first.member_id == "client-1"
    assert first.generation_id == -1 and first.protocol_name == ""  # not nullable before v7
    old = asyncio.create_task(call(facade, h.API_JOIN_GROUP, 3, join_body()))
    await settle()
    assert not old.done()  # admitted directly, waiting for the rebalance
    facade.clock += 10_000  # the pending v4 member never came back
    facade.tick()
    assert (await old).error_code is E.none


async def test_static_member_restart_through_handlers() -> None:
    facade = FakeFacade()
    tasks = [asyncio.create_task(join(facade, 9, instance=i)) for i in ("a", "b")]
    await settle()
    facade.tick()
    a, b = [await t for t in tasks]
    members = [a.member_id, b.member_id]
    await asyncio.gather(sync(facade, 5, b, {}, members), sync(facade, 5, a, None, members))
    assert [(x.member_id, x.group_instance_id) for x in a.members] == [(a.member_id, "a"), (b.member_id, "b")]
    back = await call(facade, h.API_JOIN_GROUP, 9, join_body("", "a"))
    assert back.error_code is E.none and back.generation_id == 1
    assert back.skip_assignment and back.leader == back.member_id  # v9: leader, but do not assign
    got = await sync(facade, 5, back, {}, [])
    assert got.assignment == f"to-{a.member_id}".encode()
    assert (await heartbeat(facade, 4, a, instance="a")).error_code is E.fenced_instance_id
    older = await call(facade, h.API_JOIN_GROUP, 5, join_body("", "b"))
    assert older.leader == back.member_id and not older.members  # pre-v9: the old leader id, no list


async def test_sync_waits_for_the_leader_and_cancelled_requests_are_harmless() -> None:
    facade = FakeFacade()
    tasks = [asyncio.create_task(join(facade, 5)) for _ in range(3)]
    await settle()
    facade.tick()
    joined = sorted([await t for t in tasks], key=lambda r: r.leader != r.member_id)
    leader, f1, f2 = joined
    waiting = asyncio.create_task(sync(facade, 5, f1, {}, []))
    gone = asyncio.create_task(sync(facade, 5, f2, {}, []))
    await settle()
    assert not waiting.done()
    gone.cancel()  # its connection closed while parked
    await settle()
    await sync(facade, 5, leader, None, [j.member_id for j in joined])
    assert (await waiting).assignment == f"to-{f1.member_id}".encode()


@pytest.mark.parametrize("version", [0, 5, 9])
async def test_join_errors_fit_every_version(version: int) -> None:
    facade = FakeFacade()
    facade.errors[G] = E.not_coordinator
    resp = await call(facade, h.API_JOIN_GROUP, version, join_body("m-1"))
    assert resp.error_code is E.not_coordinator and resp.member_id == "m-1" and resp.generation_id == -1
    facade.errors.clear()
    bad = await call(facade, h.API_JOIN_GROUP, version, join_body("") | {"session_timeout": 0})
    assert bad.error_code is E.invalid_session_timeout


async def test_coordinator_errors_per_api() -> None:
    facade = FakeFacade()
    facade.errors[G] = E.coordinator_load_in_progress
    joined = SimpleNamespace(generation_id=1, member_id="m")
    assert (await sync(facade, 5, joined, {}, [])).error_code is E.rebalance_in_progress
    assert (await heartbeat(facade, 4, joined)).error_code is E.none  # answered blindly while loading
    facade.errors[G] = E.not_coordinator
    assert (await sync(facade, 0, joined, {}, [])).error_code is E.not_coordinator
    assert (await heartbeat(facade, 0, joined)).error_code is E.not_coordinator
    left = await call(facade, h.API_LEAVE_GROUP, 5, {"group_id": G, "members": [{"member_id": "m"}]})
    assert left.error_code is E.not_coordinator and left.members == ()
    left0 = await call(facade, h.API_LEAVE_GROUP, 0, {"group_id": G, "member_id": "m"})
    assert left0.error_code is E.not_coordinator


# --- OffsetCommit / OffsetFetch ------------------------------------------------------------------


def commit_body(generation: int = -1, member: str = "", offsets: dict[tuple[str, int], int] | None = None) -> dict:
    offsets = offsets if offsets is not None else {("t", 0): 10, ("t", 1): 11, ("u", 0): 12}
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset,
                "committed_leader_epoch": 4,
                "committed_metadata": f"meta-{offset}",
            }
        )
    return {
        "group_id": G,
        "generation_id_or_member_epoch": generation,
        "member_id": member,
        "group_instance_id": None,
        "retention_time": -1,
        "topics": [{"name": t, "partitions": p} for t, p in topics.items()],
    }


def errors_of(resp: Any) -> dict[tuple[str, int], ErrorCode]:
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def offsets_of(topics: Any) -> dict[tuple[str, int], tuple[int, int, str | None, ErrorCode]]:
    return {
        (t.name, p.partition_index): (
            p.committed_offset,
            getattr(p, "committed_leader_epoch", -1),
            p.metadata,
            p.error_code,
        )
        for t in topics
        for p in t.partitions
    }


@pytest.mark.parametrize(("commit_v", "fetch_v"), [(2, 1), (3, 2), (4, 3), (5, 5), (6, 6), (7, 7), (8, 8)])
async def test_commit_then_fetch(commit_v: int, fetch_v: int) -> None:
    facade = FakeFacade()
    resp = await call(facade, h.API_OFFSET_COMMIT, commit_v, commit_body())
    assert set(errors_of(resp).values()) == {E.none}
    assert len(facade.log) == 3  # persisted before being applied
    epoch = 4 if commit_v >= 6 else -1
    expected_epoch = epoch if fetch_v >= 5 else -1
    wanted = [{"name": "t", "partition_indexes": [0, 1, 7]}]
    if fetch_v >= 8:
        body = {"groups": [{"group_id": G, "topics": wanted}, {"group_id": "elsewhere", "topics": None}]}
        facade.errors["elsewhere"] = E.not_coordinator
        fetched = await call(facade, h.API_OFFSET_FETCH, fetch_v, body)
        ours, theirs = fetched.groups
        assert (theirs.group_id, theirs.error_code, theirs.topics) == ("elsewhere", E.not_coordinator, ())
        topics = ours.topics
    else:
        fetched = await call(facade, h.API_OFFSET_FETCH, fetch_v, {"group_id": G, "topics": wanted})
        topics = fetched.topics
    assert offsets_of(topics) == {
        ("t", 0): (10, expected_epoch, "meta-10", E.none),
        ("t", 1): (11, expected_epoch, "meta-11", E.none),
        ("t", 7): (-1, -1, "", E.none),  # nothing committed: -1, no error
    }
    # The log alone rebuilds the same offsets (what a new coordinator does after failover).
    replayed = GroupCoordinatorCore()
    records.replay(replayed, facade.log, facade.clock)
    assert replayed.fetch_offsets(G) == facade.core.fetch_offsets(G)
    assert replayed.fetch_offsets(G)[("u", 0)].offset == 12


@pytest.mark.parametrize("fetch_v", [2, 7])
async def test_fetch_all_partitions(fetch_v: int) -> None:
    facade = FakeFacade()
    await call(facade, h.API_OFFSET_COMMIT, 8, commit_body())
    fetched = await call(facade, h.API_OFFSET_FETCH, fetch_v, {"group_id": G, "topics": None})
    assert set(offsets_of(fetched.topics)) == {("t", 0), ("t", 1), ("u", 0)}
    all_v8 = await call(facade, h.API_OFFSET_FETCH, 8, {"groups": [{"group_id": G, "topics": None}]})
    assert set(offsets_of(all_v8.groups[0].topics)) == {("t", 0), ("t", 1), ("u", 0)}


@pytest.mark.parametrize("fetch_v", [1, 2, 7])
async def test_fetch_coordinator_errors(fetch_v: int) -> None:
    facade = FakeFacade()
    facade.errors[G] = E.coordinator_load_in_progress
    body = {"group_id": G, "topics": [{"name": "t", "partition_indexes": [0, 1]}]}
    fetched = await call(facade, h.API_OFFSET_FETCH, fetch_v, body)
    if fetch_v < 2:  # no top-level error code: every partition carries it
        assert {v[3] for v in offsets_of(fetched.topics).values()} == {E.coordinator_load_in_progress}
    else:
        assert fetched.error_code is E.coordinator_load_in_progress and fetched.topics == ()


async def test_commit_validation_persistence_and_metadata_limits() -> None:
    facade = FakeFacade()
    leader, follower = await form(facade, 5, 3)
    stale = await call(facade, h.API_OFFSET_COMMIT, 8, commit_body(0, leader.member_id))
    assert set(errors_of(stale).values()) == {E.illegal_generation}
    outsider = await call(facade, h.API_OFFSET_COMMIT, 8, commit_body())
    assert set(errors_of(outsider).values()) == {E.unknown_member_id}
    assert facade.log == []
    body = commit_body(1, follower.member_id, {("t", 0): 1, ("t", 1): 2})
    body["topics"][0]["partitions"][1]["committed_metadata"] = "x" * 5_000
    mixed = await call(facade, h.API_OFFSET_COMMIT, 8, body)
    assert errors_of(mixed) == {("t", 0): E.none, ("t", 1): E.offset_metadata_too_large}
    assert set(facade.core.fetch_offsets(G)) == {("t", 0)}
    facade.persist_error = E.not_leader_or_follower  # lost the partition meanwhile
    failed = await call(facade, h.API_OFFSET_COMMIT, 8, commit_body(1, follower.member_id, {("t", 0): 99}))
    assert errors_of(failed) == {("t", 0): E.not_coordinator}
    assert facade.core.fetch_offsets(G)[("t", 0)].offset == 1  # never applied
    facade.errors[G] = E.not_coordinator
    moved = await call(facade, h.API_OFFSET_COMMIT, 2, commit_body())
    assert set(errors_of(moved).values()) == {E.not_coordinator}


# --- ListGroups / DescribeGroups / DeleteGroups / OffsetDelete -----------------------------------


@pytest.mark.parametrize("version", [0, 3, 4, 5])
async def test_list_groups(version: int) -> None:
    facade = FakeFacade()
    await form(facade, 5, 3)
    facade.core.apply_offsets("simple", {("t", 0): OffsetAndMetadata(1)})
    listed = await call(facade, h.API_LIST_GROUPS, version, {})
    assert listed.error_code is E.none
    assert {(g.group_id, g.protocol_type) for g in listed.groups} == {(G, "consumer"), ("simple", "")}
    if version >= 4:
        stable = await call(facade, h.API_LIST_GROUPS, version, {"states_filter": ["Stable"]})
        assert [(g.group_id, g.group_state) for g in stable.groups] == [(G, "Stable")]
    if version >= 5:
        assert {g.group_type for g in listed.groups} == {"classic"}
        none = await call(facade, h.API_LIST_GROUPS, version, {"types_filter": ["consumer"]})
        assert none.groups == ()
        classic = await call(facade, h.API_LIST_GROUPS, version, {"types_filter": ["Classic"]})
        assert len(classic.groups) == 2


async def test_list_groups_reports_kip848_groups_as_consumer_groups() -> None:
    """Kafka lists a ConsumerGroupHeartbeat group with group_type "consumer", the type a
    types_filter selects it by; only the others are "classic"."""
    facade = FakeFacade()
    await form(facade, 5, 3)
    joining = HeartbeatRequest("kip848", "m1", 0, rebalance_timeout_ms=10_000, subscribed_topic_names=("t",), owned={})
    assert facade.core.consumer_group_heartbeat(joining, facade.clock).error is E.none
    listed = await call(facade, h.API_LIST_GROUPS, 5, {})
    assert {(g.group_id, g.group_type) for g in listed.groups} == {(G, "classic"), ("kip848", "consumer")}
    consumer = await call(facade, h.API_LIST_GROUPS, 5, {"types_filter": ["Consumer"]})
    assert [(g.group_id, g.protocol_type) for g in consumer.groups] == [("kip848", "consumer")]
    classic = await call(facade, h.API_LIST_GROUPS, 5, {"types_filter": ["classic"]})
    assert [g.group_id for g in classic.groups] == [G]


@pytest.mark.parametrize("version", [0, 3, 5, 6])
async def test_describe_groups(version: int) -> None:
    facade = FakeFacade()
    leader, follower = await form(facade, 5, 3)
    facade.errors["moved"] = E.not_coordinator
    body = {"groups": [G, "unknown", "moved"], "include_authorized_operations": False}
    described = await call(facade, h.API_DESCRIBE_GROUPS, version, body)
    ours, unknown, moved = described.groups
    assert (ours.error_code, ours.group_state, ours.protocol_type, ours.protocol_data) == (
        E.none,
        "Stable",
        "consumer",
        "range",
    )
    assert [(x.member_id, x.client_id, x.member_metadata, x.member_assignment) for x in ours.members] == [
        (j.member_id, "client", b"meta", f"to-{j.member_id}".encode()) for j in (leader, follower)
    ]
    if version >= 6:
        assert unknown.error_code is E.group_id_not_found and unknown.error_message
    else:
        assert (unknown.error_code, unknown.group_state, unknown.members) == (E.none, "Dead", ())
    assert moved.error_code is E.not_coordinator


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_delete_groups(version: int) -> None:
    facade = FakeFacade()
    await call(facade, h.API_OFFSET_COMMIT, 8, commit_body() | {"group_id": "old"})
    await form(facade, 5, 3)
    facade.log.clear()
    body = {"groups_names": ["old", G, "unknown"]}
    deleted = await call(facade, h.API_DELETE_GROUPS, version, body)
    assert [(r.group_id, r.error_code) for r in deleted.results] == [
        ("old", E.none),
        (G, E.non_empty_group),
        ("unknown", E.group_id_not_found),
    ]
    assert facade.core.group_state("old") is None
    decoded = [records.decode(k, v) for k, v in facade.log]
    assert decoded[-1] == records.GroupTombstone("old")
    assert {(d.topic, d.partition) for d in decoded[:-1]} == {("t", 0), ("t", 1), ("u", 0)}


async def test_delete_groups_of_a_kip848_group_tombstones_each_of_its_keys() -> None:
    """As Kafka: the group epoch, subscription metadata and target epoch keys each get their
    tombstone before the offsets' and the group tombstone, so that a compacted log drops them."""
    facade = FakeFacade()
    facade.core.consumer.partitions_of = lambda topic: 2 if topic == "t" else None
    join = HeartbeatRequest("kip848", "m1", 0, rebalance_timeout_ms=10_000, subscribed_topic_names=("t",), owned={})
    assert facade.core.consumer_group_heartbeat(join, facade.clock).error is E.none
    assert facade.core.consumer_group_heartbeat(HeartbeatRequest("kip848", "m1", -1), facade.clock).error is E.none
    await call(
        facade, h.API_OFFSET_COMMIT, 8, commit_body() | {"group_id": "kip848", "generation_id_or_member_epoch": -1}
    )
    facade.log.clear()
    deleted = await call(facade, h.API_DELETE_GROUPS, 2, {"groups_names": ["kip848"]})
    assert [(r.group_id, r.error_code) for r in deleted.results] == [("kip848", E.none)]
    decoded = [records.decode(k, v) for k, v in facade.log]
    assert decoded[:3] == [
        ConsumerGroupTombstone("kip848", "target_epoch"),
        ConsumerGroupTombstone("kip848", "subscriptions"),
        ConsumerGroupTombstone("kip848", "epoch"),
    ]
    assert decoded[-1] == records.GroupTombstone("kip848") and len(decoded) == 3 + 3 + 1
    assert facade.core.consumer.group("kip848") is None


async def test_delete_groups_answers_a_group_named_twice_once() -> None:
    """KafkaApis.handleDeleteGroupsRequest de-duplicates the names (``groupsNames.distinct``): one
    result per group. The second entry was answered GROUP_ID_NOT_FOUND after the first deleted it."""
    facade = FakeFacade()
    await call(facade, h.API_OFFSET_COMMIT, 8, commit_body() | {"group_id": "old"})
    deleted = await call(facade, h.API_DELETE_GROUPS, 2, {"groups_names": ["old", "unknown", "old"]})
    assert [(r.group_id, r.error_code) for r in deleted.results] == [
        ("old", E.none),
        ("unknown", E.group_id_not_found),
    ]
    assert facade.core.group_state("old") is None


async def test_delete_group_that_cannot_be_persisted_survives() -> None:
    facade = FakeFacade()
    await call(facade, h.API_OFFSET_COMMIT, 8, commit_body())
    facade.persist_error = E.request_timed_out
    deleted = await call(facade, h.API_DELETE_GROUPS, 2, {"groups_names": [G]})
    assert deleted.results[0].error_code is E.request_timed_out
    assert facade.core.group_state(G) is GroupState.EMPTY
    assert len(facade.core.fetch_offsets(G)) == 3


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 1, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1) + struct.pack(">i", 0)


async def test_offset_delete() -> None:
    facade = FakeFacade()
    await call(facade, h.API_OFFSET_COMMIT, 8, commit_body())
    body = {"group_id": G, "topics": [{"name": "t", "partitions": [{"partition_index": 0}]}]}
    deleted = await call(facade, h.API_OFFSET_DELETE, 0, body)
    assert deleted.error_code is E.none and errors_of(deleted) == {("t", 0): E.none}
    assert set(facade.core.fetch_offsets(G)) == {("t", 1), ("u", 0)}
    assert records.decode(*facade.log[-1]) == records.OffsetTombstone(G, "t", 0)
    # Members subscribed to "t": its offsets stay; "u" is not subscribed any more.
    tasks = [asyncio.create_task(join(facade, 5, metadata=subscription("t")))]
    await settle()
    facade.tick()
    joined = await tasks[0]
    await sync(facade, 3, joined, None, [joined.member_id])
    body = {
        "group_id": G,
        "topics": [
            {"name": "t", "partitions": [{"partition_index": 1}]},
            {"name": "u", "partitions": [{"partition_index": 0}]},
        ],
    }
    mixed = await call(facade, h.API_OFFSET_DELETE, 0, body)
    assert errors_of(mixed) == {("t", 1): E.group_subscribed_to_topic, ("u", 0): E.none}
    unknown = await call(facade, h.API_OFFSET_DELETE, 0, body | {"group_id": "nope"})
    assert unknown.error_code is E.group_id_not_found and unknown.topics == ()
    facade.errors[G] = E.not_coordinator
    assert (await call(facade, h.API_OFFSET_DELETE, 0, body)).error_code is E.not_coordinator


def test_versions_cover_what_kio_knows() -> None:
    for api_key, (low, high) in h.VERSIONS.items():
        assert api_key in h.HANDLERS
        for version in range(low, high + 1):
            load_request_schema(api_key, version)
            load_response_schema(api_key, version)


# --- a group id of the other type, unknown groups (Kafka's GroupMetadataManager/OffsetMetadataManager) ----


@pytest.mark.parametrize(("version", "expected"), [(8, E.illegal_generation), (9, E.group_id_not_found)])
async def test_commit_with_a_generation_to_an_unknown_group(version: int, expected: ErrorCode) -> None:
    """Kafka's OffsetMetadataManager: a commit carrying a generation (or member epoch) for a group
    that does not exist is GROUP_ID_NOT_FOUND from OffsetCommit v9, which both protocols' clients
    understand; older versions keep ILLEGAL_GENERATION. Nothing is stored either way."""
    facade = FakeFacade()
    body = commit_body(3, "m") | {"group_id": "ghost"}
    resp = await call(facade, h.API_OFFSET_COMMIT, version, body)
    assert set(errors_of(resp).values()) == {expected}
    assert facade.log == [] and facade.core.group_state("ghost") is None
    # Without a generation it is a simple consumer's commit: the group is created to hold it.
    simple = await call(facade, h.API_OFFSET_COMMIT, version, commit_body() | {"group_id": "ghost"})
    assert set(errors_of(simple).values()) == {E.none}


def join_kip848(facade: FakeFacade, group_id: str = "kip848") -> None:
    joining = HeartbeatRequest(group_id, "m1", 0, rebalance_timeout_ms=10_000, subscribed_topic_names=("t",), owned={})
    assert facade.core.consumer_group_heartbeat(joining, facade.clock).error is E.none


@pytest.mark.parametrize("version", [0, 5, 6])
async def test_describe_groups_sees_a_kip848_group_as_not_a_classic_group(version: int) -> None:
    """Kafka's DescribeGroups only describes classic groups: a KIP-848 group is answered like an
    unknown one, Dead with no members, with GROUP_ID_NOT_FOUND and its reason from v6 (KIP-1043).
    Admin clients then describe it with ConsumerGroupDescribe."""
    facade = FakeFacade()
    join_kip848(facade)
    body = {"groups": ["kip848"], "include_authorized_operations": False}
    (described,) = (await call(facade, h.API_DESCRIBE_GROUPS, version, body)).groups
    assert (described.group_state, described.protocol_type, described.members) == ("Dead", "", ())
    if version >= 6:
        assert described.error_code is E.group_id_not_found
        assert described.error_message == "Group kip848 is not a classic group."
    else:
        assert described.error_code is E.none


async def test_consumer_group_describe_of_a_classic_group() -> None:
    """Kafka's ConsumerGroupDescribe: GROUP_ID_NOT_FOUND for a classic group as for an unknown one,
    the message telling which it is."""
    facade = FakeFacade()
    await form(facade, 5, 3)
    body = {"group_ids": [G, "unknown"], "include_authorized_operations": False}
    classic, unknown = (await call(facade, h.API_CONSUMER_GROUP_DESCRIBE, 0, body)).groups
    assert (classic.error_code, classic.error_message) == (E.group_id_not_found, f"Group {G} is not a consumer group.")
    assert (unknown.error_code, unknown.error_message) == (E.group_id_not_found, "Group unknown not found.")


class TopicsFacade(FakeFacade):
    """A facade whose cluster has topics (ids for KIP-848 answers) and a principal that may not
    DESCRIBE ``hidden``."""

    def __init__(self, topics: dict[str, int], hidden: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.topics, self.hidden = topics, hidden
        self.ids = {name: uuid.UUID(int=i + 1) for i, name in enumerate(sorted(topics))}
        consumer = self.core.consumer
        consumer.partitions_of, consumer.topic_names = topics.get, lambda: list(topics)

    def topic_id_of(self, topic: str) -> uuid.UUID | None:
        return self.ids.get(topic)

    def topic_name_of(self, topic_id: uuid.UUID) -> str | None:
        return next((name for name, i in self.ids.items() if i == topic_id), None)

    def may_describe_topic(self) -> Any:
        return lambda topic: topic not in self.hidden


def regex_heartbeat(regex: str) -> dict[str, Any]:
    return {
        "group_id": "rx",
        "member_id": "m1",
        "member_epoch": 0,
        "rebalance_timeout": 30_000,
        "subscribed_topic_names": [],
        "subscribed_topic_regex": regex,
        "topic_partitions": [],
    }


async def test_consumer_group_heartbeat_with_a_regex_and_describe_shows_it() -> None:
    """A regex subscription (SubscribedTopicRegex, v1) is resolved to the topics the
    principal may DESCRIBE, and ConsumerGroupDescribe shows the member's regex."""
    facade = TopicsFacade({"rx-1": 2, "rx-hidden": 1, "other": 1}, hidden=frozenset({"rx-hidden"}))
    answer = await call(facade, h.API_CONSUMER_GROUP_HEARTBEAT, 1, regex_heartbeat("rx-.*"))
    assert answer.error_code is E.none
    assigned = {facade.topic_name_of(t.topic_id): set(t.partitions) for t in answer.assignment.topic_partitions}
    assert assigned == {"rx-1": {0, 1}}
    described = await call(facade, h.API_CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": ["rx"]})
    (member,) = described.groups[0].members
    assert (member.subscribed_topic_regex, member.subscribed_topic_names) == ("rx-.*", ())


async def test_consumer_group_heartbeat_with_an_invalid_regex_answers_kafkas_error() -> None:
    facade = TopicsFacade({"t": 1})
    answer = await call(facade, h.API_CONSUMER_GROUP_HEARTBEAT, 1, regex_heartbeat("("))
    assert answer.error_code is E.invalid_regular_expression and answer.error_code.value == 128
    assert answer.error_message == "SubscribedTopicRegex `(` is not a valid regular expression: missing )."

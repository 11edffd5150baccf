"""Classic group metadata in ``__consumer_offsets``: what the core asks to store, when answers wait
for it, and what a new coordinator loads from it (Kafka's GroupMetadataManager.storeGroup and
loadGroupsAndOffsets, GroupCoordinator.onGroupLoaded).

The log here is a list: a store that succeeds puts its record there, one that fails does not (a
record whose append failed may also be missing after a failover). "Failover" is ``unload`` of the
old core and a replay of that list into a fresh one.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from test_group_coordinator import OPS, REBALANCE, SESSION, World, consumer_subscription, join, new_member, om, sync

from diskless.cluster.coordinator_records import RecordFormatError, pack
from diskless.groups import records
from diskless.groups.coordinator import (
    GroupConfig,
    GroupCoordinatorCore,
    GroupState,
    GroupStore,
    JoinResult,
    StoredGroup,
    StoredMember,
    SyncResult,
)
from diskless.groups.handlers import group_store_error

E = ErrorCode
G = "group"


class Log:
    """The core's ``on_store``: keeps the requests until the test says how they end."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None]] = []
        self.pending: list[GroupStore] = []

    def __call__(self, store: GroupStore) -> None:
        self.pending.append(store)

    def complete(self, core: GroupCoordinatorCore, now: int, error: ErrorCode = E.none) -> list[StoredGroup]:
        """End every pending store, oldest first; returns what they stored."""
        done, self.pending = self.pending, []
        for store in done:
            if error is E.none:
                self.records.append(records.encode_group(store.group))
            core.group_stored(store.group.group_id, store.token, error, now)
        return [store.group for store in done]


def make_core(log: Log, **overrides: Any) -> GroupCoordinatorCore:
    counter = itertools.count(1)
    settings = {"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 1} | overrides
    return GroupCoordinatorCore(
        GroupConfig(**settings), member_id_factory=lambda prefix: f"{prefix}-{next(counter)}", on_store=log
    )


def failover(old: GroupCoordinatorCore, log: Log, now: int) -> GroupCoordinatorCore:
    """The partition moves: the old core answers what it parked, a new one replays the log."""
    old.unload()
    new = make_core(Log())
    records.replay(new, log.records, now)
    return new


def stable_group(
    core: GroupCoordinatorCore, log: Log, now: int = 0, n: int = 2, **kwargs: Any
) -> tuple[list[JoinResult], dict[str, bytes]]:
    """n dynamic members join and sync; the group record is stored. Returns (joins, assignment)."""
    replies = [new_member(core, now, **kwargs) for _ in range(n)]
    core.tick(now)
    results = [r.value for r in replies]
    assignment = {r.member_id: f"to-{r.member_id}".encode() for r in results}
    syncs = [sync(core, now, r.member_id, r.generation_id) for r in results[1:]]
    syncs.insert(0, sync(core, now, results[0].member_id, results[0].generation_id, assignment))
    (stored,) = log.complete(core, now)
    assert stored.generation_id == results[0].generation_id
    assert all(s.value.error is E.none for s in syncs)
    assert core.group_state(G) is GroupState.STABLE
    return results, assignment


# --- load -------------------------------------------------------------------------------------------


def test_members_of_a_stored_stable_group_keep_heartbeating_after_failover() -> None:
    """Without group records the new coordinator knew no member: UNKNOWN_MEMBER_ID, then a
    rebalance per group. Loaded, members go on at their generation."""
    log = Log()
    core = make_core(log)
    (a, b), assignment = stable_group(core, log, protocols=[("range", consumer_subscription("t"))])
    core.commit_offsets(G, 1, a.member_id, None, {("t", 0): om(5)}, 10)
    log.records.append(records.encode_offset(G, "t", 0, om(5)))
    new = failover(core, log, 1_000)
    assert new.group_state(G) is GroupState.STABLE and new.generation(G) == 1
    for member in (a, b):
        assert new.heartbeat(G, 1, member.member_id, None, 2_000) is E.none
        got = sync(new, 2_000, member.member_id, 1)
        assert got.value == SyncResult(E.none, "consumer", "range", assignment[member.member_id])
    assert new.validate_commit(G, 1, a.member_id, None, 2_000) is E.none
    assert new.fetch_offsets(G) == {("t", 0): om(5)}
    described = new.describe_group(G)
    assert described.protocol_data == "range"
    assert [(m.member_id, m.client_id, m.client_host) for m in described.members] == [
        (a.member_id, "client", "/127.0.0.1"),
        (b.member_id, "client", "/127.0.0.1"),
    ]
    # The leader still leads: its JoinGroup starts the next generation, as it would have before.
    assert [g.group_id for g in new.list_groups(["Stable"])] == [G]
    rejoin = join(new, 3_000, a.member_id, protocols=[("range", consumer_subscription("t"))])
    assert new.group_state(G) is GroupState.PREPARING_REBALANCE and not rejoin.done


def test_loaded_members_session_timers_start_at_the_load() -> None:
    """Kafka's onGroupLoaded: a member that died with the old coordinator times out a session
    after the load, and the others rebalance without it."""
    log = Log()
    core = make_core(log)
    (a, b), _ = stable_group(core, log)
    new = failover(core, log, 50_000)  # long after the members' last heartbeats on the old one
    assert new.next_deadline_ms() == 50_000 + SESSION
    new.tick(50_000 + SESSION - 1)
    assert new.heartbeat(G, 1, a.member_id, None, 50_000 + SESSION - 1) is E.none
    new.tick(50_000 + SESSION)  # b never showed up
    assert new.group_state(G) is GroupState.PREPARING_REBALANCE
    assert new.heartbeat(G, 1, b.member_id, None, 50_000 + SESSION) is E.unknown_member_id


def test_failover_while_rebalancing_loads_the_last_stored_generation() -> None:
    """Only Stable and Empty groups are stored: a rebalance in flight is lost with the coordinator.
    Its parked requests get NOT_COORDINATOR, the new one has generation 1, and whoever rejoins
    starts generation 2 there."""
    log = Log()
    core = make_core(log)
    (a, b), assignment = stable_group(core, log)
    rejoin_a = join(core, 100, a.member_id)  # the leader rejoins: PreparingRebalance
    rejoin_b = join(core, 100, b.member_id)
    assert core.group_state(G) is GroupState.COMPLETING_REBALANCE
    generation = rejoin_a.value.generation_id
    follower = sync(core, 100, b.member_id, generation)
    new = failover(core, log, 200)
    assert follower.value.error is E.not_coordinator
    assert rejoin_b.value.generation_id == 2
    assert new.generation(G) == 1 and new.group_state(G) is GroupState.STABLE
    # b went on to sync generation 2, which the new coordinator never saw.
    assert sync(new, 300, b.member_id, 2).value.error is E.illegal_generation
    assert new.heartbeat(G, 2, b.member_id, None, 300) is E.illegal_generation
    # Both rejoin (the leader first), as clients do after those errors.
    again_a, again_b = join(new, 400, a.member_id), join(new, 400, b.member_id)
    assert again_a.value.generation_id == again_b.value.generation_id == 2
    leader_sync = sync(new, 400, a.member_id, 2, assignment)
    assert not leader_sync.done  # waits for generation 2's record


def test_empty_group_is_stored_with_its_state_time() -> None:
    """The Empty group's record keeps when it became Empty: a new coordinator expires its offsets
    by that clock (KIP-211), not by each offset's commit time as for a group without members."""
    log = Log()
    core = make_core(log)
    (a, b), _ = stable_group(core, log)
    core.commit_offsets(G, 1, a.member_id, None, {("t", 0): om(5, ts=0)}, 0)
    log.records.append(records.encode_offset(G, "t", 0, om(5, ts=0)))
    core.leave_group(G, [(a.member_id, None), (b.member_id, None)], 2_000)
    assert core.group_state(G) is GroupState.EMPTY
    (empty,) = log.complete(core, 2_000)
    assert (empty.generation_id, empty.members, empty.state_timestamp_ms) == (2, (), 2_000)
    assert empty.protocol_type == "consumer" and empty.protocol_name is None
    new = failover(core, log, 3_000)
    assert new.group_state(G) is GroupState.EMPTY and new.generation(G) == 2
    assert new.expired_offsets(2_999, 1_000) == {}  # committed at 0, but Empty only since 2000
    assert new.expired_offsets(3_000, 1_000) == {G: [("t", 0)]}
    assert new.heartbeat(G, 1, a.member_id, None, 3_000) is E.unknown_member_id


def test_a_group_tombstone_after_its_record_drops_the_group() -> None:
    stored = StoredGroup(
        G, "consumer", 3, "range", "m", 7, (StoredMember("m", None, "c", "h", 1_000, 1_000, b"s", b"a"),)
    )
    deleted = [
        records.encode_offset(G, "t", 0, om(1)),
        records.encode_group(stored),
        *records.group_deletion_records(G, [("t", 0)]),
    ]
    core = make_core(Log())
    assert records.replay(core, deleted, 0) == 4
    assert core.group_state(G) is None and core.fetch_offsets(G) == {}
    # Offsets committed after the deletion, then a new group of that name: only what came after.
    again = [*deleted, records.encode_offset(G, "t", 1, om(2)), records.encode_group(stored)]
    core = make_core(Log())
    records.replay(core, again, 0)
    assert core.fetch_offsets(G) == {("t", 1): om(2)}
    assert core.group_state(G) is GroupState.STABLE and core.generation(G) == 3
    # A later record of the same group replaces the earlier one; its offsets stay.
    emptied = StoredGroup(G, "consumer", 4, None, None, 9)
    records.replay(core, [records.encode_group(emptied)], 0)
    assert core.group_state(G) is GroupState.EMPTY and core.generation(G) == 4
    assert core.fetch_offsets(G) == {("t", 1): om(2)}
    assert core.next_deadline_ms() is None  # the replaced member's timer went with it


def test_a_group_of_another_protocol_type_is_stored_and_loaded() -> None:
    """Connect workers and other non-consumer clients: stored the same way; their offsets are not
    expired by subscription (Kafka reads subscriptions of "consumer" groups only)."""
    log = Log()
    core = make_core(log)
    (a, _), assignment = stable_group(core, log, protocol_type="connect", protocols=[("sessioned", b"worker")])
    core.apply_offsets(G, {("t", 0): om(1, ts=0)})
    new = failover(core, log, 100)
    described = new.describe_group(G)
    assert (described.state, described.protocol_type, described.protocol_data) == ("Stable", "connect", "sessioned")
    assert described.members[0].metadata == b"worker"
    assert new.heartbeat(G, 1, a.member_id, None, 100) is E.none
    assert sync(new, 100, a.member_id, 1).value.assignment == assignment[a.member_id]
    new.apply_offsets(G, {("t", 0): om(1, ts=0)})
    assert new.expired_offsets(10**9, 1_000) == {}


# --- SyncGroup waits for the record -------------------------------------------------------------------


def test_sync_answers_wait_until_the_group_record_is_durable() -> None:
    log = Log()
    core = make_core(log)
    a, b = new_member(core, 0), new_member(core, 0)
    core.tick(0)
    leader, follower = a.value, b.value
    follower_sync = sync(core, 10, follower.member_id, 1)
    assignment = {leader.member_id: b"A", follower.member_id: b"B"}
    leader_sync = sync(core, 10, leader.member_id, 1, assignment)
    assert not leader_sync.done and not follower_sync.done
    assert core.group_state(G) is GroupState.COMPLETING_REBALANCE
    (pending,) = log.pending
    assert [(m.member_id, m.assignment) for m in pending.group.members] == [
        (leader.member_id, b"A"),
        (follower.member_id, b"B"),
    ]
    # Waiting members may heartbeat; a leader sending SyncGroup again waits for the same record.
    assert core.heartbeat(G, 1, follower.member_id, None, 20) is E.none
    again = sync(core, 30, leader.member_id, 1, {leader.member_id: b"other"})
    assert leader_sync.value.error is E.rebalance_in_progress  # the superseded request
    assert len(log.pending) == 1
    late = sync(core, 40, follower.member_id, 1)  # a follower's retry replaces its first request
    assert follower_sync.value.error is E.rebalance_in_progress
    log.complete(core, 50)
    assert again.value == SyncResult(E.none, "consumer", "range", b"A")
    assert late.value == SyncResult(E.none, "consumer", "range", b"B")
    assert core.group_state(G) is GroupState.STABLE


@pytest.mark.parametrize(
    ("append_error", "answered"),
    [
        (E.not_coordinator, E.not_coordinator),
        (E.not_enough_replicas, E.coordinator_not_available),
        (E.request_timed_out, E.rebalance_in_progress),
        (E.message_too_large, E.unknown_server_error),
    ],
)
def test_a_failed_store_answers_an_error_and_rebalances(append_error: ErrorCode, answered: ErrorCode) -> None:
    log = Log()
    core = make_core(log)
    (a, b), assignment = stable_group(core, log)
    rejoins = [join(core, 100, a.member_id), join(core, 100, b.member_id)]
    follower_sync = sync(core, 100, b.member_id, 2)
    leader_sync = sync(core, 100, a.member_id, 2, assignment)
    log.complete(core, 200, group_store_error(append_error))
    assert all(r.value.generation_id == 2 for r in rejoins)
    assert leader_sync.value == follower_sync.value == SyncResult(answered)
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    assert core.heartbeat(G, 2, b.member_id, None, 200) is E.rebalance_in_progress
    # The members rejoin and generation 3 completes once its record is stored.
    again = [join(core, 300, a.member_id), join(core, 300, b.member_id)]
    assert [r.value.generation_id for r in again] == [3, 3]
    synced = [sync(core, 300, b.member_id, 3), sync(core, 300, a.member_id, 3, assignment)]
    log.complete(core, 400)
    assert [s.value.error for s in synced] == [E.none, E.none]
    assert failover(core, log, 500).generation(G) == 3  # the failed generation 2 left no record


def test_a_store_that_ends_after_the_group_moved_on_changes_nothing() -> None:
    """Kafka checks the group is still CompletingRebalance at that generation; a member leaving
    meanwhile started another rebalance, which already answered the parked SyncGroups."""
    log = Log()
    core = make_core(log)
    a, b, c = new_member(core, 0), new_member(core, 0), new_member(core, 0)
    core.tick(0)
    ids = [r.value.member_id for r in (a, b, c)]
    follower_sync = sync(core, 10, ids[1], 1)
    leader_sync = sync(core, 10, ids[0], 1, {m: b"x" for m in ids})
    core.leave_group(G, [(ids[2], None)], 20)
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    assert leader_sync.value.error is follower_sync.value.error is E.rebalance_in_progress
    log.complete(core, 30)
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    # The log has generation 1 as the leader assigned it: what a failover now would load.
    new = failover(core, log, 40)
    assert new.generation(G) == 1 and len(new.describe_group(G).members) == 3


def test_a_group_becoming_empty_is_stored_without_waiting() -> None:
    log = Log()
    core = make_core(log)
    (a, b), _ = stable_group(core, log)
    core.leave_group(G, [(a.member_id, None), (b.member_id, None)], 100)
    assert core.group_state(G) is GroupState.EMPTY
    (pending,) = log.pending
    assert pending.group.members == () and pending.group.generation_id == 2
    log.complete(core, 200, E.not_coordinator)  # nobody waits: nothing changes
    assert core.group_state(G) is GroupState.EMPTY
    assert core.delete_group(G) is E.none


def test_without_a_store_callback_every_store_succeeds_at_once() -> None:
    core = GroupCoordinatorCore(GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=1))
    a = new_member(core, 0)
    core.tick(0)
    got = sync(core, 0, a.value.member_id, 1, {a.value.member_id: b"A"})
    assert got.value.assignment == b"A" and core.group_state(G) is GroupState.STABLE


# --- static members -----------------------------------------------------------------------------------


def static_group(core: GroupCoordinatorCore, log: Log) -> tuple[JoinResult, JoinResult]:
    ra, rb = join(core, 0, instance="inst-a"), join(core, 0, instance="inst-b")
    core.tick(0)
    a, b = ra.value, rb.value
    sync(core, 0, b.member_id, 1, instance="inst-b")
    sync(core, 0, a.member_id, 1, {a.member_id: b"A", b.member_id: b"B"}, instance="inst-a")
    log.complete(core, 0)
    assert core.group_state(G) is GroupState.STABLE
    return a, b


def test_a_static_member_replaced_in_a_stable_group_is_answered_once_stored() -> None:
    """Without the record a failover would bring back the old member id, and the restarted
    instance would be fenced by its own previous incarnation's id."""
    log = Log()
    core = make_core(log)
    a, b = static_group(core, log)
    back = join(core, 5_000, instance="inst-b", session=SESSION + 1)
    assert not back.done
    (pending,) = log.pending
    new_id = next(m.member_id for m in pending.group.members if m.group_instance_id == "inst-b")
    assert new_id != b.member_id and pending.group.generation_id == 1
    assert core.heartbeat(G, 1, b.member_id, "inst-b", 5_001) is E.fenced_instance_id
    log.complete(core, 5_002)
    assert back.value.member_id == new_id and back.value.generation_id == 1
    assert back.value.leader_id == a.member_id
    new = failover(core, log, 6_000)
    assert new.heartbeat(G, 1, new_id, "inst-b", 6_001) is E.none
    assert new.heartbeat(G, 1, b.member_id, "inst-b", 6_001) is E.fenced_instance_id
    assert sync(new, 6_002, new_id, 1, instance="inst-b").value.assignment == b"B"
    assert new.next_deadline_ms() == 6_000 + SESSION  # a's session, from the load


def test_a_static_replacement_that_cannot_be_stored_is_undone() -> None:
    """Kafka's revert: the old member id is the instance's again; the new instance gets the error
    and joins again."""
    log = Log()
    core = make_core(log)
    a, b = static_group(core, log)
    back = join(core, 5_000, instance="inst-a", session=SESSION + 1, rebalance=REBALANCE + 1)
    log.complete(core, 5_001, E.not_coordinator)
    assert back.value.error is E.not_coordinator and back.value.member_id == ""
    assert core.heartbeat(G, 1, a.member_id, "inst-a", 5_002) is E.none
    assert {m.member_id for m in core.describe_group(G).members} == {a.member_id, b.member_id}
    group = core._groups[G]
    assert group.leader_id == a.member_id and group.static_members["inst-a"] == a.member_id
    assert group.members[a.member_id].session_timeout_ms == SESSION
    assert core.group_state(G) is GroupState.STABLE and core.generation(G) == 1
    # It tries again and this time the record is stored.
    again = join(core, 6_000, instance="inst-a")
    log.complete(core, 6_001)
    assert again.value.error is E.none
    assert core.heartbeat(G, 1, a.member_id, "inst-a", 6_002) is E.fenced_instance_id


def test_a_static_replacement_overtaken_by_a_rebalance_joins_it() -> None:
    log = Log()
    core = make_core(log)
    a, _ = static_group(core, log)
    back = join(core, 5_000, instance="inst-b")
    leader_rejoin = join(core, 5_001, a.member_id, instance="inst-a")  # the leader forces a rebalance
    assert core.group_state(G) is GroupState.COMPLETING_REBALANCE  # back counted as rejoined
    assert back.value.generation_id == leader_rejoin.value.generation_id == 2
    log.complete(core, 5_002, E.not_coordinator)  # too late to matter
    assert core.group_state(G) is GroupState.COMPLETING_REBALANCE
    assert core.heartbeat(G, 2, back.value.member_id, "inst-b", 5_003) is E.none


# --- record format ------------------------------------------------------------------------------------


def test_group_records_round_trip_and_ignore_appended_fields() -> None:
    stored = StoredGroup(
        "ж",
        "consumer",
        7,
        "range",
        "m1",
        1_234,
        (
            StoredMember("m1", None, "c1", "/10.0.0.1", 30_000, 10_000, b"\x00sub", b"\x00asg"),
            StoredMember("m2", "inst", "c2", "/10.0.0.2", 30_000, 10_000, b"", b""),
        ),
    )
    key, value = records.encode_group(stored)
    assert key == records.group_key("ж") == records.encode_group_tombstone("ж")[0]
    assert records.decode(key, value) == stored
    assert records.decode(*records.encode_group(StoredGroup("g", None, 0, None, None, 0))) == StoredGroup(
        "g", None, 0, None, None, 0
    )
    member = ["m1", None, "c1", "h", 1, 2, b"s", b"a", "a later field"]
    later = pack(records.GROUP_VALUE_VERSION, ["consumer", 7, "range", "m1", 5, [member], "another"])
    assert records.decode(key, later).members[0].assignment == b"a"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "value",
    [
        pack(2, ["consumer", 1, "range", "m", 0, []]),  # a newer value version
        pack(1, ["consumer", 1, "range", "m", 0]),  # too short
        pack(1, ["consumer", "1", "range", "m", 0, []]),
        pack(1, ["consumer", 1, None, None, 0, [["m", None, "c", "h", 1, 2, b"s", b"a"]]]),  # members, no protocol
        pack(1, ["consumer", 1, "range", "m", 0, [["m", None, "c", "h", 1, 2, "not bytes", b"a"]]]),
        pack(1, ["consumer", 1, "range", "m", 0, [["m", None, "c", "h", 1, 2, b"s"]]]),
    ],
)
def test_group_records_refuse_what_they_do_not_know(value: bytes) -> None:
    with pytest.raises(RecordFormatError):
        records.decode(records.group_key("g"), value)


# --- random interleavings with stores and failovers ---------------------------------------------------


class StoringWorld(World):
    """``World``'s well-behaved clients against a core whose group records are stored when the
    test says (or fail), and a coordinator that may fail over at any point (replaying the records
    that were stored)."""

    def __init__(self, static: list[bool], delay: int) -> None:
        super().__init__(4, static, delay, 100)
        self.log = Log()
        self.core = make_core(self.log, initial_rebalance_delay_ms=delay)
        self.durable: list[StoredGroup] = []

    def on_sync(self, actor: Any, gen: int, result: SyncResult) -> None:
        if result.error is E.none:
            # The safety property: nobody gets an assignment a failover could lose.
            assert any(
                g.generation_id == gen and any(m.assignment == result.assignment for m in g.members)
                for g in self.durable
            ), "an assignment that is not stored"
        super().on_sync(actor, gen, result)

    def step(self, op: tuple[str, int, int]) -> None:
        kind, _, arg = op
        if kind == "store" and self.log.pending:
            store = self.log.pending.pop(0)
            error = E.none if arg < 7 else (E.not_coordinator, E.rebalance_in_progress, E.unknown_server_error)[arg - 7]
            if error is E.none:
                self.log.records.append(records.encode_group(store.group))
                self.durable.append(store.group)
            self.core.group_stored(store.group.group_id, store.token, error, self.now)
            self.check_core()
        elif kind == "failover":
            self.core.unload()  # parked requests: NOT_COORDINATOR, the clients rejoin
            self.log.pending.clear()  # appended, never replicated: lost with the old leader
            self.core = make_core(self.log, initial_rebalance_delay_ms=self.core.config.initial_rebalance_delay_ms)
            records.replay(self.core, self.log.records, self.now)
            # A rebalance the old coordinator did not store happens again: generations may repeat.
            self.max_generation, self.plans = 0, {}
            self.check_core()
        else:
            super().step(op)

    def check_core(self) -> None:
        group = self.core._groups.get(G)
        if group is not None and group.sync_store is not None:
            assert group.state is GroupState.COMPLETING_REBALANCE
        if group is not None and group.state is GroupState.STABLE and group.static_stores:
            # A replaced static member waits in JoinGroup for its record, in a Stable group.
            waiting = {s.new_member_id for s in group.static_stores.values()}
            assert all(
                not m.sync_reply and (not m.join_reply or m.member_id in waiting) for m in group.members.values()
            )
            return
        super().check_core()


STORING_OPS = st.one_of(
    OPS,
    st.tuples(st.just("store"), st.just(0), st.integers(0, 9)),
    st.tuples(st.just("store"), st.just(0), st.integers(0, 6)),
    st.tuples(st.just("failover"), st.just(0), st.just(0)),
)


@given(
    st.lists(STORING_OPS, max_size=120), st.lists(st.booleans(), min_size=4, max_size=4), st.sampled_from([0, 3_000])
)
def test_random_interleavings_with_stores_and_failovers(
    ops: list[tuple[str, int, int]], static: list[bool], delay: int
) -> None:
    world = StoringWorld(static, delay)
    for op in ops:
        world.step(op)
    # Stores end, the clock runs out, the coordinator goes: every parked request is answered once,
    # and what the log holds loads.
    while world.log.pending:
        world.step(("store", 0, 0))
    world.now += 10 * REBALANCE
    world.core.tick(world.now)
    while world.log.pending:
        world.step(("store", 0, 0))
    live = world.core.generation(G)
    world.core.unload()
    assert all(r.done for r in world.replies)
    loaded = make_core(Log())
    records.replay(loaded, world.log.records, world.now)
    assert loaded.generation(G) <= live

"""The classic group coordinator core with a fake clock, its record format and ``partition_for``."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.groups import records
from diskless.groups.coordinator import (
    GroupConfig,
    GroupCoordinatorCore,
    GroupState,
    JoinResult,
    LeaveResult,
    OffsetAndMetadata,
    SyncResult,
    parse_subscribed_topics,
)

E = ErrorCode
G = "group"
SESSION = 10_000
REBALANCE = 20_000
RANGE = [("range", b"meta")]


class Reply:
    """A reply callback that must be invoked exactly once."""

    def __init__(self, hook: Callable[[Any], None] | None = None) -> None:
        self.results: list[Any] = []
        self.hook = hook

    def __call__(self, result: Any) -> None:
        assert not self.results, f"reply invoked twice: {self.results[0]} then {result}"
        self.results.append(result)
        if self.hook is not None:
            self.hook(result)

    @property
    def done(self) -> bool:
        return bool(self.results)

    @property
    def value(self) -> Any:
        assert self.results, "no reply yet"
        return self.results[0]


def make_core(**overrides: Any) -> GroupCoordinatorCore:
    counter = itertools.count(1)
    settings = {"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 1} | overrides
    return GroupCoordinatorCore(GroupConfig(**settings), member_id_factory=lambda prefix: f"{prefix}-{next(counter)}")


def join(
    core: GroupCoordinatorCore,
    now: int,
    member_id: str = "",
    *,
    group: str = G,
    instance: str | None = None,
    protocols: list[tuple[str, bytes]] | None = None,
    protocol_type: str = "consumer",
    session: int = SESSION,
    rebalance: int = REBALANCE,
    client_id: str = "client",
    v4: bool = True,
    skip: bool = False,
) -> Reply:
    reply = Reply()
    core.join_group(
        group,
        member_id,
        instance,
        protocol_type,
        RANGE if protocols is None else protocols,
        session,
        rebalance,
        now,
        reply,
        require_known_member_id=v4,
        support_skip_assignment=skip,
        client_id=client_id,
        client_host="/127.0.0.1",
    )
    return reply


def sync(
    core: GroupCoordinatorCore,
    now: int,
    member_id: str,
    generation: int,
    assignments: dict[str, bytes] | None = None,
    *,
    instance: str | None = None,
    group: str = G,
) -> Reply:
    reply = Reply()
    core.sync_group(group, generation, member_id, instance, None, None, assignments or {}, now, reply)
    return reply


def new_member(core: GroupCoordinatorCore, now: int, **kwargs: Any) -> Reply:
    """KIP-394 dance: the first JoinGroup gets MEMBER_ID_REQUIRED and an id, the second parks."""
    first = join(core, now, **kwargs)
    assert first.value.error is E.member_id_required
    return join(core, now, first.value.member_id, **kwargs)


def form_group(core: GroupCoordinatorCore, now: int, n: int = 3, group: str = G, **kwargs: Any) -> list[JoinResult]:
    """n dynamic members join and sync; returns their join results (leader first)."""
    replies = [new_member(core, now, group=group, **kwargs) for _ in range(n)]
    assert not any(r.done for r in replies)  # the initial delay (0 here) runs from the timer
    core.tick(now)
    results = [r.value for r in replies]
    leader = results[0]
    syncs = [sync(core, now, r.member_id, r.generation_id, group=group) for r in results[1:]]
    assert not any(s.done for s in syncs)  # followers wait for the leader
    assignment = {r.member_id: f"assigned-to-{r.member_id}".encode() for r in results}
    lead_sync = sync(core, now, leader.member_id, leader.generation_id, assignment, group=group)
    protocol_type = kwargs.get("protocol_type", "consumer")
    for r, s in zip(results, [lead_sync, *syncs], strict=True):
        assert s.value == SyncResult(E.none, protocol_type, "range", assignment[r.member_id])
    assert core.group_state(group) is GroupState.STABLE
    return results


# --- JoinGroup / SyncGroup --------------------------------------------------------------------------


def test_three_members_form_one_generation() -> None:
    core = make_core()
    results = form_group(core, 0)
    leader = results[0]
    assert {r.generation_id for r in results} == {1}
    assert {r.leader_id for r in results} == {leader.member_id}
    assert [m.member_id for m in leader.members] == [r.member_id for r in results]
    assert all(m.metadata == b"meta" for m in leader.members)
    assert all(r.members == () for r in results[1:])  # only the leader gets the member list
    assert all(r.protocol_name == "range" and r.protocol_type == "consumer" for r in results)
    assert results[0].member_id == "client-1"  # prefix is the client id
    for r in results:
        assert core.heartbeat(G, 1, r.member_id, None, 1_000) is E.none


def test_member_id_required_only_from_v4() -> None:
    core = make_core()
    old = join(core, 0, v4=False)
    assert not old.done  # v0-3: admitted at once with a generated id
    core.tick(0)
    assert old.value.error is E.none and old.value.member_id == "client-1"
    first = join(core, 10)
    assert first.value == JoinResult(E.member_id_required, "client-2")


def test_initial_rebalance_delay_extends_while_members_arrive() -> None:
    core = make_core(initial_rebalance_delay_ms=3_000)
    a = new_member(core, 0)
    core.tick(2_000)
    b = new_member(core, 2_000)
    assert core.next_deadline_ms() == 3_000
    core.tick(3_000)  # b arrived during the delay: wait another delay
    assert not a.done and not b.done
    assert core.next_deadline_ms() == 6_000
    core.tick(5_999)
    assert not a.done
    core.tick(6_000)
    assert a.value.generation_id == b.value.generation_id == 1
    assert len(a.value.members) == 2


def test_initial_rebalance_delay_never_exceeds_rebalance_timeout() -> None:
    core = make_core(initial_rebalance_delay_ms=3_000)
    replies = [new_member(core, 0, rebalance=5_000)]
    now = 0
    while not replies[0].done and now < 20_000:
        now += 1_000
        replies.append(new_member(core, now, rebalance=5_000))
        core.tick(now)
    # 3 s initial delay, then at most the 2 s left of the 5 s rebalance timeout.
    assert now == 5_000 and replies[0].value.error is E.none


def test_silent_member_is_expired_and_group_rebalances() -> None:
    core = make_core()
    a, b, c = form_group(core, 0)
    for t in (4_000, 8_000):
        assert core.heartbeat(G, 1, a.member_id, None, t) is E.none
        assert core.heartbeat(G, 1, b.member_id, None, t) is E.none
    core.tick(SESSION - 1)
    assert core.group_state(G) is GroupState.STABLE
    core.tick(SESSION)  # c's last sign of life was at 0
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    assert core.heartbeat(G, 1, a.member_id, None, SESSION) is E.rebalance_in_progress
    assert core.heartbeat(G, 1, c.member_id, None, SESSION) is E.unknown_member_id
    ra = join(core, SESSION, a.member_id)
    assert not ra.done
    rb = join(core, SESSION, b.member_id)  # everybody known has rejoined: completes at once
    assert ra.value.generation_id == rb.value.generation_id == 2
    assert ra.value.leader_id == a.member_id
    assert [m.member_id for m in ra.value.members] == [a.member_id, b.member_id]


def test_member_silent_during_a_rebalance_is_dropped_at_its_session_timeout() -> None:
    """aiokafka past max_poll_interval_ms, caught by a rebalance: it stops heartbeating and never
    rejoins (nor leaves). Its session timeout, shorter than the rebalance timeout, ends the wait."""
    core = make_core()
    a, b = form_group(core, 0, n=2)
    assert core.heartbeat(G, 1, a.member_id, None, 500) is E.none
    rc = new_member(core, 1_000)  # a newcomer starts a rebalance
    assert core.heartbeat(G, 1, a.member_id, None, 1_500) is E.rebalance_in_progress
    ra = join(core, 1_500, a.member_id)
    core.tick(SESSION - 1)  # b's last heartbeat was at 0 (form_group's SyncGroup)
    assert not ra.done
    core.tick(SESSION)
    assert ra.value.error is E.none and ra.value.generation_id == 2
    assert rc.value.generation_id == 2
    assert sorted(m.member_id for m in ra.value.members) == sorted([a.member_id, rc.value.member_id])
    assert SESSION < 1_000 + REBALANCE  # done well before the rebalance timeout
    assert core.heartbeat(G, 2, b.member_id, None, SESSION) is E.unknown_member_id


def test_leave_triggers_rebalance() -> None:
    core = make_core()
    a, b, c = form_group(core, 0)
    top, results = core.leave_group(G, [(b.member_id, None)], 100)
    assert top is E.none and [r.error for r in results] == [E.none]
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    assert core.heartbeat(G, 1, c.member_id, None, 200) is E.rebalance_in_progress
    rc = join(core, 300, c.member_id)
    ra = join(core, 300, a.member_id)
    assert ra.value.generation_id == rc.value.generation_id == 2
    assert len(ra.value.members) == 2
    _, again = core.leave_group(G, [(b.member_id, None)], 400)
    assert again[0].error is E.unknown_member_id


def test_last_member_leaving_empties_the_group() -> None:
    core = make_core()
    (a,) = form_group(core, 0, n=1)
    core.leave_group(G, [(a.member_id, None)], 10)
    assert core.group_state(G) is GroupState.EMPTY
    assert core.generation(G) == 2
    assert core.next_deadline_ms() is None


def test_rebalance_timeout_drops_members_that_did_not_rejoin() -> None:
    core = make_core()
    a, b, c = form_group(core, 0)
    ra = join(core, 1_000, a.member_id)  # the leader rejoining forces a rebalance
    rb = join(core, 1_000, b.member_id)
    assert not ra.done
    for t in range(2_000, REBALANCE, 4_000):  # c keeps heartbeating but never rejoins
        assert core.heartbeat(G, 1, c.member_id, None, t) is E.rebalance_in_progress
    core.tick(1_000 + REBALANCE - 1)
    assert not ra.done
    core.tick(1_000 + REBALANCE)
    assert ra.value.generation_id == rb.value.generation_id == 2
    assert [m.member_id for m in ra.value.members] == [a.member_id, b.member_id]
    assert core.heartbeat(G, 2, c.member_id, None, 1_000 + REBALANCE) is E.unknown_member_id


def test_members_parked_in_join_need_no_heartbeat() -> None:
    core = make_core()
    a, _ = form_group(core, 0, n=2, session=5_000, rebalance=60_000)
    ra = join(core, 1_000, a.member_id, session=5_000, rebalance=60_000)
    core.tick(30_000)  # a's session has long passed, but it is parked in JoinGroup; b was silent
    assert ra.value.error is E.none and ra.value.generation_id == 2
    assert [m.member_id for m in ra.value.members] == [a.member_id]


def test_new_member_stuck_in_join_times_out() -> None:
    core = make_core(new_member_join_timeout_ms=300_000)
    (a,) = form_group(core, 0, n=1, rebalance=600_000)
    newcomer = new_member(core, 1_000, rebalance=600_000)
    for t in range(5_000, 301_000, 5_000):  # a keeps heartbeating but does not rejoin
        core.heartbeat(G, 1, a.member_id, None, t)
        core.tick(t)
    assert not newcomer.done
    core.tick(301_000)
    assert newcomer.value == JoinResult(E.unknown_member_id, "")
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE


def test_follower_rejoin_with_same_metadata_in_stable_is_answered_at_once() -> None:
    core = make_core()
    a, b, _ = form_group(core, 0)
    again = join(core, 10, b.member_id)
    assert again.value.generation_id == 1 and again.value.leader_id == a.member_id
    assert core.group_state(G) is GroupState.STABLE
    changed = join(core, 20, b.member_id, protocols=[("range", b"other")])
    assert not changed.done
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE


def test_sync_errors() -> None:
    core = make_core()
    a, b, _ = form_group(core, 0)
    assert sync(core, 1, a.member_id, 7).value.error is E.illegal_generation
    assert sync(core, 1, "nobody", 1).value.error is E.unknown_member_id
    assert sync(core, 1, a.member_id, 1, group="other").value.error is E.unknown_member_id
    wrong = Reply()
    core.sync_group(G, 1, a.member_id, None, "connect", None, {}, 1, wrong)
    assert wrong.value.error is E.inconsistent_group_protocol
    stable_again = sync(core, 2, b.member_id, 1)  # Stable: the current assignment again
    assert stable_again.value.assignment == f"assigned-to-{b.member_id}".encode()
    join(core, 3, a.member_id)
    assert sync(core, 4, b.member_id, 1).value.error is E.rebalance_in_progress


def test_followers_waiting_in_sync_are_sent_back_when_the_group_changes() -> None:
    core = make_core()
    ra, rb = new_member(core, 0), new_member(core, 0)
    core.tick(0)
    a, b = ra.value, rb.value
    waiting = sync(core, 1, b.member_id, 1)
    assert not waiting.done
    newcomer = new_member(core, 2)  # CompletingRebalance -> PreparingRebalance
    assert waiting.value.error is E.rebalance_in_progress
    assert core.heartbeat(G, 1, a.member_id, None, 3) is E.rebalance_in_progress
    join(core, 4, a.member_id)
    join(core, 4, b.member_id)
    assert newcomer.value.generation_id == 2


def test_member_that_never_syncs_is_removed_after_rebalance_timeout() -> None:
    core = make_core()
    ra, rb = new_member(core, 0), new_member(core, 0)
    core.tick(0)
    a, b = ra.value, rb.value
    sync(core, 10, a.member_id, 1, {a.member_id: b"x", b.member_id: b"y"})
    assert core.group_state(G) is GroupState.STABLE
    for t in range(4_000, REBALANCE, 4_000):
        core.heartbeat(G, 1, a.member_id, None, t)
        core.heartbeat(G, 1, b.member_id, None, t)
    core.tick(REBALANCE)  # b joined but never synced
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    assert core.heartbeat(G, 1, b.member_id, None, REBALANCE) is E.unknown_member_id


def test_completing_rebalance_heartbeats_are_fine() -> None:
    core = make_core()
    ra = new_member(core, 0)
    core.tick(0)
    assert core.group_state(G) is GroupState.COMPLETING_REBALANCE
    assert core.heartbeat(G, 1, ra.value.member_id, None, 5) is E.none
    assert core.heartbeat(G, 0, ra.value.member_id, None, 5) is E.illegal_generation


def test_join_errors() -> None:
    core = make_core(min_session_timeout_ms=6_000, max_size=3)
    assert join(core, 0, session=1_000).value.error is E.invalid_session_timeout
    assert join(core, 0, group="").value.error is E.invalid_group_id
    assert join(core, 0, "made-up").value.error is E.unknown_member_id
    form_group(core, 0, n=2)
    assert join(core, 0, protocol_type="connect").value.error is E.inconsistent_group_protocol
    assert join(core, 0, protocols=[("sticky", b"")]).value.error is E.inconsistent_group_protocol
    form_group(core, 0, n=3, group="full")
    assert join(core, 0, group="full").value == JoinResult(E.group_max_size_reached, "")
    # While rebalancing, the limit counts the members that rejoined (Kafka sheds the last ones).
    assert not new_member(core, 0).done
    assert join(core, 0).value.error is E.member_id_required
    assert join(core, 0, group="fresh", protocols=[]).value.error is E.inconsistent_group_protocol
    assert join(core, 0, group="fresh", protocol_type="").value.error is E.inconsistent_group_protocol


def test_protocol_with_most_votes_among_common_ones() -> None:
    core = make_core()
    prefs = [
        [("range", b"1"), ("roundrobin", b"1"), ("sticky", b"1")],
        [("roundrobin", b"2"), ("range", b"2")],
        [("roundrobin", b"3"), ("range", b"3"), ("sticky", b"3")],
    ]
    replies = [new_member(core, 0, protocols=p) for p in prefs]
    core.tick(0)
    assert {r.value.protocol_name for r in replies} == {"roundrobin"}
    leader = replies[0].value
    assert [m.metadata for m in leader.members] == [b"1", b"2", b"3"]  # metadata of the chosen protocol


def test_pending_member_blocks_join_until_its_session_expires() -> None:
    core = make_core()
    (a,) = form_group(core, 0, n=1)
    first = join(core, 100)  # gets an id but never comes back
    assert first.value.error is E.member_id_required
    ra = join(core, 100, a.member_id)
    assert not ra.done  # waits for the pending member
    core.tick(100 + SESSION)
    assert ra.value.generation_id == 2 and len(ra.value.members) == 1


def test_superseded_join_is_answered() -> None:
    core = make_core()
    a, b = form_group(core, 0, n=2)
    first = join(core, 1, a.member_id)
    second = join(core, 2, a.member_id)
    assert first.value.error is E.rebalance_in_progress
    join(core, 3, b.member_id)
    assert second.value.generation_id == 2


# --- static membership ------------------------------------------------------------------------------


def static_group(core: GroupCoordinatorCore) -> tuple[JoinResult, JoinResult]:
    ra = join(core, 0, instance="inst-a")
    rb = join(core, 0, instance="inst-b")  # static members never get MEMBER_ID_REQUIRED
    core.tick(0)
    a, b = ra.value, rb.value
    assert a.member_id == "inst-a-1" and b.member_id == "inst-b-2"
    assignment = {a.member_id: b"A", b.member_id: b"B"}
    sync(core, 0, b.member_id, 1, instance="inst-b")
    sync(core, 0, a.member_id, 1, assignment, instance="inst-a")
    assert core.group_state(G) is GroupState.STABLE
    return a, b


@pytest.mark.parametrize("restart", ["leader", "follower"])
def test_static_member_restart_keeps_generation_when_stable(restart: str) -> None:
    core = make_core()
    a, b = static_group(core)
    old, instance, expected = (a, "inst-a", b"A") if restart == "leader" else (b, "inst-b", b"B")
    back = join(core, 5_000, instance=instance)
    assert back.value.error is E.none
    assert back.value.generation_id == 1
    assert back.value.member_id != old.member_id
    assert back.value.leader_id == a.member_id  # the old leader id: nobody runs the assignor
    assert back.value.members == ()
    assert core.group_state(G) is GroupState.STABLE
    got = sync(core, 5_001, back.value.member_id, 1, instance=instance)
    assert got.value == SyncResult(E.none, "consumer", "range", expected)
    # The zombie with the old member id is fenced; the other member noticed nothing.
    assert core.heartbeat(G, 1, old.member_id, instance, 5_002) is E.fenced_instance_id
    other = b if restart == "leader" else a
    other_instance = "inst-b" if restart == "leader" else "inst-a"
    assert core.heartbeat(G, 1, other.member_id, other_instance, 5_002) is E.none
    assert core.generation(G) == 1


def test_static_leader_restart_with_skip_assignment() -> None:
    core = make_core()
    _, b = static_group(core)
    back = join(core, 10, instance="inst-a", skip=True)
    assert back.value.skip_assignment and back.value.leader_id == back.value.member_id
    assert {m.member_id for m in back.value.members} == {back.value.member_id, b.member_id}
    assert back.value.generation_id == 1


def test_static_member_restart_with_other_selected_protocol_rebalances() -> None:
    core = make_core()
    both = [("range", b""), ("roundrobin", b"")]
    ra = join(core, 0, instance="inst-a", protocols=both)
    rb = join(core, 0, instance="inst-b", protocols=both)
    core.tick(0)
    sync(core, 0, ra.value.member_id, 1, {}, instance="inst-a")
    assert core.group_state(G) is GroupState.STABLE
    back = join(core, 10, instance="inst-b", protocols=[("roundrobin", b"")])  # only roundrobin is common now
    assert not back.done
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    assert core.heartbeat(G, 1, rb.value.member_id, "inst-b", 11) is E.fenced_instance_id
    join(core, 12, ra.value.member_id, instance="inst-a", protocols=both)
    assert back.value.generation_id == 2 and back.value.protocol_name == "roundrobin"


def test_static_member_restart_with_new_metadata_keeps_generation() -> None:
    core = make_core()
    static_group(core)
    back = join(core, 10, instance="inst-a", protocols=[("range", b"new-subscription")])
    # The selected protocol does not change: no rebalance, even with new metadata (Kafka's rule).
    assert back.value.generation_id == 1
    assert core.group_state(G) is GroupState.STABLE


def test_static_member_fencing() -> None:
    core = make_core()
    a, _ = static_group(core)
    assert core.heartbeat(G, 1, "inst-a-999", "inst-a", 1) is E.fenced_instance_id
    assert core.heartbeat(G, 1, a.member_id, "inst-unknown", 1) is E.unknown_member_id
    assert join(core, 1, "inst-a-999", instance="inst-a").value.error is E.fenced_instance_id
    assert sync(core, 1, "inst-a-999", 1, instance="inst-a").value.error is E.fenced_instance_id
    assert core.validate_commit(G, 1, "inst-a-999", "inst-a", 1) is E.fenced_instance_id
    _, left = core.leave_group(G, [("inst-a-999", "inst-a")], 1)
    assert left[0].error is E.fenced_instance_id


def test_duplicate_static_instance_parked_in_sync_is_fenced() -> None:
    core = make_core()
    ra = join(core, 0, instance="inst-a")
    rb = join(core, 0, instance="inst-b")
    core.tick(0)
    parked = sync(core, 1, rb.value.member_id, 1, instance="inst-b")
    twin = join(core, 2, instance="inst-b")  # a second process with the same instance id
    assert parked.value.error is E.fenced_instance_id
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE  # CompletingRebalance restarts
    join(core, 3, ra.value.member_id, instance="inst-a")
    assert twin.value.generation_id == 2


def test_static_members_that_do_not_rejoin_are_kept() -> None:
    core = make_core()
    a, b = static_group(core)
    ra = join(core, 100, a.member_id, instance="inst-a")  # leader rejoin: rebalance
    for t in range(4_000, REBALANCE + 1, 4_000):  # b stays alive but does not rejoin
        assert core.heartbeat(G, 1, b.member_id, "inst-b", t) is E.rebalance_in_progress
    core.tick(100 + REBALANCE)
    assert ra.value.generation_id == 2
    assert {m.member_id for m in ra.value.members} == {a.member_id, b.member_id}
    # b rejoins with its id and the same metadata: gets generation 2 without another rebalance.
    rb = join(core, 100 + REBALANCE, b.member_id, instance="inst-b")
    assert rb.value.generation_id == 2


def test_leader_that_does_not_rejoin_is_replaced_by_one_that_did() -> None:
    core = make_core()
    a, b = static_group(core)  # a leads
    rb = join(core, 100, b.member_id, instance="inst-b", protocols=[("range", b"changed")])
    for t in range(4_000, REBALANCE + 1, 4_000):
        core.heartbeat(G, 1, a.member_id, "inst-a", t)  # static a stays, but does not rejoin
    core.tick(100 + REBALANCE)
    assert rb.value.leader_id == b.member_id
    assert {m.member_id for m in rb.value.members} == {a.member_id, b.member_id}


def test_leave_by_instance_id_and_pending_member() -> None:
    core = make_core()
    _, b = static_group(core)
    pending = join(core, 1, protocols=RANGE)
    assert pending.value.error is E.member_id_required
    top, results = core.leave_group(
        G, [("", "inst-b"), (pending.value.member_id, None), ("", "inst-zzz"), ("ghost", None)], 2
    )
    assert top is E.none
    assert [r.error for r in results] == [E.none, E.none, E.unknown_member_id, E.unknown_member_id]
    assert core.heartbeat(G, 1, b.member_id, "inst-b", 3) is E.unknown_member_id
    assert core.leave_group("nope", [("x", None)], 3) == (E.none, [LeaveResult("x", None, E.unknown_member_id)])
    assert core.leave_group("", [("x", None)], 3) == (E.invalid_group_id, [])


# --- offsets ----------------------------------------------------------------------------------------


def om(offset: int, ts: int = 0) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, 3, f"m{offset}", ts)


def test_offsets_validate_apply_fetch() -> None:
    core = make_core()
    # A simple consumer (no group management) commits to an unknown group.
    assert core.validate_commit("simple", -1, "", None, 0) is E.none
    assert core.fetch_offsets("simple") == {}  # nothing stored before persistence is confirmed
    core.apply_offsets("simple", {("t", 0): om(5)})
    assert core.fetch_offsets("simple") == {("t", 0): om(5)}
    assert core.group_state("simple") is GroupState.EMPTY
    assert core.validate_commit("simple", -1, "", None, 0) is E.none  # Empty group: still fine
    assert core.validate_commit("ghost", 3, "m", None, 0) is E.illegal_generation
    a, b, c = form_group(core, 0)
    assert core.validate_commit(G, -1, "", None, 1) is E.unknown_member_id  # non-members once it has members
    assert core.validate_commit(G, 0, a.member_id, None, 1) is E.illegal_generation
    assert core.validate_commit(G, 1, "stranger", None, 1) is E.unknown_member_id
    assert core.commit_offsets(G, 1, a.member_id, None, {("t", 1): om(7), ("t", 2): om(8)}, 1) is E.none
    assert core.fetch_offsets(G, [("t", 1), ("t", 9)]) == {("t", 1): om(7)}
    assert set(core.fetch_offsets(G)) == {("t", 1), ("t", 2)}
    join(core, 2, a.member_id)  # PreparingRebalance: commits of the old generation still go through
    assert core.validate_commit(G, 1, b.member_id, None, 3) is E.none
    join(core, 4, b.member_id)
    join(core, 4, c.member_id)
    assert core.group_state(G) is GroupState.COMPLETING_REBALANCE
    assert core.validate_commit(G, 2, b.member_id, None, 5) is E.rebalance_in_progress


def test_commit_counts_as_heartbeat() -> None:
    core = make_core()
    (a,) = form_group(core, 0, n=1)
    core.validate_commit(G, 1, a.member_id, None, SESSION - 1)
    core.tick(SESSION)
    assert core.group_state(G) is GroupState.STABLE


def consumer_subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def test_parse_subscription() -> None:
    assert parse_subscribed_topics(consumer_subscription("a", "b")) == {"a", "b"}
    assert parse_subscribed_topics(b"\x00") is None
    assert parse_subscribed_topics(struct.pack(">hih", 0, 1, 10) + b"ab") is None


def test_delete_offsets() -> None:
    core = make_core()
    core.apply_offsets("empty", {("t", 0): om(1), ("t", 1): om(2)})
    assert core.delete_offsets("empty", [("t", 0)]) == {("t", 0): E.none}
    assert core.fetch_offsets("empty") == {("t", 1): om(2)}
    assert core.delete_offsets("unknown", [("t", 0)]) == {("t", 0): E.group_id_not_found}
    # A consumer group with members keeps the offsets of the topics it subscribes to.
    form_group(core, 0, n=2, protocols=[("range", consumer_subscription("orders"))])
    core.apply_offsets(G, {("orders", 0): om(1), ("old", 0): om(2)})
    assert core.delete_offsets(G, [("orders", 0), ("old", 0)]) == {
        ("orders", 0): E.group_subscribed_to_topic,
        ("old", 0): E.none,
    }
    assert core.fetch_offsets(G) == {("orders", 0): om(1)}
    # Unparseable subscriptions: assume subscribed to everything.
    form_group(core, 0, n=1, group="opaque", protocols=[("range", b"??")])
    core.apply_offsets("opaque", {("x", 0): om(1)})
    assert core.delete_offsets("opaque", [("x", 0)]) == {("x", 0): E.group_subscribed_to_topic}
    # Groups of another protocol type with members cannot delete at all.
    form_group(core, 0, n=1, group="connect", protocol_type="connect")
    assert core.check_delete_offsets("connect", [("x", 0)]) == (E.non_empty_group, {})


def test_delete_group() -> None:
    core = make_core()
    core.apply_offsets("g1", {("t", 0): om(1)})
    form_group(core, 0, n=1)
    assert core.delete_group(G) is E.non_empty_group
    assert core.delete_group("nope") is E.group_id_not_found
    assert core.prepare_delete_group("g1") is E.none
    # While its tombstones are written the group is Dead: nobody joins or commits.
    assert join(core, 1, group="g1").value.error is E.coordinator_not_available
    assert core.validate_commit("g1", -1, "", None, 1) is E.coordinator_not_available
    assert core.prepare_delete_group("g1") is E.group_id_not_found
    assert "g1" not in [g.group_id for g in core.list_groups()]
    core.abort_delete_group("g1")  # persisting failed: nothing happened
    assert core.group_state("g1") is GroupState.EMPTY
    assert core.delete_group("g1") is E.none
    assert core.fetch_offsets("g1") == {}
    d = core.describe_group("g1")
    assert not d.exists and d.state == "Dead" and d.members == ()


def test_expired_offsets_and_pruning() -> None:
    core = make_core()
    core.apply_offsets("simple", {("t", 0): om(1, ts=0), ("t", 1): om(2, ts=500)})
    (a,) = form_group(core, 0, n=1, protocols=[("range", consumer_subscription("live"))])
    core.commit_offsets(G, 1, a.member_id, None, {("live", 0): om(1), ("gone", 0): om(2)}, 0)
    assert core.expired_offsets(999, 1_000) == {}
    assert core.expired_offsets(1_000, 1_000) == {"simple": [("t", 0)], G: [("gone", 0)]}
    core.leave_group(G, [(a.member_id, None)], 2_000)  # Empty since 2000: all its offsets go at 3000
    assert core.expired_offsets(2_999, 1_000) == {"simple": [("t", 0), ("t", 1)]}
    assert core.expired_offsets(3_000, 1_000)[G] == [("live", 0), ("gone", 0)]
    core.remove_offsets(G, [("live", 0), ("gone", 0)])
    assert core.prune_empty_groups() == [G]
    assert core.group_state(G) is None


def test_offsets_of_topics_outside_the_subscription_expire_only_while_the_group_is_stable() -> None:
    """Kafka expires them by commit time only in a Stable group: during a rebalance the
    subscription of the last generation may be changing (a member rejoining for another topic must
    find that topic's offsets when it gets its partitions)."""
    core = make_core()
    a, b = form_group(core, 0, n=2, protocols=[("range", consumer_subscription("live"))])
    core.commit_offsets(G, 1, a.member_id, None, {("live", 0): om(1), ("next", 0): om(2)}, 0)
    both = [("range", consumer_subscription("live", "next"))]
    rejoin_a = join(core, 500, a.member_id, protocols=both)
    assert core.group_state(G) is GroupState.PREPARING_REBALANCE
    assert core.expired_offsets(1_000, 1_000) == {}
    rejoin_b = join(core, 500, b.member_id, protocols=both)
    assert core.group_state(G) is GroupState.COMPLETING_REBALANCE
    assert core.expired_offsets(1_000, 1_000) == {}
    generation = rejoin_a.value.generation_id
    sync(core, 500, b.member_id, generation)
    sync(core, 500, a.member_id, generation, {a.member_id: b"x", b.member_id: b"y"})
    assert rejoin_b.value.error is E.none and core.group_state(G) is GroupState.STABLE
    assert core.expired_offsets(1_000, 1_000) == {}  # "next" is subscribed now


# --- ListGroups / DescribeGroups / unload -------------------------------------------------------


def test_list_and_describe() -> None:
    core = make_core()
    a, b, c = form_group(core, 0)
    core.apply_offsets("simple", {("t", 0): om(1)})
    new_member(core, 0, group="forming")
    assert {(g.group_id, g.state, g.protocol_type) for g in core.list_groups()} == {
        (G, "Stable", "consumer"),
        ("simple", "Empty", ""),
        ("forming", "PreparingRebalance", "consumer"),
    }
    assert [g.group_id for g in core.list_groups(["stable", "Empty"])] == [G, "simple"]
    d = core.describe_group(G)
    assert d.state == "Stable" and d.protocol_data == "range" and d.exists
    assert [(m.member_id, m.client_id, m.client_host, m.metadata) for m in d.members] == [
        (r.member_id, "client", "/127.0.0.1", b"meta") for r in (a, b, c)
    ]
    assert d.members[1].assignment == f"assigned-to-{b.member_id}".encode()
    forming = core.describe_group("forming")
    assert forming.protocol_data == "" and forming.members[0].metadata == b""


def test_unload_answers_parked_requests() -> None:
    core = make_core()
    new_member(core, 0)
    rb = new_member(core, 0)
    core.tick(0)
    parked_sync = sync(core, 1, rb.value.member_id, 1)
    parked_join = new_member(core, 2, group="other")
    core.shutdown()  # what the broker calls when it loses the partition
    assert parked_sync.value.error is E.not_coordinator
    assert parked_join.value.error is E.not_coordinator
    assert core.list_groups() == [] and core.next_deadline_ms() is None


def test_callbacks_may_reenter_the_core() -> None:
    core = make_core()
    seen: list[SyncResult] = []

    def on_join(result: JoinResult) -> None:
        # The group is consistent when the reply arrives: syncing from the callback works.
        core.sync_group(
            G, result.generation_id, result.member_id, None, None, None, {result.member_id: b"x"}, 0, seen.append
        )

    first = join(core, 0)
    core.join_group(G, first.value.member_id, None, "consumer", RANGE, SESSION, REBALANCE, 0, on_join)
    core.tick(0)
    assert seen == [SyncResult(E.none, "consumer", "range", b"x")]


# --- records ----------------------------------------------------------------------------------------


def test_records_round_trip() -> None:
    value = OffsetAndMetadata(42, 7, "métadonnée", 1_700_000_000_000)
    key, raw = records.encode_offset("g", "topic", 3, value)
    assert records.decode(key, raw) == records.OffsetCommitRecord("g", "topic", 3, value)
    assert key == records.offset_key("g", "topic", 3)  # deterministic keys: compaction works
    assert records.decode(*records.encode_offset_tombstone("g", "topic", 3)) == records.OffsetTombstone("g", "topic", 3)
    assert records.decode(*records.encode_group_tombstone("g")) == records.GroupTombstone("g")
    assert records.encode_group_tombstone("g")[0] != key


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"", None),
        (b"\x09" + b"\x90", None),
        (b"\x01\xff\xff", None),
        (records.offset_key("g", "t", 0), b"\x07\x94\x01\x02\xa0\x03"),
        (records.offset_key("g", "t", 0), b"\x01\x92\x01\x02"),
        (records.group_key("g"), b"\x01\x90"),
    ],
)
def test_records_refuse_what_they_do_not_know(key: bytes, value: bytes | None) -> None:
    with pytest.raises(records.RecordFormatError):
        records.decode(key, value)


def test_replay_rebuilds_offsets() -> None:
    log = [
        records.encode_offset("a", "t", 0, om(1)),
        records.encode_offset("a", "t", 1, om(2)),
        records.encode_offset("b", "t", 0, om(3)),
        records.encode_offset("a", "t", 0, om(4)),
        records.encode_offset_tombstone("a", "t", 1),
        records.encode_offset("c", "t", 0, om(5)),
        *records.group_deletion_records("c", []),  # the group tombstone alone drops c's offsets
        records.encode_offset("c", "u", 0, om(6)),  # c committed again after its deletion
    ]
    core = make_core()
    assert records.replay(core, log, 0) == len(log)
    assert core.fetch_offsets("a") == {("t", 0): om(4)}
    assert core.fetch_offsets("b") == {("t", 0): om(3)}
    assert core.fetch_offsets("c") == {("u", 0): om(6)}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["g1", "g2", "ж"]),
            st.sampled_from(["t", "u"]),
            st.integers(0, 2),
            st.one_of(st.none(), st.integers(0, 2**63 - 1)),
        ),
        max_size=40,
    )
)
def test_replay_matches_a_dict_model(ops: list[tuple[str, str, int, int | None]]) -> None:
    model: dict[tuple[str, str, int], int] = {}
    log = []
    for group, topic, partition, offset in ops:
        if offset is None:
            log.append(records.encode_offset_tombstone(group, topic, partition))
            model.pop((group, topic, partition), None)
        else:
            log.append(records.encode_offset(group, topic, partition, OffsetAndMetadata(offset)))
            model[(group, topic, partition)] = offset
    core = make_core()
    records.replay(core, log, 0)
    rebuilt = {(g, t, p): v.offset for g in ("g1", "g2", "ж") for (t, p), v in core.fetch_offsets(g).items()}
    assert rebuilt == model


def test_partition_for_matches_java() -> None:
    # Values printed by jshell: "hello".hashCode() etc.
    assert records.java_string_hash("hello") == 99162322
    assert records.java_string_hash("") == 0
    # "group-1" by hand: sum(c * 31^(n-1-i)) = 109_185_316_707 (mod 2^32) = 293_427_299
    assert records.java_string_hash("group-1") == 293427299
    assert records.java_string_hash("console-consumer-12345") == 158455506
    assert records.java_string_hash("héllo wörld") == 1628148953
    assert records.java_string_hash("\U0001f600") == 1772899  # a surrogate pair: two UTF-16 units
    assert records.java_string_hash("polygenelubricants") == -(2**31)
    assert records.partition_for("hello", 50) == 99162322 % 50 == 22
    assert records.partition_for("group-1", 50) == 49
    assert records.partition_for("polygenelubricants", 50) == 0  # Utils.abs(MIN_VALUE) == 0
    assert records.partition_for("", 50) == 0
    negative = "console-consumer-1"
    h = records.java_string_hash(negative)
    assert records.partition_for(negative, 7) == abs(h) % 7


# --- random interleavings -------------------------------------------------------------------------


@dataclass
class Actor:
    """A client process as the coordinator's callers see it."""

    index: int
    instance: str | None
    member_id: str = ""
    generation: int = -1
    leader: str = ""
    members: tuple[str, ...] = ()
    incarnation: int = 0
    ids: set[str] = field(default_factory=set)
    joining: bool = False
    syncing: bool = False
    needs_join: bool = True  # what a real client knows: it must (re)join
    synced: bool = False


class World:
    def __init__(self, n: int, static: list[bool], delay: int, max_size: int) -> None:
        self.core = make_core(initial_rebalance_delay_ms=delay, max_size=max_size)
        self.now = 0
        self.actors = [Actor(i, f"inst-{i}" if static[i] else None) for i in range(n)]
        self.replies: list[Reply] = []
        # generation -> actor index -> assignment payload "generation|leader|member|all members"
        self.assigned: dict[int, dict[int, bytes]] = {}
        # generation -> the member list its leader got to compute the assignment
        self.plans: dict[int, tuple[str, ...]] = {}
        self.max_generation = 0

    def _reply(self, actor: Actor, kind: str) -> Reply:
        incarnation, generation = actor.incarnation, actor.generation

        def deliver(result: Any) -> None:
            if isinstance(result, JoinResult) and result.error is E.none:
                # A static member's next incarnation inherits this id's assignment.
                actor.ids.add(result.member_id)
            if actor.incarnation != incarnation:
                return  # the process that sent it is gone
            if kind == "join":
                actor.joining = False
                self.on_join(actor, result)
            else:
                actor.syncing = False
                self.on_sync(actor, generation, result)

        reply = Reply(deliver)
        self.replies.append(reply)
        return reply

    def on_join(self, actor: Actor, result: JoinResult) -> None:
        if result.error is E.none:
            assert result.generation_id >= self.max_generation, "a generation went backwards"
            self.max_generation = max(self.max_generation, result.generation_id)
            actor.member_id, actor.generation, actor.leader = result.member_id, result.generation_id, result.leader_id
            actor.ids.add(result.member_id)
            actor.members = tuple(m.member_id for m in result.members)
            actor.needs_join, actor.synced = False, False
            if result.members and not result.skip_assignment:
                assert result.member_id in actor.members
                plan = tuple(sorted(actor.members))
                assert self.plans.setdefault(result.generation_id, plan) == plan, "two rebalances, one generation"
        elif result.error is E.member_id_required:
            actor.member_id = result.member_id
        else:
            self.on_error(actor, result.error)

    def on_sync(self, actor: Actor, gen: int, result: SyncResult) -> None:
        if result.error is E.none:
            if result.assignment:
                g, leader, member, plan = result.assignment.decode().split("|")
                assert int(g) == gen, "assignment of another generation"
                assert member in actor.ids, "assignment meant for another member"
                others = self.assigned.setdefault(gen, {})
                for index, payload in others.items():
                    if index != actor.index:
                        _, other_leader, _, other_plan = payload.decode().split("|")
                        assert (other_leader, other_plan) == (leader, plan), "two assignments in one generation"
                        assert payload != result.assignment, "two members with the same assignment"
                others[actor.index] = result.assignment
            actor.synced = True
        else:
            self.on_error(actor, result.error)

    @staticmethod
    def on_error(actor: Actor, error: ErrorCode) -> None:
        if error is E.none:
            return
        actor.needs_join = True
        if error in (E.unknown_member_id, E.fenced_instance_id):
            actor.member_id, actor.generation = "", -1

    def step(self, op: tuple[str, int, int]) -> None:
        kind, i, arg = op
        actor = self.actors[i % len(self.actors)]
        core = self.core
        if kind == "act":
            # Whatever a well-behaved client does next; keeps generations completing.
            if actor.joining or actor.syncing:
                kind = "heartbeat"
            elif actor.needs_join:
                kind = "join"
            elif not actor.synced:
                kind = "sync"
            else:
                kind = "heartbeat"
        if kind == "tick":
            self.now += arg
            core.tick(self.now)
        elif kind == "join" and not actor.joining and not actor.syncing and (actor.needs_join or arg == 9):
            # arg == 9: an unprompted rejoin (a leader noticing new partitions, new metadata...).
            actor.joining = True
            meta = b"v2" if arg % 5 == 0 else b"v1"
            core.join_group(
                G,
                actor.member_id,
                actor.instance,
                "consumer",
                [("range", meta)],
                SESSION,
                REBALANCE + 1_000 * (arg % 3),
                self.now,
                self._reply(actor, "join"),
                support_skip_assignment=arg % 2 == 0,
            )
        elif kind == "sync" and actor.generation > 0 and not (actor.joining or actor.syncing or actor.synced):
            actor.syncing = True
            assignment = {}
            if actor.leader == actor.member_id:
                plan = ",".join(sorted(actor.members))
                assignment = {m: f"{actor.generation}|{actor.member_id}|{m}|{plan}".encode() for m in actor.members}
            core.sync_group(
                G,
                actor.generation,
                actor.member_id,
                actor.instance,
                None,
                None,
                assignment,
                self.now,
                self._reply(actor, "sync"),
            )
        elif kind == "heartbeat" and actor.member_id:
            self.on_error(actor, core.heartbeat(G, actor.generation, actor.member_id, actor.instance, self.now))
        elif kind == "leave" and actor.member_id and arg < 3:
            core.leave_group(G, [(actor.member_id, actor.instance)], self.now)
            actor.member_id, actor.generation, actor.needs_join = "", -1, True
        elif kind == "restart" and actor.instance is not None and arg < 3:
            # The process dies and comes back without its member id (static membership's case).
            actor.incarnation += 1
            actor.member_id, actor.generation, actor.joining, actor.syncing = "", -1, False, False
            actor.needs_join = True
        elif kind == "commit" and actor.member_id:
            core.validate_commit(G, actor.generation, actor.member_id, actor.instance, self.now)
        self.check_core()

    def check_core(self) -> None:
        group = self.core._groups.get(G)
        if group is None:
            return
        members = group.members
        if members:
            assert group.leader_id in members
        assert set(group.static_members.values()) <= set(members)
        for instance, member_id in group.static_members.items():
            assert members[member_id].group_instance_id == instance
        if group.state is GroupState.EMPTY:
            assert not members
        if group.state is GroupState.STABLE:
            assert not any(m.join_reply or m.sync_reply for m in members.values())
        if group.state is GroupState.PREPARING_REBALANCE:
            assert group.join_deadline_ms is not None
            assert not any(m.sync_reply for m in members.values())
        counts = {p: c for p, c in group.supported_protocols.items() if c}
        expected: dict[str, int] = {}
        for m in members.values():
            for name, _ in m.protocols:
                expected[name] = expected.get(name, 0) + 1
        assert counts == expected


# "act" is a client's natural next step (join, sync or heartbeat); the others perturb the group.
CLIENT_OPS = ["join", "join", "sync", "sync", "heartbeat", "heartbeat", "leave", "restart", "commit"]
OPS = st.one_of(
    st.tuples(st.just("act"), st.integers(0, 3), st.integers(0, 8)),
    st.tuples(st.just("tick"), st.just(0), st.sampled_from([0, 1, 500, 1_000, 2_000, 3_000, 25_000])),
    st.tuples(st.sampled_from(CLIENT_OPS), st.integers(0, 3), st.integers(0, 9)),
)


@given(
    st.lists(OPS, max_size=120),
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.sampled_from([0, 3_000]),
    st.sampled_from([3, 100]),
)
def test_random_interleavings_never_split_a_generation(
    ops: list[tuple[str, int, int]], static: list[bool], delay: int, max_size: int
) -> None:
    world = World(4, static, delay, max_size)
    for op in ops:
        world.step(op)
    # Run the clock out, then let the coordinator go: every parked request must be answered once.
    world.now += 10 * REBALANCE
    world.core.tick(world.now)
    world.core.unload()
    assert all(r.done for r in world.replies)


@given(
    st.lists(OPS, max_size=80),
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.sampled_from([0, 3_000]),
    st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_members_that_leave_or_go_silent_never_stall_the_others(
    ops: list[tuple[str, int, int]], static: list[bool], delay: int, alive: list[bool]
) -> None:
    """Liveness (issue 9): after any history, the members that stop (dynamic ones send LeaveGroup,
    as aiokafka does past max_poll_interval_ms; static ones just go silent) never hold up the
    others, who keep acting as well-behaved clients: the group is Stable with exactly them, all
    synced, within a bounded time (a rebalance timeout for a rebalance already under way, a
    session timeout for silent or pending members, another rebalance timeout for the rebalance
    their removal starts, plus heartbeat slack)."""
    world = World(4, static, delay, 100)
    for op in ops:
        world.step(op)
    survivors = [actor for actor, keep in zip(world.actors, alive, strict=True) if keep]
    for actor, keep in zip(world.actors, alive, strict=True):
        if not keep and actor.member_id and actor.instance is None:
            world.step(("leave", actor.index, 0))
    start = world.now
    bound = 3 * (REBALANCE + 2_000) + 2 * SESSION + 10_000
    while True:
        for actor in survivors:
            world.step(("act", actor.index, 1))
        group = world.core._groups.get(G)
        if survivors:
            settled = (
                group is not None
                and group.state is GroupState.STABLE
                and set(group.members) == {a.member_id for a in survivors}
                and all(a.synced and not a.needs_join for a in survivors)
            )
        else:
            settled = group is None or group.state is GroupState.EMPTY
        if settled:
            break
        assert world.now - start < bound, (
            f"stalled {world.now - start} ms in {group and group.state}: members {group and list(group.members)}"
        )
        world.step(("tick", 0, 500))

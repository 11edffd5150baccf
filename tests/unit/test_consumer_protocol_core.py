"""KIP-848 consumer groups (ConsumerGroupHeartbeat) in the sans-IO coordinator core."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.groups.consumer_protocol import ConsumerGroupConfig, HeartbeatRequest, HeartbeatResult
from diskless.groups.coordinator import GroupCoordinatorCore, OffsetAndMetadata

TOPIC = "t"
GROUP = "g"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000


def make_core(partitions: int = 12, **config: int) -> GroupCoordinatorCore:
    return GroupCoordinatorCore(
        consumer_config=ConsumerGroupConfig(**config),
        partitions_of=lambda topic: partitions if topic == TOPIC else None,
    )


class Member:
    """A well-behaved client: applies assignments, revokes what it no longer gets."""

    def __init__(self, core: GroupCoordinatorCore, member_id: str, clock: Clock, instance_id: str | None = None):
        self.core, self.member_id, self.clock, self.instance_id = core, member_id, clock, instance_id
        self.epoch = 0
        self.owned: set[int] = set()

    def heartbeat(self, **overrides: object) -> HeartbeatResult:
        fields: dict[str, object] = {
            "group_id": GROUP,
            "member_id": self.member_id,
            "member_epoch": self.epoch,
            "instance_id": self.instance_id,
            "owned": {TOPIC: frozenset(self.owned)} if self.owned else {},
        }
        if self.epoch == 0:
            fields.update(rebalance_timeout_ms=30_000, subscribed_topic_names=(TOPIC,), owned={})
        fields.update(overrides)
        result = self.core.consumer_group_heartbeat(HeartbeatRequest(**fields), self.clock.now)  # type: ignore[arg-type]
        if result.error is ErrorCode.none and result.member_epoch >= 0:
            self.epoch = result.member_epoch
            if result.assignment is not None:
                self.owned = set(result.assignment.get(TOPIC, frozenset()))
        return result


def assert_exclusive(core: GroupCoordinatorCore) -> None:
    """No partition is owned (assigned or pending revocation) by two members."""
    group = core.consumer.group(GROUP)
    assert group is not None
    seen: set[tuple[str, int]] = set()
    for m in group.members.values():
        owns = m.owns()
        assert not owns & seen, f"partition owned twice: {owns & seen}"
        seen |= owns


def converge(members: list[Member], rounds: int = 10) -> None:
    for _ in range(rounds):
        for m in members:
            assert m.heartbeat().error is ErrorCode.none
            assert_exclusive(m.core)


def test_three_members_get_disjoint_assignments_covering_all_partitions() -> None:
    core, clock = make_core(), Clock()
    members = [Member(core, f"m{i}", clock) for i in range(3)]
    converge(members)
    assert sorted(len(m.owned) for m in members) == [4, 4, 4]
    assert set().union(*(m.owned for m in members)) == set(range(12))
    group = core.consumer.group(GROUP)
    assert group is not None and group.state.value == "Stable"
    assert all(m.epoch == group.group_epoch == 3 for m in members)


def test_new_member_gets_partitions_only_after_revocation() -> None:
    core, clock = make_core(), Clock()
    members = [Member(core, f"m{i}", clock) for i in range(3)]
    converge(members)
    late = Member(core, "m3", clock)
    late.heartbeat()
    assert late.owned == set()  # everything is still owned by the others
    first = members[0]
    before = set(first.owned)
    # m0 learns it must give one partition up: its epoch stays until it confirms.
    result = first.heartbeat()
    assert len(first.owned) == 3 and result.member_epoch == 3
    revoked = before - first.owned
    late.heartbeat()
    assert not late.owned & revoked
    # Heartbeat with unchanged ownership (null topic_partitions): not a confirmation.
    first.heartbeat(owned=None)
    late.heartbeat()
    assert not late.owned & revoked
    first.heartbeat()  # now it lists only the partitions it kept
    assert first.epoch == 4
    late.heartbeat()
    assert revoked <= late.owned
    converge([*members, late])
    assert sorted(len(m.owned) for m in [*members, late]) == [3, 3, 3, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4), min_size=20, max_size=120), st.sampled_from([3, 5, 12]))
def test_never_two_owners_under_random_heartbeat_orders(order: list[int], partitions: int) -> None:
    core, clock = make_core(partitions), Clock()
    members = [Member(core, f"m{i}", clock) for i in range(5)]
    active = [False] * 5
    for step, index in enumerate(order):
        m = members[index]
        if step % 17 == 16 and active[index]:
            # Occasionally a member leaves, and comes back later as a new member.
            assert m.heartbeat(member_epoch=-1).error is ErrorCode.none
            m.epoch, m.owned, active[index] = 0, set(), False
            continue
        result = m.heartbeat()
        assert result.error is ErrorCode.none, result
        active[index] = True
        assert_exclusive(core)
        # What a client believes it owns is never owned by someone else either.
        owners = core.consumer.owners(GROUP)
        for p in m.owned:
            assert owners.get((TOPIC, p)) == m.member_id
    converge([m for m, a in zip(members, active, strict=True) if a], rounds=6)
    live = [m for m, a in zip(members, active, strict=True) if a]
    if live:
        assert set().union(*(m.owned for m in live)) == set(range(partitions))
        sizes = [len(m.owned) for m in live]
        assert max(sizes) - min(sizes) <= 1


def test_leave_and_expiry_reassign() -> None:
    core, clock = make_core(session_timeout_ms=10_000), Clock()
    members = [Member(core, f"m{i}", clock) for i in range(3)]
    converge(members)
    result = members[0].heartbeat(member_epoch=-1)
    assert (result.error, result.member_epoch) == (ErrorCode.none, -1)
    converge(members[1:])
    assert sorted(len(m.owned) for m in members[1:]) == [6, 6]
    # m2 stops heartbeating: its session expires and m1 gets everything.
    clock.now += 6_000
    members[1].heartbeat()
    clock.now += 6_000
    assert core.next_deadline_ms() is not None and core.next_deadline_ms() <= clock.now
    core.tick(clock.now)
    converge(members[1:2])
    assert members[1].owned == set(range(12))
    assert members[2].heartbeat().error is ErrorCode.unknown_member_id
    # It rejoins with epoch 0.
    members[2].epoch, members[2].owned = 0, set()
    converge(members[1:])
    assert sorted(len(m.owned) for m in members[1:]) == [6, 6]


def test_fencing_and_validation_errors() -> None:
    core, clock = make_core(), Clock()
    a, b = Member(core, "a", clock), Member(core, "b", clock)
    converge([a, b])
    assert a.heartbeat(member_epoch=a.epoch + 1).error is ErrorCode.fenced_member_epoch
    assert a.heartbeat(member_epoch=a.epoch - 1, owned=None).error is ErrorCode.fenced_member_epoch
    assert Member(core, "x", clock).heartbeat(member_epoch=5).error is ErrorCode.unknown_member_id
    unknown_group = HeartbeatRequest(group_id="nope", member_id="x", member_epoch=3, owned=None)
    assert core.consumer_group_heartbeat(unknown_group, clock.now).error is ErrorCode.group_id_not_found
    bad = HeartbeatRequest(group_id=GROUP, member_id="y", member_epoch=0, owned={})
    assert core.consumer_group_heartbeat(bad, clock.now).error is ErrorCode.invalid_request
    assert Member(core, "z", clock).heartbeat(server_assignor="sticky").error is ErrorCode.unsupported_assignor
    invalid = Member(core, "r", clock).heartbeat(subscribed_topic_regex="(")
    assert (invalid.error, invalid.error_message) == (
        ErrorCode.invalid_regular_expression,
        "SubscribedTopicRegex `(` is not a valid regular expression: missing ).",
    )
    assert Member(core, "", clock).heartbeat().error is ErrorCode.invalid_request


def test_range_assignor_is_honoured() -> None:
    core, clock = make_core(), Clock()
    members = [Member(core, f"m{i}", clock) for i in range(3)]
    for m in members:
        m.heartbeat(server_assignor="range")
    converge(members)
    assert [sorted(m.owned) for m in members] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_static_member_temporary_leave_keeps_assignment() -> None:
    core, clock = make_core(), Clock()
    a, b = Member(core, "a", clock, "inst-a"), Member(core, "b", clock, "inst-b")
    converge([a, b])
    owned = set(a.owned)
    assert a.heartbeat(member_epoch=-2).member_epoch == -2
    group = core.consumer.group(GROUP)
    assert group is not None
    epoch = group.group_epoch
    again = Member(core, "a2", clock, "inst-a")
    result = again.heartbeat()
    assert result.error is ErrorCode.none and again.owned == owned
    assert group.group_epoch == epoch
    # A second live member with the same instance id is refused.
    assert Member(core, "a3", clock, "inst-a").heartbeat().error is ErrorCode.unreleased_instance_id


def test_offsets_with_member_epochs_and_group_types() -> None:
    core, clock = make_core(), Clock()
    a = Member(core, "a", clock)
    converge([a])
    offsets = {(TOPIC, 0): OffsetAndMetadata(5)}
    assert core.commit_offsets(GROUP, a.epoch, "a", None, offsets, clock.now) is ErrorCode.none
    assert core.commit_offsets(GROUP, a.epoch - 1, "a", None, offsets, clock.now) is ErrorCode.stale_member_epoch
    assert core.commit_offsets(GROUP, a.epoch, "zz", None, offsets, clock.now) is ErrorCode.unknown_member_id
    assert core.validate_fetch(GROUP, "a", a.epoch) is ErrorCode.none
    assert core.validate_fetch(GROUP, "a", a.epoch + 1) is ErrorCode.stale_member_epoch
    assert core.validate_fetch(GROUP, None, -1) is ErrorCode.none
    assert core.fetch_offsets(GROUP)[(TOPIC, 0)].offset == 5
    # A classic JoinGroup on the consumer group is refused.
    replies: list = []
    core.join_group(GROUP, "", None, "consumer", [("range", b"")], 10_000, 10_000, clock.now, replies.append)
    assert replies[0].error is ErrorCode.inconsistent_group_protocol
    assert [(o.group_id, o.protocol_type) for o in core.list_groups()] == [(GROUP, "consumer")]
    # Once empty, the offsets stay and the group accepts classic members again.
    a.heartbeat(member_epoch=-1)
    assert core.commit_offsets(GROUP, -1, "", None, offsets, clock.now) is ErrorCode.none
    core.join_group(GROUP, "", None, "consumer", [("range", b"")], 10_000, 10_000, clock.now, replies.append)
    assert replies[1].error is ErrorCode.member_id_required
    assert core.fetch_offsets(GROUP)[(TOPIC, 0)].offset == 5
    # ...and a ConsumerGroupHeartbeat on a classic group with members is GROUP_ID_NOT_FOUND.
    core.join_group(GROUP, replies[1].member_id, None, "consumer", [("range", b"")], 10_000, 10_000, 0, replies.append)
    assert Member(core, "b", clock).heartbeat().error is ErrorCode.group_id_not_found


def test_offset_delete_keeps_offsets_of_topics_members_subscribe_to() -> None:
    """Kafka's OffsetDelete on a consumer group: GROUP_SUBSCRIBED_TO_TOPIC for a subscribed topic
    (the members consume from those offsets); others, and all once the group is empty, go."""
    core, clock = make_core(), Clock()
    a = Member(core, "a", clock)
    converge([a])
    offsets = {(TOPIC, 0): OffsetAndMetadata(5), ("other", 0): OffsetAndMetadata(7)}
    assert core.commit_offsets(GROUP, a.epoch, "a", None, offsets, clock.now) is ErrorCode.none

    errors = core.delete_offsets(GROUP, [(TOPIC, 0), ("other", 0)])
    assert errors == {(TOPIC, 0): ErrorCode.group_subscribed_to_topic, ("other", 0): ErrorCode.none}
    assert set(core.fetch_offsets(GROUP)) == {(TOPIC, 0)}

    a.heartbeat(member_epoch=-1)  # the last member leaves
    assert core.delete_offsets(GROUP, [(TOPIC, 0)]) == {(TOPIC, 0): ErrorCode.none}
    assert core.fetch_offsets(GROUP) == {}


def test_a_member_that_reports_owning_none_of_the_revoked_partitions_moves_on_at_once() -> None:
    """Kafka's CurrentAssignmentBuilder asks for a revocation only if the member's heartbeat still
    lists a partition to revoke. A member that reports owning none of them (it had not taken them
    yet) gets the new epoch at once; held in UNREVOKED_PARTITIONS it waited for an ownership change
    that would not come (its next heartbeats send null: unchanged), blocking the new member's
    partitions, until its rebalance timeout removed it."""
    core, clock = make_core(), Clock()
    first = Member(core, "m0", clock)
    assert first.heartbeat().member_epoch == 1 and len(first.owned) == 12
    late = Member(core, "m1", clock)
    late.heartbeat()
    assert late.owned == set()  # all twelve still belong to m0
    result = first.heartbeat(owned={})  # m0 has not taken any of its partitions yet
    assert result.error is ErrorCode.none and result.member_epoch == 2 and len(first.owned) == 6
    late.heartbeat()
    assert len(late.owned) == 6 and not late.owned & first.owned
    clock.now += 30_001  # past the rebalance timeout: nobody is waiting for a revocation
    core.tick(clock.now)
    for m in (first, late):
        assert m.heartbeat(owned=None).error is ErrorCode.none
    assert set(core.consumer.owners(GROUP).values()) == {"m0", "m1"}


def test_offset_delete_on_a_consumer_group_without_committed_offsets() -> None:
    """Kafka's OffsetDelete on an existing consumer group never fails at group level: a group whose
    members committed nothing yet answers per partition, like one with offsets."""
    core, clock = make_core(), Clock()
    converge([Member(core, "a", clock)])
    assert core.check_delete_offsets(GROUP, [(TOPIC, 0), ("other", 0)]) == (
        ErrorCode.none,
        {(TOPIC, 0): ErrorCode.group_subscribed_to_topic, ("other", 0): ErrorCode.none},
    )
    assert core.delete_offsets(GROUP, [("other", 0)]) == {("other", 0): ErrorCode.none}


def test_offset_commit_below_v9_from_a_consumer_protocol_member_is_unsupported_version() -> None:
    """ConsumerGroup.validateOffsetCommit: a member of a KIP-848 group must commit with OffsetCommit
    v9+ ("OffsetCommit version 9 or above must be used by members using the modern group
    protocol"): UNSUPPORTED_VERSION, checked after the member is found and before its epoch. It was
    accepted (and v8 has no member epoch field: the "generation" it carries was taken for one)."""
    core, clock = make_core(), Clock()
    a = Member(core, "a", clock)
    converge([a])
    commit = core.validate_commit
    assert commit(GROUP, a.epoch, "a", None, clock.now, api_version=8) is ErrorCode.unsupported_version
    assert commit(GROUP, a.epoch - 1, "a", None, clock.now, api_version=8) is ErrorCode.unsupported_version
    assert commit(GROUP, a.epoch, "zz", None, clock.now, api_version=8) is ErrorCode.unknown_member_id
    assert commit(GROUP, a.epoch, "a", None, clock.now, api_version=9) is ErrorCode.none
    # TxnOffsetCommit has no such rule.
    assert commit(GROUP, a.epoch, "a", None, clock.now, transactional=True) is ErrorCode.none
    # An admin commit (no member) to an empty consumer group: any version.
    a.heartbeat(member_epoch=-1)
    assert commit(GROUP, -1, "", None, clock.now, api_version=2) is ErrorCode.none

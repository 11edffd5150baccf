"""KIP-848 consumer groups in ``__consumer_offsets``: which records a change writes, that
ConsumerGroupHeartbeat answers wait for them, and that a new coordinator loads them (Kafka's
GroupMetadataManager records, their replay and onLoaded), so that members go on at their epoch
across a coordinator failover instead of being fenced and rejoining.

The log here is a list (``Log``): what the leader appended, of which a prefix is durable (the
high watermark); stores end when the test says. "Failover" unloads the old core and replays into
a new one what the new leader has: the durable records, and maybe whole batches after them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import Record, RecordFormatError, pack
from diskless.groups import records
from diskless.groups.consumer_protocol import (
    ConsumerGroup,
    ConsumerGroupConfig,
    ConsumerGroupTombstone,
    ConsumerRecord,
    CurrentAssignmentRecord,
    GroupEpochRecord,
    HeartbeatRequest,
    HeartbeatResult,
    MemberMetadataRecord,
    MemberState,
    MemberTombstone,
    RegexRecord,
    RegexTombstone,
    SubscriptionMetadataRecord,
    TargetEpochRecord,
    TargetMemberRecord,
    record_key,
)
from diskless.groups.coordinator import (
    ConsumerGroupStore,
    GroupCoordinatorCore,
    GroupStore,
    JoinResult,
    OffsetAndMetadata,
)
from diskless.groups.handlers import consumer_store_error

E = ErrorCode
TOPIC, GROUP = "t", "g"
PARTITIONS = 6
SESSION = 45_000
REBALANCE = 30_000


class Log:
    """The core's ``on_store``: appends at once (unless ``refuse``), keeps each store pending until
    the test ends it. ``claims`` are (member, epoch, partitions) of every current-assignment
    record that was durable at some point: what a member may have been told."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.ends: list[int] = []  # where each appended store (one batch) ends
        self.hwm = 0
        self.pending: list[tuple[GroupStore | ConsumerGroupStore, int | None]] = []  # None: not appended
        self.refuse = False
        self.stores: list[ConsumerGroupStore] = []
        self.claims: set[tuple[str, int, frozenset[tuple[str, int]]]] = set()

    def __call__(self, store: GroupStore | ConsumerGroupStore) -> bool:
        if isinstance(store, ConsumerGroupStore):
            self.stores.append(store)
        if self.refuse:
            self.pending.append((store, None))
            return False
        if isinstance(store, ConsumerGroupStore):
            self.records.extend(records.encode_consumer(r) for r in store.records)
        else:
            self.records.append(records.encode_group(store.group))
        self.ends.append(len(self.records))
        self.pending.append((store, len(self.records)))
        return True

    def _advance(self, to: int) -> None:
        for key, value in self.records[self.hwm : to]:
            record = records.decode(key, value)
            if isinstance(record, CurrentAssignmentRecord):
                self.claims.add((record.member_id, record.member_epoch, flat(record.assigned)))
        self.hwm = max(self.hwm, to)

    def complete(self, core: GroupCoordinatorCore, error: ErrorCode = E.none, count: int | None = None) -> None:
        """End the oldest pending stores (all, or ``count``): replicated, or failed with ``error``
        (mapped as the shell does). One that was not appended fails (NOT_COORDINATOR) whatever."""
        n = len(self.pending) if count is None else count
        done, self.pending = self.pending[:n], self.pending[n:]
        for store, end in done:
            outcome = consumer_store_error(error)
            if end is None:
                outcome = E.not_coordinator if error is E.none else outcome
            elif error is E.none:
                self._advance(end)
            group_id = store.group_id if isinstance(store, ConsumerGroupStore) else store.group.group_id
            core.group_stored(group_id, store.token, outcome, 0)

    def durable(self) -> list[Record]:
        return self.records[: self.hwm]

    def failover(self, old: GroupCoordinatorCore, now: int, in_doubt: int = 0) -> GroupCoordinatorCore:
        """The partition moves; the new leader has the durable records and ``in_doubt`` whole
        batches after them, which become durable there."""
        old.unload()
        later = [end for end in self.ends if end > self.hwm][:in_doubt]
        keep = later[-1] if later else self.hwm
        self._advance(keep)
        del self.records[keep:]
        self.ends = [end for end in self.ends if end <= keep]
        self.pending = []
        new = make_core(self, partitions=old.consumer.partitions_of(TOPIC) or PARTITIONS, config=old.consumer.config)
        # The same cluster seen from the new leader's broker (a test may create and delete topics).
        new.consumer.partitions_of = old.consumer.partitions_of
        new.consumer.topic_names, new.consumer.topics_version = old.consumer.topic_names, old.consumer.topics_version
        records.replay(new, self.records, now)
        return new


def flat(assignment: Any) -> frozenset[tuple[str, int]]:
    return frozenset((t, p) for t, parts in assignment.items() for p in parts)


def make_core(
    log: Log | None, partitions: int = PARTITIONS, config: ConsumerGroupConfig | None = None
) -> GroupCoordinatorCore:
    return GroupCoordinatorCore(
        consumer_config=config or ConsumerGroupConfig(),
        partitions_of=lambda topic: partitions if topic == TOPIC else None,
        on_store=log,
    )


class Client:
    """A well-behaved consumer: one heartbeat at a time, it takes what it is assigned and reports
    what it owns; after an error other than fencing it retries with the epoch it knows."""

    def __init__(
        self,
        member_id: str,
        instance_id: str | None = None,
        rebalance_timeout_ms: int = REBALANCE,
        regex: str | None = None,
    ) -> None:
        self.member_id, self.instance_id = member_id, instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.regex = regex  # subscribes by this regex (and no names) instead of TOPIC
        self.epoch = 0
        self.owned: set[int] = set()
        self.answers: list[HeartbeatResult] = []
        self.waiting = False

    def request(self, **overrides: Any) -> HeartbeatRequest:
        fields: dict[str, Any] = {
            "group_id": GROUP,
            "member_id": self.member_id,
            "member_epoch": self.epoch,
            "instance_id": self.instance_id,
            "owned": {TOPIC: frozenset(self.owned)} if self.owned else {},
        }
        if self.epoch == 0:
            fields.update(rebalance_timeout_ms=self.rebalance_timeout_ms, subscribed_topic_names=(TOPIC,), owned={})
            if self.regex is not None:
                fields.update(subscribed_topic_names=(), subscribed_topic_regex=self.regex)
        fields.update(overrides)
        return HeartbeatRequest(**fields)

    def send(
        self,
        core: GroupCoordinatorCore,
        now: int,
        on_answer: Callable[[HeartbeatResult], None] | None = None,
        **overrides: Any,
    ) -> list[HeartbeatResult]:
        """Send a heartbeat; the returned list gets its answer (once durable), then ``on_answer``."""
        got: list[HeartbeatResult] = []

        def answered(result: HeartbeatResult) -> None:
            self.waiting = False
            got.append(result)
            self.answers.append(result)
            self.learn(result)
            if on_answer is not None:
                on_answer(result)

        self.waiting = True
        core.consumer_group_heartbeat(self.request(**overrides), now, answered)
        return got

    def learn(self, result: HeartbeatResult) -> None:
        if result.error is E.none and result.member_epoch >= 0:
            self.epoch = result.member_epoch
            if result.assignment is not None:
                self.owned = set(result.assignment.get(TOPIC, frozenset()))
        elif result.error in (E.unknown_member_id, E.fenced_member_epoch):
            self.epoch, self.owned = 0, set()


def heartbeat(core: GroupCoordinatorCore, log: Log, client: Client, now: int = 1_000, **kw: Any) -> HeartbeatResult:
    """A heartbeat whose records are replicated at once."""
    got = client.send(core, now, **kw)
    log.complete(core)
    assert len(got) == 1
    return got[0]


def converge(core: GroupCoordinatorCore, log: Log, clients: list[Client], now: int = 1_000, rounds: int = 6) -> None:
    for _ in range(rounds):
        for c in clients:
            assert heartbeat(core, log, c, now).error is E.none
    group = core.consumer.group(GROUP)
    assert group is not None and group.state.value == "Stable"


def persisted(group: ConsumerGroup) -> Any:
    """What of a group the log keeps (no timers)."""
    members = {
        m.member_id: (
            m.instance_id,
            m.rack_id,
            m.client_id,
            m.client_host,
            m.rebalance_timeout_ms,
            m.subscribed_topics,
            m.subscribed_regex,
            m.server_assignor,
            m.member_epoch,
            m.previous_member_epoch,
            m.state,
            flat(m.assigned),
            flat(m.pending_revocation),
        )
        for m in group.members.values()
    }
    target = {mid: flat(a) for mid, a in group.target.items()}
    resolved = {regex: (r.topics, r.refreshed_ms) for regex, r in group.resolved.items()}
    return (
        resolved,
        group.group_epoch,
        group.assignment_epoch,
        group.subscription_metadata,
        group.static_members,
        target,
        members,
    )


def written_matches(core: GroupCoordinatorCore) -> None:
    """Each group's ``written`` (what the log has of it) is its state, once a call has ended."""
    for group in core.consumer.groups.values():
        assert not group.dirty_all and not group.dirty_members
        if not group.written:
            continue  # a group that never got as far as a record (a refused join)
        expected = {record_key(r): r for r in core.consumer.current_records(group)}
        assert group.written == expected


def decoded(log: Log) -> list[ConsumerRecord]:
    return [records.decode(k, v) for k, v in log.records]  # type: ignore[misc]


def assert_exclusive(core: GroupCoordinatorCore) -> None:
    group = core.consumer.group(GROUP)
    seen: set[tuple[str, int]] = set()
    for m in group.members.values() if group is not None else ():
        assert not m.owns() & seen, "a partition owned twice"
        seen |= m.owns()


# --- a failover costs no rejoin ---------------------------------------------------------------------


def test_members_go_on_at_their_epoch_after_a_failover() -> None:
    """Before, the new coordinator knew no member: UNKNOWN_MEMBER_ID for everyone, who then
    rejoined with epoch 0 and had all their partitions revoked. Loaded, nothing changes for them."""
    log = Log()
    core = make_core(log)
    clients = [Client(f"m{i}") for i in range(3)]
    converge(core, log, clients)
    before = persisted(core.consumer.group(GROUP))  # type: ignore[arg-type]
    epochs = [(c.epoch, set(c.owned)) for c in clients]
    appended = len(log.records)
    new = log.failover(core, 5_000)
    assert persisted(new.consumer.group(GROUP)) == before  # type: ignore[arg-type]
    for c, (epoch, owned) in zip(clients, epochs, strict=True):
        result = heartbeat(new, log, c, 6_000)
        assert (result.error, result.member_epoch) == (E.none, epoch)
        assert c.owned == owned
    assert len(log.records) == appended  # nothing changed: nothing written
    assert [g.state for g in new.list_groups()] == ["Stable"]
    # The members' commits are accepted at their epochs by the new coordinator too.
    assert new.validate_commit(GROUP, clients[0].epoch, "m0", None, 6_000, api_version=9) is E.none


def test_loaded_members_timers_start_at_the_load() -> None:
    """Kafka's onLoaded: every member's session timer starts at the load, and a member revoking
    partitions gets its rebalance timer again; one that does not come back is removed then."""
    log = Log()
    core = make_core(log)
    a, b = Client("a"), Client("b")
    converge(core, log, [a])
    heartbeat(core, log, b)
    assert heartbeat(core, log, a).member_epoch == 1  # a must revoke: UNREVOKED_PARTITIONS at epoch 1
    assert core.consumer.group(GROUP).members["a"].state is MemberState.UNREVOKED_PARTITIONS  # type: ignore[union-attr]
    new = log.failover(core, 100_000)
    loaded = new.consumer.group(GROUP)
    assert loaded is not None
    assert loaded.members["a"].rebalance_deadline_ms == 100_000 + REBALANCE
    assert loaded.members["b"].session_deadline_ms == 100_000 + SESSION
    assert new.next_deadline_ms() == 100_000 + REBALANCE
    assert heartbeat(new, log, b, 100_001).error is E.none
    new.tick(100_000 + REBALANCE)  # a never confirmed its revocation: removed, b gets everything
    log.complete(new)
    converge(new, log, [b], 100_000 + REBALANCE)
    assert b.owned == set(range(PARTITIONS))
    assert heartbeat(new, log, a, 100_000 + REBALANCE).error is E.unknown_member_id
    # Its removal is in the log: gone after another failover as well.
    assert "a" not in log.failover(new, 200_000).consumer.group(GROUP).members  # type: ignore[union-attr]


# --- what is written, and when ----------------------------------------------------------------------


def test_records_are_written_only_when_something_changed() -> None:
    """Kafka writes a record per key that changed, never one for a plain heartbeat."""
    log = Log()
    core = make_core(log)
    a, b = Client("a"), Client("b")
    heartbeat(core, log, a)
    (join,) = log.stores
    assert [type(r) for r in join.records] == [
        MemberMetadataRecord,
        GroupEpochRecord,
        SubscriptionMetadataRecord,
        TargetMemberRecord,
        TargetEpochRecord,
        CurrentAssignmentRecord,
    ]
    heartbeat(core, log, b)  # a second member: its metadata, a new epoch, both targets, its assignment
    assert [type(r) for r in log.stores[-1].records] == [
        MemberMetadataRecord,
        GroupEpochRecord,
        TargetMemberRecord,
        TargetMemberRecord,
        TargetEpochRecord,
        CurrentAssignmentRecord,
    ]
    heartbeat(core, log, a)  # a's reconciliation step: only its current assignment
    (step,) = log.stores[-1].records
    assert isinstance(step, CurrentAssignmentRecord) and step.state is MemberState.UNREVOKED_PARTITIONS
    converge(core, log, [a, b])
    stores = len(log.stores)
    for _ in range(5):
        for c in (a, b):
            got = c.send(core, 2_000)
            assert got and got[0].error is E.none  # answered at once: nothing to wait for
            c.send(core, 2_000, owned=None)  # unchanged ownership (null topic_partitions)
    assert len(log.stores) == stores
    # A new client host is a change of the member's metadata: one record.
    heartbeat(core, log, a, client_host="/10.0.0.9")
    assert [type(r) for r in log.stores[-1].records] == [MemberMetadataRecord]


def test_an_answer_waits_until_the_groups_records_are_durable() -> None:
    """Kafka's coordinator answers once the request's records are committed, and a request that
    wrote none once the records before it are: nobody is told what a failover could undo."""
    log = Log()
    core = make_core(log)
    a, b = Client("a"), Client("b")
    converge(core, log, [a, b])
    moved = b.send(core, 2_000, client_host="/10.0.0.9")
    assert moved == [] and len(log.pending) == 1
    plain = a.send(core, 2_000, owned=None)  # writes nothing, but its group's last store is not durable
    assert plain == [] and len(log.pending) == 1
    log.complete(core)
    assert moved[0].error is plain[0].error is E.none


@pytest.mark.parametrize(
    ("append_error", "answered"),
    [
        (E.not_coordinator, E.not_coordinator),
        (E.not_enough_replicas, E.coordinator_not_available),
        (E.request_timed_out, E.coordinator_not_available),
        (E.message_too_large, E.unknown_server_error),
    ],
)
def test_a_store_that_is_not_replicated_answers_its_error(append_error: ErrorCode, answered: ErrorCode) -> None:
    """As Kafka maps a failed write (CoordinatorOperationExceptionHelper). The records are the
    log's (appended, as in Kafka the state stays): the member retries with the epoch it knows and
    is accepted; the group's next change writes its epoch again, whose answer waits for it."""
    log = Log()
    core = make_core(log)
    a, b = Client("a"), Client("b")
    converge(core, log, [a, b])
    epoch = a.epoch
    b_sub = b.send(core, 2_000, subscribed_topic_names=(TOPIC, "other"))  # a new group epoch
    log.complete(core, append_error)
    assert b_sub[0].error is answered
    got = a.send(core, 3_000)
    assert got == []  # waits for the epoch record written again
    assert [type(r) for r in log.stores[-1].records][:1] == [GroupEpochRecord]
    log.complete(core)
    assert got[0].error is E.none and a.epoch >= epoch
    assert heartbeat(core, log, b).error is E.none


def test_records_that_cannot_be_appended_leave_the_group_as_the_log_has_it() -> None:
    """Kafka reverts its state to the last written offset when an append fails: the joining
    member was never a member (it gets the error and joins again); the others see nothing."""
    log = Log()
    core = make_core(log)
    a, b = Client("a"), Client("b")
    converge(core, log, [a])
    before = persisted(core.consumer.group(GROUP))  # type: ignore[arg-type]
    log.refuse = True  # leadership went: nothing can be appended
    joined = b.send(core, 2_000)
    assert persisted(core.consumer.group(GROUP)) == before  # type: ignore[arg-type]
    assert joined == []  # the error comes with the store's report
    log.complete(core)
    assert joined[0].error is E.not_coordinator
    # A brand-new group whose first records cannot be appended does not exist at all.
    lone = Client("x")
    got = lone.send(core, 2_000, group_id="another")
    assert "another" not in core.consumer.groups and got == []
    log.complete(core)
    assert got[0].error is E.not_coordinator
    log.refuse = False
    assert heartbeat(core, log, b).error is E.none and b.epoch == 2
    written_matches(core)


# --- failovers at awkward moments ---------------------------------------------------------------------


@pytest.mark.parametrize("in_doubt", [0, 1, 2], ids=["lost", "first-batch", "both-batches"])
def test_a_failover_between_an_assignment_computed_and_stored(in_doubt: int) -> None:
    """A new member's join computed a new target, and a member was told nothing yet of its part:
    the stores are appended, not replicated, when the partition moves. The new leader has none,
    some or all of them; either way nobody has to rejoin and the group converges."""
    log = Log()
    core = make_core(log)
    a, b, c = Client("a"), Client("b"), Client("c")
    converge(core, log, [a, b])
    join = c.send(core, 2_000)
    revoke = a.send(core, 2_000)  # a learns what to revoke (its answer waits for the records)
    assert join == revoke == [] and len(log.pending) == 2
    new = log.failover(core, 3_000, in_doubt)
    assert join[0].error is revoke[0].error is E.not_coordinator
    group = new.consumer.group(GROUP)
    assert group is not None and ("c" in group.members) == (in_doubt > 0)
    for client in (a, b, c):
        assert heartbeat(new, log, client, 4_000).error is E.none
    converge(new, log, [a, b, c], 4_000)
    assert sorted(len(x.owned) for x in (a, b, c)) == [2, 2, 2]
    assert all(r.error not in (E.unknown_member_id, E.fenced_member_epoch) for x in (a, b) for r in x.answers)


@pytest.mark.parametrize("in_doubt", [0, 1])
def test_a_member_leaving_during_a_failover(in_doubt: int) -> None:
    """A member's leave (epoch -1) is appended, not replicated, when the partition moves. If the
    new leader does not have it the member is loaded and removed a session after the load (its
    partitions then go to the others); if it does, the member is gone at once."""
    log = Log()
    core = make_core(log)
    a, b = Client("a"), Client("b")
    converge(core, log, [a, b])
    left = a.send(core, 2_000, member_epoch=-1)
    new = log.failover(core, 3_000, in_doubt)
    assert left[0].error is E.not_coordinator
    group = new.consumer.group(GROUP)
    assert group is not None and ("a" in group.members) == (in_doubt == 0)
    assert heartbeat(new, log, b, 3_001).error is E.none
    new.tick(3_000 + SESSION)
    log.complete(new)
    converge(new, log, [b], 3_000 + SESSION)
    assert b.owned == set(range(PARTITIONS))
    assert "a" not in log.failover(new, 100_000).consumer.group(GROUP).members  # type: ignore[union-attr]


def test_a_deleted_group_recreated_under_the_same_id_loads_as_the_new_group() -> None:
    """DeleteGroups writes the group tombstone, which drops the KIP-848 group's records too; a
    group of the same name created afterwards starts again from epoch 1, and only it loads."""
    log = Log()
    core = make_core(log)
    old = [Client("a"), Client("b")]
    converge(core, log, old)
    for c in old:
        assert heartbeat(core, log, c, member_epoch=-1).error is E.none
    assert core.prepare_delete_group(GROUP) is E.none
    log.records.extend(records.group_deletion_records(GROUP, []))
    log._advance(len(log.records))
    core.complete_delete_group(GROUP)
    assert core.consumer.group(GROUP) is None
    fresh = Client("c")
    converge(core, log, [fresh])
    assert fresh.epoch == 1
    live = persisted(core.consumer.group(GROUP))  # type: ignore[arg-type]
    new = log.failover(core, 5_000)
    assert persisted(new.consumer.group(GROUP)) == live  # type: ignore[arg-type]
    assert list(new.consumer.group(GROUP).members) == ["c"]  # type: ignore[union-attr]


def test_a_delete_that_cannot_be_stored_keeps_the_group() -> None:
    log = Log()
    core = make_core(log)
    a = Client("a")
    converge(core, log, [a])
    heartbeat(core, log, a, member_epoch=-1)
    assert core.prepare_delete_group(GROUP) is E.none
    core.abort_delete_group(GROUP)  # its tombstone could not be written
    group = core.consumer.group(GROUP)
    assert group is not None and group.group_epoch == 2  # as the log still has it
    live = persisted(group)
    assert persisted(log.failover(core, 5_000).consumer.group(GROUP)) == live  # type: ignore[arg-type]


def test_an_empty_group_taken_over_by_a_classic_member_is_tombstoned() -> None:
    """No online migration: a classic JoinGroup on an Empty KIP-848 group drops it. Its tombstone
    goes first, so that a replay does not bring the KIP-848 group back beside the classic one."""
    log = Log()
    core = make_core(log)
    a = Client("a")
    converge(core, log, [a])
    heartbeat(core, log, a, member_epoch=-1)
    joined: list[JoinResult] = []
    core.join_group(GROUP, "", None, "consumer", [("range", b"")], 10_000, 10_000, 2_000, joined.append)
    assert joined[0].error is E.member_id_required
    # A tombstone per key, as Kafka, the group epoch's last.
    assert log.stores[-1].records == tuple(
        ConsumerGroupTombstone(GROUP, kind) for kind in ("target_epoch", "subscriptions", "epoch")
    )
    log.complete(core)
    new = log.failover(core, 3_000)
    assert new.consumer.group(GROUP) is None


def test_a_classic_takeover_whose_tombstone_cannot_be_appended_is_refused() -> None:
    """The KIP-848 group's tombstone could not be appended: the group is still in the log. Dropping
    it from memory anyway and letting the classic member in would load both groups under one id
    after a failover (the classic members' commits then validated against the KIP-848 group:
    UNKNOWN_MEMBER_ID), and the upkeep would keep appending the dropped group's records."""
    log = Log()
    core = make_core(log)
    a = Client("a")
    converge(core, log, [a])
    heartbeat(core, log, a, member_epoch=-1)
    log.refuse = True
    joined: list[JoinResult] = []
    core.join_group(GROUP, "", None, "consumer", [("range", b"")], 10_000, 10_000, 2_000, joined.append)
    assert joined[0].error is E.coordinator_not_available
    assert core.consumer.group(GROUP) is not None and core.group_state(GROUP) is None
    log.complete(core)
    log.refuse = False
    core.join_group(GROUP, "", None, "consumer", [("range", b"")], 10_000, 10_000, 3_000, joined.append)
    assert joined[-1].error is E.member_id_required and core.consumer.group(GROUP) is None
    log.complete(core)
    assert log.failover(core, 4_000).consumer.group(GROUP) is None


def test_a_join_while_an_empty_classic_group_of_that_id_is_being_deleted_is_retried() -> None:
    """DeleteGroups turns an Empty classic group Dead while its tombstones replicate. A KIP-848
    member joining under that id meanwhile (consumers restarted with group.protocol=consumer right
    after ``kafka-consumer-groups --delete``) must get a retriable error, as a classic JoinGroup
    does, not GROUP_ID_NOT_FOUND, which librdkafka takes as fatal."""
    log = Log()
    core = make_core(log)
    core.apply_offsets(GROUP, {(TOPIC, 0): OffsetAndMetadata(5)})  # an Empty classic group: offsets only
    assert core.prepare_delete_group(GROUP) is E.none
    a = Client("a")
    got = a.send(core, 1_000)
    assert got[0].error is E.coordinator_not_available
    core.complete_delete_group(GROUP)
    assert heartbeat(core, log, Client("a"), 2_000).error is E.none


def test_a_static_member_keeps_its_assignment_across_a_failover() -> None:
    """KIP-345 in KIP-848: a static member's temporary leave (epoch -2) is written, and the
    instance rejoining with a new member id takes over the old one's assignment; the old id's
    records are dropped with one tombstone."""
    log = Log()
    core = make_core(log)
    a, b = Client("a", "inst-a"), Client("b", "inst-b")
    converge(core, log, [a, b])
    owned = set(a.owned)
    assert heartbeat(core, log, a, member_epoch=-2).member_epoch == -2
    new = log.failover(core, 5_000)
    gone = new.consumer.group(GROUP).members["a"]  # type: ignore[union-attr]
    assert gone.member_epoch == -2 and gone.assigned
    again = Client("a2", "inst-a")
    assert heartbeat(new, log, again, 6_000).error is E.none and again.owned == owned
    assert MemberTombstone(GROUP, "a") in log.stores[-1].records
    newer = log.failover(new, 7_000).consumer.group(GROUP)
    assert newer is not None and set(newer.members) == {"a2", "b"} and newer.static_members["inst-a"] == "a2"


def test_an_expired_member_is_removed_in_the_log_too() -> None:
    log = Log()
    core = make_core(log)
    a, b = Client("a"), Client("b")
    converge(core, log, [a, b])
    heartbeat(core, log, b, 40_000)
    core.tick(1_000 + SESSION)  # a's session ran out
    # A tombstone per key of the member, as Kafka, then the new group epoch.
    assert log.stores[-1].records[:4] == (
        MemberTombstone(GROUP, "a", "assignment"),
        MemberTombstone(GROUP, "a", "target"),
        MemberTombstone(GROUP, "a", "member"),
        GroupEpochRecord(GROUP, 3),
    )
    log.complete(core)
    assert set(log.failover(core, 50_000).consumer.group(GROUP).members) == {"b"}  # type: ignore[union-attr]


# --- record format ------------------------------------------------------------------------------------

EXAMPLES: list[ConsumerRecord] = [
    GroupEpochRecord("ж", 7),
    ConsumerGroupTombstone("ж"),
    ConsumerGroupTombstone("ж", "subscriptions"),
    ConsumerGroupTombstone("ж", "target_epoch"),
    SubscriptionMetadataRecord("ж", {"t": 6, "u": 1}),
    SubscriptionMetadataRecord("ж", {}),
    MemberMetadataRecord("ж", "m", "inst", "rack-1", "client", "/10.0.0.1", ("t", "u"), 30_000, "uniform"),
    MemberMetadataRecord("ж", "m", None, None, "", "", (), -1, None),
    MemberMetadataRecord("ж", "m", None, None, "", "", ("t",), -1, None, "^rx-.*"),
    RegexRecord("ж", "^rx-.*", frozenset({"rx-1", "rx-2"}), 1_700_000_000_000),
    RegexRecord("ж", "(", frozenset(), 0),
    RegexTombstone("ж", "^rx-.*"),
    MemberTombstone("ж", "m"),
    MemberTombstone("ж", "m", "target"),
    MemberTombstone("ж", "m", "assignment"),
    TargetEpochRecord("ж", 7),
    TargetMemberRecord("ж", "m", {"t": frozenset({0, 5}), "u": frozenset({0})}),
    TargetMemberRecord("ж", "m", {}),
    CurrentAssignmentRecord(
        "ж", "m", 7, 6, MemberState.UNREVOKED_PARTITIONS, {"t": frozenset({1})}, {"u": frozenset({0})}
    ),
    CurrentAssignmentRecord("ж", "m", -2, 3, MemberState.STABLE, {}, {}),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_records_round_trip(record: ConsumerRecord) -> None:
    key, value = records.encode_consumer(record)
    assert key[0] in (*range(3, 9), 16)
    assert records.decode(key, value) == record


def test_record_keys_are_kafkas_key_versions_and_values_ignore_appended_fields() -> None:
    versions = {(type(r).__name__, getattr(r, "kind", "")): records.encode_consumer(r)[0][0] for r in EXAMPLES}
    assert versions == {
        ("GroupEpochRecord", ""): 3,
        ("ConsumerGroupTombstone", "epoch"): 3,
        ("SubscriptionMetadataRecord", ""): 4,
        ("ConsumerGroupTombstone", "subscriptions"): 4,
        ("MemberMetadataRecord", ""): 5,
        ("MemberTombstone", "member"): 5,
        ("TargetEpochRecord", ""): 6,
        ("ConsumerGroupTombstone", "target_epoch"): 6,
        ("TargetMemberRecord", ""): 7,
        ("MemberTombstone", "target"): 7,
        ("CurrentAssignmentRecord", ""): 8,
        ("MemberTombstone", "assignment"): 8,
        ("RegexRecord", ""): 16,
        ("RegexTombstone", ""): 16,
    }
    key = pack(8, [GROUP, "m"])
    later = pack(0, [3, 2, 0, [["t", [1, 2]]], [], "a later field"])
    assert records.decode(key, later) == CurrentAssignmentRecord(
        GROUP, "m", 3, 2, MemberState.STABLE, {"t": frozenset({1, 2})}, {}
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (pack(3, [GROUP]), pack(1, [3])),  # a newer value version
        (pack(3, [GROUP]), pack(0, [])),  # too short
        (pack(3, [GROUP]), pack(0, ["3"])),
        (pack(3, [GROUP, "m"]), pack(0, [3])),  # a member key for a group record
        (pack(4, [GROUP, "m"]), None),  # a tombstone of a member key for a group key
        (pack(7, [GROUP]), None),
        (pack(5, [GROUP]), pack(0, [None, None, "c", "h", [], 1, None])),
        (pack(5, [GROUP, "m"]), pack(0, [None, None, "c", "h", ["t", 1], 1, None])),
        (pack(5, [GROUP, "m"]), pack(0, [None, None, "c", "h", [], True, None])),
        (pack(7, [GROUP, "m"]), pack(0, [[["t", ["1"]]]])),
        (pack(7, [GROUP, "m"]), pack(0, [[["t", [1]], ["t", [2]]]])),
        (pack(8, [GROUP, "m"]), pack(0, [3, 2, 9, [], []])),  # an unknown member state
        (pack(9, [GROUP, "m"]), pack(0, [])),  # an unknown record type
        (pack(16, [GROUP]), pack(0, [[], 0])),  # a regex key without its regex
        (pack(16, [GROUP, "r"]), pack(0, [["t", 1], 0])),
        (pack(16, [GROUP, "r"]), pack(0, [[]])),
        (pack(5, [GROUP, "m"]), pack(0, [None, None, "c", "h", [], 1, None, 7])),  # a regex not a string
    ],
)
def test_records_refuse_what_they_do_not_know(key: bytes, value: bytes | None) -> None:
    with pytest.raises(RecordFormatError):
        records.decode(key, value)


# --- random interleavings -----------------------------------------------------------------------------


class World:
    """Clients heartbeating a core whose stores end when the test says (replicated, timed out, or
    lost with the leadership, which a failover then follows), whose appends may be refused, and
    which may fail over at any point. Two clients subscribe by a regex that resolves to TOPIC,
    which may be deleted and created again under its name (the regex resolved again when allowed)."""

    def __init__(self, partitions: int) -> None:
        self.log = Log()
        # Sessions and rebalance timeouts longer than any run: members only leave when they say so.
        self.config = ConsumerGroupConfig(session_timeout_ms=10**9)
        self.partitions = partitions
        self.topics = {TOPIC: partitions}
        self.topics_version = 0
        self.core = make_core(self.log, partitions, self.config)
        self.core.consumer.partitions_of = self.topics.get
        self.core.consumer.topic_names = lambda: list(self.topics)
        self.core.consumer.topics_version = lambda: self.topics_version
        self.now = 1_000
        self.clients = [self.client(i) for i in range(4)]
        self.active = [False] * 4
        # Errors in a row since the client's last answer that went through (see ``answered``).
        self.failed = [0] * 4

    @staticmethod
    def client(i: int) -> Client:
        return Client(f"m{i}", rebalance_timeout_ms=10**9, regex=f"{TOPIC}|u.*" if i >= 2 else None)

    def answered(self, client: Client, i: int, result: HeartbeatResult) -> None:
        if client is not self.clients[i] or not self.active[i]:
            return  # a client that left
        if result.error is E.none and result.member_epoch >= 0:
            # The safety property: what a member is told is in a durable record of its epoch
            # (Client.learn has run: ``owned`` is what it was told).
            told = (client.member_id, result.member_epoch, frozenset((TOPIC, p) for p in client.owned))
            assert told in self.log.claims, f"told before stored: {told}"
            self.failed[i] = 0
            return
        # What this change is for: a member that did not leave never has to rejoin. The records of
        # an answer that was lost (a failover, a replication timeout) may be in the log: the member
        # is then one epoch ahead of what it knows, which Kafka accepts (its previous epoch). Two
        # answers lost in a row may leave it two epochs ahead: fenced, as in Kafka.
        assert result.error is not E.unknown_member_id, (client.member_id, result)
        assert result.error is not E.fenced_member_epoch or self.failed[i] >= 2, (client.member_id, result)
        self.failed[i] += 1

    def send(self, i: int, **overrides: Any) -> None:
        client = self.clients[i]
        if not client.waiting:
            client.send(self.core, self.now, lambda result: self.answered(client, i, result), **overrides)

    def step(self, op: tuple[str, int]) -> None:
        kind, arg = op
        if kind == "heartbeat":
            self.active[arg] = True
            self.send(arg)
        elif kind == "unchanged" and self.active[arg] and self.clients[arg].epoch > 0 and not self.failed[arg]:
            # Null topic_partitions (unchanged): only after an answer that went through. After an
            # error clients send the full request, whose ownership the previous epoch is checked by.
            self.send(arg, owned=None)
        elif kind == "leave" and self.active[arg] and not self.clients[arg].waiting:
            self.active[arg] = False  # gone, whatever the answer; it may come back with epoch 0
            self.clients[arg].send(self.core, self.now, member_epoch=-1)
            self.clients[arg] = self.client(arg)
        elif kind == "replicated" and self.log.pending:
            self.log.complete(self.core, count=1)
        elif kind == "timeout" and self.log.pending:
            self.log.complete(self.core, E.request_timed_out, count=1)
        elif kind == "leadership-lost":
            # Pending stores fail (NOT_COORDINATOR), and the partition moves.
            self.log.complete(self.core, E.not_coordinator)
            self.step(("failover", arg))
            return
        elif kind == "refuse":
            self.log.refuse = bool(arg % 2)
        elif kind == "failover":
            self.log.refuse = False
            self.core = self.log.failover(self.core, self.now, arg % 3)
        elif kind == "time":
            self.now += 100 * arg
            self.core.tick(self.now)
        elif kind == "topic":
            # The topic goes, or comes back under its name; time passes (regexes resolve again).
            if arg % 2:
                if self.topics.pop(TOPIC, None) is None:
                    self.topics[TOPIC] = self.partitions
                self.topics_version += 1
            self.now += 4_000 * arg
            self.core.tick(self.now)
        written_matches(self.core)
        assert_exclusive(self.core)
        owners = self.core.consumer.owners(GROUP)
        for client, active in zip(self.clients, self.active, strict=True):
            if active:  # what a client believes it owns is no one else's
                assert all(owners.get((TOPIC, p)) == client.member_id for p in client.owned)


OPS = st.one_of(
    st.tuples(st.sampled_from(["heartbeat", "heartbeat", "unchanged", "leave"]), st.integers(0, 3)),
    st.tuples(st.sampled_from(["replicated", "replicated", "replicated", "timeout"]), st.just(0)),
    st.tuples(st.sampled_from(["refuse", "failover", "leadership-lost", "time", "topic"]), st.integers(0, 5)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, min_size=10, max_size=200), st.sampled_from([3, 6, 12]))
def test_random_interleavings_with_stores_and_failovers(ops: list[tuple[str, int]], partitions: int) -> None:
    world = World(partitions)
    for op in ops:
        world.step(op)
    # Appends work again and every store ends: the log replays into the live state, and after a
    # failover everyone still in the group goes on at its epoch.
    world.step(("refuse", 0))
    while world.log.pending:
        world.step(("replicated", 0))
    for i, active in enumerate(world.active):
        if active:
            world.step(("heartbeat", i))
            while world.log.pending:
                world.step(("replicated", 0))
    live = world.core.consumer.group(GROUP)
    replayed = make_core(None, partitions, world.config)
    records.replay(replayed, world.log.records, world.now)
    if live is None or not live.written:
        assert replayed.consumer.group(GROUP) is None
    else:
        assert persisted(replayed.consumer.group(GROUP)) == persisted(live)  # type: ignore[arg-type]
    world.step(("failover", 0))
    for i, active in enumerate(world.active):
        if active:
            epoch = world.clients[i].epoch
            world.step(("heartbeat", i))
            while world.log.pending:
                world.step(("replicated", 0))
            assert world.clients[i].epoch >= epoch

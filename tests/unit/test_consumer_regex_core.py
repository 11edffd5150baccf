"""KIP-848 regular-expression subscriptions (SubscribedTopicRegex) in the sans-IO core, as Kafka 4.0:
RE2 syntax checked when a regex is new to the group, full-match resolution against the cluster's
topics (those the principal may DESCRIBE), refreshed at most every REGEX_REFRESH_INTERVAL_MS when
topics changed, the group epoch bumped when a resolution changes, and the ConsumerGroupRegularExpression
records that let a new coordinator go on with the same subscription and assignment."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import pack, unpack
from diskless.groups import records
from diskless.groups.consumer_protocol import (
    REGEX_REFRESH_INTERVAL_MS,
    Assignment,
    ConsumerGroups,
    HeartbeatRequest,
    HeartbeatResult,
    RegexRecord,
    RegexTombstone,
    SubscriptionMetadataRecord,
    regex_error,
)

E = ErrorCode
GROUP = "g"


class Cluster:
    """The shell's topic view: names with partition counts, and a version that moves on changes."""

    def __init__(self, **topics: int) -> None:
        self.topics = dict(topics)
        self.version = 0
        self.ids = {name: f"{name}@0" for name in topics}  # a topic created again has another id

    def create(self, name: str, partitions: int) -> None:
        self.topics[name] = partitions
        self.version += 1
        self.ids[name] = f"{name}@{self.version}"

    def delete(self, name: str) -> None:
        del self.topics[name]
        del self.ids[name]
        self.version += 1

    def groups(self) -> ConsumerGroups:
        return ConsumerGroups(None, self.topics.get, lambda: list(self.topics), lambda: self.version, self.ids.get)


class Client:
    """A well-behaved member: takes what it is given, reports what it owns."""

    def __init__(self, groups: ConsumerGroups, member_id: str, *, regex: str | None = None, names: tuple = ()):
        self.groups, self.member_id = groups, member_id
        self.regex, self.names = regex, names
        self.epoch = 0
        self.owned: Assignment = {}

    def heartbeat(self, now: int, **overrides: Any) -> HeartbeatResult:
        fields: dict[str, Any] = {"group_id": GROUP, "member_id": self.member_id, "member_epoch": self.epoch}
        fields["owned"] = dict(self.owned)
        if self.epoch == 0:
            fields.update(
                rebalance_timeout_ms=30_000,
                subscribed_topic_names=self.names,
                subscribed_topic_regex=self.regex or "",
                owned={},
            )
        fields.update(overrides)
        result = self.groups.heartbeat(HeartbeatRequest(**fields), now)
        if result.error is E.none and result.member_epoch >= 0:
            self.epoch = result.member_epoch
            if result.assignment is not None:
                self.owned = {t: ps for t, ps in result.assignment.items() if ps}
        return result

    def topics(self) -> set[str]:
        return set(self.owned)


def converge(clients: list[Client], now: int, rounds: int = 8) -> None:
    for _ in range(rounds):
        for c in clients:
            assert c.heartbeat(now).error is E.none
            owners: dict[tuple[str, int], str] = {}
            for m in c.groups.groups[GROUP].members.values():
                for tp in m.owns():
                    assert tp not in owners, f"{tp} owned by {owners[tp]} and {m.member_id}"
                    owners[tp] = m.member_id


def flat(clients: list[Client]) -> set[tuple[str, int]]:
    return {(t, p) for c in clients for t, ps in c.owned.items() for p in ps}


def replayed(groups: ConsumerGroups, log: list[tuple[bytes, bytes | None]], now: int) -> ConsumerGroups:
    """The log (written so far, plus the group's pending changes) replayed into a new coordinator."""
    for group in groups.take_touched():
        changes, _ = groups.take_changes(group)
        log.extend(records.encode_consumer(r) for r in changes)
    fresh = ConsumerGroups(
        groups.config, groups.partitions_of, groups.topic_names, groups.topics_version, groups.topic_id_of
    )
    for key, value in log:
        fresh.apply(records.decode(key, value), now)  # type: ignore[arg-type]
    return fresh


def state(groups: ConsumerGroups) -> Any:
    group = groups.groups[GROUP]
    members = {
        i: (m.subscribed_topics, m.subscribed_regex, m.member_epoch, m.assigned, m.pending_revocation)
        for i, m in group.members.items()
    }
    resolved = {r: (v.topics, v.refreshed_ms) for r, v in group.resolved.items()}
    return group.group_epoch, group.assignment_epoch, members, resolved, group.target, group.subscription_metadata


def test_full_match_semantics_as_re2j_matches() -> None:
    cluster = Cluster(**{"topic": 2, "topic-1": 2, "other-topic-1": 2})
    groups = cluster.groups()
    anchored, prefix = Client(groups, "a", regex="^topic"), Client(groups, "b", regex="^topic.*")
    converge([anchored], 1_000)
    converge([anchored, prefix], 1_001 + REGEX_REFRESH_INTERVAL_MS)  # both resolved, together
    group = groups.groups[GROUP]
    assert group.resolved["^topic"].topics == {"topic"}
    assert group.resolved["^topic.*"].topics == {"topic", "topic-1"}
    assert group.member_topics(group.members["a"]) == {"topic"}
    assert "other-topic-1" not in anchored.topics() | prefix.topics()
    assert flat([anchored, prefix]) == {(t, p) for t in ("topic", "topic-1") for p in range(2)}


def test_an_invalid_regex_is_refused_with_kafkas_error_and_changes_nothing() -> None:
    groups = Cluster(t=1).groups()
    for regex, what in [("(", "missing )"), ("(a)\\1", "invalid escape sequence"), ("a(?=b)", "invalid perl operator")]:
        result = Client(groups, "x", regex=regex).heartbeat(1_000)
        assert (result.error, result.error_message) == (
            E.invalid_regular_expression,
            f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {what}.",
        )
    assert GROUP not in groups.groups  # no group made by a refused join
    member = Client(groups, "m", regex="t")
    converge([member], 1_000)
    # A member changing to an invalid regex keeps its subscription and partitions.
    epoch = groups.groups[GROUP].group_epoch
    assert member.heartbeat(1_000, subscribed_topic_regex="[z-a]").error is E.invalid_regular_expression
    assert groups.groups[GROUP].members["m"].subscribed_regex == "t" and groups.groups[GROUP].group_epoch == epoch
    assert regex_error("^rx-.*") is None


def test_a_new_matching_topic_bumps_the_epoch_once_the_refresh_interval_passed() -> None:
    cluster = Cluster(**{"rx-1": 2, "other": 2})
    groups = cluster.groups()
    a, b = Client(groups, "a", regex="rx-.*"), Client(groups, "b", regex="rx-.*")
    converge([a, b], 1_000)
    epoch = groups.groups[GROUP].group_epoch
    cluster.create("rx-2", 2)
    cluster.create("nope-rx-3", 2)
    # Within the interval of the last resolution: nothing moves (one rebalance for a burst).
    converge([a, b], 1_000 + REGEX_REFRESH_INTERVAL_MS)
    assert groups.groups[GROUP].group_epoch == epoch and "rx-2" not in a.topics() | b.topics()
    later = 1_001 + REGEX_REFRESH_INTERVAL_MS
    converge([a, b], later)
    assert groups.groups[GROUP].group_epoch == epoch + 1
    assert flat([a, b]) == {(t, p) for t in ("rx-1", "rx-2") for p in range(2)}
    # Topics unchanged since: a later heartbeat resolves nothing again.
    refreshed = groups.groups[GROUP].resolved["rx-.*"].refreshed_ms
    converge([a, b], later + 3 * REGEX_REFRESH_INTERVAL_MS)
    assert groups.groups[GROUP].resolved["rx-.*"].refreshed_ms == refreshed


def test_a_deleted_topic_leaves_at_once_and_a_recreated_one_comes_back() -> None:
    cluster = Cluster(**{"rx-1": 2, "rx-2": 2})
    groups = cluster.groups()
    a = Client(groups, "a", regex="rx-.*")
    converge([a], 1_000)
    epoch = groups.groups[GROUP].group_epoch
    cluster.delete("rx-2")
    converge([a], 1_500)  # within the interval: the subscription metadata moves without a resolution
    assert groups.groups[GROUP].group_epoch == epoch + 1 and a.topics() == {"rx-1"}
    cluster.create("rx-2", 3)  # the same name again, other partitions
    converge([a], 2_000)
    assert groups.groups[GROUP].group_epoch == epoch + 2
    assert a.owned["rx-2"] == {0, 1, 2}


def test_names_and_a_regex_together() -> None:
    cluster = Cluster(**{"rx-1": 1, "plain": 1, "other": 1})
    groups = cluster.groups()
    mixed, names = Client(groups, "a", regex="rx-.*", names=("plain",)), Client(groups, "b", names=("other",))
    converge([mixed, names], 1_000)
    assert mixed.topics() == {"rx-1", "plain"} and names.topics() == {"other"}
    assert groups.groups[GROUP].subscribed_topics() == {"rx-1", "plain", "other"}


def test_resolution_keeps_the_topics_the_principal_may_describe() -> None:
    groups = Cluster(**{"rx-open": 1, "rx-secret": 1}).groups()
    a = Client(groups, "a", regex="rx-.*")
    assert a.heartbeat(1_000, may_describe=lambda topic: topic != "rx-secret").error is E.none
    converge([a], 1_000)
    assert groups.groups[GROUP].resolved["rx-.*"].topics == {"rx-open"} and a.topics() == {"rx-open"}


def test_two_members_share_a_regex_whose_record_goes_with_the_last() -> None:
    cluster = Cluster(**{"rx-1": 4})
    groups = cluster.groups()
    a, b = Client(groups, "a", regex="rx-.*"), Client(groups, "b", regex="rx-.*")
    converge([a, b], 1_000)
    assert sorted(len(c.owned["rx-1"]) for c in (a, b)) == [2, 2]
    log: list[tuple[bytes, bytes | None]] = []
    replayed(groups, log, 1_000)
    assert a.heartbeat(1_000, member_epoch=-1).error is E.none
    group = groups.groups[GROUP]
    changes, _ = groups.take_changes(group)
    assert not any(isinstance(r, RegexTombstone) for r in changes) and "rx-.*" in group.resolved
    converge([b], 1_000)
    assert b.owned["rx-1"] == {0, 1, 2, 3}
    assert b.heartbeat(1_000, member_epoch=-1).error is E.none
    changes, _ = groups.take_changes(group)
    assert RegexTombstone(GROUP, "rx-.*") in changes and not group.resolved


def test_a_regex_changed_back_and_forth() -> None:
    cluster = Cluster(**{"a-1": 2, "b-1": 2})
    groups = cluster.groups()
    member = Client(groups, "m", regex="a-.*")
    converge([member], 1_000)
    log: list[tuple[bytes, bytes | None]] = []
    now = 1_000
    for regex, topic in [("b-.*", "b-1"), ("a-.*", "a-1"), ("b-.*", "b-1")]:
        now += REGEX_REFRESH_INTERVAL_MS + 1
        epoch = groups.groups[GROUP].group_epoch
        assert member.heartbeat(now, subscribed_topic_regex=regex).error is E.none
        converge([member], now)
        assert member.topics() == {topic} and groups.groups[GROUP].group_epoch == epoch + 1
        assert set(groups.groups[GROUP].resolved) == {regex}  # the old one's resolution went
        assert state(replayed(groups, log, now)) == state(groups)
    decoded = [records.decode(k, v) for k, v in log]
    assert RegexTombstone(GROUP, "a-.*") in decoded and RegexTombstone(GROUP, "b-.*") in decoded
    # Back to names only: the regex goes, its topics with it.
    assert member.heartbeat(now, subscribed_topic_regex="", subscribed_topic_names=("a-1",)).error is E.none
    converge([member], now)
    assert member.topics() == {"a-1"} and not groups.groups[GROUP].resolved


def test_a_new_regex_waits_for_the_interval_of_the_groups_last_resolution() -> None:
    """Kafka refreshes a group's regexes together, at most every interval: a regex brought within
    it is resolved once the interval passed (its member meanwhile gets nothing from it)."""
    cluster = Cluster(**{"a-1": 1, "b-1": 1})
    groups = cluster.groups()
    a, b = Client(groups, "a", regex="a-.*"), Client(groups, "b", regex="b-.*")
    converge([a], 1_000)
    converge([a, b], 2_000)
    assert b.topics() == set() and "b-.*" not in groups.groups[GROUP].resolved
    converge([a, b], 1_001 + REGEX_REFRESH_INTERVAL_MS)
    assert b.topics() == {"b-1"} and a.topics() == {"a-1"}


def test_a_topic_created_while_a_rebalance_is_in_flight() -> None:
    """A member still revoking (its old partitions not released yet) when a new topic comes: the
    next target includes the topic, and no partition ever has two owners."""
    cluster = Cluster(**{"rx-1": 4})
    groups = cluster.groups()
    a = Client(groups, "a", regex="rx-.*")
    converge([a], 1_000)
    b = Client(groups, "b", regex="rx-.*")
    assert b.heartbeat(1_000).error is E.none  # a must give up two partitions: a is revoking
    assert a.heartbeat(1_000, owned=dict(a.owned)).error is E.none
    assert groups.groups[GROUP].members["a"].pending_revocation
    cluster.create("rx-2", 4)
    later = 1_001 + REGEX_REFRESH_INTERVAL_MS
    converge([b, a], later)
    assert flat([a, b]) == {(t, p) for t in ("rx-1", "rx-2") for p in range(4)}
    assert sorted(sum(len(ps) for ps in c.owned.values()) for c in (a, b)) == [4, 4]


def test_replay_after_a_failover_keeps_regex_members_subscription_and_assignment() -> None:
    cluster = Cluster(**{"rx-1": 3, "rx-2": 3, "zz": 1})
    groups = cluster.groups()
    a, b = Client(groups, "a", regex="rx-.*"), Client(groups, "b", regex="rx-.*", names=("zz",))
    converge([a, b], 1_000)
    log: list[tuple[bytes, bytes | None]] = []
    loaded = replayed(groups, log, 5_000)
    assert state(loaded) == state(groups)
    assert RegexRecord(GROUP, "rx-.*", frozenset({"rx-1", "rx-2"}), 1_000) in [records.decode(k, v) for k, v in log]
    # The members go on at their epochs on the new coordinator, owning what they owned.
    before = (a.epoch, b.epoch, dict(a.owned), dict(b.owned))
    a.groups = b.groups = loaded
    converge([a, b], 5_000)
    assert before == (a.epoch, b.epoch, a.owned, b.owned)
    # A topic created during the failover: the loaded resolution is resolved again once allowed.
    cluster.create("rx-3", 2)
    converge([a, b], 1_001 + REGEX_REFRESH_INTERVAL_MS)
    assert "rx-3" in a.topics() | b.topics()


def test_a_failover_between_the_member_record_and_its_regex_resolution() -> None:
    """The member's record (with its regex) is stored before its regex is resolved (the interval
    of the group's last resolution had not passed): the new coordinator knows the regex, not its
    resolution, and resolves it when allowed."""
    cluster = Cluster(**{"a-1": 1, "b-1": 2})
    groups = cluster.groups()
    a, b = Client(groups, "a", regex="a-.*"), Client(groups, "b", regex="b-.*")
    converge([a], 1_000)
    converge([b], 2_000)
    log: list[tuple[bytes, bytes | None]] = []
    loaded = replayed(groups, log, 3_000)
    assert loaded.groups[GROUP].members["b"].subscribed_regex == "b-.*"
    assert "b-.*" not in loaded.groups[GROUP].resolved
    a.groups = b.groups = loaded
    converge([a, b], 1_001 + REGEX_REFRESH_INTERVAL_MS)
    assert b.owned == {"b-1": {0, 1}} and a.owned == {"a-1": {0}}


def test_a_topic_deleted_and_created_again_between_heartbeats_is_another_topic() -> None:
    """As Kafka's subscription metadata (it keeps topic ids): a subscribed topic deleted and created
    again with as many partitions, no heartbeat seeing it gone, bumps the group epoch, so that the
    members are sent their assignment again with the new topic's id (else they keep fetching the
    old id, as the assignment looks unchanged by name). Also across a failover: the ids are in the
    ConsumerGroupPartitionMetadata record."""
    cluster = Cluster(**{"rx-1": 2, "named": 1})
    groups = cluster.groups()
    by_regex, by_name = Client(groups, "a", regex="rx-.*"), Client(groups, "b", names=("named",))
    converge([by_regex, by_name], 1_000)
    epoch = groups.groups[GROUP].group_epoch
    for topic, partitions in (("rx-1", 2), ("named", 1)):
        cluster.delete(topic)
        cluster.create(topic, partitions)
    # Within the refresh interval: the regex is not resolved again, the topic is the same by name.
    answers = [by_regex.heartbeat(2_000, owned=None), by_name.heartbeat(2_000, owned=None)]
    assert groups.groups[GROUP].group_epoch == epoch + 1
    assert [a.assignment for a in answers] == [{"rx-1": frozenset({0, 1})}, {"named": frozenset({0})}]
    converge([by_regex, by_name], 2_000)

    loaded = replayed(groups, [], 3_000)
    assert loaded.groups[GROUP].subscription_ids == cluster.ids
    cluster.delete("rx-1")
    cluster.create("rx-1", 2)  # during the failover
    member = Client(loaded, "a")
    member.epoch, member.owned = by_regex.epoch, by_regex.owned
    answer = member.heartbeat(3_000, owned=None)
    assert loaded.groups[GROUP].group_epoch == epoch + 2 and answer.assignment == {"rx-1": frozenset({0, 1})}


def test_records_of_regexes_round_trip_and_old_member_values_read_without_a_regex() -> None:
    record = RegexRecord(GROUP, "rx-.*", frozenset({"rx-1", "rx-2"}), 123)
    key, value = records.encode_consumer(record)
    assert key[0] == 16  # Kafka's ConsumerGroupRegularExpressionKey
    assert records.decode(key, value) == record
    assert records.decode(*records.encode_consumer(RegexTombstone(GROUP, "rx-.*"))) == RegexTombstone(GROUP, "rx-.*")
    groups = Cluster(t=1).groups()
    Client(groups, "m", regex="t").heartbeat(1_000)
    member = next(r for r in groups.current_records(groups.groups[GROUP]) if hasattr(r, "subscribed_regex"))
    key, value = records.encode_consumer(member)
    assert records.decode(key, value) == member and member.subscribed_regex == "t"  # type: ignore[union-attr]
    _, fields = unpack(value, "value")  # type: ignore[arg-type]
    old = records.decode(key, pack(0, fields[:7]))
    assert old.subscribed_regex is None  # type: ignore[union-attr]
    # Subscription metadata with topic ids; one written before ids reads without them.
    metadata = SubscriptionMetadataRecord(GROUP, {"t": 1, "u": 2}, {"t": "t@0"})
    key, value = records.encode_consumer(metadata)
    assert records.decode(key, value) == metadata
    assert records.decode(key, pack(0, [[["t", 1], ["u", 2]]])) == SubscriptionMetadataRecord(GROUP, {"t": 1, "u": 2})

"""Sans-IO KIP-848 consumer groups: ConsumerGroupHeartbeat with server-side assignment.

``ConsumerGroups`` holds the consumer-protocol groups of one ``__consumer_offsets`` partition and
follows Kafka's GroupMetadataManager.consumerGroupHeartbeat (3.7+, without online migration):

- The group epoch is bumped whenever membership, a subscription, or the partition count of a
  subscribed topic changes; the target assignment is then recomputed at once by the group's
  assignor (``uniform`` or ``range``) and gets the group epoch as its assignment epoch.
- Each member converges to its target through Kafka's CurrentAssignmentBuilder states: STABLE,
  UNREVOKED_PARTITIONS (the member must first stop owning partitions that go elsewhere: it keeps
  its epoch until a heartbeat's ``topic_partitions`` no longer lists them) and
  UNRELEASED_PARTITIONS (the member got the new epoch, but some of its target partitions are still
  owned, as assigned or pending revocation, by another member). A partition is therefore never
  given to a member while another one still owns it.
- Member epoch -1 leaves; -2 is a static member's temporary leave (its assignment is kept until
  its session expires or it rejoins with the same instance id). A member that misses its session
  timeout, or does not revoke within its rebalance timeout, is removed.

Persistence, as Kafka's GroupMetadataManager: the group's state is kept in ``__consumer_offsets``
as keyed records (the ``*Record`` classes below, encoded by ``records``): the group epoch, the
subscription metadata, each member's metadata, the target assignment (its epoch and each member's
part) and each member's current assignment (epochs, state, assigned and pending-revocation
partitions). Each group remembers the latest record of each key as appended (``written``);
``take_changes`` returns the records that differ from it, so a heartbeat that changes nothing
writes nothing, a reconciliation step writes the member's current assignment, and a new target
writes the members whose part changed. ``apply`` replays a record into a fresh instance; a loaded
member's session timer (and rebalance timer, if it is revoking) starts at the load, as Kafka's
onLoaded. The core decides when to take the changes and when answers may go (once durable).
Committed offsets stay in ``GroupCoordinatorCore``.

Topics are identified by name here; the handler maps topic ids to names. ``partitions_of(topic)``
(supplied by the shell) gives the partition count of a topic, None if it does not exist.

Regular-expression subscriptions, as Kafka 4.0 (KIP-848's SubscribedTopicRegex): a member may
subscribe by a regex, alone or with topic names. A regex new to the group is compiled first (RE2
syntax, as Kafka's RE2/J; INVALID_REGULAR_EXPRESSION otherwise). The group resolves each of its
regexes against the shell's ``topic_names()`` by full match (``^orders`` is not ``orders-1``),
keeping the topics the heartbeat's principal may DESCRIBE (``HeartbeatRequest.may_describe``), and
a member's subscription is its names plus what its regex resolved to. Resolution happens during a
heartbeat, as Kafka's maybeUpdateRegularExpressions decides: when a regex is not resolved yet or
``topics_version()`` moved since (topics were created), but at most once per
``REGEX_REFRESH_INTERVAL_MS``; a change of the resolved topics bumps the group epoch, so members
get the new partitions. A deleted topic leaves the subscription metadata at once (its partition
count is gone), as for names. Each resolution is a ConsumerGroupRegularExpression record, with a
tombstone once no member subscribes to the regex; a resolution loaded from the log is resolved
again when next allowed (it may predate topics created during the failover).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import re2
from kio.schema.errors import ErrorCode

Assignment = dict[str, frozenset[int]]  # topic -> partitions

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

ASSIGNORS = ("uniform", "range")

# Kafka's REGEX_BATCH_REFRESH_INTERVAL_MS: a group's regular expressions are resolved again at most
# this often, so that a burst of topic creations costs one rebalance rather than one each.
REGEX_REFRESH_INTERVAL_MS = 10_000

# RE2 (Kafka resolves with RE2/J): linear time whatever the pattern, so a member cannot make the
# coordinator spin; no backreferences or lookarounds. Errors are answered, not logged by RE2 itself.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


def compile_regex(regex: str) -> re2._Regexp:
    """The compiled SubscribedTopicRegex; ValueError with RE2's description if it is not one."""
    try:
        return re2.compile(regex, _RE2_OPTIONS)
    except re2.error as exc:
        raw = exc.args[0] if exc.args else b""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        # RE2 says "<what>: <where>"; Kafka's message carries RE2/J's description, the "what".
        raise ValueError(text.split(": ", 1)[0]) from None


def regex_error(regex: str) -> str | None:
    """Kafka's INVALID_REGULAR_EXPRESSION message for ``regex``, None if it compiles."""
    try:
        compile_regex(regex)
    except ValueError as exc:
        return f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {exc}."
    return None


class MemberState(enum.Enum):
    # Values as Kafka's MemberState bytes (its ConsumerGroupCurrentMemberAssignmentValue.State).
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class ConsumerGroupConfig:
    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors (first is default)
    max_size: int = 2**31 - 1  # group.consumer.max.size


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None  # topic_partitions; None when unchanged since the last heartbeat
    client_id: str = ""
    client_host: str = ""
    # Which topics the member's principal may DESCRIBE (None: all). A regex resolved during this
    # heartbeat keeps only those, as Kafka resolves with the context of the heartbeat that triggers it.
    may_describe: Callable[[str], bool] | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None
    error_message: str | None = None


@dataclass(slots=True, eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    subscribed_topics: tuple[str, ...] = ()
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    session_deadline_ms: int | None = None
    rebalance_deadline_ms: int | None = None

    def owns(self) -> set[tuple[str, int]]:
        return _flatten(self.assigned) | _flatten(self.pending_revocation)


# --- records: what __consumer_offsets keeps of a group (``records`` encodes them) ------------------


@dataclass(frozen=True, slots=True)
class GroupEpochRecord:
    """Kafka's ConsumerGroupMetadata (key version 3): the group epoch."""

    group_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupTombstone:
    """A group key without a value: the consumer group is gone (members, target and all; its
    committed offsets are not: they have their own records). As Kafka, a deleted group gets one
    per key, ``kind`` (its group epoch key, "epoch", last, after those of its subscription
    metadata and target epoch), so that a compacted ``__consumer_offsets`` drops every key's
    records; any of them drops the whole group at a replay."""

    group_id: str
    kind: str = "epoch"


@dataclass(frozen=True, slots=True)
class SubscriptionMetadataRecord:
    """Kafka's ConsumerGroupPartitionMetadata (4): the partition count of each subscribed topic, and
    its topic id where known (Kafka's TopicMetadata has it: a topic deleted and created again under
    the same name, with as many partitions, is another topic)."""

    group_id: str
    partitions: Mapping[str, int]
    topic_ids: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MemberMetadataRecord:
    """Kafka's ConsumerGroupMemberMetadata (5): what the member told about itself."""

    group_id: str
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topics: tuple[str, ...]
    rebalance_timeout_ms: int
    server_assignor: str | None
    subscribed_regex: str | None = None


@dataclass(frozen=True, slots=True)
class MemberTombstone:
    """A member key without a value: the member left. As Kafka, one per key the member has,
    ``kind`` (current assignment, target, then its metadata, "member"), so that a compacted
    ``__consumer_offsets`` drops every key's records (one left behind would bring the member back
    with its old partitions once the tombstones are cleaned away); any of them drops the whole
    member at a replay, and the upkeep appends again only the keys of live members."""

    group_id: str
    member_id: str
    kind: str = "member"


@dataclass(frozen=True, slots=True)
class RegexRecord:
    """Kafka's ConsumerGroupRegularExpression (16): the topics a regex of the group resolved to, and
    when (the refresh interval counts from it across a failover too)."""

    group_id: str
    regex: str
    topics: frozenset[str]
    refreshed_ms: int


@dataclass(frozen=True, slots=True)
class RegexTombstone:
    """A regex key without a value: no member subscribes to the regex any more."""

    group_id: str
    regex: str


@dataclass(frozen=True, slots=True)
class TargetEpochRecord:
    """Kafka's ConsumerGroupTargetAssignmentMetadata (6): the epoch of the target assignment."""

    group_id: str
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class TargetMemberRecord:
    """Kafka's ConsumerGroupTargetAssignmentMember (7): one member's part of the target."""

    group_id: str
    member_id: str
    partitions: Mapping[str, frozenset[int]]


@dataclass(frozen=True, slots=True)
class CurrentAssignmentRecord:
    """Kafka's ConsumerGroupCurrentMemberAssignment (8): where the member is in its reconciliation."""

    group_id: str
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned: Mapping[str, frozenset[int]]
    pending_revocation: Mapping[str, frozenset[int]]


ConsumerRecord = (
    GroupEpochRecord
    | ConsumerGroupTombstone
    | SubscriptionMetadataRecord
    | MemberMetadataRecord
    | MemberTombstone
    | RegexRecord
    | RegexTombstone
    | TargetEpochRecord
    | TargetMemberRecord
    | CurrentAssignmentRecord
)

# The keys of a group's records: (kind, member id), "" for the group's own, the regex for a regex's.
RecordKey = tuple[str, str]
_EPOCH, _SUBSCRIPTIONS, _TARGET_EPOCH = ("epoch", ""), ("subscriptions", ""), ("target_epoch", "")
MEMBER_KINDS = ("member", "target", "assignment")
# The order of a deletion's tombstones, as Kafka's: a member's current assignment, target, metadata;
# the group's target epoch, subscription metadata, epoch.
MEMBER_TOMBSTONE_KINDS = ("assignment", "target", "member")
GROUP_TOMBSTONE_KINDS = ("target_epoch", "subscriptions", "epoch")
REGEX_KIND = "regex"


def record_key(record: ConsumerRecord) -> RecordKey:
    """The key a record writes (a later record of the same key replaces it); a tombstone's is the
    key it deletes."""
    if isinstance(record, ConsumerGroupTombstone):
        return (record.kind, "")
    if isinstance(record, MemberTombstone):
        return (record.kind, record.member_id)
    if isinstance(record, (RegexRecord, RegexTombstone)):
        return (REGEX_KIND, record.regex)
    if isinstance(record, GroupEpochRecord):
        return _EPOCH
    if isinstance(record, SubscriptionMetadataRecord):
        return _SUBSCRIPTIONS
    if isinstance(record, TargetEpochRecord):
        return _TARGET_EPOCH
    if isinstance(record, MemberMetadataRecord):
        return ("member", record.member_id)
    if isinstance(record, TargetMemberRecord):
        return ("target", record.member_id)
    return ("assignment", record.member_id)


def deletion_records(group_id: str, keys: Iterable[RecordKey]) -> list[ConsumerRecord]:
    """The tombstones that delete a group whose records have ``keys``: one per member key, then
    the group's three (whether written or not) with its regexes' before its subscription metadata,
    in Kafka's order."""
    keys = set(keys)
    members = sorted({member_id for kind, member_id in keys if kind in MEMBER_KINDS})
    out: list[ConsumerRecord] = [
        MemberTombstone(group_id, member_id, kind)
        for member_id in members
        for kind in MEMBER_TOMBSTONE_KINDS
        if (kind, member_id) in keys
    ]
    target_epoch, *rest = GROUP_TOMBSTONE_KINDS
    out.append(ConsumerGroupTombstone(group_id, target_epoch))
    out.extend(RegexTombstone(group_id, regex) for kind, regex in sorted(keys) if kind == REGEX_KIND)
    out.extend(ConsumerGroupTombstone(group_id, kind) for kind in rest)
    return out


@dataclass(frozen=True, slots=True)
class ResolvedRegex:
    """A regex's resolution. ``version``: the topics version it saw (``ConsumerGroups.topics_version``),
    None for one loaded from the log (another broker's count: resolved again when next allowed)."""

    topics: frozenset[str]
    refreshed_ms: int
    version: int | None = None


@dataclass(slots=True, eq=False)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Assignment] = field(default_factory=dict)
    subscription_metadata: dict[str, int] = field(default_factory=dict)  # topic -> partitions
    subscription_ids: dict[str, str] = field(default_factory=dict)  # topic -> its id, where known
    # What each regex its members subscribe to resolved to (Kafka's resolvedRegularExpressions).
    resolved: dict[str, ResolvedRegex] = field(default_factory=dict)
    # The latest record of each key as appended to __consumer_offsets: changes are written as the
    # difference from it (``take_changes``); after a replay, what the log holds.
    written: dict[RecordKey, ConsumerRecord] = field(default_factory=dict)
    # What may differ from ``written``: some members, or anything.
    dirty_members: set[str] = field(default_factory=set)
    dirty_all: bool = False
    # The core's: the token of the group's latest store, and whether a store failed since (the next
    # change then writes the epoch record again, so that answers have a store to wait for).
    store_token: int = 0
    confirm: bool = False

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch != self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def member_topics(self, member: ConsumerMember) -> frozenset[str]:
        """The member's subscription: its topic names and what its regex resolved to (nothing yet
        while unresolved)."""
        resolved = self.resolved.get(member.subscribed_regex) if member.subscribed_regex else None
        topics = frozenset(member.subscribed_topics)
        return topics | resolved.topics if resolved is not None else topics

    def subscribed_topics(self) -> frozenset[str]:
        return frozenset(t for m in self.members.values() for t in self.member_topics(m))

    def regexes(self) -> set[str]:
        """The regexes members subscribe to."""
        return {m.subscribed_regex for m in self.members.values() if m.subscribed_regex}

    def assignor(self, default: str) -> str:
        # Kafka picks the assignor most members ask for; the configured default otherwise.
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        return max(votes, key=lambda a: (votes[a], a == default)) if votes else default


def _flatten(assignment: Mapping[str, Iterable[int]]) -> set[tuple[str, int]]:
    return {(t, p) for t, parts in assignment.items() for p in parts}


def _group_by_topic(tps: Iterable[tuple[str, int]]) -> Assignment:
    out: dict[str, set[int]] = {}
    for t, p in tps:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in sorted(out.items())}


# --- assignors ------------------------------------------------------------------------------------


def uniform_assign(
    subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int], previous: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Spread the partitions of subscribed topics evenly, keeping previous owners where possible.

    Sticky: partitions stay with their previous (still subscribed) owner, unowned ones go to the
    eligible member with the fewest partitions, then partitions move from the most loaded member
    to eligible members with at least two fewer until no such move exists.
    """
    members = sorted(subscriptions)
    subs = {m: frozenset(subscriptions[m]) for m in members}
    owned: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
    all_tps = [(t, p) for t in sorted(partitions) for p in range(partitions[t]) if any(t in s for s in subs.values())]
    taken: set[tuple[str, int]] = set()
    for m in members:
        for tp in sorted(_flatten(previous.get(m, {}))):
            if tp[0] in subs[m] and tp[0] in partitions and tp[1] < partitions[tp[0]] and tp not in taken:
                owned[m].add(tp)
                taken.add(tp)
    # Keep at most the balanced quota per member, so that the balancing loop has less to move.
    for tp in all_tps:
        if tp in taken:
            continue
        eligible = [m for m in members if tp[0] in subs[m]]
        target = min(eligible, key=lambda m: (len(owned[m]), m))
        owned[target].add(tp)
    moved = True
    while moved:
        moved = False
        for a in sorted(members, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[a]):
                candidates = [b for b in members if tp[0] in subs[b] and len(owned[b]) < len(owned[a]) - 1]
                if candidates:
                    b = min(candidates, key=lambda m: (len(owned[m]), m))
                    owned[a].discard(tp)
                    owned[b].add(tp)
                    moved = True
                    break
            if moved:
                break
    return {m: _group_by_topic(owned[m]) for m in members}


def range_assign(
    subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int], previous: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Per topic, contiguous ranges of partitions to the subscribed members in member id order."""
    members = sorted(subscriptions)
    owned: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
    for topic in sorted(partitions):
        subscribers = [m for m in members if topic in set(subscriptions[m])]
        if not subscribers:
            continue
        count = partitions[topic]
        quota, extra = divmod(count, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = quota + (1 if i < extra else 0)
            owned[m].update((topic, p) for p in range(start, start + size))
            start += size
    return {m: _group_by_topic(owned[m]) for m in members}


_ASSIGNOR_FUNCS = {"uniform": uniform_assign, "range": range_assign}


# --- the groups -----------------------------------------------------------------------------------


class ConsumerGroups:
    """The consumer-protocol groups of one coordinator partition (no offsets: see the core)."""

    def __init__(
        self,
        config: ConsumerGroupConfig | None = None,
        partitions_of: Callable[[str], int | None] | None = None,
        topic_names: Callable[[], Iterable[str]] | None = None,
        topics_version: Callable[[], int] | None = None,
        topic_id_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self.config = config or ConsumerGroupConfig()
        self.partitions_of: Callable[[str], int | None] = partitions_of or (lambda topic: None)
        # A subscribed topic's id (None if unknown): one re-created under its name is a change of
        # the subscription metadata, as in Kafka, so that members learn the new id.
        self.topic_id_of: Callable[[str], str | None] = topic_id_of or (lambda topic: None)
        # The topics regexes are resolved against, and a number that moves whenever that set may
        # have changed (a move without a change only costs a resolution).
        self.topic_names: Callable[[], Iterable[str]] = topic_names or (lambda: ())
        self.topics_version: Callable[[], int] = topics_version or (lambda: 0)
        self.groups: dict[str, ConsumerGroup] = {}
        # Groups changed since the core last took their changes (an ordered set).
        self.touched: dict[str, None] = {}

    # --- timers -------------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        deadlines = [
            d
            for g in self.groups.values()
            for m in g.members.values()
            for d in (m.session_deadline_ms, m.rebalance_deadline_ms)
            if d is not None
        ]
        return min(deadlines) if deadlines else None

    def tick(self, now_ms: int) -> list[tuple[str, str]]:
        """Remove members whose session or rebalance timeout passed; returns (group, member) ids."""
        removed = []
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                expired = member.session_deadline_ms is not None and member.session_deadline_ms <= now_ms
                stuck = member.rebalance_deadline_ms is not None and member.rebalance_deadline_ms <= now_ms
                if expired or stuck:
                    self._remove_member(group, member)
                    removed.append((group.group_id, member.member_id))
                    self._refresh_target(group)
        return removed

    # --- queries ------------------------------------------------------------------------------

    def group(self, group_id: str) -> ConsumerGroup | None:
        return self.groups.get(group_id)

    def is_consumer_group(self, group_id: str) -> bool:
        return group_id in self.groups

    def is_empty(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is None or not group.members

    def forget(self, group_id: str) -> ConsumerGroup | None:
        """Drop a group without a tombstone: the caller writes one that drops it (the KIP-848 group's,
        or a group tombstone, which drops the classic group and the offsets too), or it is a replayed one."""
        return self.groups.pop(group_id, None)

    def owners(self, group_id: str) -> dict[tuple[str, int], str]:
        """Who owns which partition (assigned or pending revocation): for tests and invariants."""
        group = self.groups.get(group_id)
        out: dict[tuple[str, int], str] = {}
        if group is not None:
            for m in group.members.values():
                for tp in m.owns():
                    out[tp] = m.member_id
        return out

    # --- offsets validation -------------------------------------------------------------------

    def validate_offset_commit(
        self, group_id: str, member_id: str, member_epoch: int, *, api_version: int = -1
    ) -> ErrorCode:
        """``api_version``: the OffsetCommit version, -1 for none (TxnOffsetCommit, internal callers)."""
        group = self.groups[group_id]
        if member_epoch < 0 and not group.members:
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if 0 <= api_version < 9:
            # As Kafka (ConsumerGroup.validateOffsetCommit): a member of this protocol commits with v9+,
            # the first version whose generation field is the member epoch.
            return ErrorCode.unsupported_version
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        group = self.groups[group_id]
        if member_epoch < 0 and not member_id:
            return ErrorCode.none  # admin clients and old consumers
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    # --- ConsumerGroupHeartbeat ---------------------------------------------------------------

    def _validate(self, req: HeartbeatRequest) -> tuple[ErrorCode, str | None]:
        if not req.group_id:
            return ErrorCode.invalid_request, "GroupId can't be empty."
        if not req.member_id:
            return ErrorCode.invalid_request, "MemberId can't be empty."
        if req.instance_id is not None and not req.instance_id:
            return ErrorCode.invalid_request, "InstanceId can't be empty."
        if req.rack_id is not None and not req.rack_id:
            return ErrorCode.invalid_request, "RackId can't be empty."
        if req.member_epoch == JOIN_EPOCH:
            if req.rebalance_timeout_ms == -1:
                return ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request."
            if req.owned is None or req.owned:
                return ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining."
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                # As Kafka 4.0: an empty list or regex joins subscribed to nothing.
                return (
                    ErrorCode.invalid_request,
                    "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.",
                )
        elif req.member_epoch == STATIC_LEAVE_EPOCH:
            if req.instance_id is None:
                return ErrorCode.invalid_request, "InstanceId can't be null."
        elif req.member_epoch < STATIC_LEAVE_EPOCH:
            return ErrorCode.invalid_request, f"MemberEpoch {req.member_epoch} is invalid."
        if req.server_assignor is not None and req.server_assignor not in self.config.assignors:
            return ErrorCode.unsupported_assignor, f"ServerAssignor {req.server_assignor} is not supported."
        return ErrorCode.none, None

    def heartbeat(self, req: HeartbeatRequest, now_ms: int) -> HeartbeatResult:
        """ConsumerGroupHeartbeat. The caller checked that the group is not a classic group."""
        error, message = self._validate(req)
        if error is not ErrorCode.none:
            return HeartbeatResult(error, error_message=message)
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req, now_ms)
        group = self.groups.get(req.group_id)
        # As Kafka, a regex is compiled when it is new to the group (one in use was checked when it
        # came), before anything changes: the whole heartbeat is refused.
        if req.subscribed_topic_regex and (group is None or req.subscribed_topic_regex not in group.regexes()):
            message = regex_error(req.subscribed_topic_regex)
            if message is not None:
                return HeartbeatResult(ErrorCode.invalid_regular_expression, error_message=message)
        if group is None:
            if req.member_epoch != JOIN_EPOCH:
                return HeartbeatResult(ErrorCode.group_id_not_found, error_message=f"Group {req.group_id} not found.")
            group = self.groups[req.group_id] = ConsumerGroup(req.group_id)
        member = group.members.get(req.member_id)
        bump = False
        if req.member_epoch == JOIN_EPOCH:
            if member is None and req.instance_id is not None and req.instance_id in group.static_members:
                old = group.members[group.static_members[req.instance_id]]
                if old.member_epoch != STATIC_LEAVE_EPOCH:
                    return HeartbeatResult(
                        ErrorCode.unreleased_instance_id,
                        error_message=f"Static member {req.instance_id} is still in use by another member.",
                    )
                member = self._replace_static_member(group, old, req.member_id)
            elif member is None:
                if len(group.members) >= self.config.max_size:
                    return HeartbeatResult(ErrorCode.group_max_size_reached)
                member = group.members[req.member_id] = ConsumerMember(req.member_id)
                bump = True
            else:
                # A known member rejoining lost its state: it owns nothing any more.
                member.assigned, member.pending_revocation = {}, {}
                member.state = MemberState.STABLE
                member.member_epoch, member.previous_member_epoch = 0, -1
                member.rebalance_deadline_ms = None
        else:
            if member is None:
                return HeartbeatResult(
                    ErrorCode.unknown_member_id, error_message=f"Member {req.member_id} is not a member of the group."
                )
            if req.instance_id is not None and group.static_members.get(req.instance_id) != member.member_id:
                return HeartbeatResult(ErrorCode.fenced_instance_id)
            if not self._epoch_valid(member, req.member_epoch, req.owned):
                return HeartbeatResult(
                    ErrorCode.fenced_member_epoch,
                    error_message=f"The consumer group member has a smaller member epoch ({req.member_epoch}) "
                    f"than the one known by the group coordinator ({member.member_epoch}).",
                )
        # Update the member's static fields; a subscription or assignor change bumps the group epoch.
        if req.instance_id is not None and member.instance_id is None:
            member.instance_id = req.instance_id
            group.static_members[req.instance_id] = member.member_id
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id = req.client_id or member.client_id
        member.client_host = req.client_host or member.client_host
        if req.subscribed_topic_names is not None:
            topics = tuple(sorted(set(req.subscribed_topic_names)))
            if topics != member.subscribed_topics:
                member.subscribed_topics = topics
                bump = True
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None  # librdkafka sends "" for "no regex"
            if regex != member.subscribed_regex:
                # The member's subscription changed whether or not the new regex is resolved yet
                # (its old regex's topics go): a new target, as for a change of names.
                member.subscribed_regex = regex
                self._forget_unused_regexes(group)
                bump = True
        if req.server_assignor is not None and req.server_assignor != member.server_assignor:
            member.server_assignor = req.server_assignor
            bump = True
        if self._maybe_refresh_regexes(group, req.may_describe, now_ms):
            bump = True
        metadata = self._subscription_metadata(group)
        ids = self._topic_ids(metadata)
        if metadata != group.subscription_metadata or self._recreated(group, ids):
            group.subscription_metadata = metadata
            bump = True
        group.subscription_ids = ids
        if bump:
            group.group_epoch += 1
            self._compute_target(group)
        before = (dict(member.assigned), member.member_epoch)
        self._reconcile(group, member, req.owned, now_ms)
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms
        self._touch(group, member.member_id)
        changed = before != (member.assigned, member.member_epoch)
        send_assignment = req.member_epoch == JOIN_EPOCH or req.owned is not None or changed
        return HeartbeatResult(
            ErrorCode.none,
            member.member_id,
            member.member_epoch,
            self.config.heartbeat_interval_ms,
            dict(member.assigned) if send_assignment else None,
        )

    def _leave(self, req: HeartbeatRequest, now_ms: int) -> HeartbeatResult:
        group = self.groups.get(req.group_id)
        if group is None:
            return HeartbeatResult(ErrorCode.group_id_not_found, error_message=f"Group {req.group_id} not found.")
        member = group.members.get(req.member_id)
        if member is None and req.instance_id is not None:
            current = group.static_members.get(req.instance_id)
            member = group.members.get(current) if current is not None else None
            if member is not None:
                return HeartbeatResult(ErrorCode.fenced_instance_id)
        if member is None:
            return HeartbeatResult(ErrorCode.unknown_member_id)
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # Kept, with its assignment, until its session expires or it rejoins.
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = STATIC_LEAVE_EPOCH
            member.session_deadline_ms = now_ms + self.config.session_timeout_ms
            member.rebalance_deadline_ms = None
            self._touch(group, member.member_id)
        else:
            self._remove_member(group, member)
            self._refresh_target(group)
        return HeartbeatResult(ErrorCode.none, req.member_id, req.member_epoch, 0)

    @staticmethod
    def _epoch_valid(member: ConsumerMember, epoch: int, owned: Assignment | None) -> bool:
        """Kafka's throwIfMemberEpochIsInvalid."""
        if epoch > member.member_epoch:
            return False
        if epoch < member.member_epoch:
            # The response carrying the bumped epoch may have been lost: accept the previous epoch
            # if what the member owns is a subset of its current assignment.
            if epoch != member.previous_member_epoch or owned is None:
                return False
            return _flatten(owned) <= _flatten(member.assigned)
        return True

    # --- regular expressions ---------------------------------------------------------------------

    def _maybe_refresh_regexes(
        self, group: ConsumerGroup, may_describe: Callable[[str], bool] | None, now_ms: int
    ) -> bool:
        """Kafka's maybeUpdateRegularExpressions, its refresh done at once (the topics are in memory):
        the group's regexes are resolved again if one is not resolved yet or topics changed since
        the last resolution, but not within REGEX_REFRESH_INTERVAL_MS of it. Returns whether any
        regex now resolves to other topics (the group epoch must move)."""
        regexes = group.regexes()
        if not regexes:
            return False
        last = max((r.refreshed_ms for r in group.resolved.values()), default=None)
        if last is not None and now_ms <= last + REGEX_REFRESH_INTERVAL_MS:
            return False
        version = self.topics_version()
        stale = any(group.resolved.get(regex) is None or group.resolved[regex].version != version for regex in regexes)
        if not stale:
            return False
        compiled = []
        for regex in sorted(regexes):
            try:
                compiled.append((regex, compile_regex(regex)))
            except ValueError:
                # Checked when it came; one loaded from a log written by another RE2 resolves to nothing.
                compiled.append((regex, None))
        matched: dict[str, set[str]] = {regex: set() for regex in regexes}
        for topic in self.topic_names():
            for regex, pattern in compiled:
                # Full match, as RE2/J's matches(): "^topic" is not "topic-1".
                if pattern is not None and pattern.fullmatch(topic) is not None:
                    matched[regex].add(topic)
        if may_describe is not None:
            allowed = {t: may_describe(t) for t in set().union(*matched.values())}
            matched = {regex: {t for t in topics if allowed[t]} for regex, topics in matched.items()}
        changed = False
        for regex, topics in matched.items():
            old = group.resolved.get(regex)
            changed |= old is None or old.topics != topics
            group.resolved[regex] = ResolvedRegex(frozenset(topics), now_ms, version)
        return changed

    @staticmethod
    def _forget_unused_regexes(group: ConsumerGroup) -> None:
        """Resolutions of regexes no member subscribes to any more go (a tombstone each)."""
        for regex in set(group.resolved) - group.regexes():
            del group.resolved[regex]

    def _replace_static_member(self, group: ConsumerGroup, old: ConsumerMember, new_id: str) -> ConsumerMember:
        del group.members[old.member_id]
        target = group.target.pop(old.member_id, None)
        old.member_id = new_id
        # The old epoch was -2: the rejoining member continues from the assignment epoch it had.
        old.member_epoch = old.previous_member_epoch if old.previous_member_epoch >= 0 else 0
        group.members[new_id] = old
        if target is not None:
            group.target[new_id] = target
        assert old.instance_id is not None
        group.static_members[old.instance_id] = new_id
        self._touch(group)  # the old member id goes, the new one comes
        return old

    def _remove_member(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        self._drop_member(group, member.member_id)
        self._forget_unused_regexes(group)
        member.session_deadline_ms = member.rebalance_deadline_ms = None
        self._touch(group)

    @staticmethod
    def _drop_member(group: ConsumerGroup, member_id: str) -> None:
        member = group.members.pop(member_id, None)
        group.target.pop(member_id, None)
        instance_id = member.instance_id if member is not None else None
        if instance_id is not None and group.static_members.get(instance_id) == member_id:
            del group.static_members[instance_id]

    def _refresh_target(self, group: ConsumerGroup) -> None:
        """After a removal: new group epoch and target, then wake members held by released partitions."""
        group.group_epoch += 1
        group.subscription_metadata = self._subscription_metadata(group)
        group.subscription_ids = self._topic_ids(group.subscription_metadata)
        self._compute_target(group)

    def _subscription_metadata(self, group: ConsumerGroup) -> dict[str, int]:
        out = {}
        for topic in sorted(group.subscribed_topics()):
            count = self.partitions_of(topic)
            if count is not None and count > 0:
                out[topic] = count
        return out

    def _topic_ids(self, metadata: Mapping[str, int]) -> dict[str, str]:
        out = {}
        for topic in metadata:
            topic_id = self.topic_id_of(topic)
            if topic_id is not None:
                out[topic] = topic_id
        return out

    @staticmethod
    def _recreated(group: ConsumerGroup, ids: Mapping[str, str]) -> bool:
        """Whether a subscribed topic has another id than the one the group knows: it was deleted
        and created again between two looks (an id not known yet, from records written before ids
        were, is taken as it is)."""
        return any(group.subscription_ids.get(topic, topic_id) != topic_id for topic, topic_id in ids.items())

    def _compute_target(self, group: ConsumerGroup) -> None:
        assignor = _ASSIGNOR_FUNCS[group.assignor(self.config.assignors[0])]
        subscriptions = {m.member_id: tuple(sorted(group.member_topics(m))) for m in group.members.values()}
        group.target = assignor(subscriptions, group.subscription_metadata, group.target)
        group.assignment_epoch = group.group_epoch
        self._touch(group)

    # --- CurrentAssignmentBuilder -------------------------------------------------------------

    def _owner_elsewhere(self, group: ConsumerGroup, member: ConsumerMember) -> set[tuple[str, int]]:
        return {tp for m in group.members.values() if m is not member for tp in m.owns()}

    def _reconcile(self, group: ConsumerGroup, member: ConsumerMember, owned: Assignment | None, now_ms: int) -> None:
        if member.member_epoch == STATIC_LEAVE_EPOCH:
            return
        target_epoch = group.assignment_epoch
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if self._still_owns(owned, member.pending_revocation):
                return
            member.pending_revocation = {}
            member.rebalance_deadline_ms = None
            self._next_assignment(group, member, target_epoch, owned, now_ms)
        elif member.state is MemberState.UNRELEASED_PARTITIONS or member.member_epoch != target_epoch:
            self._next_assignment(group, member, target_epoch, owned, now_ms)

    @staticmethod
    def _still_owns(owned: Assignment | None, revoking: Assignment) -> bool:
        if owned is None:
            return True  # unchanged since the last heartbeat: still owns them
        return bool(_flatten(owned) & _flatten(revoking))

    def _next_assignment(
        self, group: ConsumerGroup, member: ConsumerMember, target_epoch: int, owned: Assignment | None, now_ms: int
    ) -> None:
        """Kafka's computeNextAssignment; ``owned`` is what the heartbeat reports (None: unchanged)."""
        target = _flatten(group.target.get(member.member_id, {}))
        current = _flatten(member.assigned)
        kept = current & target
        revoking = current - target
        wanted = target - current
        elsewhere = self._owner_elsewhere(group, member)
        free = {tp for tp in wanted if tp not in elsewhere}
        unreleased = bool(wanted - free)
        if revoking and self._still_owns(owned, _group_by_topic(revoking)):
            # New partitions are withheld until the member confirms the revocation. A member that
            # already reports owning none of them (it had not taken them yet) has nothing to
            # confirm: waiting for a change of its ownership that will not come would stall it.
            member.assigned = _group_by_topic(kept)
            member.pending_revocation = _group_by_topic(revoking)
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.rebalance_deadline_ms = now_ms + member.rebalance_timeout_ms
            return
        if member.member_epoch != target_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = target_epoch
        member.assigned = _group_by_topic(kept | free)
        member.pending_revocation = {}
        member.rebalance_deadline_ms = None
        member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE

    # --- records ------------------------------------------------------------------------------

    def _touch(self, group: ConsumerGroup, member_id: str | None = None) -> None:
        """Something of ``group`` may have changed: one member's records (``member_id``) or any."""
        if member_id is None:
            group.dirty_all = True
        else:
            group.dirty_members.add(member_id)
        self.touched[group.group_id] = None

    def take_touched(self) -> list[ConsumerGroup]:
        """The groups that may have changed since the last call."""
        groups = [g for g in (self.groups.get(i) for i in self.touched) if g is not None]
        self.touched = {}
        return groups

    def current_records(self, group: ConsumerGroup, member_ids: Iterable[str] | None = None) -> list[ConsumerRecord]:
        """The group's state as records (of ``member_ids`` only, and the group's own): what a
        replay must find. Order as Kafka writes them: member metadata, regex resolutions, group
        epoch and subscriptions, the target (members, then its epoch), current assignments."""
        gid = group.group_id
        live = [group.members[i] for i in (group.members if member_ids is None else member_ids) if i in group.members]
        out: list[ConsumerRecord] = [
            MemberMetadataRecord(
                gid,
                m.member_id,
                m.instance_id,
                m.rack_id,
                m.client_id,
                m.client_host,
                m.subscribed_topics,
                m.rebalance_timeout_ms,
                m.server_assignor,
                m.subscribed_regex,
            )
            for m in live
        ]
        out.extend(RegexRecord(gid, regex, r.topics, r.refreshed_ms) for regex, r in sorted(group.resolved.items()))
        out.append(GroupEpochRecord(gid, group.group_epoch))
        out.append(SubscriptionMetadataRecord(gid, dict(group.subscription_metadata), dict(group.subscription_ids)))
        out.extend(TargetMemberRecord(gid, m.member_id, dict(group.target.get(m.member_id, {}))) for m in live)
        out.append(TargetEpochRecord(gid, group.assignment_epoch))
        out.extend(
            CurrentAssignmentRecord(
                gid,
                m.member_id,
                m.member_epoch,
                m.previous_member_epoch,
                m.state,
                dict(m.assigned),
                dict(m.pending_revocation),
            )
            for m in live
        )
        return out

    def take_changes(
        self, group: ConsumerGroup, *, force: bool = False
    ) -> tuple[list[ConsumerRecord], dict[RecordKey, ConsumerRecord | None]]:
        """The records that bring what is written of ``group`` to its current state, and the undo
        of ``written`` (which is updated as if they were appended: ``revert`` if they were not).
        ``force`` writes the group epoch record even if unchanged (something to wait for)."""
        if group.dirty_all:
            member_ids = set(group.members) | {mid for kind, mid in group.written if kind in MEMBER_KINDS}
        else:
            member_ids = set(group.dirty_members)
        group.dirty_all, group.dirty_members = False, set()
        undo: dict[RecordKey, ConsumerRecord | None] = {}
        changes: list[ConsumerRecord] = []
        # Members that left first, a tombstone per key: a member id that comes back (it rejoins) is
        # written after.
        for member_id in sorted(member_ids - set(group.members)):
            for kind in MEMBER_TOMBSTONE_KINDS:
                key = (kind, member_id)
                if key in group.written:
                    undo.setdefault(key, group.written.pop(key))
                    changes.append(MemberTombstone(group.group_id, member_id, kind))
        for key in sorted(k for k in group.written if k[0] == REGEX_KIND and k[1] not in group.resolved):
            undo.setdefault(key, group.written.pop(key))
            changes.append(RegexTombstone(group.group_id, key[1]))
        ordered = [i for i in group.members if i in member_ids]
        for record in self.current_records(group, ordered):
            key = record_key(record)
            old = group.written.get(key)
            if old != record or (force and key == _EPOCH):
                undo.setdefault(key, old)
                group.written[key] = record
                changes.append(record)
        return changes, undo

    def revert(self, group: ConsumerGroup, undo: Mapping[RecordKey, ConsumerRecord | None], now_ms: int) -> None:
        """The records of ``take_changes`` (``undo``) were not appended: the group goes back to what
        the log holds, as Kafka reverts its state to the last written offset, so that its members
        (who get the error) go on from the epochs they know. Members keep their timers; one whose
        removal is undone gets a fresh session from ``now_ms``."""
        for key, old in undo.items():
            if old is None:
                group.written.pop(key, None)
            else:
                group.written[key] = old
        scratch = ConsumerGroups(self.config, self.partitions_of)
        for record in group.written.values():
            scratch.apply(record, now_ms)
        restored = scratch.groups.get(group.group_id) or ConsumerGroup(group.group_id)
        for member_id, member in restored.members.items():
            current = group.members.get(member_id)
            if current is not None and current.session_deadline_ms is not None:
                member.session_deadline_ms = current.session_deadline_ms
                member.rebalance_deadline_ms = current.rebalance_deadline_ms
        group.group_epoch, group.assignment_epoch = restored.group_epoch, restored.assignment_epoch
        group.members, group.static_members = restored.members, restored.static_members
        group.target, group.subscription_metadata = restored.target, restored.subscription_metadata
        group.subscription_ids = restored.subscription_ids
        group.resolved = restored.resolved
        group.dirty_all, group.dirty_members = False, set()
        if not group.written and self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]  # never in the log: as if never created

    def apply(self, record: ConsumerRecord, now_ms: int) -> None:
        """Replay one record, in log order. A loaded member's session timer starts at ``now_ms``,
        and its rebalance timer too if it is revoking partitions, as in Kafka's onLoaded."""
        gid = record.group_id
        if isinstance(record, ConsumerGroupTombstone):
            self.groups.pop(gid, None)
            return
        group = self.groups.get(gid)
        if group is None:
            if isinstance(record, (MemberTombstone, RegexTombstone)):
                return
            group = self.groups[gid] = ConsumerGroup(gid)
        if isinstance(record, MemberTombstone):
            self._drop_member(group, record.member_id)
            for kind in MEMBER_KINDS:
                group.written.pop((kind, record.member_id), None)
            return
        if isinstance(record, RegexTombstone):
            group.resolved.pop(record.regex, None)
            group.written.pop(record_key(record), None)
            return
        if isinstance(record, RegexRecord):
            group.resolved[record.regex] = ResolvedRegex(frozenset(record.topics), record.refreshed_ms)
        elif isinstance(record, GroupEpochRecord):
            group.group_epoch = record.epoch
        elif isinstance(record, SubscriptionMetadataRecord):
            group.subscription_metadata = dict(record.partitions)
            group.subscription_ids = dict(record.topic_ids)
        elif isinstance(record, TargetEpochRecord):
            group.assignment_epoch = record.assignment_epoch
        elif isinstance(record, TargetMemberRecord):
            group.target[record.member_id] = dict(record.partitions)
        elif isinstance(record, MemberMetadataRecord):
            member = self._loaded_member(group, record.member_id)
            if member.instance_id is not None and group.static_members.get(member.instance_id) == member.member_id:
                del group.static_members[member.instance_id]
            member.instance_id = record.instance_id
            member.rack_id = record.rack_id
            member.client_id = record.client_id
            member.client_host = record.client_host
            member.subscribed_topics = tuple(record.subscribed_topics)
            member.subscribed_regex = record.subscribed_regex
            member.rebalance_timeout_ms = record.rebalance_timeout_ms
            member.server_assignor = record.server_assignor
            if member.instance_id is not None:
                group.static_members[member.instance_id] = member.member_id
            self._start_timers(member, now_ms)
        else:
            member = self._loaded_member(group, record.member_id)
            member.member_epoch = record.member_epoch
            member.previous_member_epoch = record.previous_member_epoch
            member.state = record.state
            member.assigned = dict(record.assigned)
            member.pending_revocation = dict(record.pending_revocation)
            self._start_timers(member, now_ms)
        group.written[record_key(record)] = record

    @staticmethod
    def _loaded_member(group: ConsumerGroup, member_id: str) -> ConsumerMember:
        # A member's records may come in any order of keys (the upkeep appends old ones again).
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = ConsumerMember(member_id)
        return member

    def _start_timers(self, member: ConsumerMember, now_ms: int) -> None:
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms
        revoking = member.state is MemberState.UNREVOKED_PARTITIONS
        member.rebalance_deadline_ms = now_ms + member.rebalance_timeout_ms if revoking else None

    # --- unload -------------------------------------------------------------------------------

    def clear(self) -> None:
        self.groups.clear()
        self.touched.clear()

"""Sans-IO group coordinator: Kafka's classic ("generic") consumer group protocol.

``GroupCoordinatorCore`` holds the groups of one ``__consumer_offsets`` partition and follows the
semantics and error codes of Kafka's GroupCoordinator (kafka.coordinator.group, 2.x/3.x):

- States Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and Dead while a group is
  being deleted or after its coordinator unloaded it.
- JoinGroup parks members until every known member has rejoined or the rebalance timeout (the
  largest of the members' rebalance timeouts) runs out; dynamic members that did not rejoin are
  then removed. The first rebalance of an Empty group waits ``initial_rebalance_delay_ms`` (and
  again for each new member, up to the rebalance timeout), as group.initial.rebalance.delay.ms.
- KIP-394: a JoinGroup (v4+) with an empty member id gets MEMBER_ID_REQUIRED and a fresh member
  id; the member is "pending" until it rejoins with that id (or its session timeout expires).
- The leader is the first member that joined (or, if it did not rejoin, any member that did). The
  protocol is the one every member supports that collects most votes (each member votes for its
  most preferred candidate; ties go to the candidate voted first, in member join order).
- SyncGroup parks followers until the leader sends the assignment and the group record holding it
  is stored, then answers everyone (a failed store answers its error and rebalances). Members
  that do not send SyncGroup within the rebalance timeout are removed (KIP-767 style "pending
  sync" expiration) and the group rebalances.
- Heartbeats keep members alive; a member whose session timeout passes without a heartbeat is
  removed and the group rebalances. Members waiting in JoinGroup/SyncGroup need no heartbeat,
  except new members, who get ``new_member_join_timeout_ms`` to complete their first join.
- Static membership (KIP-345): a member with a ``group.instance.id`` that rejoins with an unknown
  member id replaces its old member id. In a Stable group whose selected protocol does not change
  this happens without a rebalance (once the group record with the new member id is stored) and
  the member gets its previous assignment back through SyncGroup; requests carrying the old
  member id are fenced with FENCED_INSTANCE_ID. Static members that do not rejoin during a
  rebalance are kept (only their session timeout removes them).
- Offsets: ``validate_commit`` decides whether a commit is allowed (Kafka's rules: members of the
  current generation, or anyone with generation -1 and an empty member id while the group is
  Empty/unknown); the shell persists the records, then ``apply_offsets`` makes them visible.
  Nothing is stored before persistence is confirmed, so a fetch never returns an offset that a
  coordinator failover could lose.

Timers are deadlines: every call that takes ``now_ms`` may move them; the shell runs
``tick(now_ms)`` when ``next_deadline_ms()`` is reached. Replies (JoinGroup and SyncGroup results)
go to callbacks, each invoked exactly once, always after the core finished updating its state, so
a callback may call back into the core.

Group records (``StoredGroup``, see the package docstring): the core decides what to store and
when, and hands each record to the ``on_store`` callback as a ``GroupStore`` (after its state
change, in order, like replies); the shell persists it and reports with ``group_stored``. Until
then the leader's assignment is held back (SyncGroup answers wait), and a static member's
replacement is unanswered (undone if the store fails). After a failover ``load_group`` rebuilds
each group from its latest record. Without ``on_store`` every store succeeds at once.

KIP-848 groups' records (``consumer_protocol``) go to ``on_store`` as ``ConsumerGroupStore``s, at
the end of the call that changed the group (a heartbeat, a timer, a conversion to classic), one
per group, only when something the log keeps changed. ``on_store`` appends them at once and says
whether they are in the log (if not, the group goes back to what the log holds, as Kafka reverts
to its last written offset), then reports with ``group_stored`` as for classic records. A
ConsumerGroupHeartbeat answer waits until the group's latest store is durable, as Kafka's
coordinator answers once the records (or, for a request that wrote none, those before it) are
committed: nobody is told an epoch or assignment a failover could lose. A failed store answers its
error (as Kafka maps append errors); records appended but not known to be replicated stay (they
are the log's, as in Kafka), and the group's next change writes its epoch again so that the next
answers wait for something durable.
"""

from __future__ import annotations

import enum
import functools
import itertools
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from .consumer_protocol import (
    ConsumerGroup,
    ConsumerGroupConfig,
    ConsumerGroups,
    ConsumerRecord,
    HeartbeatRequest,
    HeartbeatResult,
    deletion_records,
)

TopicPartition = tuple[str, int]

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1
CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_EMPTY = GroupState.EMPTY
_PREPARING = GroupState.PREPARING_REBALANCE
_COMPLETING = GroupState.COMPLETING_REBALANCE
_STABLE = GroupState.STABLE
_DEAD = GroupState.DEAD

# Kafka's GroupState.validPreviousStates: a transition from anywhere else is a bug in the core.
_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    _PREPARING: frozenset({_STABLE, _COMPLETING, _EMPTY}),
    _COMPLETING: frozenset({_PREPARING}),
    _STABLE: frozenset({_COMPLETING}),
    _EMPTY: frozenset({_PREPARING}),
    _DEAD: frozenset(GroupState),
}


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Kafka's group.* broker settings, with Kafka's defaults."""

    min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    max_size: int = 2**31 - 1  # group.max.size
    # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs: a new member parked in JoinGroup cannot
    # heartbeat, so it gets this long to complete its first join before it is dropped.
    new_member_join_timeout_ms: int = 300_000
    offset_metadata_max_bytes: int = 4_096  # offset.metadata.max.bytes


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class JoinedMember:
    """One entry of the member list the leader receives in its JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class LeaveResult:
    """Per-member outcome of a LeaveGroup (v3+ batches several members)."""

    member_id: str
    group_instance_id: str | None
    error: ErrorCode


CLASSIC_GROUP_TYPE = "classic"
CONSUMER_GROUP_TYPE = "consumer"  # a KIP-848 (ConsumerGroupHeartbeat) group


@dataclass(frozen=True, slots=True)
class GroupOverview:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = CLASSIC_GROUP_TYPE


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    exists: bool
    state: str
    protocol_type: str
    protocol_data: str
    members: tuple[MemberDescription, ...]
    error_message: str | None = None  # why a group that does not exist (as a classic group) is not described


@dataclass(frozen=True, slots=True)
class StoredMember:
    """One member as a group record keeps it (Kafka's GroupMetadataValue.MemberMetadata)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # its metadata for the group's selected protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class StoredGroup:
    """What a group record keeps (Kafka's GroupMetadataValue): a group with members loads Stable at
    this generation, one without loads Empty, its state clock at ``state_timestamp_ms``."""

    group_id: str
    protocol_type: str | None
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    state_timestamp_ms: int
    members: tuple[StoredMember, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupStore:
    """A group record the shell must persist, then report with ``group_stored(group_id, token, ...)``."""

    token: int
    group: StoredGroup


@dataclass(frozen=True, slots=True)
class ConsumerGroupStore:
    """A KIP-848 group's records the shell must append now, in this order (``on_store`` returns
    whether they are in the log), then report with ``group_stored(group_id, token, ...)``."""

    token: int
    group_id: str
    records: tuple[ConsumerRecord, ...]


@dataclass(slots=True, eq=False)
class _ConsumerStoreWait:
    """A ConsumerGroupStore not yet reported, and the heartbeat answers waiting for it."""

    group_id: str
    waiting: list[tuple[Callable[[HeartbeatResult], None], HeartbeatResult]] = field(default_factory=list)


JoinReply = Callable[[JoinResult], None]
SyncReply = Callable[[SyncResult], None]
HeartbeatReply = Callable[[HeartbeatResult], None]
# Persists a classic group record (its return value is ignored) or a KIP-848 group's records
# (returns False if they could not be appended; anything else: they are in the log).
StoreRequest = Callable[[GroupStore | ConsumerGroupStore], object]


@dataclass(slots=True, eq=False)
class _Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_reply: JoinReply | None = None
    sync_reply: SyncReply | None = None
    # A member added by JoinGroup whose first join has not completed yet: it cannot heartbeat.
    is_new: bool = False
    heartbeat_deadline_ms: int | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_reply is not None

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise KeyError(protocol)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        return next(name for name, _ in self.protocols if name in candidates)

    def heartbeat_satisfied(self) -> bool:
        """Kafka's MemberMetadata.hasSatisfiedHeartbeat at the moment the deadline fires."""
        if self.is_new:
            return False
        return self.join_reply is not None or self.sync_reply is not None


@dataclass(slots=True, eq=False)
class _StaticStore:
    """A static member replaced in a Stable group, its JoinGroup answer waiting for the group record;
    what to undo if the record cannot be stored."""

    generation_id: int
    group_instance_id: str
    old_member_id: str
    new_member_id: str
    old_protocols: list[tuple[str, bytes]]
    old_rebalance_timeout_ms: int
    old_session_timeout_ms: int
    reply: JoinReply
    current_leader: str
    support_skip_assignment: bool


@dataclass(slots=True, eq=False)
class _Group:
    group_id: str
    state_timestamp_ms: int
    state: GroupState = _EMPTY
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)  # KIP-394 member id -> deadline
    pending_sync: set[str] = field(default_factory=set)
    supported_protocols: Counter[str] = field(default_factory=Counter)
    new_member_added: bool = False
    # The DelayedJoin of a rebalance; ``initial_join`` = (delay, remaining) for the initial delay.
    join_deadline_ms: int | None = None
    initial_join: tuple[int, int] | None = None
    sync_deadline_ms: int | None = None
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    subscribed_topics: frozenset[str] | None = None
    # The leader's SyncGroup assignment being stored (the token of its record) before anyone gets it.
    sync_store: int | None = None
    pending_assignment: dict[str, bytes] = field(default_factory=dict)
    static_stores: dict[int, _StaticStore] = field(default_factory=dict)  # token -> replacement

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        names = {name for name, _ in protocols}
        if self.state is _EMPTY:
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols[n] == len(self.members) for n in names
        )

    def select_protocol(self) -> str:
        candidates = {p for p, count in self.supported_protocols.items() if count == len(self.members)}
        # Counter keeps first-insertion order and max() returns the first maximum: ties go to the
        # candidate voted first, in member join order, which keeps the choice deterministic.
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=lambda name: votes[name])


_F = TypeVar("_F", bound=Callable[..., Any])


def _delivers_replies(method: _F) -> _F:
    """Run the public ``method``, then hand the queued replies to their callbacks.

    Replies are queued while the state changes and delivered once the outermost call is done, so
    a callback always sees a consistent core (and may call it again).
    """

    @functools.wraps(method)
    def wrapper(self: GroupCoordinatorCore, *args: Any, **kwargs: Any) -> Any:
        self._depth += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._flush()

    return wrapper  # type: ignore[return-value]


def parse_subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """Topics of a ConsumerProtocolSubscription, parsed with its v0 layout, a prefix of every version.

    None when the bytes do not parse (Kafka then assumes the group may consume any topic).
    """
    try:
        pos = 2  # int16 version
        (count,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        if count < 0 or count > len(metadata):
            return None
        topics = []
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if size < 0 or pos + size > len(metadata):
                return None
            topics.append(metadata[pos : pos + size].decode("utf-8"))
            pos += size
        return frozenset(topics)
    except (struct.error, UnicodeDecodeError):
        return None


class GroupCoordinatorCore:
    """The classic groups (and their offsets) of one ``__consumer_offsets`` partition.

    The shell's part: run ``tick(now)`` once ``next_deadline_ms()`` is reached (and look again
    after every call that takes ``now_ms``); on becoming coordinator, ``records.replay`` the
    partition into a fresh core before serving; persist every ``GroupStore`` handed to
    ``on_store``, in the order handed, and report each with ``group_stored``; on losing the
    partition, ``unload()`` so that parked JoinGroup/SyncGroup requests are answered
    (NOT_COORDINATOR) rather than forgotten.
    """

    def __init__(
        self,
        config: GroupConfig | None = None,
        *,
        partition: int = -1,
        member_id_factory: Callable[[str], str] | None = None,
        consumer_config: ConsumerGroupConfig | None = None,
        partitions_of: Callable[[str], int | None] | None = None,
        topic_names: Callable[[], Iterable[str]] | None = None,
        topics_version: Callable[[], int] | None = None,
        topic_id_of: Callable[[str], str | None] | None = None,
        on_store: StoreRequest | None = None,
    ) -> None:
        self.config = config or GroupConfig()
        # Gets each group record to persist; None: nothing is persisted and every store succeeds at once.
        self._on_store = on_store
        self._store_tokens = itertools.count(1)
        # KIP-848 groups (ConsumerGroupHeartbeat); their committed offsets live here, in _groups.
        self.consumer = ConsumerGroups(consumer_config, partitions_of, topic_names, topics_version, topic_id_of)
        self.partition = partition
        self._new_member_id = member_id_factory or (lambda prefix: f"{prefix}-{uuid.uuid4()}")
        self._groups: dict[str, _Group] = {}
        self._outbox: list[tuple[Callable[[Any], None], Any]] = []
        self._depth = 0
        # KIP-848 stores appended but not reported yet (token -> answers waiting), and consumer groups
        # being deleted (DeleteGroups), kept until their tombstones are stored.
        self._consumer_stores: dict[int, _ConsumerStoreWait] = {}
        self._deleting: dict[str, ConsumerGroup | None] = {}

    # --- replies ------------------------------------------------------------------------------

    def _flush(self) -> None:
        while self._outbox:
            pending, self._outbox = self._outbox, []
            first_error: BaseException | None = None
            for callback, result in pending:
                try:
                    callback(result)
                except Exception as exc:  # one broken callback must not starve the others
                    first_error = first_error or exc
            if first_error is not None:
                raise first_error

    def _invoke_join(self, member: _Member, result: JoinResult) -> bool:
        if member.join_reply is None:
            return False
        self._outbox.append((member.join_reply, result))
        member.join_reply = None
        return True

    def _invoke_sync(self, member: _Member, result: SyncResult) -> bool:
        if member.sync_reply is None:
            return False
        self._outbox.append((member.sync_reply, result))
        member.sync_reply = None
        return True

    # --- group records ------------------------------------------------------------------------

    def _snapshot(self, group: _Group, assignment: Mapping[str, bytes] | None = None) -> StoredGroup:
        """The group's record: its members with ``assignment`` (default: their current ones)."""
        members: tuple[StoredMember, ...] = ()
        if group.protocol_name is not None:
            members = tuple(
                StoredMember(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata(group.protocol_name),
                    m.assignment if assignment is None else assignment.get(m.member_id, b""),
                )
                for m in group.members.values()
            )
        return StoredGroup(
            group.group_id,
            group.protocol_type,
            group.generation_id,
            group.protocol_name,
            group.leader_id,
            group.state_timestamp_ms,
            members,
        )

    def _request_store(self, group: _Group, token: int, snapshot: StoredGroup, now_ms: int) -> None:
        """Have ``snapshot`` persisted; ``_stored`` runs once it is (at once without a store callback).

        The request goes out with the replies, after the core finished its change, in the order the
        core made the changes: the shell appends records in that order."""
        if self._on_store is None:
            self._stored(group, token, ErrorCode.none, now_ms)
        else:
            self._outbox.append((self._on_store, GroupStore(token, snapshot)))

    @_delivers_replies
    def group_stored(self, group_id: str, token: int, error: ErrorCode, now_ms: int) -> None:
        """The shell's answer to a ``GroupStore`` or ``ConsumerGroupStore``: its records are durable
        (NONE) or could not be written (the error the waiting members get, as Kafka maps append
        errors)."""
        wait = self._consumer_stores.pop(token, None)
        if wait is not None:
            self._consumer_stored(wait, token, error)
            return
        group = self._groups.get(group_id)
        if group is not None:
            self._stored(group, token, error, now_ms)

    def _stored(self, group: _Group, token: int, error: ErrorCode, now_ms: int) -> None:
        if token == group.sync_store:
            group.sync_store = None
            assignment, group.pending_assignment = group.pending_assignment, {}
            if group.state is not _COMPLETING:
                return
            if error is not ErrorCode.none:
                # Kafka: nobody gets an assignment the log does not have; everyone rejoins.
                self._reset_and_propagate_assignment_error(group, error, now_ms)
                self._maybe_prepare_rebalance(group, now_ms)
                return
            for m in group.members.values():
                m.assignment = assignment.get(m.member_id, b"")
            self._propagate_assignment(group, ErrorCode.none, now_ms)
            self._transition(group, _STABLE, now_ms)
            return
        replaced = group.static_stores.pop(token, None)
        if replaced is not None:
            self._static_member_stored(group, replaced, error, now_ms)
        # Else the record of a group that became Empty: nobody waits for it. If it failed, the log
        # still has the previous generation, whose members (all gone) will time out after a load.

    @_delivers_replies
    def load_group(self, stored: StoredGroup, now_ms: int) -> None:
        """A replayed group record: the group as it was stored, Stable with its members (Empty
        without), offsets kept. As Kafka's onGroupLoaded, every member's session timer starts now:
        members that are still alive keep heartbeating at their generation, the others time out and
        the group rebalances then."""
        old = self._groups.get(stored.group_id)
        if old is not None:
            for member_id in list(old.members):
                self._remove(old, member_id)
        group = _Group(stored.group_id, state_timestamp_ms=stored.state_timestamp_ms)
        if old is not None:
            group.offsets = old.offsets
        self._groups[stored.group_id] = group
        group.generation_id = stored.generation_id
        group.protocol_name = stored.protocol_name if stored.members else None
        for s in stored.members:
            assert group.protocol_name is not None  # records.decode refuses members without a protocol
            member = _Member(
                s.member_id,
                s.group_instance_id,
                s.client_id,
                s.client_host,
                s.rebalance_timeout_ms,
                s.session_timeout_ms,
                stored.protocol_type or "",
                [(group.protocol_name, s.subscription)],
                assignment=s.assignment,
            )
            self._add_member(group, member, None)
            self._schedule_heartbeat(member, now_ms)
        group.protocol_type = stored.protocol_type
        if stored.leader_id in group.members:
            group.leader_id = stored.leader_id
        group.state = _STABLE if group.members else _EMPTY
        group.subscribed_topics = self._compute_subscribed_topics(group)

    # --- KIP-848 group records ------------------------------------------------------------------

    def _store_consumer_changes(self, now_ms: int) -> dict[str, int]:
        """Hand ``on_store`` the records of each KIP-848 group this call changed (one store per
        group, none if nothing the log keeps changed). Returns the token of each group's store."""
        made: dict[str, int] = {}
        for group in self.consumer.take_touched():
            records, undo = self.consumer.take_changes(group, force=group.confirm)
            if not records:
                continue
            token = next(self._store_tokens)
            group.store_token, group.confirm = token, False
            made[group.group_id] = token
            try:
                appended = self._append_consumer(ConsumerGroupStore(token, group.group_id, tuple(records)))
            except Exception:
                self.consumer.revert(group, undo, now_ms)
                raise
            if not appended:
                # Not in the log: back to what the log holds (the answers waiting get the error).
                self.consumer.revert(group, undo, now_ms)
        return made

    def _append_consumer(self, store: ConsumerGroupStore) -> bool:
        """Have ``store`` appended; False if it is not in the log. Its answers wait for its report."""
        if self._on_store is None:
            return True  # durable at once: nothing to wait for
        self._consumer_stores[store.token] = _ConsumerStoreWait(store.group_id)
        try:
            appended = self._on_store(store)
        except Exception:
            del self._consumer_stores[store.token]
            raise
        return appended is not False

    def _consumer_stored(self, wait: _ConsumerStoreWait, token: int, error: ErrorCode) -> None:
        for reply, result in wait.waiting:
            self._outbox.append((reply, result if error is ErrorCode.none else HeartbeatResult(error)))
        group = self.consumer.group(wait.group_id)
        if error is not ErrorCode.none and group is not None and group.store_token == token:
            # Its records may be lost, or in the log but not durable yet: answers from now on must
            # wait for a store of their own, which the group's next change makes (``confirm``).
            group.confirm = True

    def _answer_consumer(
        self, group_id: str, result: HeartbeatResult, reply: HeartbeatReply | None, made: Mapping[str, int]
    ) -> HeartbeatResult | None:
        """Answer now, or once the group's latest store (``made`` by this call, or before) is
        durable: what the answer tells (an epoch, an assignment) is in it or before it. Errors tell
        nothing of the group: at once."""
        wait = None
        if result.error is ErrorCode.none:
            group = self.consumer.group(group_id)
            token = made.get(group_id, group.store_token if group is not None else 0)
            wait = self._consumer_stores.get(token)
        if wait is None:
            if reply is not None:
                self._outbox.append((reply, result))
            return result
        if reply is None:
            raise ValueError(f"the answer to {group_id}'s heartbeat waits for its records: pass a reply")
        wait.waiting.append((reply, result))
        return None

    def apply_consumer_record(self, record: ConsumerRecord, now_ms: int) -> None:
        """A replayed KIP-848 group record (``consumer_protocol.ConsumerGroups.apply``)."""
        self.consumer.apply(record, now_ms)

    # --- timers -------------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which ``tick`` has something to do, or None."""
        best: int | None = self.consumer.next_deadline_ms()
        for group in self._groups.values():
            for deadline in self._group_deadlines(group):
                if best is None or deadline < best:
                    best = deadline
        return best

    @staticmethod
    def _group_deadlines(group: _Group) -> Iterable[int]:
        if group.join_deadline_ms is not None:
            yield group.join_deadline_ms
        if group.sync_deadline_ms is not None:
            yield group.sync_deadline_ms
        yield from group.pending_members.values()
        for member in group.members.values():
            if member.heartbeat_deadline_ms is not None:
                yield member.heartbeat_deadline_ms

    @_delivers_replies
    def tick(self, now_ms: int) -> None:
        """Fire every expired deadline, earliest first (session, join, sync and pending timeouts)."""
        self.consumer.tick(now_ms)
        self._store_consumer_changes(now_ms)
        for group in list(self._groups.values()):
            # Each step removes the deadline it fires or moves it past now_ms, so this ends.
            while True:
                event = self._earliest_due(group, now_ms)
                if event is None:
                    break
                self._fire(group, event, now_ms)

    def _earliest_due(self, group: _Group, now_ms: int) -> tuple[int, str, str] | None:
        due: list[tuple[int, str, str]] = []
        for member in group.members.values():
            if member.heartbeat_deadline_ms is not None and member.heartbeat_deadline_ms <= now_ms:
                due.append((member.heartbeat_deadline_ms, "heartbeat", member.member_id))
        for member_id, deadline in group.pending_members.items():
            if deadline <= now_ms:
                due.append((deadline, "pending", member_id))
        if group.join_deadline_ms is not None and group.join_deadline_ms <= now_ms:
            due.append((group.join_deadline_ms, "join", ""))
        if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now_ms:
            due.append((group.sync_deadline_ms, "sync", ""))
        return min(due) if due else None

    def _fire(self, group: _Group, event: tuple[int, str, str], now_ms: int) -> None:
        _, kind, member_id = event
        if kind == "heartbeat":
            member = group.members[member_id]
            if member.heartbeat_satisfied():
                # Kafka completes the delayed heartbeat here and schedules none: the member is
                # parked in a rebalance, and the next deadline is set when its join/sync answer goes.
                member.heartbeat_deadline_ms = None
            else:
                self._remove_member_and_update_group(group, member, now_ms)
        elif kind == "pending":
            del group.pending_members[member_id]
            if group.state is _PREPARING:
                self._try_complete_join(group, now_ms)
        elif kind == "join":
            self._on_join_deadline(group, now_ms)
        else:
            self._on_sync_deadline(group, now_ms)

    def _schedule_heartbeat(self, member: _Member, now_ms: int, timeout_ms: int | None = None) -> None:
        member.heartbeat_deadline_ms = now_ms + (member.session_timeout_ms if timeout_ms is None else timeout_ms)

    # --- group bookkeeping --------------------------------------------------------------------

    def _transition(self, group: _Group, state: GroupState, now_ms: int) -> None:
        if group.state not in _VALID_PREVIOUS[state]:
            raise AssertionError(f"group {group.group_id}: illegal transition {group.state.value} -> {state.value}")
        group.state = state
        group.state_timestamp_ms = now_ms

    def _add_member(self, group: _Group, member: _Member, reply: JoinReply | None) -> None:
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
        if not group.members:
            group.protocol_type = member.protocol_type
        if group.leader_id is None:
            group.leader_id = member.member_id
        group.members[member.member_id] = member
        group.supported_protocols.update(name for name, _ in member.protocols)
        member.join_reply = reply
        group.pending_members.pop(member.member_id, None)

    def _remove(self, group: _Group, member_id: str) -> None:
        """Kafka's GroupMetadata.remove; any reply still owed to the member is answered first."""
        member = group.members.pop(member_id, None)
        if member is not None:
            self._invoke_join(member, JoinResult(ErrorCode.unknown_member_id, UNKNOWN_MEMBER_ID))
            self._invoke_sync(member, SyncResult(ErrorCode.unknown_member_id))
            group.supported_protocols.subtract(name for name, _ in member.protocols)
            if member.group_instance_id is not None:
                group.static_members.pop(member.group_instance_id, None)
            member.heartbeat_deadline_ms = None
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)
        group.pending_members.pop(member_id, None)
        group.pending_sync.discard(member_id)

    def _update_member(
        self,
        member: _Member,
        group: _Group,
        protocols: list[tuple[str, bytes]],
        reply: JoinReply,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
    ) -> None:
        group.supported_protocols.subtract(name for name, _ in member.protocols)
        member.protocols = protocols
        group.supported_protocols.update(name for name, _ in protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        # Kafka overwrites a pending JoinGroup callback; its request then never gets an answer.
        # We answer it instead, so that no caller waits forever on a superseded request.
        self._invoke_join(member, JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
        member.join_reply = reply

    def _member_metadata(self, group: _Group) -> tuple[JoinedMember, ...]:
        assert group.protocol_name is not None
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
            for m in group.members.values()
        )

    def _current_join_result(self, group: _Group, member: _Member, *, with_members: bool) -> JoinResult:
        return JoinResult(
            ErrorCode.none,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            False,
            self._member_metadata(group) if with_members else (),
        )

    def _compute_subscribed_topics(self, group: _Group) -> frozenset[str] | None:
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not group.members:
            return frozenset()
        if group.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in group.members.values():
            parsed = parse_subscribed_topics(member.metadata(group.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return frozenset(topics)

    def _validate_current_member(self, group: _Group, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """A static member's instance id must map to this member id; the member must exist."""
        if group_instance_id is not None:
            current = group.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    # --- rebalance ----------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: _Group, now_ms: int) -> None:
        if group.state in _VALID_PREVIOUS[_PREPARING]:
            self._prepare_rebalance(group, now_ms)

    def _prepare_rebalance(self, group: _Group, now_ms: int) -> None:
        if group.state is _COMPLETING:
            # Followers parked in SyncGroup must rejoin: their generation is being abandoned.
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress, now_ms)
        group.pending_sync.clear()
        group.sync_deadline_ms = None
        # A leader's assignment still being stored is dropped: this generation is being abandoned.
        group.sync_store = None
        group.pending_assignment = {}
        if group.state is _EMPTY:
            delay = self.config.initial_rebalance_delay_ms
            group.initial_join = (delay, max(group.rebalance_timeout_ms - delay, 0))
            group.join_deadline_ms = now_ms + delay
        else:
            group.initial_join = None
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms
        self._transition(group, _PREPARING, now_ms)
        self._try_complete_join(group, now_ms)

    def _try_complete_join(self, group: _Group, now_ms: int) -> None:
        # The initial delay never completes early: it exists to collect more members.
        if group.state is _PREPARING and group.initial_join is None and group.all_joined():
            self._complete_join(group, now_ms)

    def _on_join_deadline(self, group: _Group, now_ms: int) -> None:
        if group.state is not _PREPARING:
            group.join_deadline_ms = None
            group.initial_join = None
            return
        if group.initial_join is not None:
            delay, remaining = group.initial_join
            if group.new_member_added and remaining != 0:
                # Members are still arriving: wait another delay, never past the rebalance timeout.
                group.new_member_added = False
                next_delay = min(self.config.initial_rebalance_delay_ms, remaining)
                group.initial_join = (next_delay, max(remaining - delay, 0))
                group.join_deadline_ms = now_ms + next_delay
                return
        self._complete_join(group, now_ms)

    def _complete_join(self, group: _Group, now_ms: int) -> None:
        """Kafka's onCompleteJoin: start the next generation with the members that rejoined."""
        group.join_deadline_ms = None
        group.initial_join = None
        for member in [m for m in group.members.values() if not m.awaiting_join and m.group_instance_id is None]:
            self._remove(group, member.member_id)
        if group.state is _DEAD:
            return
        if group.members and not self._elect_joined_leader(group):
            # Only static members that did not rejoin are left: wait for them (or for their
            # session timeouts) another rebalance timeout. Never a zero delay, so tick() ends.
            group.join_deadline_ms = now_ms + max(group.rebalance_timeout_ms, 1)
            return
        self._init_next_generation(group, now_ms)
        if group.state is _EMPTY:
            # Kafka stores the Empty group too: its generation, and when it became Empty (the
            # offsets' retention clock, KIP-211). Nobody waits for this record.
            self._request_store(group, next(self._store_tokens), self._snapshot(group), now_ms)
            return
        for member in list(group.members.values()):
            # The leader alone gets the member list it needs to compute the assignment.
            is_leader = member.member_id == group.leader_id
            self._invoke_join(member, self._current_join_result(group, member, with_members=is_leader))
            self._schedule_heartbeat(member, now_ms)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms

    def _elect_joined_leader(self, group: _Group) -> bool:
        """Keep the leader if it rejoined, else pick any member that did; False if none did."""
        if group.leader_id is None:
            return False
        if group.members[group.leader_id].awaiting_join:
            return True
        for member in group.members.values():
            if member.awaiting_join:
                group.leader_id = member.member_id
                return True
        return False

    def _init_next_generation(self, group: _Group, now_ms: int) -> None:
        group.generation_id += 1
        if group.members:
            group.protocol_name = group.select_protocol()
            group.subscribed_topics = self._compute_subscribed_topics(group)
            self._transition(group, _COMPLETING, now_ms)
        else:
            group.protocol_name = None
            group.subscribed_topics = self._compute_subscribed_topics(group)
            self._transition(group, _EMPTY, now_ms)
        group.pending_sync.clear()
        group.sync_deadline_ms = None

    def _on_sync_deadline(self, group: _Group, now_ms: int) -> None:
        group.sync_deadline_ms = None
        if group.state not in (_COMPLETING, _STABLE) or not group.pending_sync:
            return
        for member_id in sorted(group.pending_sync):
            self._remove(group, member_id)
        self._prepare_rebalance(group, now_ms)

    def _reset_and_propagate_assignment_error(self, group: _Group, error: ErrorCode, now_ms: int) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error, now_ms)

    def _propagate_assignment(self, group: _Group, error: ErrorCode, now_ms: int) -> None:
        for member in group.members.values():
            if error is ErrorCode.none:
                result = SyncResult(error, group.protocol_type, group.protocol_name, member.assignment)
            else:
                result = SyncResult(error)
            if self._invoke_sync(member, result):
                # Its session may have lapsed while it waited for the leader: restart the clock.
                self._schedule_heartbeat(member, now_ms)

    def _remove_member_and_update_group(self, group: _Group, member: _Member, now_ms: int) -> None:
        # A new member may time out while parked in JoinGroup: UNKNOWN_MEMBER_ID makes it retry.
        self._invoke_join(member, JoinResult(ErrorCode.unknown_member_id, UNKNOWN_MEMBER_ID))
        self._remove(group, member.member_id)
        if group.state in (_STABLE, _COMPLETING):
            self._maybe_prepare_rebalance(group, now_ms)
        elif group.state is _PREPARING:
            self._try_complete_join(group, now_ms)

    # --- JoinGroup ----------------------------------------------------------------------------

    @_delivers_replies
    def join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: Iterable[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        reply: JoinReply,
        *,
        require_known_member_id: bool = True,
        support_skip_assignment: bool = False,
        client_id: str = "",
        client_host: str = "",
    ) -> None:
        """JoinGroup. ``reply`` gets the result now or when the rebalance completes.

        ``require_known_member_id`` is JoinGroup v4+ (KIP-394), ``support_skip_assignment`` v9+.
        """
        protocols = [(name, bytes(data)) for name, data in protocols]
        if not group_id:
            self._outbox.append((reply, JoinResult(ErrorCode.invalid_group_id, member_id)))
            return
        if not self.config.min_session_timeout_ms <= session_timeout_ms <= self.config.max_session_timeout_ms:
            self._outbox.append((reply, JoinResult(ErrorCode.invalid_session_timeout, member_id)))
            return
        is_unknown = member_id == UNKNOWN_MEMBER_ID
        if self.consumer.is_consumer_group(group_id):
            if not self.consumer.is_empty(group_id):
                # No online migration: a consumer-protocol group with members refuses classic members.
                self._outbox.append((reply, JoinResult(ErrorCode.inconsistent_group_protocol, member_id)))
                return
            # Its tombstone goes before any record of the classic group. If it cannot be appended the
            # group stays, as the log has it (a classic group beside it would load next to it after a
            # failover, and the upkeep would keep its records): the member retries.
            dropped = self.consumer.forget(group_id)
            if dropped is not None and dropped.written:
                tombstones = tuple(deletion_records(group_id, dropped.written))
                if not self._append_consumer(ConsumerGroupStore(next(self._store_tokens), group_id, tombstones)):
                    self.consumer.groups[group_id] = dropped
                    self._outbox.append((reply, JoinResult(ErrorCode.coordinator_not_available, member_id)))
                    return
        group = self._groups.get(group_id)
        if group is None:
            if not is_unknown:
                self._outbox.append((reply, JoinResult(ErrorCode.unknown_member_id, member_id)))
                return
            group = self._groups[group_id] = _Group(group_id, state_timestamp_ms=now_ms)
        if not self._accept_joining_member(group, member_id):
            existing = group.members.get(member_id)
            if existing is not None:
                self._remove(group, member_id)
            self._outbox.append((reply, JoinResult(ErrorCode.group_max_size_reached, UNKNOWN_MEMBER_ID)))
        else:
            args = (protocol_type, protocols, session_timeout_ms, rebalance_timeout_ms, now_ms, reply)
            if is_unknown:
                self._join_new_member(
                    group,
                    group_instance_id,
                    *args,
                    require_known_member_id=require_known_member_id,
                    support_skip_assignment=support_skip_assignment,
                    client_id=client_id,
                    client_host=client_host,
                )
            else:
                self._join_current_member(group, member_id, group_instance_id, *args, client_id, client_host)
        if group.state is _PREPARING:
            self._try_complete_join(group, now_ms)

    def _accept_joining_member(self, group: _Group, member_id: str) -> bool:
        if group.state in (_EMPTY, _DEAD):
            return True
        if group.state is _PREPARING:
            member = group.members.get(member_id)
            # Counting members already parked (rather than the group size) lets the group shed
            # the last rejoining members when group.max.size was lowered.
            return (member is not None and member.awaiting_join) or group.num_awaiting_join() < self.config.max_size
        return member_id in group.members or len(group.members) < self.config.max_size

    def _join_new_member(
        self,
        group: _Group,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        reply: JoinReply,
        *,
        require_known_member_id: bool,
        support_skip_assignment: bool,
        client_id: str,
        client_host: str,
    ) -> None:
        if group.state is _DEAD:
            # Being deleted or unloaded: the member should find the coordinator again and retry.
            self._outbox.append((reply, JoinResult(ErrorCode.coordinator_not_available, UNKNOWN_MEMBER_ID)))
            return
        if not group.supports(protocol_type, protocols):
            self._outbox.append((reply, JoinResult(ErrorCode.inconsistent_group_protocol, UNKNOWN_MEMBER_ID)))
            return
        new_member_id = self._new_member_id(group_instance_id if group_instance_id is not None else client_id)
        if group_instance_id is not None:
            old_member_id = group.static_members.get(group_instance_id)
            if old_member_id is not None:
                self._update_static_member_and_rebalance(
                    group,
                    old_member_id,
                    new_member_id,
                    group_instance_id,
                    protocols,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    now_ms,
                    reply,
                    support_skip_assignment,
                )
                return
        elif require_known_member_id:
            # KIP-394: hand out the id first, so a client that times out and retries does not
            # leave a trail of unknown members behind. The id is reserved for a session timeout.
            group.pending_members[new_member_id] = now_ms + session_timeout_ms
            self._outbox.append((reply, JoinResult(ErrorCode.member_id_required, new_member_id)))
            return
        self._add_member_and_rebalance(
            group,
            new_member_id,
            group_instance_id,
            protocol_type,
            protocols,
            session_timeout_ms,
            rebalance_timeout_ms,
            now_ms,
            reply,
            client_id,
            client_host,
        )

    def _join_current_member(
        self,
        group: _Group,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        reply: JoinReply,
        client_id: str,
        client_host: str,
    ) -> None:
        if group.state is _DEAD:
            self._outbox.append((reply, JoinResult(ErrorCode.coordinator_not_available, member_id)))
            return
        if not group.supports(protocol_type, protocols):
            self._outbox.append((reply, JoinResult(ErrorCode.inconsistent_group_protocol, member_id)))
            return
        if member_id in group.pending_members and group_instance_id is None:
            self._add_member_and_rebalance(
                group,
                member_id,
                None,
                protocol_type,
                protocols,
                session_timeout_ms,
                rebalance_timeout_ms,
                now_ms,
                reply,
                client_id,
                client_host,
            )
            return
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not ErrorCode.none:
            self._outbox.append((reply, JoinResult(error, member_id)))
            return
        member = group.members[member_id]
        update = (protocols, reply, rebalance_timeout_ms, session_timeout_ms)
        if group.state is _PREPARING:
            self._update_member(member, group, *update)
            self._maybe_prepare_rebalance(group, now_ms)
        elif group.state is _COMPLETING:
            if member.matches(protocols):
                # It lost our JoinGroup answer: resend this generation's, no new rebalance.
                is_leader = member_id == group.leader_id
                self._outbox.append((reply, self._current_join_result(group, member, with_members=is_leader)))
            else:
                self._update_member(member, group, *update)
                self._maybe_prepare_rebalance(group, now_ms)
        elif group.state is _STABLE:
            if member_id == group.leader_id or not member.matches(protocols):
                # A leader's JoinGroup forces a rebalance: that is how it reacts to changes that
                # the member metadata does not show (new partitions of subscribed topics...).
                self._update_member(member, group, *update)
                self._maybe_prepare_rebalance(group, now_ms)
            else:
                self._outbox.append((reply, self._current_join_result(group, member, with_members=False)))
        else:
            self._outbox.append((reply, JoinResult(ErrorCode.unknown_member_id, member_id)))

    def _add_member_and_rebalance(
        self,
        group: _Group,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        reply: JoinReply,
        client_id: str,
        client_host: str,
    ) -> None:
        member = _Member(
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            protocol_type,
            protocols,
            is_new=True,
        )
        if group.state is _PREPARING and group.generation_id == 0:
            # Lets the initial rebalance delay extend itself while members keep arriving.
            group.new_member_added = True
        self._add_member(group, member, reply)
        # A new member parked in JoinGroup cannot heartbeat; bound its wait instead.
        self._schedule_heartbeat(member, now_ms, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group, now_ms)

    def _update_static_member_and_rebalance(
        self,
        group: _Group,
        old_member_id: str,
        new_member_id: str,
        group_instance_id: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        reply: JoinReply,
        support_skip_assignment: bool,
    ) -> None:
        current_leader = group.leader_id or ""
        previous = group.members[old_member_id]
        old_protocols = previous.protocols
        old_timeouts = (previous.rebalance_timeout_ms, previous.session_timeout_ms)
        member = self._replace_static_member(group, group_instance_id, old_member_id, new_member_id)
        self._update_member(member, group, protocols, reply, rebalance_timeout_ms, session_timeout_ms)
        self._schedule_heartbeat(member, now_ms)
        if group.state is _STABLE:
            if group.protocol_name == group.select_protocol():
                # The restarted instance takes its old place: same generation, same assignment
                # (it gets it through SyncGroup), no rebalance for the others. As in Kafka, it is
                # answered once the group record with its new member id is durable: a coordinator
                # failover must not bring back the old id, which would fence the new instance.
                token = next(self._store_tokens)
                group.static_stores[token] = _StaticStore(
                    group.generation_id,
                    group_instance_id,
                    old_member_id,
                    new_member_id,
                    old_protocols,
                    *old_timeouts,
                    reply,
                    current_leader,
                    support_skip_assignment,
                )
                self._request_store(group, token, self._snapshot(group), now_ms)
            else:
                self._maybe_prepare_rebalance(group, now_ms)
        elif group.state is _COMPLETING:
            # The leader may already be assigning with the old member id: start over.
            self._prepare_rebalance(group, now_ms)
        elif group.state is not _PREPARING:
            self._invoke_join(member, JoinResult(ErrorCode.unknown_member_id, new_member_id))

    def _static_member_stored(self, group: _Group, replaced: _StaticStore, error: ErrorCode, now_ms: int) -> None:
        member = group.members.get(replaced.new_member_id)
        if (
            member is None
            or member.join_reply is not replaced.reply
            or group.state is not _STABLE
            or group.generation_id != replaced.generation_id
        ):
            # The group moved on meanwhile: a rebalance answers the JoinGroup (the member counts as
            # rejoined), a removal already did, and the next record supersedes this one.
            return
        if error is not ErrorCode.none:
            # Kafka undoes the replacement: the old member id is the instance's again, and the new
            # instance gets the error and joins again.
            self._invoke_join(
                member,
                JoinResult(
                    error,
                    UNKNOWN_MEMBER_ID,
                    group.generation_id,
                    group.protocol_type,
                    group.protocol_name,
                    replaced.current_leader,
                ),
            )
            group.supported_protocols.subtract(name for name, _ in member.protocols)
            member.protocols = replaced.old_protocols
            group.supported_protocols.update(name for name, _ in member.protocols)
            member.rebalance_timeout_ms = replaced.old_rebalance_timeout_ms
            member.session_timeout_ms = replaced.old_session_timeout_ms
            self._replace_static_member(
                group, replaced.group_instance_id, replaced.new_member_id, replaced.old_member_id
            )
            self._schedule_heartbeat(member, now_ms)
            return
        is_leader = group.leader_id == member.member_id
        if replaced.support_skip_assignment:
            # v9+: tell a static leader it leads, but must not run the assignor again.
            result = JoinResult(
                ErrorCode.none,
                member.member_id,
                group.generation_id,
                group.protocol_type,
                group.protocol_name,
                group.leader_id or "",
                is_leader,
                self._member_metadata(group) if is_leader else (),
            )
        else:
            # Older clients would run the assignor if they saw themselves as leader, and
            # a Stable group would ignore that assignment: report the old leader id.
            result = JoinResult(
                ErrorCode.none,
                member.member_id,
                group.generation_id,
                group.protocol_type,
                group.protocol_name,
                replaced.current_leader,
            )
        self._invoke_join(member, result)
        # Its session may have lapsed while the record was written (a member waiting for its
        # JoinGroup answer needs no heartbeat): restart the clock.
        self._schedule_heartbeat(member, now_ms)

    def _replace_static_member(
        self, group: _Group, group_instance_id: str, old_member_id: str, new_member_id: str
    ) -> _Member:
        member = group.members.pop(old_member_id)
        # Whoever still waits with the old id is a duplicate instance: fence it right away.
        self._invoke_join(member, JoinResult(ErrorCode.fenced_instance_id, old_member_id))
        self._invoke_sync(member, SyncResult(ErrorCode.fenced_instance_id))
        member.member_id = new_member_id
        group.members[new_member_id] = member
        if group.leader_id == old_member_id:
            group.leader_id = new_member_id
        if old_member_id in group.pending_sync:
            group.pending_sync.discard(old_member_id)
            group.pending_sync.add(new_member_id)
        group.static_members[group_instance_id] = new_member_id
        return member

    # --- SyncGroup ----------------------------------------------------------------------------

    @_delivers_replies
    def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
        now_ms: int,
        reply: SyncReply,
    ) -> None:
        """SyncGroup. Followers are answered when the leader's assignment arrives."""
        if not group_id:
            self._outbox.append((reply, SyncResult(ErrorCode.invalid_group_id)))
            return
        group = self._groups.get(group_id)
        if group is None:
            self._outbox.append((reply, SyncResult(ErrorCode.unknown_member_id)))
            return
        error = self._validate_sync(group, generation_id, member_id, group_instance_id, protocol_type, protocol_name)
        if error is not ErrorCode.none:
            self._outbox.append((reply, SyncResult(error)))
        elif group.state is _EMPTY:
            self._outbox.append((reply, SyncResult(ErrorCode.unknown_member_id)))
        elif group.state is _PREPARING:
            self._outbox.append((reply, SyncResult(ErrorCode.rebalance_in_progress)))
        elif group.state is _COMPLETING:
            member = group.members[member_id]
            # A second SyncGroup from the same member replaces the first; answer the first.
            self._invoke_sync(member, SyncResult(ErrorCode.rebalance_in_progress))
            member.sync_reply = reply
            self._remove_pending_sync(group, member_id)
            if member_id == group.leader_id and group.sync_store is None:
                # Members the leader left out get an empty assignment, as Kafka does. Nobody gets
                # theirs before the group record holding it is durable (``_stored``); a leader's
                # SyncGroup sent again meanwhile waits for that same record, as in Kafka.
                group.pending_assignment = {m: bytes(assignments.get(m, b"")) for m in group.members}
                group.sync_store = token = next(self._store_tokens)
                self._request_store(group, token, self._snapshot(group, group.pending_assignment), now_ms)
        else:  # Stable: hand out the current assignment again
            member = group.members[member_id]
            self._remove_pending_sync(group, member_id)
            self._outbox.append(
                (reply, SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment))
            )
            self._schedule_heartbeat(member, now_ms)

    def _validate_sync(
        self,
        group: _Group,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> ErrorCode:
        if group.state is _DEAD:
            return ErrorCode.coordinator_not_available
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not ErrorCode.none:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if protocol_type is not None and protocol_type != group.protocol_type:
            return ErrorCode.inconsistent_group_protocol
        if protocol_name is not None and protocol_name != group.protocol_name:
            return ErrorCode.inconsistent_group_protocol
        return ErrorCode.none

    def _remove_pending_sync(self, group: _Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline_ms = None

    # --- Heartbeat / LeaveGroup ---------------------------------------------------------------

    @_delivers_replies
    def heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None, now_ms: int
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state is _DEAD:
            return ErrorCode.coordinator_not_available
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not ErrorCode.none:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state is _EMPTY:
            return ErrorCode.unknown_member_id
        self._schedule_heartbeat(group.members[member_id], now_ms)
        if group.state is _PREPARING:
            # The only way a Stable member learns that it must rejoin.
            return ErrorCode.rebalance_in_progress
        # CompletingRebalance: members may heartbeat between their JoinGroup and SyncGroup.
        return ErrorCode.none

    @_delivers_replies
    def leave_group(
        self, group_id: str, members: Iterable[tuple[str, str | None]], now_ms: int
    ) -> tuple[ErrorCode, list[LeaveResult]]:
        """LeaveGroup for (member id, group instance id) pairs; a static member may be removed by
        instance id alone (empty member id), as the admin client does. Returns (top-level error,
        per-member results)."""
        members = list(members)
        if not group_id:
            return ErrorCode.invalid_group_id, []
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.none, [LeaveResult(mid, iid, ErrorCode.unknown_member_id) for mid, iid in members]
        if group.state is _DEAD:
            return ErrorCode.coordinator_not_available, []
        results = []
        for member_id, instance_id in members:
            if member_id == UNKNOWN_MEMBER_ID:
                current = group.static_members.get(instance_id) if instance_id is not None else None
                if current is None:
                    error = ErrorCode.unknown_member_id
                else:
                    self._remove_member_and_update_group(group, group.members[current], now_ms)
                    error = ErrorCode.none
            elif member_id in group.pending_members:
                self._remove(group, member_id)
                if group.state is _PREPARING:
                    self._try_complete_join(group, now_ms)
                error = ErrorCode.none
            else:
                error = self._validate_current_member(group, member_id, instance_id)
                if error is ErrorCode.none:
                    self._remove_member_and_update_group(group, group.members[member_id], now_ms)
            results.append(LeaveResult(member_id, instance_id, error))
        return ErrorCode.none, results

    # --- KIP-848 consumer groups ------------------------------------------------------------------

    @_delivers_replies
    def consumer_group_heartbeat(
        self, request: HeartbeatRequest, now_ms: int, reply: HeartbeatReply | None = None
    ) -> HeartbeatResult | None:
        """ConsumerGroupHeartbeat. A classic group with members is not a consumer group
        (GROUP_ID_NOT_FOUND, as Kafka without online migration); an Empty one (offsets only) becomes one.
        One being deleted (Dead until its tombstones are stored) is COORDINATOR_NOT_AVAILABLE, as for a
        JoinGroup: the member retries, where GROUP_ID_NOT_FOUND would be fatal to it.

        Returns the answer if it goes at once (``reply`` gets it too), else None: ``reply`` gets it
        once the group's records are durable, or the store's error. A core with ``on_store`` needs
        ``reply``."""
        classic = self._groups.get(request.group_id)
        made: dict[str, int] = {}
        if classic is not None and classic.state is _DEAD:
            result = HeartbeatResult(
                ErrorCode.coordinator_not_available, error_message=f"Group {request.group_id} is being deleted."
            )
        elif classic is not None and (classic.members or classic.pending_members or classic.state is not _EMPTY):
            result = HeartbeatResult(
                ErrorCode.group_id_not_found, error_message=f"Group {request.group_id} is not a consumer group."
            )
        else:
            result = self.consumer.heartbeat(request, now_ms)
            made = self._store_consumer_changes(now_ms)
        return self._answer_consumer(request.group_id, result, reply, made)

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+: a consumer-protocol member must be current; classic groups ignore the fields."""
        if self.consumer.is_consumer_group(group_id):
            return self.consumer.validate_offset_fetch(group_id, member_id, member_epoch)
        return ErrorCode.none

    # --- offsets ------------------------------------------------------------------------------

    @_delivers_replies
    def validate_commit(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        now_ms: int,
        *,
        transactional: bool = False,
        api_version: int = -1,
    ) -> ErrorCode:
        """May this OffsetCommit (``transactional``: TxnOffsetCommit) go ahead? Stores nothing:
        ``apply_offsets`` once persisted.

        A commit from a current member counts as a heartbeat, as in Kafka. For a consumer-protocol
        group ``generation_id`` is the member epoch (OffsetCommit v9+). TxnOffsetCommit differs as in
        Kafka: a commit without member id and generation (all that v0-2 carry) is accepted from
        anyone; the group state is not enforced (the Java producer treats REBALANCE_IN_PROGRESS as
        fatal); a stale member epoch is ILLEGAL_GENERATION (STALE_MEMBER_EPOCH is fatal to it too).
        ``api_version`` is the OffsetCommit version (-1: none, as for TxnOffsetCommit).
        """
        if self.consumer.is_consumer_group(group_id):
            version = -1 if transactional else api_version
            error = self.consumer.validate_offset_commit(group_id, member_id, generation_id, api_version=version)
            if transactional and error is ErrorCode.stale_member_epoch:
                return ErrorCode.illegal_generation
            return error
        group = self._groups.get(group_id)
        if group is None:
            # Unknown group: fine for a simple consumer (no group management). A member's commit is
            # GROUP_ID_NOT_FOUND from OffsetCommit v9 on, as in Kafka: both protocols' clients know it
            # there. Older versions (and TxnOffsetCommit) keep ILLEGAL_GENERATION, which they expect.
            if generation_id < 0:
                return ErrorCode.none
            return ErrorCode.group_id_not_found if api_version >= 9 else ErrorCode.illegal_generation
        if group.state is _DEAD:
            return ErrorCode.coordinator_not_available
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = self._validate_current_member(group, member_id, group_instance_id)
            if error is not ErrorCode.none:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation
        elif transactional:
            return ErrorCode.none
        elif group.state is not _EMPTY:
            # Once the group has members, only they may commit.
            return ErrorCode.unknown_member_id
        if transactional:
            return ErrorCode.none
        if group.state is _COMPLETING:
            # A member of this generation that has not synced yet: its assignment is not final.
            return ErrorCode.rebalance_in_progress
        if group.state in (_STABLE, _PREPARING):
            # During PreparingRebalance commits stay allowed: the member learns about the
            # rebalance from its heartbeat and may commit what it processed before rejoining.
            self._schedule_heartbeat(group.members[member_id], now_ms)
        return ErrorCode.none

    def apply_offsets(self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Make persisted offsets visible (creates the group, Empty, if it does not exist).

        The shell calls this in the order the records were persisted, also while replaying.
        """
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = _Group(
                group_id, state_timestamp_ms=max((o.commit_timestamp_ms for o in offsets.values()), default=0)
            )
        group.offsets.update(offsets)

    @_delivers_replies
    def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now_ms: int,
    ) -> ErrorCode:
        """``validate_commit`` then ``apply_offsets``, for callers with nothing to persist."""
        error = self.validate_commit(group_id, generation_id, member_id, group_instance_id, now_ms)
        if error is ErrorCode.none:
            self.apply_offsets(group_id, offsets)
        return error

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets of the group (all of them when ``partitions`` is None).

        Partitions without a committed offset are absent. Offsets are returned whatever the group
        state, since simple consumers commit without any group membership.
        """
        group = self._groups.get(group_id)
        if group is None:
            return {}
        if partitions is None:
            return dict(group.offsets)
        return {tp: group.offsets[tp] for tp in partitions if tp in group.offsets}

    def check_delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete validation, without deleting: (group error, per-partition errors).

        Partitions mapped to NONE may be deleted: the shell persists their tombstones and then
        calls ``delete_offsets``. A consumer group with members keeps the offsets of topics it is
        subscribed to (GROUP_SUBSCRIBED_TO_TOPIC); other non-empty groups refuse (NON_EMPTY_GROUP).
        """
        partitions = list(partitions)
        consumer_group = self.consumer.group(group_id)
        if consumer_group is not None:
            # A KIP-848 group: its offsets live in an Empty classic record, its members here. It is
            # looked up first: until a member commits there is no such record, yet the group exists.
            subscribed = consumer_group.subscribed_topics()
            return ErrorCode.none, {
                tp: ErrorCode.group_subscribed_to_topic if tp[0] in subscribed else ErrorCode.none for tp in partitions
            }
        group = self._groups.get(group_id)
        if group is None or group.state is _DEAD:
            return ErrorCode.group_id_not_found, {}
        if group.state is _EMPTY:
            return ErrorCode.none, dict.fromkeys(partitions, ErrorCode.none)
        if group.protocol_type == CONSUMER_PROTOCOL_TYPE:
            subscribed = group.subscribed_topics
            return ErrorCode.none, {
                tp: (
                    ErrorCode.group_subscribed_to_topic if subscribed is None or tp[0] in subscribed else ErrorCode.none
                )
                for tp in partitions
            }
        return ErrorCode.non_empty_group, {}

    def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """OffsetDelete: remove the deletable offsets; every partition gets its error code (a
        group-level error is reported on every partition)."""
        partitions = list(partitions)
        group_error, errors = self.check_delete_offsets(group_id, partitions)
        if group_error is not ErrorCode.none:
            return dict.fromkeys(partitions, group_error)
        self.remove_offsets(group_id, [tp for tp, error in errors.items() if error is ErrorCode.none])
        return errors

    def remove_offsets(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Drop offsets unconditionally (tombstones replayed, deleted topics, expiration)."""
        group = self._groups.get(group_id)
        if group is not None:
            for tp in partitions:
                group.offsets.pop(tp, None)

    def expired_offsets(
        self, now_ms: int, retention_ms: int, group_ids: Iterable[str] | None = None
    ) -> dict[str, list[TopicPartition]]:
        """Offsets that offsets.retention.ms lets go, per Kafka's rules (KIP-211).

        An Empty group that has had members loses all its offsets ``retention_ms`` after it became
        Empty; a group that never had members (simple consumers) loses each offset that long after
        its commit; a Stable consumer group loses offsets of topics it no longer subscribes to. The
        shell persists tombstones, then calls ``remove_offsets``. ``group_ids`` limits the look to
        those groups.
        """
        expired: dict[str, list[TopicPartition]] = {}
        groups = (
            self._groups.values()
            if group_ids is None
            else [g for g in (self._groups.get(i) for i in group_ids) if g is not None]
        )
        for group in groups:
            if group.state is _DEAD:
                continue
            consumer_group = self.consumer.group(group.group_id)
            if consumer_group is not None:
                # Offsets of a consumer-protocol group: kept while it has members, else as for Empty groups.
                subscribed = consumer_group.subscribed_topics()
                tps = [
                    tp
                    for tp, om in group.offsets.items()
                    if tp[0] not in subscribed and now_ms - om.commit_timestamp_ms >= retention_ms
                ]
            elif group.state is _EMPTY and group.protocol_type is not None:
                expired_all = now_ms - group.state_timestamp_ms >= retention_ms
                tps = list(group.offsets) if expired_all else []
            elif group.state is _EMPTY or (
                # Only while Stable, as in Kafka: during a rebalance the subscription may be changing,
                # and a topic a member rejoins for must keep its offsets.
                group.state is _STABLE
                and group.protocol_type == CONSUMER_PROTOCOL_TYPE
                and group.subscribed_topics is not None
            ):
                subscribed = group.subscribed_topics or frozenset()
                tps = [
                    tp
                    for tp, om in group.offsets.items()
                    if tp[0] not in subscribed and now_ms - om.commit_timestamp_ms >= retention_ms
                ]
            else:
                tps = []
            if tps:
                expired[group.group_id] = tps
        return expired

    def prune_empty_groups(self, busy: Callable[[str], bool] | None = None) -> list[str]:
        """Forget Empty groups without offsets (Kafka's cleanup task marks them Dead). A group for
        which ``busy(group_id)`` is true is kept: it has offsets on their way (a commit being
        persisted, a transaction's), which Kafka's ``hasOffsets`` counts too. An Empty classic group
        whose id a KIP-848 group with members took over is kept as well: the group tombstone the
        shell writes for it would drop the KIP-848 group too (both go once that one is empty)."""

        def idle(group_id: str) -> bool:
            return busy is None or not busy(group_id)

        gone = [
            g.group_id
            for g in self._groups.values()
            if g.state is _EMPTY and not g.offsets and idle(g.group_id) and self.consumer.is_empty(g.group_id)
        ]
        for group_id in gone:
            del self._groups[group_id]
        empty = [g for g in list(self.consumer.groups) if self.consumer.is_empty(g) and g not in self._groups]
        for group_id in [g for g in empty if idle(g)]:
            self.consumer.forget(group_id)  # the shell writes a group tombstone if the log has records of it
            gone.append(group_id)
        return gone

    # --- DeleteGroups -------------------------------------------------------------------------

    def prepare_delete_group(self, group_id: str) -> ErrorCode:
        """First half of DeleteGroups: an Empty group turns Dead (joins and commits now get
        COORDINATOR_NOT_AVAILABLE) while the shell persists its tombstones; then
        ``complete_delete_group`` (or ``abort_delete_group`` if persisting failed)."""
        if self.consumer.is_consumer_group(group_id):
            if not self.consumer.is_empty(group_id):
                return ErrorCode.non_empty_group
            # The group tombstone the caller writes drops its records too; kept aside until then.
            self._deleting[group_id] = self.consumer.forget(group_id)
            if group_id not in self._groups:
                return ErrorCode.none
        group = self._groups.get(group_id)
        if group is None or group.state is _DEAD:
            return ErrorCode.group_id_not_found
        if group.state is not _EMPTY:
            return ErrorCode.non_empty_group
        self._transition(group, _DEAD, group.state_timestamp_ms)
        return ErrorCode.none

    def consumer_deletion_records(self, group_id: str) -> list[ConsumerRecord]:
        """The tombstones of the KIP-848 group ``prepare_delete_group`` is deleting (none if it is
        not one): one per key it has in the log, which the caller writes before the group
        tombstone, so that a compacted log drops them all."""
        group = self._deleting.get(group_id)
        return deletion_records(group_id, group.written) if group is not None and group.written else []

    def complete_delete_group(self, group_id: str) -> None:
        self._deleting.pop(group_id, None)
        group = self._groups.get(group_id)
        if group is not None and group.state is _DEAD:
            del self._groups[group_id]

    def abort_delete_group(self, group_id: str) -> None:
        consumer_group = self._deleting.pop(group_id, None)
        if consumer_group is not None and not self.consumer.is_consumer_group(group_id):
            self.consumer.groups[group_id] = consumer_group  # as the log still has it
        group = self._groups.get(group_id)
        if group is not None and group.state is _DEAD:
            # Outside Kafka's transition table on purpose: the deletion never happened.
            group.state = _EMPTY

    def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups for callers with nothing to persist: prepare and complete at once."""
        error = self.prepare_delete_group(group_id)
        if error is ErrorCode.none:
            self.complete_delete_group(group_id)
        return error

    @_delivers_replies
    def remove_group(self, group_id: str) -> None:
        """Forget a group whatever its state, KIP-848 group of that id included (a replayed group tombstone)."""
        self.consumer.forget(group_id)
        group = self._groups.pop(group_id, None)
        if group is not None:
            for member in list(group.members.values()):
                self._remove(group, member.member_id)

    # --- ListGroups / DescribeGroups / unload -------------------------------------------------

    def list_groups(self, states: Iterable[str] | None = None) -> list[GroupOverview]:
        """Groups of this partition, optionally only those in ``states`` (case-insensitive)."""
        wanted = {s.lower() for s in states} if states else None
        overviews = [
            GroupOverview(g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if g.state is not _DEAD
            and not self.consumer.is_consumer_group(g.group_id)
            and (wanted is None or g.state.value.lower() in wanted)
        ]
        for cg in self.consumer.groups.values():
            state = cg.state.value
            if wanted is None or state.lower() in wanted:
                overviews.append(GroupOverview(cg.group_id, CONSUMER_PROTOCOL_TYPE, state, CONSUMER_GROUP_TYPE))
        return overviews

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups; an unknown group is described as Dead with no members, as Kafka does.

        Member metadata and assignments are only shown when the group is Stable.
        """
        if self.consumer.is_consumer_group(group_id):
            # Kafka's DescribeGroups describes classic groups only: a KIP-848 group is answered like an
            # unknown one (the admin client describes it with ConsumerGroupDescribe instead).
            return GroupDescription(
                group_id, False, _DEAD.value, "", "", (), f"Group {group_id} is not a classic group."
            )
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, False, _DEAD.value, "", "", (), f"Group {group_id} not found.")
        stable = group.state is _STABLE and group.protocol_name is not None
        members = tuple(
            MemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol_name) if stable and group.protocol_name else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupDescription(
            group_id,
            group.state is not _DEAD,
            group.state.value,
            group.protocol_type or "",
            (group.protocol_name or "") if stable else "",
            members,
        )

    def group_ids(self) -> list[str]:
        return list(self._groups)

    def group_state(self, group_id: str) -> GroupState | None:
        group = self._groups.get(group_id)
        return None if group is None else group.state

    def generation(self, group_id: str) -> int:
        group = self._groups.get(group_id)
        return NO_GENERATION if group is None else group.generation_id

    @_delivers_replies
    def unload(self, error: ErrorCode = ErrorCode.not_coordinator) -> None:
        """This broker no longer coordinates the partition: answer every parked request with
        ``error`` (clients then look the coordinator up again) and forget all groups."""
        for group in self._groups.values():
            for member in group.members.values():
                self._invoke_join(member, JoinResult(error, member.member_id))
                self._invoke_sync(member, SyncResult(error))
                member.heartbeat_deadline_ms = None
            group.state = _DEAD
        self._groups.clear()
        for wait in self._consumer_stores.values():
            for reply, _ in wait.waiting:
                self._outbox.append((reply, HeartbeatResult(error)))
        self._consumer_stores.clear()
        self._deleting.clear()
        self.consumer.clear()

    def shutdown(self) -> None:
        """``unload()`` with NOT_COORDINATOR: the name the broker's group shell calls."""
        self.unload(ErrorCode.not_coordinator)

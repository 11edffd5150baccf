"""Record format of ``__consumer_offsets`` and the group -> partition mapping.

Committed offsets, classic group metadata and KIP-848 groups are persisted (see the package
docstring). Records are key/value pairs, each starting with a format version byte followed by
msgpack:

=============  =========================================  ==========================================
record         key                                        value
=============  =========================================  ==========================================
offset commit  ``0x01`` + msgpack [group, topic, part]    ``0x01`` + msgpack [offset, leader_epoch,
                                                          metadata, commit_timestamp_ms]
offset delete  same key as the commit                     None (tombstone)
group          ``0x02`` + msgpack [group]                 ``0x01`` + msgpack [protocol_type,
                                                          generation, protocol, leader,
                                                          state_timestamp_ms, [member...]]
group delete   same key as the group                      None (tombstone)
=============  =========================================  ==========================================

KIP-848 (consumer protocol) groups use Kafka's record types, their key version bytes as Kafka's
(3 to 8, and 16), their values msgpack after a ``0x00`` byte (Kafka's value version); a partition set is
[[topic, [partition...]]...], topics by name (the coordinator knows topics by name):

==========================  ==========================  ==============================================
record (Kafka's name)       key                         value
==========================  ==========================  ==============================================
ConsumerGroupMetadata       ``0x03`` + [group]          [group_epoch]
ConsumerGroupPartition-     ``0x04`` + [group]          [[[topic, partition_count, topic_id]...]]
Metadata                                                (topic_id appended, absent where unknown)
ConsumerGroupMember-        ``0x05`` + [group, member]  [instance_id, rack_id, client_id, client_host,
Metadata                                                [topic...], rebalance_timeout_ms,
                                                        server_assignor, subscribed_topic_regex]
ConsumerGroupTarget-        ``0x06`` + [group]          [assignment_epoch]
AssignmentMetadata
ConsumerGroupTarget-        ``0x07`` + [group, member]  [partitions]
AssignmentMember
ConsumerGroupCurrent-       ``0x08`` + [group, member]  [member_epoch, previous_member_epoch, state
MemberAssignment                                        (Kafka's MemberState byte), assigned,
                                                        pending_revocation]
ConsumerGroupRegular-       ``0x10`` + [group, regex]   [[topic...], refreshed_ms]: what the regex
Expression                                              resolved to, and when (Kafka's Timestamp;
                                                        its Version, a metadata offset, has no
                                                        cluster-wide counterpart here: a new
                                                        coordinator resolves again once allowed)
==========================  ==========================  ==============================================

The coordinator writes a key only when its value changes (a heartbeat that changes nothing
writes nothing; a reconciliation step writes the member's current assignment; a new target
writes its epoch and the members whose part changed), answers once they are durable, and a new
coordinator replays them into the group as last written (``consumer_protocol``). As in Kafka,
every key a deletion drops gets its own tombstone (a key without a value), so that a compacted
``__consumer_offsets`` drops each: a member that leaves, its current assignment, target and
metadata keys; a regex no member subscribes to any more, its key; a deleted group, each member
key left and its target epoch, regexes, subscription metadata and group epoch keys. At a replay
any tombstone of a member drops the whole member, a regex's its resolution, any other of the
group's the whole group; a group tombstone (``0x02``) drops a KIP-848 group of that id as well.

A member is [member_id, group_instance_id, client_id, client_host, rebalance_timeout_ms,
session_timeout_ms, subscription, assignment] (the last two binary), as in Kafka's
GroupMetadataValue; protocol_type, protocol, leader and group_instance_id may be nil. A group
record holds a classic group as last stored: written when a rebalance completes (the leader's
SyncGroup, before anyone gets the assignment), when a static member replaces its old member id in
a Stable group, and when the group becomes Empty; replaying it loads the group Stable (Empty
without members), so that members keep their generation across a coordinator failover.

Keys are deterministic (same group/topic/partition, same bytes) so that log compaction keeps
only the latest value of each. Deleting a group writes a tombstone for each of its offsets (so
compaction drops them) plus a group tombstone, which on replay drops the group and every offset
of it seen so far, including any the per-offset tombstones missed. Unknown versions are refused
rather than skipped: a newer broker's records must not be half-understood by an older one (a
broker from before group records refuses a partition holding one, and one from before KIP-848
group records, key versions 3 to 8, refuses a partition holding those, and one from before regex
subscriptions one holding key version 16: upgrade every broker before the new ones coordinate
groups). Fields appended to a value (or member) by a later
revision are ignored, so adding one needs no new version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from diskless.cluster.coordinator_records import Record, RecordFormatError, pack, unpack

from .consumer_protocol import (
    REGEX_KIND,
    ConsumerGroupTombstone,
    ConsumerRecord,
    CurrentAssignmentRecord,
    GroupEpochRecord,
    MemberMetadataRecord,
    MemberState,
    MemberTombstone,
    RegexRecord,
    RegexTombstone,
    SubscriptionMetadataRecord,
    TargetEpochRecord,
    TargetMemberRecord,
)
from .coordinator import GroupCoordinatorCore, OffsetAndMetadata, StoredGroup, StoredMember

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 1
GROUP_VALUE_VERSION = 1
# KIP-848 groups: key versions as Kafka's record types, one value version (Kafka's 0) for all.
CONSUMER_GROUP_KEY_VERSION = 3
CONSUMER_PARTITIONS_KEY_VERSION = 4
CONSUMER_MEMBER_KEY_VERSION = 5
CONSUMER_TARGET_KEY_VERSION = 6
CONSUMER_TARGET_MEMBER_KEY_VERSION = 7
CONSUMER_ASSIGNMENT_KEY_VERSION = 8
CONSUMER_REGEX_KEY_VERSION = 16
CONSUMER_VALUE_VERSION = 0
# The key version of each kind of a KIP-848 group's keys (``consumer_protocol.record_key``), for tombstones.
_CONSUMER_KEY_OF_KIND = {
    "epoch": CONSUMER_GROUP_KEY_VERSION,
    "subscriptions": CONSUMER_PARTITIONS_KEY_VERSION,
    "target_epoch": CONSUMER_TARGET_KEY_VERSION,
    "member": CONSUMER_MEMBER_KEY_VERSION,
    "target": CONSUMER_TARGET_MEMBER_KEY_VERSION,
    "assignment": CONSUMER_ASSIGNMENT_KEY_VERSION,
    REGEX_KIND: CONSUMER_REGEX_KEY_VERSION,
}
_CONSUMER_KIND_OF_KEY = {version: kind for kind, version in _CONSUMER_KEY_OF_KIND.items()}


@dataclass(frozen=True, slots=True)
class OffsetCommitRecord:
    group_id: str
    topic: str
    partition: int
    value: OffsetAndMetadata


@dataclass(frozen=True, slots=True)
class OffsetTombstone:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupTombstone:
    group_id: str


DecodedRecord = OffsetCommitRecord | OffsetTombstone | GroupTombstone | StoredGroup | ConsumerRecord


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return pack(OFFSET_KEY_VERSION, [group_id, topic, partition])


def group_key(group_id: str) -> bytes:
    return pack(GROUP_KEY_VERSION, [group_id])


def encode_offset(group_id: str, topic: str, partition: int, value: OffsetAndMetadata) -> Record:
    """The record of one committed offset."""
    payload = [value.offset, value.leader_epoch, value.metadata, value.commit_timestamp_ms]
    return offset_key(group_id, topic, partition), pack(OFFSET_VALUE_VERSION, payload)


def encode_offset_tombstone(group_id: str, topic: str, partition: int) -> Record:
    return offset_key(group_id, topic, partition), None


def encode_group(group: StoredGroup) -> Record:
    """The record of a classic group's metadata (its latest replaces any before)."""
    members = [
        [
            m.member_id,
            m.group_instance_id,
            m.client_id,
            m.client_host,
            m.rebalance_timeout_ms,
            m.session_timeout_ms,
            m.subscription,
            m.assignment,
        ]
        for m in group.members
    ]
    payload = [
        group.protocol_type,
        group.generation_id,
        group.protocol_name,
        group.leader_id,
        group.state_timestamp_ms,
        members,
    ]
    return group_key(group.group_id), pack(GROUP_VALUE_VERSION, payload)


def encode_group_tombstone(group_id: str) -> Record:
    return group_key(group_id), None


def group_deletion_records(group_id: str, partitions: Iterable[tuple[str, int]]) -> list[Record]:
    """Tombstones of a deleted group: one per offset it had, then the group tombstone."""
    records = [encode_offset_tombstone(group_id, topic, partition) for topic, partition in partitions]
    records.append(encode_group_tombstone(group_id))
    return records


# --- KIP-848 groups ----------------------------------------------------------------------------------


def _partitions(assignment: Mapping[str, Iterable[int]]) -> list[object]:
    return [[topic, sorted(parts)] for topic, parts in sorted(assignment.items()) if parts]


def encode_consumer(record: ConsumerRecord) -> Record:
    """The key/value of a KIP-848 group's record (a tombstone's value is None)."""
    g = record.group_id
    if isinstance(record, ConsumerGroupTombstone):
        return pack(_CONSUMER_KEY_OF_KIND[record.kind], [g]), None
    if isinstance(record, GroupEpochRecord):
        return pack(CONSUMER_GROUP_KEY_VERSION, [g]), pack(CONSUMER_VALUE_VERSION, [record.epoch])
    if isinstance(record, SubscriptionMetadataRecord):
        # The topic id appended where known: a broker from before ids reads [topic, count].
        topics = [
            [topic, count, record.topic_ids[topic]] if topic in record.topic_ids else [topic, count]
            for topic, count in sorted(record.partitions.items())
        ]
        return pack(CONSUMER_PARTITIONS_KEY_VERSION, [g]), pack(CONSUMER_VALUE_VERSION, [topics])
    if isinstance(record, TargetEpochRecord):
        return pack(CONSUMER_TARGET_KEY_VERSION, [g]), pack(CONSUMER_VALUE_VERSION, [record.assignment_epoch])
    if isinstance(record, RegexTombstone):
        return pack(CONSUMER_REGEX_KEY_VERSION, [g, record.regex]), None
    if isinstance(record, RegexRecord):
        value = [sorted(record.topics), record.refreshed_ms]
        return pack(CONSUMER_REGEX_KEY_VERSION, [g, record.regex]), pack(CONSUMER_VALUE_VERSION, value)
    m = record.member_id
    if isinstance(record, MemberTombstone):
        return pack(_CONSUMER_KEY_OF_KIND[record.kind], [g, m]), None
    if isinstance(record, MemberMetadataRecord):
        value = [
            record.instance_id,
            record.rack_id,
            record.client_id,
            record.client_host,
            list(record.subscribed_topics),
            record.rebalance_timeout_ms,
            record.server_assignor,
            # Appended (Kafka has it after the names): a broker from before regexes reads the rest.
            record.subscribed_regex,
        ]
        return pack(CONSUMER_MEMBER_KEY_VERSION, [g, m]), pack(CONSUMER_VALUE_VERSION, value)
    if isinstance(record, TargetMemberRecord):
        return pack(CONSUMER_TARGET_MEMBER_KEY_VERSION, [g, m]), pack(
            CONSUMER_VALUE_VERSION, [_partitions(record.partitions)]
        )
    value = [
        record.member_epoch,
        record.previous_member_epoch,
        record.state.value,
        _partitions(record.assigned),
        _partitions(record.pending_revocation),
    ]
    return pack(CONSUMER_ASSIGNMENT_KEY_VERSION, [g, m]), pack(CONSUMER_VALUE_VERSION, value)


def _consumer_value(value: bytes, count: int, what: str, optional: int = 0) -> list[object]:
    """The value's first ``count`` fields, then ``optional`` more (None where the value has none:
    written before they were added)."""
    version, fields = unpack(value, "value")
    if version != CONSUMER_VALUE_VERSION or len(fields) < count:
        raise RecordFormatError(f"unsupported {what} value version {version}")
    return (fields + [None] * optional)[: count + optional]


def _decode_partitions(items: object) -> dict[str, frozenset[int]]:
    if not isinstance(items, list):
        raise RecordFormatError("partitions are not a list")
    out: dict[str, frozenset[int]] = {}
    for entry in items:
        if not (isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[0], str)):
            raise RecordFormatError("partitions entry needs [topic, [partition...]]")
        parts = entry[1]
        if not (isinstance(parts, list) and all(isinstance(p, int) for p in parts)) or entry[0] in out:
            raise RecordFormatError("partitions of a topic are not a list of integers")
        if parts:
            out[entry[0]] = frozenset(parts)
    return out


def _int(*values: object) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _decode_consumer(version: int, items: list[object], value: bytes | None) -> ConsumerRecord:
    group_keys = (CONSUMER_GROUP_KEY_VERSION, CONSUMER_PARTITIONS_KEY_VERSION, CONSUMER_TARGET_KEY_VERSION)
    size = 1 if version in group_keys else 2
    if len(items) != size or not all(isinstance(i, str) for i in items):
        raise RecordFormatError(f"key version {version} needs {size} strings")
    g = str(items[0])
    if version == CONSUMER_REGEX_KEY_VERSION:
        return _decode_regex(g, str(items[1]), value)
    if value is None:
        kind = _CONSUMER_KIND_OF_KEY[version]
        return ConsumerGroupTombstone(g, kind) if size == 1 else MemberTombstone(g, str(items[1]), kind)
    if version == CONSUMER_GROUP_KEY_VERSION:
        (epoch,) = _consumer_value(value, 1, "group epoch")
        if not _int(epoch):
            raise RecordFormatError("group epoch is not an integer")
        return GroupEpochRecord(g, epoch)  # type: ignore[arg-type]
    if version == CONSUMER_PARTITIONS_KEY_VERSION:
        (topics,) = _consumer_value(value, 1, "partition metadata")
        if not isinstance(topics, list) or not all(
            isinstance(t, list) and len(t) >= 2 and isinstance(t[0], str) and _int(t[1]) for t in topics
        ):
            raise RecordFormatError("partition metadata needs [[topic, count]...]")
        ids = {t[0]: t[2] for t in topics if len(t) >= 3 and t[2] is not None}
        if not all(isinstance(i, str) for i in ids.values()):
            raise RecordFormatError("partition metadata topic ids are not strings")
        return SubscriptionMetadataRecord(g, {t[0]: t[1] for t in topics}, ids)
    if version == CONSUMER_TARGET_KEY_VERSION:
        (epoch,) = _consumer_value(value, 1, "target assignment metadata")
        if not _int(epoch):
            raise RecordFormatError("assignment epoch is not an integer")
        return TargetEpochRecord(g, epoch)  # type: ignore[arg-type]
    m = str(items[1])
    if version == CONSUMER_MEMBER_KEY_VERSION:
        instance, rack, client_id, client_host, topics, rebalance_ms, assignor, regex = _consumer_value(
            value, 7, "member", optional=1
        )
        if not (_optional_str(instance) and _optional_str(rack) and _optional_str(assignor) and _optional_str(regex)):
            raise RecordFormatError("member ids have wrong types")
        if not (isinstance(client_id, str) and isinstance(client_host, str) and _int(rebalance_ms)):
            raise RecordFormatError("member fields have wrong types")
        if not (isinstance(topics, list) and all(isinstance(t, str) for t in topics)):
            raise RecordFormatError("member subscription is not a list of topics")
        return MemberMetadataRecord(
            g,
            m,
            instance,
            rack,
            client_id,
            client_host,
            tuple(topics),
            rebalance_ms,  # type: ignore[arg-type]
            assignor,  # type: ignore[arg-type]
            regex,  # type: ignore[arg-type]
        )
    if version == CONSUMER_TARGET_MEMBER_KEY_VERSION:
        (partitions,) = _consumer_value(value, 1, "target assignment member")
        return TargetMemberRecord(g, m, _decode_partitions(partitions))
    member_epoch, previous, state, assigned, pending = _consumer_value(value, 5, "current assignment")
    if not _int(member_epoch, previous, state):
        raise RecordFormatError("current assignment epochs/state are not integers")
    try:
        member_state = MemberState(state)
    except ValueError as exc:
        raise RecordFormatError(f"unknown member state {state}") from exc
    return CurrentAssignmentRecord(
        g,
        m,
        member_epoch,
        previous,
        member_state,
        _decode_partitions(assigned),
        _decode_partitions(pending),  # type: ignore[arg-type]
    )


_CONSUMER_KEY_VERSIONS = (
    *range(CONSUMER_GROUP_KEY_VERSION, CONSUMER_ASSIGNMENT_KEY_VERSION + 1),
    CONSUMER_REGEX_KEY_VERSION,
)


def _decode_regex(group_id: str, regex: str, value: bytes | None) -> ConsumerRecord:
    if value is None:
        return RegexTombstone(group_id, regex)
    topics, refreshed_ms = _consumer_value(value, 2, "regular expression")
    if not (isinstance(topics, list) and all(isinstance(t, str) for t in topics) and _int(refreshed_ms)):
        raise RecordFormatError("regular expression needs [[topic...], refreshed_ms]")
    return RegexRecord(group_id, regex, frozenset(topics), refreshed_ms)  # type: ignore[arg-type]


def decode(key: bytes, value: bytes | None) -> DecodedRecord:
    """Decode one record; raises RecordFormatError for anything this version cannot read."""
    version, items = unpack(key, "key")
    if version in _CONSUMER_KEY_VERSIONS:
        return _decode_consumer(version, items, value)
    if version == OFFSET_KEY_VERSION:
        if len(items) != 3:
            raise RecordFormatError("offset key needs [group, topic, partition]")
        group_id, topic, partition = items
        if not (isinstance(group_id, str) and isinstance(topic, str) and isinstance(partition, int)):
            raise RecordFormatError("offset key has wrong field types")
        if value is None:
            return OffsetTombstone(group_id, topic, partition)
        value_version, fields = unpack(value, "value")
        if value_version != OFFSET_VALUE_VERSION or len(fields) < 4:
            raise RecordFormatError(f"unsupported offset value version {value_version}")
        offset, leader_epoch, metadata, commit_ts = fields[:4]
        if not (isinstance(offset, int) and isinstance(leader_epoch, int) and isinstance(commit_ts, int)):
            raise RecordFormatError("offset value has wrong field types")
        if not isinstance(metadata, str):
            raise RecordFormatError("offset metadata is not a string")
        return OffsetCommitRecord(
            group_id, topic, partition, OffsetAndMetadata(offset, leader_epoch, metadata, commit_ts)
        )
    if version == GROUP_KEY_VERSION:
        if len(items) != 1 or not isinstance(items[0], str):
            raise RecordFormatError("group key needs [group]")
        if value is None:
            return GroupTombstone(items[0])
        return _decode_group(items[0], value)
    raise RecordFormatError(f"unsupported key version {version}")


def _optional_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def _decode_member(fields: object) -> StoredMember:
    if not isinstance(fields, list) or len(fields) < 8:
        raise RecordFormatError("group member needs 8 fields")
    member_id, instance_id, client_id, client_host, rebalance_ms, session_ms, subscription, assignment = fields[:8]
    if not (isinstance(member_id, str) and _optional_str(instance_id)):
        raise RecordFormatError("group member ids have wrong types")
    if not (isinstance(client_id, str) and isinstance(client_host, str)):
        raise RecordFormatError("group member client has wrong types")
    if not (isinstance(rebalance_ms, int) and isinstance(session_ms, int)):
        raise RecordFormatError("group member timeouts are not integers")
    if not (isinstance(subscription, bytes) and isinstance(assignment, bytes)):
        raise RecordFormatError("group member subscription/assignment are not binary")
    return StoredMember(
        member_id, instance_id, client_id, client_host, rebalance_ms, session_ms, subscription, assignment
    )


def _decode_group(group_id: str, value: bytes) -> StoredGroup:
    value_version, fields = unpack(value, "value")
    if value_version != GROUP_VALUE_VERSION or len(fields) < 6:
        raise RecordFormatError(f"unsupported group value version {value_version}")
    protocol_type, generation, protocol_name, leader_id, state_ts, members = fields[:6]
    if not (_optional_str(protocol_type) and _optional_str(protocol_name) and _optional_str(leader_id)):
        raise RecordFormatError("group value has wrong field types")
    if not (isinstance(generation, int) and isinstance(state_ts, int) and isinstance(members, list)):
        raise RecordFormatError("group value has wrong field types")
    decoded = tuple(_decode_member(m) for m in members)
    if decoded and protocol_name is None:
        raise RecordFormatError("group with members has no protocol")
    return StoredGroup(group_id, protocol_type, generation, protocol_name, leader_id, state_ts, decoded)  # type: ignore[arg-type]


def apply_record(core: GroupCoordinatorCore, record: DecodedRecord, now_ms: int) -> None:
    """Make one record's effect visible in ``core`` (records apply in log order); a group record
    (classic or KIP-848) loads the group, whose members' session timers start at ``now_ms``."""
    if isinstance(record, StoredGroup):
        core.load_group(record, now_ms)
    elif isinstance(record, OffsetCommitRecord):
        core.apply_offsets(record.group_id, {(record.topic, record.partition): record.value})
    elif isinstance(record, OffsetTombstone):
        core.remove_offsets(record.group_id, [(record.topic, record.partition)])
    elif isinstance(record, GroupTombstone):
        core.remove_group(record.group_id)
    else:
        core.apply_consumer_record(record, now_ms)


def replay(core: GroupCoordinatorCore, records: Iterable[Record], now_ms: int) -> int:
    """Rebuild ``core``'s groups and offsets from a partition's records, in log order, at ``now_ms``
    (when loaded members' sessions start); returns how many."""
    count = 0
    for key, value in records:
        apply_record(core, decode(key, value), now_ms)
        count += 1
    return count


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, in int32."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition of a group, exactly as Kafka computes it:
    ``Utils.abs(groupId.hashCode) % groupMetadataTopicPartitionCount``, where Kafka's Utils.abs
    maps Integer.MIN_VALUE to 0 (Math.abs would leave it negative)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions

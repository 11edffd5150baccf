"""Record format of ``__consumer_offsets`` and the group -> partition mapping.

Committed offsets and classic group metadata are persisted (see the package docstring). Records
are key/value pairs, each starting with a format version byte followed by msgpack:

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
broker from before group records refuses a partition holding one: upgrade every broker before
the new ones coordinate groups). Fields appended to a version-1 value (or member) by a later
revision are ignored, so adding one needs no new version.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from diskless.cluster.coordinator_records import Record, RecordFormatError, pack, unpack

from .coordinator import GroupCoordinatorCore, OffsetAndMetadata, StoredGroup, StoredMember

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 1
GROUP_VALUE_VERSION = 1


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


DecodedRecord = OffsetCommitRecord | OffsetTombstone | GroupTombstone | StoredGroup


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


def decode(key: bytes, value: bytes | None) -> DecodedRecord:
    """Decode one record; raises RecordFormatError for anything this version cannot read."""
    version, items = unpack(key, "key")
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
    loads the group, whose members' session timers start at ``now_ms``."""
    if isinstance(record, StoredGroup):
        core.load_group(record, now_ms)
    elif isinstance(record, OffsetCommitRecord):
        core.apply_offsets(record.group_id, {(record.topic, record.partition): record.value})
    elif isinstance(record, OffsetTombstone):
        core.remove_offsets(record.group_id, [(record.topic, record.partition)])
    else:
        core.remove_group(record.group_id)


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

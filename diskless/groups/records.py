"""Record format of ``__consumer_offsets`` and the group -> partition mapping.

Only committed offsets are persisted (membership is not, see the package docstring). Records are
key/value pairs, each starting with a format version byte followed by msgpack:

=============  =========================================  ==========================================
record         key                                        value
=============  =========================================  ==========================================
offset commit  ``0x01`` + msgpack [group, topic, part]    ``0x01`` + msgpack [offset, leader_epoch,
                                                          metadata, commit_timestamp_ms]
offset delete  same key as the commit                     None (tombstone)
group delete   ``0x02`` + msgpack [group]                 None (tombstone)
=============  =========================================  ==========================================

Keys are deterministic (same group/topic/partition, same bytes) so that log compaction keeps
only the latest value of each. Deleting a group writes a tombstone for each of its offsets (so
compaction drops them) plus a group tombstone, which on replay drops every offset of the group
seen so far, including any the per-offset tombstones missed. Unknown versions are refused rather
than skipped: a newer broker's records must not be half-understood by an older one. Fields
appended to a version-1 value by a later revision are ignored, so adding one needs no new version.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from diskless.cluster.coordinator_records import Record, RecordFormatError, pack, unpack

from .coordinator import GroupCoordinatorCore, OffsetAndMetadata

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 1


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


DecodedRecord = OffsetCommitRecord | OffsetTombstone | GroupTombstone


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
        if value is not None:
            raise RecordFormatError("group records are tombstones only")
        return GroupTombstone(items[0])
    raise RecordFormatError(f"unsupported key version {version}")


def apply_record(core: GroupCoordinatorCore, record: DecodedRecord) -> None:
    """Make one record's effect visible in ``core`` (records apply in log order)."""
    if isinstance(record, OffsetCommitRecord):
        core.apply_offsets(record.group_id, {(record.topic, record.partition): record.value})
    elif isinstance(record, OffsetTombstone):
        core.remove_offsets(record.group_id, [(record.topic, record.partition)])
    else:
        core.remove_group(record.group_id)


def replay(core: GroupCoordinatorCore, records: Iterable[Record]) -> int:
    """Rebuild ``core``'s offsets from a partition's records, in log order; returns how many."""
    count = 0
    for key, value in records:
        apply_record(core, decode(key, value))
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

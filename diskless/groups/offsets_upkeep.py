"""Keeping committed offsets alive in a time-retained ``__consumer_offsets`` partition.

Kafka compacts ``__consumer_offsets``: the latest record of every key stays, however old, and
offsets leave only when the coordinator expires them (KIP-211) and writes their tombstones.
diskless logs have time and size retention but no compaction, so ``__consumer_offsets`` keeps its
records ``offsets.retention.minutes``; an offset committed once and then left alone (an idle
partition of a busy group) would be gone from the log after that, and with it from any coordinator
that replays the log after a failover, while the live one still serves it.

So the coordinator keeps the rule itself. It knows when the latest record of each live offset was
appended; every ``offsets.retention.check.interval.ms`` it appends again, unchanged, each one older
than half the retention. The argument: a record is deleted only with its segment, no earlier than
the retention after the record's own timestamp; a live offset's latest record is at most half the
retention plus one check interval old (the check interval is capped at a quarter of the
retention), so it is never deleted while it is the latest; a replay therefore finds every live
offset. Offsets that KIP-211 expires are not appended again but tombstoned, as in Kafka.

Group records (classic group metadata) get the same care: the latest record of each group is
appended again, unchanged, once older than half the retention, so that a group Stable for longer
than the retention still loads after a failover. What is appended again is the group's latest
record as appended (kept here), never the core's current state, which may be in the middle of a
rebalance; it is read right before the append, so it cannot overtake a newer one.

KIP-848 groups' records are keyed (the group's epoch, subscription metadata and target epoch; each
member's metadata, target and current assignment): the latest record of each key is appended
again, unchanged, once older than half the retention, which is what compaction would keep. Any
of a member's tombstones (one per key, as Kafka's, for a compacted topic) forgets all its keys and
any of a group's (KIP-848 or classic group tombstone) all the group's, so nothing of a member or
group that is gone is appended again (a replayed record of a member that left would bring it back).

An appended-again offset record must not overtake a newer one: the shell skips a group while any append
of its own is in flight (a commit appended but not yet applied to the core would be overwritten by
the older value), and a partition with a pending transactional offset (a plain record appended
after it supersedes it). Both are retried at the next check, long before the deadline.

Sans-IO: the shell reports appends and asks what is due; time is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .consumer_protocol import (
    MEMBER_KINDS,
    ConsumerGroupTombstone,
    ConsumerRecord,
    MemberTombstone,
    RecordKey,
    RegexTombstone,
    record_key,
)
from .coordinator import OffsetAndMetadata, StoredGroup, TopicPartition

OffsetKey = tuple[str, TopicPartition]  # (group id, (topic, partition))


def check_interval_ms(configured_ms: int, retention_ms: int) -> int:
    """How often to look: the configured interval, but at least four times per retention."""
    return max(1, min(configured_ms, retention_ms // 4))


class OffsetsUpkeep:
    """When the latest record of each live offset of one ``__consumer_offsets`` partition was appended."""

    def __init__(self) -> None:
        # Per group: when the latest record of each of its offsets was appended (by group, so that
        # a group tombstone forgets its own offsets without looking at every other group's).
        self.written_ms: dict[str, dict[TopicPartition, int]] = {}
        # Per group: its latest group record and when it was appended.
        self.groups: dict[str, tuple[StoredGroup, int]] = {}
        # Per KIP-848 group: the latest record of each of its keys and when it was appended.
        self.consumer: dict[str, dict[RecordKey, tuple[ConsumerRecord, int]]] = {}

    def wrote(self, group_id: str, tp: TopicPartition, at_ms: int) -> None:
        self.written_ms.setdefault(group_id, {})[tp] = at_ms

    def removed(self, group_id: str, tp: TopicPartition) -> None:
        offsets = self.written_ms.get(group_id)
        if offsets is not None:
            offsets.pop(tp, None)
            if not offsets:
                del self.written_ms[group_id]

    def group_removed(self, group_id: str) -> None:
        """A group tombstone: the group's offsets and its group record are gone."""
        self.written_ms.pop(group_id, None)
        self.groups.pop(group_id, None)
        self.consumer.pop(group_id, None)

    def group_wrote(self, group: StoredGroup, at_ms: int) -> None:
        self.groups[group.group_id] = (group, at_ms)

    def consumer_wrote(self, record: ConsumerRecord, at_ms: int) -> None:
        """A KIP-848 group's record was appended (or replayed) at ``at_ms``."""
        if isinstance(record, ConsumerGroupTombstone):
            self.consumer.pop(record.group_id, None)
            return
        if isinstance(record, MemberTombstone):
            keys = self.consumer.get(record.group_id, {})
            for kind in MEMBER_KINDS:
                keys.pop((kind, record.member_id), None)
            return
        if isinstance(record, RegexTombstone):
            self.consumer.get(record.group_id, {}).pop(record_key(record), None)
            return
        self.consumer.setdefault(record.group_id, {})[record_key(record)] = (record, at_ms)

    def consumer_due(self, group_id: str, now_ms: int, retention_ms: int) -> list[ConsumerRecord]:
        """The KIP-848 group's latest records older than half the retention, to append again."""
        keys = self.consumer.get(group_id, {})
        return [record for record, at_ms in keys.values() if now_ms - at_ms > retention_ms // 2]

    def group_due(self, group_id: str, now_ms: int, retention_ms: int) -> StoredGroup | None:
        """The group's latest record, if it is older than half the retention and must be appended again."""
        latest = self.groups.get(group_id)
        if latest is None or now_ms - latest[1] <= retention_ms // 2:
            return None
        return latest[0]

    def due(
        self,
        offsets: Mapping[str, Mapping[TopicPartition, OffsetAndMetadata]],
        now_ms: int,
        retention_ms: int,
        skip: Callable[[str, TopicPartition], bool],
    ) -> dict[str, dict[TopicPartition, OffsetAndMetadata]]:
        """The live offsets (group -> partition -> value) whose latest record is older than half
        the retention and must be appended again. Offsets never seen appended count as old."""
        due: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        for group_id, group_offsets in offsets.items():
            written = self.written_ms.get(group_id, {})
            for tp, value in group_offsets.items():
                old = now_ms - written.get(tp, -(2**62)) > retention_ms // 2
                if old and not skip(group_id, tp):
                    due.setdefault(group_id, {})[tp] = value
        return due

"""Group coordination on the broker: ``GroupCoordinatorCore`` on leaders of ``__consumer_offsets``.

On top of the shared coordinator shell: committed offsets are replayed from the partition's log
when this broker becomes its leader, and transactional offset commits (TxnOffsetCommit) are kept
pending until their transaction's marker is written to the same partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from diskless.groups.consumer_protocol import ConsumerGroupConfig
from diskless.groups.coordinator import GroupConfig, GroupCoordinatorCore, OffsetAndMetadata
from diskless.groups.records import OffsetCommitRecord, OffsetTombstone, decode, partition_for, replay
from diskless.log.txn_index import CONTROL_COMMIT, control_type
from diskless.protocol import records
from diskless.replication.partition import Partition

from .coordinator_shell import CoordinatorShell

OFFSETS_TOPIC = "__consumer_offsets"

PendingOffsets = dict[str, dict[tuple[str, int], OffsetAndMetadata]]


class GroupShell(CoordinatorShell[GroupCoordinatorCore]):
    topic = OFFSETS_TOPIC

    def __init__(self, broker: object) -> None:
        super().__init__(broker)  # type: ignore[arg-type]
        # Transactional offsets waiting for their marker: (partition, producer id) -> group -> offsets.
        self.pending_txn: dict[tuple[int, int], PendingOffsets] = {}

    def configured_partitions(self) -> int:
        return self.broker.config.offsets_topic_num_partitions

    def configured_replication(self) -> int:
        return self.broker.config.offsets_topic_replication_factor

    def topic_configs(self) -> dict[str, str]:
        return {
            "retention.ms": str(self.broker.config.offsets_retention_minutes * 60_000),
            "segment.bytes": "104857600",
        }

    def hash_partition(self, key: str, partitions: int) -> int:
        return partition_for(key, partitions)

    # --- topic metadata for KIP-848 server-side assignment -------------------------------------------

    def partitions_of(self, topic: str) -> int | None:
        meta = self.broker.metadata.topics.get(topic)
        return len(meta.partitions) if meta is not None and not meta.internal else None

    def topic_id_of(self, topic: str) -> uuid.UUID | None:
        meta = self.broker.metadata.topics.get(topic)
        return uuid.UUID(meta.topic_id) if meta is not None else None

    def topic_name_of(self, topic_id: uuid.UUID) -> str | None:
        meta = self.broker.metadata.topic_by_id(str(topic_id))
        return meta.name if meta is not None else None

    def tick(self, now_ms: int) -> None:
        """Every coordinator's timers, each even when one before it raised (the first error is
        raised after all ran: the shell retries the pass)."""
        failed: Exception | None = None
        for core in list(self.cores.values()):
            try:
                core.tick(now_ms)
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    # --- transactional offsets (TxnOffsetCommit) ---------------------------------------------------
    #
    # Kafka's rule: of the records for one group's partition, the one appended last counts; a
    # transactional one counts from its COMMIT marker on. So pending offsets are tracked as they
    # are appended, in log order: a plain commit (or tombstone) appended later supersedes them.

    def appended(self, key: str, entries: list[tuple[bytes, bytes | None]], producer: tuple[int, int] | None) -> None:
        offsets: dict[tuple[str, int], OffsetAndMetadata | None] = {}
        for record_key, value in entries:
            decoded = decode(record_key, value)
            if isinstance(decoded, OffsetCommitRecord):
                offsets[(decoded.topic, decoded.partition)] = decoded.value
            elif isinstance(decoded, OffsetTombstone):
                offsets[(decoded.topic, decoded.partition)] = None
        if producer is None:
            self.supersede_pending(key, offsets)
        else:
            self.add_pending(key, producer[0], {tp: om for tp, om in offsets.items() if om is not None})

    def add_pending(self, group_id: str, producer_id: int, offsets: dict[tuple[str, int], OffsetAndMetadata]) -> None:
        """Transactional offsets appended: they count once the producer's COMMIT marker follows."""
        key = (self.partition_of(group_id), producer_id)
        self.pending_txn.setdefault(key, {}).setdefault(group_id, {}).update(offsets)

    def supersede_pending(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> None:
        """A plain commit or tombstone appended for these partitions: pending transactional
        offsets of the group appended before it no longer count, whatever their marker says."""
        index = self.partition_of(group_id)
        partitions = list(partitions)
        for (pending_index, _), groups in self.pending_txn.items():
            offsets = groups.get(group_id) if pending_index == index else None
            for tp in partitions if offsets else ():
                offsets.pop(tp, None)  # type: ignore[union-attr]

    def pending_partitions(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions with a transactional offset waiting for its transaction's end
        (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        index = self.partition_of(group_id)
        return {tp for (i, _), groups in self.pending_txn.items() if i == index for tp in groups.get(group_id, ())}

    def on_marker(self, index: int, producer_id: int, commit: bool) -> None:
        """A transaction ended on offsets partition ``index``: its offsets count now, or never."""
        pending = self.pending_txn.pop((index, producer_id), {})
        core = self.cores.get(index)
        if commit and core is not None:
            for group_id, offsets in pending.items():
                if offsets:
                    core.apply_offsets(group_id, offsets)

    def unload(self, core: GroupCoordinatorCore) -> None:
        """Pending offsets go with the core: whoever leads next ends those transactions, and a
        load here later finds their outcome in the log."""
        for key in [key for key in self.pending_txn if key[0] == core.partition]:
            del self.pending_txn[key]
        super().unload(core)

    # --- replay --------------------------------------------------------------------------------

    def load(self, partition: Partition) -> GroupCoordinatorCore:
        """Plain records apply in log order; transactional ones wait for their marker."""
        config = self.broker.config
        core = GroupCoordinatorCore(
            GroupConfig(
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
            ),
            partition=partition.index,
            consumer_config=ConsumerGroupConfig(
                session_timeout_ms=config.group_consumer_session_timeout_ms,
                heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
                assignors=tuple(a.strip() for a in config.group_consumer_assignors.split(",") if a.strip()),
            ),
            partitions_of=self.partitions_of,
        )
        for key in [key for key in self.pending_txn if key[0] == partition.index]:
            del self.pending_txn[key]
        log_start = partition.log.log_start_offset
        entries: list[tuple[bytes, bytes | None]] = []
        # Transactional records by producer, keyed by record key: a later plain record of the same
        # key supersedes them (the same rule as ``supersede_pending``).
        waiting: dict[int, dict[bytes, bytes | None]] = {}
        for raw in self.log_batches(partition):
            header = records.parse_header(raw)
            if header.is_control:
                done = waiting.pop(header.producer_id, {})
                if control_type(raw) == CONTROL_COMMIT:
                    entries.extend(done.items())
                continue
            batch_entries = [
                (k, v) for offset, k, v in records.iter_records(raw) if offset >= log_start and k is not None
            ]
            if header.is_transactional:
                waiting.setdefault(header.producer_id, {}).update(batch_entries)
                continue
            entries.extend(batch_entries)
            for open_entries in waiting.values():
                for key, _ in batch_entries:
                    open_entries.pop(key, None)
        replay(core, entries)
        for producer_id, open_entries in waiting.items():
            # Still open when we took over: pending until the transaction coordinator's marker.
            for key, value in open_entries.items():
                decoded = decode(key, value)
                if isinstance(decoded, OffsetCommitRecord):
                    pending = self.pending_txn.setdefault((partition.index, producer_id), {})
                    pending.setdefault(decoded.group_id, {})[(decoded.topic, decoded.partition)] = decoded.value
        return core

"""Group coordination on the broker: ``GroupCoordinatorCore`` on leaders of ``__consumer_offsets``.

On top of the shared coordinator shell: committed offsets are replayed from the partition's log
when this broker becomes its leader; transactional offset commits (TxnOffsetCommit) are kept
pending until their transaction's marker is written to the same partition; and a periodic pass
expires offsets (KIP-211) and keeps live ones in the time-retained log (``offsets_upkeep``).
"""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from collections.abc import Callable, Iterable

import structlog
from kio.schema.errors import ErrorCode

from diskless.groups.consumer_protocol import ConsumerGroupConfig
from diskless.groups.coordinator import GroupConfig, GroupCoordinatorCore, OffsetAndMetadata
from diskless.groups.offsets_upkeep import OffsetsUpkeep
from diskless.groups.records import (
    GroupTombstone,
    OffsetCommitRecord,
    OffsetTombstone,
    decode,
    encode_offset,
    encode_offset_tombstone,
    partition_for,
    replay,
)
from diskless.log.txn_index import CONTROL_COMMIT, control_type
from diskless.protocol import records
from diskless.replication.partition import Partition

from .coordinator_shell import CoordinatorShell

log = structlog.get_logger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"

PendingOffsets = dict[str, dict[tuple[str, int], OffsetAndMetadata]]


class GroupShell(CoordinatorShell[GroupCoordinatorCore]):
    topic = OFFSETS_TOPIC

    def __init__(self, broker: object) -> None:
        super().__init__(broker)  # type: ignore[arg-type]
        # Transactional offsets waiting for their marker: (partition, producer id) -> group -> offsets.
        self.pending_txn: dict[tuple[int, int], PendingOffsets] = {}
        # When each pending transaction's first offsets were appended (their records' age).
        self._pending_since: dict[tuple[int, int], int] = {}
        self.upkeep: dict[int, OffsetsUpkeep] = {}  # per offsets partition this broker coordinates
        self._in_flight: Counter[str] = Counter()  # group id -> appends not yet answered

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

    async def persist(
        self,
        key: str,
        entries: list[tuple[bytes, bytes | None]],
        producer: tuple[int, int] | None = None,
        on_append: Callable[[], None] | None = None,
    ) -> ErrorCode:
        self._in_flight[key] += 1
        try:
            return await super().persist(key, entries, producer, on_append)
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]

    def appended(
        self, key: str, entries: list[tuple[bytes, bytes | None]], producer: tuple[int, int] | None, now_ms: int
    ) -> None:
        index = self.partition_of(key)
        upkeep = self.upkeep.get(index)
        offsets: dict[tuple[str, int], OffsetAndMetadata | None] = {}
        for record_key, value in entries:
            decoded = decode(record_key, value)
            if isinstance(decoded, OffsetCommitRecord):
                offsets[(decoded.topic, decoded.partition)] = decoded.value
            elif isinstance(decoded, OffsetTombstone):
                offsets[(decoded.topic, decoded.partition)] = None
            elif upkeep is not None and producer is None:
                upkeep.group_removed(decoded.group_id)
        if producer is not None:
            self._pending_since.setdefault((index, producer[0]), now_ms)
            self.add_pending(key, producer[0], {tp: om for tp, om in offsets.items() if om is not None})
            return
        self.supersede_pending(key, offsets)
        for tp, value in offsets.items() if upkeep is not None else ():
            if value is None:
                upkeep.removed(key, tp)  # type: ignore[union-attr]
            else:
                upkeep.wrote(key, tp, now_ms)  # type: ignore[union-attr]

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
        since = self._pending_since.pop((index, producer_id), 0)
        core = self.cores.get(index)
        if commit and core is not None:
            upkeep = self.upkeep.get(index)
            for group_id, offsets in pending.items():
                if offsets:
                    core.apply_offsets(group_id, offsets)
                for tp in offsets if upkeep is not None else ():
                    upkeep.wrote(group_id, tp, since)  # type: ignore[union-attr]

    def unload(self, core: GroupCoordinatorCore) -> None:
        """Pending offsets go with the core: whoever leads next ends those transactions, and a
        load here later finds their outcome in the log."""
        self._forget_partition(core.partition)
        super().unload(core)

    def _forget_partition(self, index: int) -> None:
        for key in [key for key in self.pending_txn if key[0] == index]:
            del self.pending_txn[key]
            self._pending_since.pop(key, None)
        self.upkeep.pop(index, None)

    # --- offsets retention (Kafka's offsets.retention.check.interval.ms task) -----------------------

    async def maintain(self) -> None:
        """Expire offsets (KIP-211) with tombstones, forget empty groups, and append again the
        live offsets whose latest record is getting old (``offsets_upkeep``)."""
        retention_ms = self.broker.config.offsets_retention_minutes * 60_000
        for index, core in list(self.cores.items()):
            if self.cores.get(index) is core and index in self.upkeep:
                await self._maintain_partition(index, core, retention_ms)

    async def _maintain_partition(self, index: int, core: GroupCoordinatorCore, retention_ms: int) -> None:
        for group_id in core.expired_offsets(self.now_ms(), retention_ms):
            if self._in_flight[group_id] or self.cores.get(index) is not core:
                continue  # a commit on its way may revive one: the next pass decides
            # Looked at again right before the append: the awaits before may have changed the group.
            tps = core.expired_offsets(self.now_ms(), retention_ms, [group_id]).get(group_id)
            if not tps:
                continue
            tombstones = [encode_offset_tombstone(group_id, t, p) for t, p in tps]
            # Removed at the append: a commit appended after the tombstones must stay.
            await self.persist(group_id, tombstones, on_append=functools.partial(core.remove_offsets, group_id, tps))
        core.prune_empty_groups()
        upkeep = self.upkeep.get(index)
        if upkeep is None or self.cores.get(index) is not core:
            return
        pending = {g: self.pending_partitions(g) for g in core.group_ids()}
        due = upkeep.due(
            {g: core.fetch_offsets(g) for g in core.group_ids()},
            self.now_ms(),
            retention_ms,
            skip=lambda g, tp: bool(self._in_flight[g]) or tp in pending.get(g, ()),
        )
        for group_id, offsets in due.items():
            if self._in_flight[group_id] or self.cores.get(index) is not core:
                continue
            # The values as they are now (the awaits before may have let commits in), never a
            # partition a transaction may still move.
            current = core.fetch_offsets(
                group_id, [tp for tp in offsets if tp not in self.pending_partitions(group_id)]
            )
            again = [encode_offset(group_id, t, p, value) for (t, p), value in current.items()]
            if not again:
                continue
            code = await self.persist(group_id, again)
            if code is not ErrorCode.none:
                log.info("could not append offsets again", group=group_id, error=code.name)

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
        self._forget_partition(partition.index)
        log_start = partition.log.log_start_offset
        # (key, value, when appended): the batch's timestamp, the coordinator's clock.
        entries: list[tuple[bytes, bytes | None, int]] = []
        # Transactional records by producer, keyed by record key: a later plain record of the same
        # key supersedes them (the same rule as ``supersede_pending``).
        waiting: dict[int, dict[bytes, tuple[bytes | None, int]]] = {}
        for raw in self.log_batches(partition):
            header = records.parse_header(raw)
            if header.is_control:
                done = waiting.pop(header.producer_id, {})
                if control_type(raw) == CONTROL_COMMIT:
                    entries.extend((k, v, at) for k, (v, at) in done.items())
                continue
            batch_entries = [
                (k, v) for offset, k, v in records.iter_records(raw) if offset >= log_start and k is not None
            ]
            if header.is_transactional:
                waiting.setdefault(header.producer_id, {}).update(
                    (k, (v, header.max_timestamp)) for k, v in batch_entries
                )
                continue
            entries.extend((k, v, header.max_timestamp) for k, v in batch_entries)
            for open_entries in waiting.values():
                for key, _ in batch_entries:
                    open_entries.pop(key, None)
        replay(core, [(k, v) for k, v, _ in entries])
        upkeep = self.upkeep[partition.index] = OffsetsUpkeep()
        for key, value, at_ms in entries:
            decoded = decode(key, value)
            if isinstance(decoded, OffsetCommitRecord):
                upkeep.wrote(decoded.group_id, (decoded.topic, decoded.partition), at_ms)
            elif isinstance(decoded, OffsetTombstone):
                upkeep.removed(decoded.group_id, (decoded.topic, decoded.partition))
            elif isinstance(decoded, GroupTombstone):
                upkeep.group_removed(decoded.group_id)
        for producer_id, open_entries in waiting.items():
            # Still open when we took over: pending until the transaction coordinator's marker.
            for key, (value, at_ms) in open_entries.items():
                decoded = decode(key, value)
                if isinstance(decoded, OffsetCommitRecord):
                    pending = self.pending_txn.setdefault((partition.index, producer_id), {})
                    pending.setdefault(decoded.group_id, {})[(decoded.topic, decoded.partition)] = decoded.value
                    since = self._pending_since.setdefault((partition.index, producer_id), at_ms)
                    self._pending_since[(partition.index, producer_id)] = min(since, at_ms)
        return core

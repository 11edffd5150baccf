"""Group coordination on the broker: ``GroupCoordinatorCore`` on leaders of ``__consumer_offsets``.

On top of the shared coordinator shell: committed offsets, classic group records and KIP-848
group records are replayed from the partition's log when this broker becomes its leader; the
group records the core asks for (``GroupStore``, ``ConsumerGroupStore``) are appended at once, in
the core's order, and reported back once replicated (SyncGroup and ConsumerGroupHeartbeat answers
wait for that); transactional offset commits (TxnOffsetCommit) are kept pending until their
transaction's marker is written to the same partition; and a periodic pass expires offsets
(KIP-211), writes group tombstones for the Empty groups it forgets (classic or KIP-848), and keeps
live offsets and group records in the time-retained log (``offsets_upkeep``).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections import Counter
from collections.abc import Callable

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import OFFSETS_TOPIC
from diskless.groups.consumer_protocol import ConsumerGroupConfig, deletion_records
from diskless.groups.coordinator import (
    ConsumerGroupStore,
    GroupConfig,
    GroupCoordinatorCore,
    GroupStore,
    OffsetAndMetadata,
    StoredGroup,
)
from diskless.groups.handlers import consumer_store_error, group_store_error
from diskless.groups.offsets_upkeep import OffsetsUpkeep
from diskless.groups.records import (
    DecodedRecord,
    GroupTombstone,
    OffsetCommitRecord,
    OffsetTombstone,
    apply_record,
    decode,
    encode_consumer,
    encode_group,
    encode_group_tombstone,
    encode_offset,
    encode_offset_tombstone,
    partition_for,
)
from diskless.groups.txn_offsets import TxnOffsetOrder
from diskless.log.txn_index import CONTROL_COMMIT, control_type
from diskless.protocol import records
from diskless.replication.partition import Partition

from .coordinator_shell import Appended, CoordinatorShell

log = structlog.get_logger(__name__)

# A record's bytes in a batch beyond its key and value (length, attributes, deltas, headers count).
_RECORD_OVERHEAD = 32


OffsetKey = tuple[str, tuple[str, int]]  # (group id, (topic, partition))
# Values are the offset and when its record was appended.
OffsetOrder = TxnOffsetOrder[OffsetKey, tuple[OffsetAndMetadata, int]]


class GroupShell(CoordinatorShell[GroupCoordinatorCore]):
    topic = OFFSETS_TOPIC

    def __init__(self, broker: object) -> None:
        super().__init__(broker)  # type: ignore[arg-type]
        # Per offsets partition this broker coordinates: which offset records count (transactional
        # ones pending until their marker), and when each live offset's record was appended.
        self.txn_order: dict[int, OffsetOrder] = {}
        self.upkeep: dict[int, OffsetsUpkeep] = {}  # per offsets partition this broker coordinates
        self._in_flight: Counter[str] = Counter()  # group id -> appends not yet answered
        self._stores: set[asyncio.Task[None]] = set()  # group records waiting for replication

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

    def topic_names(self) -> list[str]:
        """The topics a regex subscription is resolved against: those ``partitions_of`` knows (internal
        topics are not assigned here, by name or by regex)."""
        return [name for name, meta in self.broker.metadata.topics.items() if not meta.internal]

    def topics_version(self) -> int:
        # Moves when topics (or brokers) change, not on leader or ISR churn.
        return self.broker.metadata.topology_generation

    def subscribed_topic_id(self, topic: str) -> str | None:
        """A subscribed topic's id, as KIP-848 subscription metadata keeps it (internal topics are
        not subscribed)."""
        meta = self.broker.metadata.topics.get(topic)
        return meta.topic_id if meta is not None and not meta.internal else None

    def may_describe_topic(self) -> Callable[[str], bool] | None:
        """Which topics the requesting connection's principal may DESCRIBE, None for all."""
        return self.broker.apis.security.describe_filter()

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
        self,
        key: str,
        entries: list[tuple[bytes, bytes | None]],
        producer: tuple[int, int] | None,
        now_ms: int,
        base_offset: int,
    ) -> None:
        index = self.partition_of(key)
        order, upkeep = self.txn_order.get(index), self.upkeep.get(index)
        if order is None or upkeep is None:
            return  # not loaded: nothing to keep in step
        for position, (record_key, value) in enumerate(entries):
            self._note_record(order, upkeep, decode(record_key, value), producer, base_offset + position, now_ms)

    @staticmethod
    def _note_record(
        order: OffsetOrder,
        upkeep: OffsetsUpkeep,
        record: DecodedRecord,
        producer: tuple[int, int] | None,
        offset: int,
        at_ms: int,
    ) -> bool:
        """Account for one record appended at ``offset``, live or replayed; True when its effect
        is visible at once (a plain record), False when it waits for its transaction's marker."""
        if isinstance(record, GroupTombstone):
            upkeep.group_removed(record.group_id)
            return True
        if isinstance(record, StoredGroup):
            upkeep.group_wrote(record, at_ms)
            return True
        if not isinstance(record, (OffsetCommitRecord, OffsetTombstone)):
            upkeep.consumer_wrote(record, at_ms)  # a KIP-848 group's: never transactional
            return True
        tp = (record.topic, record.partition)
        if producer is not None:
            if isinstance(record, OffsetCommitRecord):
                order.transactional(producer[0], (record.group_id, tp), (record.value, at_ms), offset)
            return False
        order.plain((record.group_id, tp), offset)
        if isinstance(record, OffsetCommitRecord):
            upkeep.wrote(record.group_id, tp, at_ms)
        else:
            upkeep.removed(record.group_id, tp)
        return True

    def pending_partitions(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions with a transactional offset waiting for its transaction's end
        (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        order = self.txn_order.get(self.partition_of(group_id))
        return {tp for group, tp in order.pending_keys() if group == group_id} if order is not None else set()

    def on_marker(self, index: int, producer_id: int, commit: bool) -> None:
        """A transaction ended on offsets partition ``index``: its offsets count now, or never."""
        order, upkeep, core = self.txn_order.get(index), self.upkeep.get(index), self.cores.get(index)
        if order is None or upkeep is None or core is None:
            return
        self._apply_ended(core, upkeep, order.ended(producer_id, commit))

    @staticmethod
    def _apply_ended(
        core: GroupCoordinatorCore, upkeep: OffsetsUpkeep, counting: dict[OffsetKey, tuple[OffsetAndMetadata, int]]
    ) -> None:
        for (group_id, tp), (value, at_ms) in counting.items():
            core.apply_offsets(group_id, {tp: value})
            upkeep.wrote(group_id, tp, at_ms)

    def unload(self, core: GroupCoordinatorCore) -> None:
        """Pending offsets go with the core: whoever leads next ends those transactions, and a
        load here later finds their outcome in the log."""
        self._forget_partition(core.partition)
        super().unload(core)

    def _forget_partition(self, index: int) -> None:
        self.txn_order.pop(index, None)
        self.upkeep.pop(index, None)

    # --- group records ------------------------------------------------------------------------------

    def _store_group(self, core: GroupCoordinatorCore, store: GroupStore | ConsumerGroupStore) -> bool:
        """The core's ``on_store``: append the group's records now, so that the log has the records
        in the order the core made the changes (a group tombstone or a later record cannot get
        ahead of them), and report to the core once they are replicated. Returns whether they are
        in the log (if not, the core takes a KIP-848 group back to what the log has)."""
        if isinstance(store, ConsumerGroupStore):
            group_id, entries = store.group_id, [encode_consumer(r) for r in store.records]
        else:
            group_id, entries = store.group.group_id, [encode_group(store.group)]
        appended: Appended | ErrorCode
        try:
            appended = self.append(group_id, entries)
        except Exception:
            # Reported all the same: members waiting for the records must not wait for records never written.
            log.exception("could not append group records", group=group_id)
            appended = ErrorCode.unknown_server_error
        task = asyncio.get_running_loop().create_task(self._report_store(core, store, group_id, appended))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)
        return isinstance(appended, Appended)

    async def _report_store(
        self,
        core: GroupCoordinatorCore,
        store: GroupStore | ConsumerGroupStore,
        group_id: str,
        appended: Appended | ErrorCode,
    ) -> None:
        try:
            code = await self.replicated(appended)
        except Exception:
            log.exception("could not replicate group records", group=group_id)
            code = ErrorCode.unknown_server_error
        # Kafka maps a failed write for SyncGroup (storeGroup) and for ConsumerGroupHeartbeat (the
        # coordinator runtime's operation errors) differently: a timeout is a rebalance for one,
        # COORDINATOR_NOT_AVAILABLE for the other.
        consumer = isinstance(store, ConsumerGroupStore)
        error = consumer_store_error(code) if consumer else group_store_error(code)
        if error is not ErrorCode.none:
            log.warning("could not store group", group=group_id, kip848=consumer, error=error.name)
        try:
            # A core unloaded meanwhile has no groups left: this changes nothing then.
            core.group_stored(group_id, store.token, error, self.now_ms())
        except Exception:
            log.exception("group store report failed", group=group_id)
        self.wake()

    async def settle_stores(self) -> None:
        """Wait until every group record appended so far has been reported to its core (tests)."""
        while self._stores:
            await asyncio.gather(*self._stores, return_exceptions=True)

    # --- offsets retention (Kafka's offsets.retention.check.interval.ms task) -----------------------

    async def maintain(self) -> None:
        """Expire offsets (KIP-211) with tombstones, forget empty groups (with a group tombstone
        for those that had a generation), and append again the live offsets and group records
        whose latest record is getting old (``offsets_upkeep``)."""
        retention_ms = self.broker.config.offsets_retention_minutes * 60_000
        for index, core in list(self.cores.items()):
            if self.cores.get(index) is core and index in self.upkeep:
                await self._maintain_partition(index, core, retention_ms)

    async def _maintain_partition(self, index: int, core: GroupCoordinatorCore, retention_ms: int) -> None:
        for group_id in core.expired_offsets(self.now_ms(), retention_ms):
            if self._in_flight[group_id] or self.cores.get(index) is not core:
                continue  # a commit on its way may revive one: the next pass decides
            # Looked at again right before the append: the awaits before may have changed the group.
            expired = core.expired_offsets(self.now_ms(), retention_ms, [group_id]).get(group_id, [])
            pending = self.pending_partitions(group_id)
            tps = [tp for tp in expired if tp not in pending]  # a tombstone would outrank the transaction's
            if not tps:
                continue
            tombstones = [encode_offset_tombstone(group_id, t, p) for t, p in tps]
            # Removed at the append: a commit appended after the tombstones must stay.
            batches = [
                (tombstones[s], functools.partial(core.remove_offsets, group_id, tps[s]))
                for s in self._split(group_id, tombstones)
            ]
            await self._persist_batches(group_id, batches)
        if self.cores.get(index) is not core:
            return
        generations = {g: core.generation(g) for g in core.group_ids()}
        # A group with a commit on its way is not without offsets (Kafka's hasOffsets counts pending
        # commits): its tombstone would follow the commit's record and drop it at the next replay.
        gone = core.prune_empty_groups(busy=lambda g: bool(self._in_flight[g] or self.pending_partitions(g)))
        # Kafka's cleanupGroupMetadata: a group that had a generation has a group record to drop, an
        # empty KIP-848 group its records (a tombstone for each of its keys, as Kafka: the group
        # tombstone would drop them at a replay, but not from a compacted log). Appended in the same
        # step as the pruning: a group of the same name created afterwards writes its records after
        # these tombstones. A batch per group: all in one could pass the topic's max.message.bytes
        # (many short-lived groups), and fail at every pass.
        known = self.upkeep.get(index)
        appends: list[Appended | ErrorCode] = []
        for g in gone:
            tombstones = []
            if known is not None and g in known.consumer:
                tombstones.extend(encode_consumer(r) for r in deletion_records(g, known.consumer[g]))
            if generations.get(g, 0) > 0:
                tombstones.append(encode_group_tombstone(g))
            if tombstones:
                appends.append(self.append(g, tombstones))
        failed = [code for code in [await self.replicated(a) for a in appends] if code is not ErrorCode.none]
        if failed:
            log.info("could not write group tombstones", groups=len(failed), error=failed[0].name)
        upkeep = self.upkeep.get(index)
        if upkeep is None or self.cores.get(index) is not core:
            return
        await self._append_group_records_again(index, core, upkeep, retention_ms)
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
            code = await self._persist_batches(group_id, [(again[s], None) for s in self._split(group_id, again)])
            if code is not ErrorCode.none:
                log.info("could not append offsets again", group=group_id, error=code.name)

    async def _append_group_records_again(
        self, index: int, core: GroupCoordinatorCore, upkeep: OffsetsUpkeep, retention_ms: int
    ) -> None:
        for group_id in list(upkeep.groups):
            if self.cores.get(index) is not core or self.upkeep.get(index) is not upkeep:
                return
            # Read right before the append: the latest record as appended, whatever the core is doing.
            latest = upkeep.group_due(group_id, self.now_ms(), retention_ms)
            if latest is None:
                continue
            code = await self.persist(group_id, [encode_group(latest)])
            if code is not ErrorCode.none:
                log.info("could not append group record again", group=group_id, error=code.name)
        for group_id in list(upkeep.consumer):
            if self.cores.get(index) is not core or self.upkeep.get(index) is not upkeep:
                return
            # Read right before the append (no await in between): the latest of each key as appended,
            # and nothing of a member or group whose tombstone is in the log already.
            due = upkeep.consumer_due(group_id, self.now_ms(), retention_ms)
            if not due:
                continue
            again = [encode_consumer(r) for r in due]
            code = await self._persist_batches(group_id, [(again[s], None) for s in self._split(group_id, again)])
            if code is not ErrorCode.none:
                log.info("could not append KIP-848 group records again", group=group_id, error=code.name)

    def _split(self, key: str, entries: list[tuple[bytes, bytes | None]]) -> list[slice]:
        """Consecutive slices of ``entries``, each well within one batch of ``key``'s partition: what
        grows old together (a large group's offsets or records) may not fit its max.message.bytes at
        once, and an append refused would be refused again at every pass while the records age out."""
        replica = self.broker.replicas.partitions.get((self.topic, self.partition_of(key)))
        budget = replica.log.config.max_message_bytes // 2 if replica is not None else 2**62
        slices, start, size = [], 0, 0
        for i, (key, value) in enumerate(entries):
            cost = len(key) + len(value or b"") + _RECORD_OVERHEAD
            if i > start and size + cost > budget:
                slices.append(slice(start, i))
                start, size = i, 0
            size += cost
        if start < len(entries):
            slices.append(slice(start, len(entries)))
        return slices

    async def _persist_batches(
        self, key: str, batches: list[tuple[list[tuple[bytes, bytes | None]], Callable[[], None] | None]]
    ) -> ErrorCode:
        """``persist`` several batches (each with its ``on_append``): all appended in this step, in
        order, before anything else can append (as one batch would be), then awaited. The first
        error, or NONE."""
        self._in_flight[key] += 1
        try:
            appended = [self.append(key, entries, None, on_append) for entries, on_append in batches]
            codes = [await self.replicated(a) for a in appended]
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]
        return next((code for code in codes if code is not ErrorCode.none), ErrorCode.none)

    # --- replay --------------------------------------------------------------------------------

    def load(self, partition: Partition) -> GroupCoordinatorCore:
        """Plain records apply in log order; transactional ones wait for their marker. Loaded
        members' session timers start now (Kafka's onGroupLoaded)."""
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
            topic_names=self.topic_names,
            topics_version=self.topics_version,
            topic_id_of=self.subscribed_topic_id,
            on_store=lambda store: self._store_group(core, store),
        )
        self._forget_partition(partition.index)
        now = self.now_ms()
        order: OffsetOrder = TxnOffsetOrder()
        upkeep = OffsetsUpkeep()
        log_start = partition.log.log_start_offset
        for raw in self.log_batches(partition):
            header = records.parse_header(raw)
            if header.is_control:
                counting = order.ended(header.producer_id, control_type(raw) == CONTROL_COMMIT)
                self._apply_ended(core, upkeep, counting)
                continue
            producer = (header.producer_id, header.producer_epoch) if header.is_transactional else None
            for offset, key, value in records.iter_records(raw):
                if offset < log_start or key is None:
                    continue
                record = decode(key, value)
                # The batch's timestamp is when the coordinator appended it (its own clock).
                if self._note_record(order, upkeep, record, producer, offset, header.max_timestamp):
                    apply_record(core, record, now)
        # Transactions still open when we took over stay pending until their marker.
        self.txn_order[partition.index], self.upkeep[partition.index] = order, upkeep
        return core

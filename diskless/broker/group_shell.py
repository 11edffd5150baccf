"""The broker side of group coordination: the asyncio shell around ``GroupCoordinatorCore``.

Groups map to partitions of the internal ``__consumer_offsets`` topic (Kafka's hash rule); the
leader of a partition coordinates its groups. Becoming leader loads that partition's committed
offsets from its log (replay) into a fresh core; losing leadership drops the core, so clients
get NOT_COORDINATOR and look the coordinator up again. An OffsetCommit is answered only once its
record is replicated like any acks=all write, which is what lets offsets survive the loss of
the coordinator's broker. Timers (session and rebalance timeouts) run from one asyncio handle
re-armed at the earliest deadline of all cores.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import MetadataError
from diskless.groups.coordinator import GroupCoordinatorCore, OffsetAndMetadata
from diskless.groups.records import OffsetCommitRecord, decode, partition_for, replay
from diskless.log.txn_index import CONTROL_COMMIT, control_type
from diskless.protocol import records
from diskless.replication.partition import Partition

if TYPE_CHECKING:
    from .broker import Broker

log = structlog.get_logger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"


class GroupShell:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.cores: dict[int, GroupCoordinatorCore] = {}
        self._timer: asyncio.TimerHandle | None = None
        # Transactional offset commits waiting for their transaction's marker:
        # (offsets partition, producer id) -> group -> {(topic, partition): offset}
        self.pending_txn: dict[tuple[int, int], dict[str, dict[tuple[str, int], OffsetAndMetadata]]] = {}

    @property
    def partitions(self) -> int:
        topic = self.broker.metadata.topics.get(OFFSETS_TOPIC)
        return len(topic.partitions) if topic is not None else self.broker.config.offsets_topic_num_partitions

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    # --- the internal topic ---------------------------------------------------------------------

    async def ensure_topic(self) -> None:
        """Create ``__consumer_offsets`` on first use, as Kafka does."""
        if OFFSETS_TOPIC in self.broker.metadata.topics:
            return
        config = self.broker.config
        replication = max(1, min(config.offsets_topic_replication_factor, len(self.broker.metadata.brokers)))
        try:
            await self.broker.create_topic(
                OFFSETS_TOPIC,
                config.offsets_topic_num_partitions,
                replication,
                {"retention.ms": str(config.offsets_retention_minutes * 60_000), "segment.bytes": "104857600"},
                internal=True,
            )
        except MetadataError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                raise

    def coordinator_node(self, group_id: str) -> int:
        """The broker coordinating ``group_id`` (-1 while its partition has no leader)."""
        state = self.broker.metadata.partition(OFFSETS_TOPIC, self.partition_of(group_id))
        return -1 if state is None else int(state.leader)

    # --- the facade the group API handlers use ---------------------------------------------------

    def coordinator(self, group_id: str) -> GroupCoordinatorCore | ErrorCode:
        index = self.partition_of(group_id)
        state = self.broker.metadata.partition(OFFSETS_TOPIC, index)
        if state is None or state.leader < 0:
            return ErrorCode.coordinator_not_available
        if state.leader != self.broker.node_id:
            return ErrorCode.not_coordinator
        core = self.cores.get(index)
        return core if core is not None else ErrorCode.coordinator_load_in_progress

    async def persist(
        self, group_id: str, entries: list[tuple[bytes, bytes | None]], producer: tuple[int, int] | None = None
    ) -> ErrorCode:
        """Append group records to the group's partition and wait until they are replicated.

        With ``producer`` (id, epoch) the batch is transactional (TxnOffsetCommit): it counts
        only once its transaction's commit marker follows it in the same log.
        """
        replica = self.broker.replicas.partitions.get((OFFSETS_TOPIC, self.partition_of(group_id)))
        if replica is None or replica.leader_state is None:
            return ErrorCode.not_coordinator
        if not entries:
            return ErrorCode.none
        now = self.now_ms()
        if producer is None:
            batch = records.build_batch(list(entries), now)
        else:
            attributes = records.TRANSACTIONAL_FLAG
            batch = records.build_batch(list(entries), now, producer[0], producer[1], -1, attributes)
        try:
            result = replica.log.append_as_leader(
                [memoryview(batch)], replica.leader_epoch, now, check_sequence=producer is None
            )
        except records.InvalidBatch as exc:
            log.error("could not append group records", error=str(exc))
            return ErrorCode.unknown_server_error
        self.broker.on_leader_append(replica)
        if await replica.wait_for_commit(result.last_offset, 30.0):
            return ErrorCode.none
        return ErrorCode.not_coordinator if replica.leader_state is None else ErrorCode.request_timed_out

    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    def all_cores(self) -> list[GroupCoordinatorCore]:
        return list(self.cores.values())

    def wake(self) -> None:
        """Re-arm the timer at the earliest deadline any core has."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadlines = [d for d in (core.next_deadline_ms() for core in self.cores.values()) if d is not None]
        if not deadlines:
            return
        delay = max(0.0, (min(deadlines) - self.now_ms()) / 1000)
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = self.now_ms()
        for core in list(self.cores.values()):
            core.tick(now)
        self.wake()

    # --- following leadership of __consumer_offsets partitions -----------------------------------

    def on_partition(self, index: int, partition: Partition | None) -> None:
        """Called whenever a ``__consumer_offsets`` partition's state changed (``None``: not hosted)."""
        if partition is not None and partition.leader_state is not None:
            if index not in self.cores:
                self.cores[index] = self._load(partition)
                log.info("coordinating groups of partition", partition=index)
        elif index in self.cores:
            core = self.cores.pop(index)
            shutdown = getattr(core, "shutdown", None)
            if callable(shutdown):
                shutdown()
            log.info("no longer coordinating groups of partition", partition=index)
        self.wake()

    # --- transactional offsets (TxnOffsetCommit) ------------------------------------------------------

    def add_pending(self, group_id: str, producer_id: int, offsets: dict[tuple[str, int], OffsetAndMetadata]) -> None:
        key = (self.partition_of(group_id), producer_id)
        self.pending_txn.setdefault(key, {}).setdefault(group_id, {}).update(offsets)

    def on_marker(self, index: int, producer_id: int, commit: bool) -> None:
        """A transaction ended on offsets partition ``index``: its offsets count now, or never."""
        pending = self.pending_txn.pop((index, producer_id), {})
        core = self.cores.get(index)
        if commit and core is not None:
            for group_id, offsets in pending.items():
                core.apply_offsets(group_id, offsets)

    def _load(self, partition: Partition) -> GroupCoordinatorCore:
        """Replay the partition: plain records apply in order; transactional ones wait for their marker."""
        core = GroupCoordinatorCore(self._core_config(), partition=partition.index)
        plog = partition.log
        entries: list[tuple[bytes, bytes | None]] = []
        waiting: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for segment in plog.segments:
            for location in segment.iter_batches():
                if location.last_offset < plog.log_start_offset:
                    continue
                raw = segment.read_batch(location)
                header = records.parse_header(raw)
                if header.is_control:
                    done = waiting.pop(header.producer_id, [])
                    if control_type(raw) == CONTROL_COMMIT:
                        entries.extend(done)
                    continue
                batch_entries = [
                    (key, value)
                    for offset, key, value in records.iter_records(raw)
                    if offset >= plog.log_start_offset and key is not None
                ]
                if header.is_transactional:
                    waiting.setdefault(header.producer_id, []).extend(batch_entries)
                else:
                    entries.extend(batch_entries)
        replay(core, entries)
        for producer_id, open_entries in waiting.items():
            # Still open when we took over: keep them pending until the coordinator's marker.
            for key, value in open_entries:
                decoded = decode(key, value)
                if isinstance(decoded, OffsetCommitRecord):
                    pending = self.pending_txn.setdefault((partition.index, producer_id), {})
                    pending.setdefault(decoded.group_id, {})[(decoded.topic, decoded.partition)] = decoded.value
        return core

    def _core_config(self) -> Any:
        from diskless.groups.coordinator import GroupConfig

        config = self.broker.config
        return GroupConfig(
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
        )

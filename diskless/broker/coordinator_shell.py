"""What group and transaction coordination share on the broker: an internal topic whose partition
leaders are the coordinators.

A key (group id, transactional id) maps to a partition of the internal topic by Kafka's hash rule;
the partition's leader coordinates it. Becoming leader builds a fresh sans-IO core from the
partition's log (replay); losing leadership drops it, so clients get NOT_COORDINATOR and look the
coordinator up again. Writes go to the partition like any acks=all write, which is what lets the
state survive the loss of the coordinator's broker. Timers run from one asyncio handle re-armed
at the earliest deadline of all cores.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import MetadataError
from diskless.protocol import records
from diskless.replication.partition import Partition

if TYPE_CHECKING:
    from .broker import Broker

log = structlog.get_logger(__name__)

CoreT = TypeVar("CoreT")


FAILED_TICK_RETRY_S = 1.0  # after a timer pass that raised


@dataclass(frozen=True, slots=True)
class Appended:
    """Records in the leader's log, not yet known to be replicated."""

    replica: Any
    last_offset: int
    epoch: int


class CoordinatorShell(Generic[CoreT]):
    topic = ""  # set by subclasses

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.cores: dict[int, CoreT] = {}
        self._loaded_epochs: dict[int, int] = {}  # partition -> leader epoch its core was loaded at
        self._timer: asyncio.TimerHandle | None = None

    # --- what subclasses define ------------------------------------------------------------------

    def configured_partitions(self) -> int:
        raise NotImplementedError

    def configured_replication(self) -> int:
        raise NotImplementedError

    def topic_configs(self) -> dict[str, str]:
        return {}

    def hash_partition(self, key: str, partitions: int) -> int:
        raise NotImplementedError

    def load(self, partition: Partition) -> CoreT:
        """A fresh core holding what the partition's log says."""
        raise NotImplementedError

    def tick(self, now_ms: int) -> None:
        """Run the cores' timers (subclasses override)."""

    def appended(
        self,
        key: str,
        entries: list[tuple[bytes, bytes | None]],
        producer: tuple[int, int] | None,
        now_ms: int,
        base_offset: int,
    ) -> None:
        """Records were just appended to ``key``'s partition at ``now_ms``, from ``base_offset`` on
        (not yet replicated): called in log order, before any later append (subclasses override)."""

    def unload(self, core: CoreT) -> None:
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()

    # --- the internal topic -----------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        topic = self.broker.metadata.topics.get(self.topic)
        return len(topic.partitions) if topic is not None else self.configured_partitions()

    def partition_of(self, key: str) -> int:
        return self.hash_partition(key, self.partitions)

    async def ensure_topic(self) -> None:
        """Create the internal topic on first use, as Kafka does."""
        if self.topic in self.broker.metadata.topics:
            return
        replication = max(1, min(self.configured_replication(), len(self.broker.metadata.brokers)))
        try:
            await self.broker.create_topic(
                self.topic, self.configured_partitions(), replication, self.topic_configs(), internal=True
            )
        except MetadataError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                raise

    def coordinator_node(self, key: str) -> int:
        """The broker coordinating ``key`` (-1 while its partition has no leader)."""
        state = self.broker.metadata.partition(self.topic, self.partition_of(key))
        return -1 if state is None else int(state.leader)

    # --- the facade handlers use ------------------------------------------------------------------

    def coordinator(self, key: str) -> CoreT | ErrorCode:
        index = self.partition_of(key)
        state = self.broker.metadata.partition(self.topic, index)
        if state is None or state.leader < 0:
            return ErrorCode.coordinator_not_available
        if state.leader != self.broker.node_id:
            return ErrorCode.not_coordinator
        core = self.cores.get(index)
        return core if core is not None else ErrorCode.coordinator_load_in_progress

    async def persist(
        self,
        key: str,
        entries: list[tuple[bytes, bytes | None]],
        producer: tuple[int, int] | None = None,
        on_append: Callable[[], None] | None = None,
    ) -> ErrorCode:
        """Append records to the key's partition and wait until they are replicated.

        With ``producer`` (id, epoch) the batch is transactional: it counts only once its
        transaction's commit marker follows it in the same log. ``on_append`` runs right after
        the append, before anything else can append: state that must follow log order.
        """
        return await self.replicated(self.append(key, entries, producer, on_append))

    def append(
        self,
        key: str,
        entries: list[tuple[bytes, bytes | None]],
        producer: tuple[int, int] | None = None,
        on_append: Callable[[], None] | None = None,
    ) -> Appended | ErrorCode:
        """``persist``'s first half, synchronous: the records are in the leader's log (in the order
        of the calls) when it returns; ``replicated`` then waits for them. An ErrorCode: not appended."""
        replica = self.broker.replicas.partitions.get((self.topic, self.partition_of(key)))
        if replica is None or replica.leader_state is None:
            return ErrorCode.not_coordinator
        if not entries:
            return ErrorCode.none
        now = self.now_ms()
        if producer is None:
            batch = records.build_batch(list(entries), now)
        else:
            batch = records.build_batch(list(entries), now, producer[0], producer[1], -1, records.TRANSACTIONAL_FLAG)
        try:
            result = replica.log.append_as_leader(
                [memoryview(batch)], replica.leader_epoch, now, check_sequence=producer is None
            )
        except records.InvalidBatch as exc:
            if exc.error == "invalid_producer_epoch":
                return ErrorCode.invalid_producer_epoch  # a fenced producer's TxnOffsetCommit
            log.error("could not append coordinator records", topic=self.topic, error=str(exc))
            return ErrorCode.unknown_server_error
        self.appended(key, entries, producer, now, result.base_offset)
        if on_append is not None:
            on_append()
        self.broker.on_leader_append(replica)
        return Appended(replica, result.last_offset, replica.leader_epoch)

    @staticmethod
    async def replicated(appended: Appended | ErrorCode) -> ErrorCode:
        """``persist``'s second half: NONE once the appended records are replicated."""
        if isinstance(appended, ErrorCode):
            return appended
        replica, epoch = appended.replica, appended.epoch
        if await replica.wait_for_commit(appended.last_offset, epoch, 30.0):
            return ErrorCode.none
        return ErrorCode.request_timed_out if replica.leads_at(epoch) else ErrorCode.not_coordinator

    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    def all_cores(self) -> list[CoreT]:
        return list(self.cores.values())

    def loading(self) -> bool:
        """Whether metadata makes this broker the leader of a partition whose core is not loaded
        yet: a listing of every core would miss that partition's keys (Kafka answers
        COORDINATOR_LOAD_IN_PROGRESS while any partition loads)."""
        topic = self.broker.metadata.topics.get(self.topic)
        if topic is None:
            return False
        node = self.broker.node_id
        return any(state.leader == node and index not in self.cores for index, state in enumerate(topic.partitions))

    def wake(self) -> None:
        """Re-arm the timer at the earliest deadline any core has."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadlines = [d for d in (core.next_deadline_ms() for core in self.cores.values()) if d is not None]  # type: ignore[attr-defined]
        if not deadlines:
            return
        delay = max(0.0, (min(deadlines) - self.now_ms()) / 1000)
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        try:
            self.tick(self.now_ms())
        except Exception:
            # Left unarmed, no session or transaction timeout would fire until some request came
            # (a group whose members all went silent never would); armed at the earliest deadline,
            # one the failed tick did not move would fire again at once, in a loop.
            log.exception("coordinator timers failed; trying again shortly", topic=self.topic)
            self._timer = asyncio.get_running_loop().call_later(FAILED_TICK_RETRY_S, self._fire)
            return
        self.wake()

    # --- following leadership of the internal topic's partitions ----------------------------------

    def on_partition(self, index: int, partition: Partition | None) -> None:
        """Called whenever a partition of the internal topic changed state (``None``: not hosted)."""
        # The epoch this broker leads the partition at (None: it does not lead it).
        epoch = partition.leader_epoch if partition is not None and partition.leader_state is not None else None
        if index in self.cores and self._loaded_epochs.get(index) != epoch:
            # At a new epoch another broker may have led in between (one this broker never saw,
            # as across a lost watch) and moved the state on: Kafka loads afresh at every epoch too.
            self.unload(self.cores.pop(index))
            log.info("no longer coordinating", topic=self.topic, partition=index)
        if partition is not None and epoch is not None and index not in self.cores:
            self.cores[index] = self.load(partition)
            self._loaded_epochs[index] = epoch
            log.info("coordinating", topic=self.topic, partition=index, epoch=epoch)
        self.wake()

    @staticmethod
    def log_batches(partition: Partition) -> list[bytes]:
        """Every batch at or after the log start, in order (for replay; not a hot path)."""
        plog = partition.log
        out = []
        for segment in plog.segments:
            for location in segment.iter_batches():
                if location.last_offset >= plog.log_start_offset:
                    out.append(segment.read_batch(location))
        return out

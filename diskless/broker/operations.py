"""Operator actions on partition states: reassignments, elections, leader rebalancing.

The decisions are ``cluster/reassignment.py`` and ``cluster/elections.py`` (sans-IO); this is the
asyncio shell that applies them. Every change is a compare-and-swap of one partition's state
against the revision it was decided from: a lost race (an ISR change, a controller election)
decides again from the newer state, a bounded number of times. Any broker can start a
reassignment or an election (the store serialises them); the controller completes reassignments
once their new replicas are in sync, and rebalances leadership when
``auto.leader.rebalance.enable`` is set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import structlog
from kio.schema.errors import ErrorCode
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from diskless.broker.connection_quotas import ConnectionLimits, LimitError, parse_overrides
from diskless.cluster import broker_configs, client_quotas, reassignment
from diskless.cluster.elections import PREFERRED, elect_preferred, imbalanced_partitions
from diskless.cluster.metadata import PartitionState
from diskless.replication.throttle import ThrottleBucket

if TYPE_CHECKING:
    from .broker import Broker

log = structlog.get_logger(__name__)

APPLIED_WAIT_S = 10.0


class ConcurrentChange(Exception):
    """The partition's state changed between the decision and the write; decide again."""


def _compare_and_swap_attempts() -> AsyncRetrying:
    """Retries of a read-decide-write whose write lost a race (``ConcurrentChange``)."""
    return AsyncRetrying(
        stop=stop_after_attempt(6),
        wait=wait_random_exponential(multiplier=0.02, max=0.5),
        retry=retry_if_exception_type(ConcurrentChange),
        reraise=True,
    )


async def _applied(read: Callable[[], object], expected: object) -> None:
    """Until this broker's copy shows a change it wrote (its watch), so a describe sent to it right
    after the answer sees it; at most APPLIED_WAIT_S (a lagging watch must not fail the change)."""
    deadline = time.monotonic() + APPLIED_WAIT_S
    while read() != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


class Operations:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        # The configuration from file, environment and flags; dynamic broker configs are laid over
        # it into ``broker.config`` whenever they change (cluster/broker_configs.py).
        self.static_config = broker.config
        self._pass_scheduled = False
        self._pass_again = False
        self._last_rebalance = time.monotonic()
        self._throttle = ThrottleBucket()
        self._connection_limits: ConnectionLimits | None = None  # last given to the server

    @property
    def live(self) -> set[int]:
        return set(self.broker.metadata.brokers)

    async def change_partition(
        self, topic: str, index: int, decide: Callable[[PartitionState], PartitionState | None]
    ) -> PartitionState | None:
        """Apply ``decide`` to the partition's current state and store the result (CAS, retried on
        a concurrent change); returns the stored state, None when ``decide`` found nothing to do.
        ``decide`` raises to refuse. Returns once this broker's metadata shows the change."""
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(6),
            wait=wait_random_exponential(multiplier=0.02, max=0.5),
            retry=retry_if_exception_type(ConcurrentChange),
            reraise=True,
        ):
            with attempt:
                return await self._change_once(topic, index, decide)
        raise AssertionError("unreachable: tenacity returns or re-raises")

    async def _change_once(
        self, topic: str, index: int, decide: Callable[[PartitionState], PartitionState | None]
    ) -> PartitionState | None:
        metadata = self.broker.metadata
        current = metadata.partition(topic, index)
        if current is None:
            raise reassignment.ReassignmentError(
                ErrorCode.unknown_topic_or_partition, f"Unknown partition {topic}-{index}"
            )
        expected = self.broker.backend.revision_of(topic, index)
        new = decide(current)
        if new is None:
            return None
        if not await self.broker.backend.update_partition(topic, index, new, expected):
            raise ConcurrentChange
        # The watch brings the stored state back as a new object (the local backend sets it at once).
        deadline = time.monotonic() + APPLIED_WAIT_S
        while metadata.partition(topic, index) is current and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return new

    # --- dynamic broker configs ------------------------------------------------------------------

    def apply_dynamic_configs(self) -> None:
        """Lay the stored dynamic configs over the static ones; logs take new topic defaults, the
        server new connection limits."""
        dynamic = self.broker.metadata.broker_configs
        self._apply_connection_limits(dynamic)
        defaults = broker_configs.layered_topic_defaults(self.static_config, dynamic, self.broker.node_id)
        if defaults == self.broker.config.topic_defaults:
            return
        self.broker.config = dataclasses.replace(self.broker.config, topic_defaults=defaults)
        for topic in list(self.broker.metadata.topics.values()):
            self.broker.replicas.update_config(topic.name, self.broker.log_config(topic))
        log.info("dynamic broker configs applied", topic_defaults=defaults)

    def _apply_connection_limits(self, dynamic: Mapping[str, Mapping[str, str]]) -> None:
        def value(name: str) -> str:
            return broker_configs.dynamic_field(self.static_config, dynamic, self.broker.node_id, name)

        try:
            limits = ConnectionLimits(
                int(value("max.connections.per.ip")),
                parse_overrides(value("max.connections.per.ip.overrides")),
                int(value("max.connections")),
                self.static_config.connections_max_idle_ms,
            )
        except (LimitError, ValueError) as exc:
            # Each value was checked when stored; a combination Kafka refuses (max.connections.per.ip
            # 0 and no overrides, from layers set apart) keeps the limits in force.
            log.warning("dynamic connection limits not applied; the previous ones stay", error=str(exc))
            return
        if limits != self._connection_limits:
            self._connection_limits = limits
            self.broker.server.configure_connections(limits)
            log.info("connection limits applied", limits=limits)

    def dynamic_value(self, name: str) -> str | None:
        return broker_configs.dynamic_value(self.broker.metadata.broker_configs, self.broker.node_id, name)

    async def alter_broker_configs(
        self, resource: str, updates_for: Callable[[dict[str, str]], dict[str, str | None]], validate_only: bool
    ) -> None:
        """Change the dynamic configs of broker resource ``resource`` ("" for the cluster default):
        ``updates_for`` maps the current ones to set (value) / delete (None) updates."""
        name = broker_configs.DEFAULT_RESOURCE if resource == "" else resource
        async for attempt in _compare_and_swap_attempts():
            with attempt:
                current = dict(self.broker.metadata.broker_configs.get(name, {}))
                updates = broker_configs.validate_dynamic(updates_for(current))
                merged = {k: v for k, v in {**current, **updates}.items() if v is not None}
                # Each value is valid alone; together with the other layers (this broker's view)
                # they must still make a startable configuration (min <= max compaction lag...).
                after = {**self.broker.metadata.broker_configs, name: merged}
                broker_configs.check_dynamic_combination(self.static_config, after, self.broker.node_id)
                if validate_only:
                    return
                if not await self.broker.backend.update_broker_configs(name, merged):
                    raise ConcurrentChange
                await _applied(lambda: self.broker.metadata.broker_configs.get(name, {}), merged)
                log.info("dynamic broker configs altered", resource=name, configs=merged)

    async def alter_client_quotas(
        self, alterations: list[client_quotas.Alteration], validate_only: bool
    ) -> dict[client_quotas.Entity, tuple[ErrorCode, str | None]]:
        """Apply an AlterClientQuotas (cluster/client_quotas.py): every valid entity's change in one
        store transaction, seen here before answering; each entity's outcome."""
        results: dict[client_quotas.Entity, tuple[ErrorCode, str | None]] = {}
        async for attempt in _compare_and_swap_attempts():
            with attempt:
                current = self.broker.metadata.client_quotas
                results, after = client_quotas.plan_alterations(current, alterations)
                changed = {e: v for e, v in after.items() if v != current.get(e, {})}
                if validate_only or not changed:
                    return results
                if not await self.broker.backend.update_client_quotas(changed):
                    raise ConcurrentChange
                await _applied(functools.partial(self._client_quotas_of, list(changed)), changed)
                log.info("client quotas altered", changes={client_quotas.render(e): v for e, v in changed.items()})
        return results

    def _client_quotas_of(self, entities: list[client_quotas.Entity]) -> dict[client_quotas.Entity, dict[str, float]]:
        return {e: self.broker.metadata.client_quotas.get(e, {}) for e in entities}

    # --- replication throttle ----------------------------------------------------------------

    def replication_allowance(self, state: PartitionState | None, follower: int) -> int | None:
        """Bytes a replica fetch of ``follower`` may be served now; None when not throttled. Only
        replicas a reassignment is adding are throttled (as kafka-reassign-partitions --throttle
        lists them), at this broker's ``leader.replication.throttled.rate``."""
        if state is None or follower not in state.adding:
            return None
        raw = self.dynamic_value("leader.replication.throttled.rate")
        if raw is None or int(raw) >= 2**62:
            return None
        return self._throttle.allowance(int(raw), time.monotonic())

    def replication_served(self, size: int) -> None:
        self._throttle.consume(size)

    # --- controller duties ---------------------------------------------------------------------

    def partition_changed(self, state: PartitionState) -> None:
        """A partition's state changed: if a reassignment of it may now complete, the controller
        does so right away rather than at its next periodic pass."""
        if not reassignment.in_progress(state) or not self._is_controller():
            return
        if self._pass_scheduled:
            self._pass_again = True  # the running pass may have looked before this change
            return
        self._pass_scheduled = True

        async def run() -> None:
            try:
                while True:
                    self._pass_again = False
                    await self.complete_reassignments()
                    if not self._pass_again:
                        break
            finally:
                self._pass_scheduled = False

        task = asyncio.create_task(run())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _is_controller(self) -> bool:
        return self.broker.metadata.controller_id == self.broker.node_id and not self.broker._stopping

    async def controller_pass(self) -> None:
        """Run by the controller after its elections: finish reassignments, rebalance leaders."""
        await self.complete_reassignments()
        config = self.broker.config
        due = time.monotonic() - self._last_rebalance >= config.leader_imbalance_check_interval_seconds
        if config.auto_leader_rebalance_enable and due:
            self._last_rebalance = time.monotonic()
            await self.rebalance_leaders()

    async def complete_reassignments(self) -> None:
        live = self.live
        for topic in list(self.broker.metadata.topics.values()):
            for index, state in enumerate(topic.partitions):
                if reassignment.complete(state, live) is None:
                    continue
                try:
                    done = await self.change_partition(topic.name, index, lambda s: reassignment.complete(s, self.live))
                except ConcurrentChange:
                    continue  # decided again at the next pass
                if done is not None:
                    log.info(
                        "reassignment completed",
                        topic=topic.name,
                        partition=index,
                        replicas=done.replicas,
                        leader=done.leader,
                        epoch=done.leader_epoch,
                    )

    async def rebalance_leaders(self) -> None:
        pct = self.broker.config.leader_imbalance_per_broker_percentage
        moved = []
        for topic, index in imbalanced_partitions(self.broker.metadata, self.live, pct):
            try:
                done = await self.change_partition(topic, index, lambda s: elect_preferred(s, self.live).state)
            except ConcurrentChange:
                continue
            if done is not None:
                moved.append((topic, index, done.leader))
        if moved:
            log.info("leaders rebalanced to preferred replicas", partitions=len(moved), first=moved[:10])

    def election_type_name(self, election_type: int) -> str:
        return "preferred" if election_type == PREFERRED else "unclean"

"""A broker process: configuration, metadata, hosted replicas, the Kafka listener and timers.

This is the asyncio shell around the sans-IO pieces. Metadata lives in a backend (a local file
for a standalone broker, etcd for a cluster); every change goes through the backend and comes
back through ``_on_metadata_change``, which is the only place replicas change role. In a cluster,
one broker is also the controller (elected through etcd) and fences brokers whose lease expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.aio import cancel_and_wait
from diskless.cluster.broker_configs import cleaner_config
from diskless.cluster.controller import elect_on_broker_change
from diskless.cluster.metadata import (
    BrokerInfo,
    ClusterMetadata,
    LocalBackend,
    MetadataError,
    PartitionState,
    RecordKey,
    TopicMetadata,
)
from diskless.cluster.producer_ids import ProducerIdBlock
from diskless.config import BrokerConfig
from diskless.fetch.read_quota import ReadQuota
from diskless.fetch.wal_reader import WalCache, WalReader
from diskless.groups.offsets_upkeep import check_interval_ms
from diskless.log.config import LogConfig, canonical_name, effective_values
from diskless.log.partition_log import PartitionLog
from diskless.log.segment import POINTERS, BatchLocation, LogSegment
from diskless.metrics import EVENT_LOOP_LAG_SECONDS, METADATA_APPLY_ERRORS, RETENTION_DELETED_SEGMENTS, serve_metrics
from diskless.produce.host import RepresentativeHost
from diskless.produce.representative import Representative
from diskless.replication.partition import Partition
from diskless.security.cluster_secret import configured_secret, load_cluster_secret
from diskless.security.internal_auth import ClusterSecret
from diskless.security.tls import internal_client_context
from diskless.storage import pointer
from diskless.storage.hedging import HedgePolicy
from diskless.storage.object_store import ObjectStore

from .apis import KafkaApis
from .group_shell import GroupShell
from .log_cleaner import LogCleaner
from .operations import Operations
from .peers import PeerPool
from .replica_manager import ReplicaManager
from .server import KafkaServer
from .txn_shell import TxnShell

log = structlog.get_logger(__name__)

HW_CHECKPOINT_INTERVAL_S = 5.0
# How often logs are checked against their flush.ms (Kafka's log.flush.scheduler.interval.ms). Kafka's
# default, Long.MAX, runs its flusher once, 30 s after start, so a topic's flush.ms does nothing
# unless the operator also sets that; here flush.ms is honoured to within this interval. A pass
# over logs whose flush.ms is the default costs a comparison each.
LOG_FLUSH_CHECK_INTERVAL_S = 1.0
# How often the files of dropped segments are checked against their file.delete.delay.ms (Kafka
# schedules one task per segment instead): they go at most this late.
SEGMENT_DELETE_CHECK_INTERVAL_S = 1.0
LOG_CONFIG_CACHE_MAX = 100_000  # parsed topic configs kept (log_config)
DISKLESS_ENABLED = "diskless.enabled"
LOOP_LAG_INTERVAL_S = 0.1  # how often the event loop's lateness is sampled (diskless_event_loop_lag_seconds)
# Longest stretch of applying metadata changes before the event loop gets a turn. Bounded in time,
# not in changes: one change can cost milliseconds of disk under load (a new log), and the etcd
# lease refresh (its own task) needs several loop turns to complete within the session timeout.
APPLY_SLICE_S = 0.02
# ISR changes (etcd transactions) in flight at once. A pass can shrink thousands of ISRs (a big
# topic whose followers are still being created); sent all at once they queue ahead of the lease
# refresh on the etcd connection and in etcd (a renewal waits for pending applies), which then
# times out and fences the broker. The rest wait their turn; each still CASes against the state
# it was decided from, so a late one loses to any newer change.
ISR_PROPOSALS_IN_FLIGHT = 8


class _OwnLeaders:
    """The representative's direct line to this broker's own partition leaders (``produce/host.py``):
    the handlers the internal requests reach, called in process."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker  # its ``apis`` exist only once the broker is built

    def commit_batches_now(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._broker.apis.diskless.commit_batches_now(body)

    async def await_replicated(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._broker.apis.diskless.await_replicated(body)

    async def verify_txn_partition(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._broker.apis.txn_verification.verify_partition(body)


# An ISR change whose outcome is unknown is asked again after this long, until the store answers
# (or the proposal no longer matters: leadership moved, the broker stops).
ISR_PROPOSAL_RETRY_S = 0.5
ISR_PROPOSAL_LOG_EVERY = 20  # attempts between two log lines while the store does not answer


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.metadata = ClusterMetadata(config.cluster_id)
        self.backend: Any
        if config.metadata_etcd_endpoints:
            from diskless.cluster.etcd_store import EtcdMetadataStore

            self.backend = EtcdMetadataStore(
                config.metadata_etcd_endpoints, config.cluster_id, self.metadata, config.etcd_credentials
            )
        else:
            self.backend = LocalBackend(os.path.join(config.log_dirs, "cluster-metadata.json"), self.metadata)
        self.backend.on_change = self._on_metadata_change
        # Set when another incarnation of our node id took over: the process must exit (cli.py).
        self.superseded = asyncio.Event()
        if hasattr(self.backend, "on_superseded"):
            self.backend.on_superseded = self.superseded.set
        # What this broker proves to its peers and checks on every internal request; known at
        # start (from config, or etcd: security/cluster_secret.py), shared by every connection.
        self.cluster_secret = ClusterSecret(configured_secret(config), internal_client_context(config))
        self.replicas = ReplicaManager(
            config.log_dirs,
            self.node_id,
            self.metadata.brokers.get,
            config.replica_fetch_wait_max_ms,
            config.replica_fetch_max_bytes,
            self.prefetch_entries,
            self._source_host(),
            credentials=self.cluster_secret,
        )
        self.peers = PeerPool(self.node_id, self.metadata.brokers.get, self._source_host(), self.cluster_secret)
        self.store: ObjectStore | None = None
        self.miss_store: ObjectStore | None = None
        self.wal_reader: WalReader | None = None
        self.representative: Representative | None = None
        self.lagging_read_quota = ReadQuota(config.diskless_fetch_lagging_max_bytes_per_second, self.monotonic_ms())
        if config.diskless_s3_endpoint:
            bucket = (
                config.diskless_s3_endpoint,
                config.diskless_s3_bucket,
                config.diskless_s3_access_key,
                config.diskless_s3_secret_key,
                config.diskless_s3_region,
            )
            self.store = ObjectStore(*bucket)
            # Cache misses (reads far behind the tail) get their own lane: WalReader.miss_store.
            self.miss_store = ObjectStore(*bucket, max_concurrency=config.diskless_fetch_miss_max_requests)
            cache = WalCache(config.diskless_cache_max_bytes, config.diskless_cache_lagging_max_bytes)
            hedge = HedgePolicy(
                quantile=config.diskless_s3_hedge_quantile, max_ratio=config.diskless_s3_hedge_max_ratio
            )
            self.wal_reader = WalReader(self.store, cache, self.miss_store, hedge)
            host = RepresentativeHost(config, self.metadata, self.peers, _OwnLeaders(self), self.cluster_secret)
            self.representative = Representative(host, self.store, self.wal_reader.cache.put)
        self._metadata_event = asyncio.Event()
        self.groups = GroupShell(self)
        self.txns = TxnShell(self)
        self.operations = Operations(self)
        self.apis = KafkaApis(self)
        self.server = KafkaServer(
            self.apis, config.socket_request_max_bytes, self.cluster_secret, config.queued_max_request_bytes
        )
        self._pid_block = ProducerIdBlock()
        self._pid_lock = asyncio.Lock()
        self._isr_updates: set[tuple[str, int]] = set()
        self._log_configs: dict[str, tuple[dict[str, str], dict[str, str], LogConfig]] = {}
        self._isr_slots = asyncio.Semaphore(ISR_PROPOSALS_IN_FLIGHT)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.port = -1
        self.metrics_port = -1
        self.log_cleaner: LogCleaner | None = None  # started with the broker when log.cleaner.enable

    def _source_host(self) -> str | None:
        """Bind outgoing broker connections to our listener address when it is a specific one."""
        host = self.config.listener.host
        return None if host in ("", "0.0.0.0", "::") else host

    @property
    def clustered(self) -> bool:
        return bool(self.config.metadata_etcd_endpoints)

    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    @staticmethod
    def monotonic_ms() -> float:
        return time.monotonic() * 1000.0

    def leader_fenced(self) -> bool:
        """Whether this broker must not act as a partition leader now (answer NOT_LEADER_OR_FOLLOWER
        to produce, commits, fetches and WalReferences as leader): in a cluster, while its etcd
        lease may have expired, i.e. no keepalive succeeded for the lease TTL, and after it
        registered again until its metadata shows that registration (``cluster/lease.py``)."""
        if not self.clustered:
            return False
        fence = self.backend.fence
        return fence is None or fence.fenced(time.monotonic_ns() // 1_000_000)

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        os.makedirs(self.config.log_dirs, exist_ok=True)
        if self.store is not None:
            await self.store.ensure_bucket()
        listener = self.config.listener
        if self.clustered:
            await self.backend.connect()
            self.cluster_secret.set(await load_cluster_secret(self.config, self.backend.client))
            await self.apis.security.start(self.backend.client)
            await self.backend.load_and_watch()
        else:
            self.cluster_secret.set(await load_cluster_secret(self.config, None))
            await self.apis.security.start(None)
            self.backend.load()
            self.metadata.controller_id = self.node_id
        self.operations.apply_dynamic_configs()  # dynamic broker configs, before logs open
        self.server.client_quotas.update(self.metadata.client_quotas)
        self.replicas.load(self.metadata.topics, self.log_config, self.now_ms())
        # One server per listener (several when each AZ has its own, diskless.listener.az.map).
        bound = {}
        for spec in self.config.listener_specs:
            bound[spec.name] = await self.server.start(spec.host or "0.0.0.0", spec.port, spec.name)
        self.port = bound[self.config.inter_broker_listener]
        endpoints = self.config.advertised_endpoints(bound)
        advertised = endpoints[self.config.inter_broker_listener]
        me = BrokerInfo(
            self.node_id,
            advertised.host,
            advertised.port,
            self.config.broker_rack,
            {name: f"{e.host}:{e.port}" for name, e in endpoints.items()},
            incarnation=uuid.uuid4().hex,
        )
        if self.clustered:
            ttl = max(1, round(self.config.broker_session_timeout_ms / 1000))
            await self.backend.register_broker(me, ttl)
            await self._wait_for(lambda: self.node_id in self.metadata.brokers, 10)
            await self._campaign()
            self._tasks.append(asyncio.create_task(self._controller_loop()))
            await self._fence_previous_incarnation()
        else:
            self.metadata.brokers = {self.node_id: me}
        await self._apply_all()
        if self.representative is not None:
            await self.representative.connect_leaders()
        if self.config.metrics_port >= 0:
            self.metrics_port = serve_metrics(self.config.metrics_host or listener.host, self.config.metrics_port)
        self._tasks.append(
            asyncio.create_task(self._every(self.config.log_retention_check_interval_ms / 1000, self.apply_retention))
        )
        self._tasks.append(
            asyncio.create_task(self._every(HW_CHECKPOINT_INTERVAL_S, self.replicas.checkpoint_high_watermarks_async))
        )
        self._tasks.append(asyncio.create_task(self._every(LOG_FLUSH_CHECK_INTERVAL_S, self.flush_dirty_logs)))
        self._tasks.append(
            asyncio.create_task(self._every(SEGMENT_DELETE_CHECK_INTERVAL_S, self.remove_retired_segments))
        )
        self._tasks.append(
            asyncio.create_task(self._every(self.config.replica_lag_time_max_ms / 2000, self._shrink_isrs))
        )
        offsets_check_ms = check_interval_ms(
            self.config.offsets_retention_check_interval_ms, self.config.offsets_retention_minutes * 60_000
        )
        self._tasks.append(asyncio.create_task(self._every(offsets_check_ms / 1000, self.groups.maintain)))
        self._tasks.append(asyncio.create_task(self._sample_loop_lag()))
        if self.config.log_cleaner_enable:
            self.log_cleaner = LogCleaner(
                lambda: ((key, p.log) for key, p in list(self.replicas.partitions.items())),
                self.now_ms,
                lambda: cleaner_config(self.config, self.metadata.broker_configs, self.node_id),
                self.config.log_dirs,
            )
            self._tasks.append(asyncio.create_task(self.log_cleaner.run_forever()))
        log.info(
            "broker started",
            node_id=self.node_id,
            rack=self.config.broker_rack,
            host=advertised.host,
            port=self.port,
            clustered=self.clustered,
            metrics_port=self.metrics_port,
        )

    async def _fence_previous_incarnation(self) -> None:
        """Partitions we led before a restart get a new leader epoch before we serve them, as Kafka
        does on broker restart, so no follower can mistake our new appends for the old epoch's."""
        stale = {
            (topic.name, index): state.leader_epoch
            for topic in self.metadata.topics.values()
            for index, state in enumerate(topic.partitions)
            if state.leader == self.node_id
        }
        for (topic, index), epoch in stale.items():
            state = self.metadata.partition(topic, index)
            if state is not None and state.leader == self.node_id and state.leader_epoch == epoch:
                bumped = replace(state, leader_epoch=epoch + 1)
                await self.backend.update_partition(topic, index, bumped, self.backend.revision_of(topic, index))

        def fenced() -> bool:
            for (topic, index), epoch in stale.items():
                state = self.metadata.partition(topic, index)
                if state is not None and state.leader_epoch == epoch:
                    return False
            return True

        try:
            await self._wait_for(fenced, 10)
        except TimeoutError:
            log.warning("previous leader epochs not fenced in time", partitions=len(stale))

    async def stop(self) -> None:
        self._stopping = True
        if self.superseded.is_set():
            await self.backend.deregister_broker(self.node_id)  # the newer incarnation leads already
        elif self.clustered:
            await self._controlled_shutdown()
        for task in self._tasks:
            task.cancel()
        await cancel_and_wait(*self._tasks)
        if self.representative is not None:
            await self.representative.close()
        await self.server.stop()
        await self.apis.security.stop()
        await self.peers.close()
        if not self.clustered:
            await self.backend.settle()  # a change a cancelled handler made is still being applied
        await self.replicas.close()
        for store in (self.store, self.miss_store):
            if store is not None:
                await store.close()
        if self.clustered:
            await self.backend.close()
        log.info("broker stopped", node_id=self.node_id)

    async def _controlled_shutdown(self) -> None:
        """Give up our lease so the controller moves leadership away, then wait for it to happen."""
        await self.backend.deregister_broker(self.node_id)
        deadline = self.config.controlled_shutdown_timeout_ms / 1000
        with contextlib.suppress(TimeoutError):
            await self._wait_for(lambda: not self._leads_any_with_others(), deadline)

    def _leads_any_with_others(self) -> bool:
        """Whether some partition we lead still has a live in-sync replica to hand leadership to."""
        live = set(self.metadata.brokers) - {self.node_id}
        return any(live.intersection(p.isr) for p in self.replicas.leading())

    @staticmethod
    async def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError
            await asyncio.sleep(0.02)

    @staticmethod
    async def _sample_loop_lag() -> None:
        """How late a timer fires is how long any ready callback (an answer, a commit) waits its turn."""
        while True:
            due = time.monotonic() + LOOP_LAG_INTERVAL_S
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            EVENT_LOOP_LAG_SECONDS.observe(max(0.0, time.monotonic() - due))

    async def _every(self, interval: float, action: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                result = action()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("periodic task failed", task=getattr(action, "__name__", str(action)))

    # --- logs and replicas -----------------------------------------------------------------------

    def is_diskless(self, topic: TopicMetadata) -> bool:
        return self.log_config(topic).diskless_enabled

    def log_config(self, topic: TopicMetadata) -> LogConfig:
        """The topic's effective configuration. Asked for on every produce and fetch, so the parsed
        result is kept while the topic's overrides and the broker's topic defaults compare equal
        (cheap for dicts this small; either may be replaced or changed in place)."""
        defaults = self.config.topic_defaults
        cached = self._log_configs.get(topic.name)
        if cached is not None and cached[0] == topic.configs and cached[1] == defaults:
            return cached[2]
        values = effective_values(topic.configs, self.config.broker_value)
        config = LogConfig.from_values({name: value for name, (value, _) in values.items()})
        config = replace(config, producer_id_expiration_ms=self.config.producer_id_expiration_ms)
        if len(self._log_configs) >= LOG_CONFIG_CACHE_MAX:
            self._log_configs.clear()  # deleted topics' entries; rebuilt on demand
        self._log_configs[topic.name] = (dict(topic.configs), dict(defaults), config)
        return config

    async def _apply_all(self) -> None:
        """Every partition of the metadata (at start: thousands of logs to open or create); the
        application yields to the event loop every ``APPLY_SLICE_S`` (``_on_metadata_change``)."""
        changes: list[RecordKey] = []
        for topic in self.metadata.topics.values():
            changes += [("partition", topic.name, str(i)) for i in range(len(topic.partitions))]
        await self._on_metadata_change(changes)

    async def metadata_changed(self, timeout: float) -> None:
        """Wait until the metadata changes (or ``timeout`` seconds pass)."""
        self._metadata_event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._metadata_event.wait(), timeout)

    async def _on_metadata_change(self, changes: list[RecordKey]) -> None:
        self._metadata_event.set()
        try:
            if self.representative is not None and any(c[0] == "broker" for c in changes):
                await self.representative.connect_leaders()
            now = self.now_ms()
            slice_started = time.monotonic()
            for change in changes:
                if time.monotonic() - slice_started > APPLY_SLICE_S:
                    # Safe to interleave with other metadata changes: each change is applied from
                    # the metadata as it is now, not as it was when the change was listed.
                    await asyncio.sleep(0)
                    slice_started = time.monotonic()
                    now = self.now_ms()
                try:
                    await self._apply_change(change, now)
                except Exception:
                    # One change that fails here (a log directory that cannot be created, a bug)
                    # must not drop the changes listed after it.
                    log.exception("metadata change not applied", change=change)
                    METADATA_APPLY_ERRORS.labels("apply").inc()
            self.replicas.log_role_summary()
        finally:
            if self.representative is not None:
                self.representative.leaders_changed()  # commits waiting for a leader may go now
            # A DeleteRecords waiting for its followers' log starts counts live replicas only, and
            # is refused once this broker stops leading: a broker gone, or a leader moved, may end it.
            self.replicas.notify_follower_fetch()

    async def _apply_change(self, change: RecordKey, now: int) -> None:
        kind = change[0]
        if kind == "topic":
            name = change[1]
            topic = self.metadata.topics.get(name)
            if topic is None:
                self.replicas.delete_topic(name)
            else:
                # Also drops replicas of an older incarnation of the name (a deletion we may never
                # have seen, e.g. across a lost watch): they must not serve the new one.
                self.replicas.on_topic(topic, self.log_config(topic))
                if self.clustered and self._is_controller():
                    # Kafka's controller elects at once when unclean.leader.election.enable is
                    # turned on for a topic with offline partitions, not at its next periodic pass.
                    await self._reconcile(topics={name})
        elif kind == "partition":
            topic = self.metadata.topics.get(change[1])
            index = int(change[2])
            if topic is not None and index < len(topic.partitions) and topic.partitions[index].replicas:
                hosted = self.replicas.apply(topic, index, self.log_config(topic), now)
                self.operations.partition_changed(topic.partitions[index])
                for shell in (self.groups, self.txns):
                    if topic.name == shell.topic:
                        shell.on_partition(index, hosted)
        elif kind == "broker-config":
            self.operations.apply_dynamic_configs()
            if self.clustered and self._is_controller():
                await self._reconcile()  # a cluster-wide unclean.leader.election.enable may now elect
        elif kind == "client-quota":
            self.server.client_quotas.update(self.metadata.client_quotas)
        elif kind == "controller" and self.metadata.controller_id == -1 and self.clustered:
            await self._campaign()
        elif kind == "broker" and self.clustered and self._is_controller():
            await self._reconcile()

    # --- diskless data ---------------------------------------------------------------------------

    def prefetch_objects(self, keys: set[str]) -> None:
        if self.wal_reader is not None:
            self.wal_reader.prefetch(keys)

    def prefetch_entries(self, entries: bytes) -> None:
        """Pointers just appended here: fetch their WAL objects so tail reads hit memory."""
        self.prefetch_objects({e.key for e in pointer.iter_entries(entries) if isinstance(e, pointer.PointerEntry)})

    async def batch_bytes(self, segment: LogSegment, location: BatchLocation) -> bytes:
        """One batch of a log, local or (for a pointers segment) from object storage."""
        raw = segment.read_batch(location)
        if segment.kind != POINTERS:
            return raw
        entry, _ = pointer.decode_entry(raw, 0)
        if isinstance(entry, pointer.InlineEntry):
            return entry.batch
        if self.wal_reader is None:
            raise RuntimeError("diskless storage is not configured")
        return (await self.wal_reader.batches([entry]))[0]

    def on_leader_append(self, partition: Partition) -> None:
        self.replicas.on_leader_append(partition)

    def on_follower_fetch(self, partition: Partition, follower: int, fetch_offset: int, log_start_offset: int) -> None:
        """A replica fetch of ``partition`` by ``follower`` at ``fetch_offset``, whose own log starts at
        ``log_start_offset`` (-1: Fetch < v5, which does not say)."""
        if partition.on_follower_fetch(follower, fetch_offset, self.now_ms(), log_start_offset):
            self.replicas.notify_append()
        self.replicas.notify_follower_fetch()
        # Only the fetching follower can rejoin, and only while it is a live broker: stale progress
        # of a dead follower must never put it back into the ISR (Kafka expands on a fetch, too).
        state = partition.leader_state
        if state is not None and state.may_rejoin(follower) and follower in self.metadata.brokers:
            self._propose_isr(partition, sorted({*state.isr, follower}))

    def _shrink_isrs(self) -> None:
        now = self.now_ms()
        shrunk: list[tuple[str, int, list[int]]] = []
        for partition in self.replicas.leading():
            assert partition.leader_state is not None
            lagging = partition.leader_state.isr_to_shrink(now, self.config.replica_lag_time_max_ms)
            if lagging:
                shrunk.append((partition.topic, partition.index, lagging))
                self._propose_isr(partition, [r for r in partition.isr if r not in lagging])
        if shrunk:
            # One line per pass: a pass can shrink thousands of partitions.
            log.info("shrinking ISR", partitions=len(shrunk), first=shrunk[:10])

    def _propose_isr(self, partition: Partition, isr: list[int]) -> None:
        """AlterPartition: CAS a new ISR into the store, once at a time per partition."""
        key = (partition.topic, partition.index)
        if key in self._isr_updates:
            return
        self._isr_updates.add(key)

        # The compare-and-swap is against the state this decision was made from, not whatever the
        # store holds when the request goes out: a stale proposal must lose to newer changes. The
        # metadata can be ahead of the replica (a resync loads it all, then applies it in slices):
        # only a replica at the metadata's leader epoch, of the same topic incarnation, proposes
        # (Kafka's controller refuses the others: FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION).
        current = self.metadata.partition(partition.topic, partition.index)
        meta = self.metadata.topics.get(partition.topic)
        if (
            current is None
            or meta is None
            or meta.topic_id != partition.topic_id
            or current.leader != self.node_id
            or current.leader_epoch != partition.leader_epoch
        ):
            self._isr_updates.discard(key)
            return
        expected = self.backend.revision_of(partition.topic, partition.index)
        state = PartitionState(partition.replicas, self.node_id, partition.leader_epoch, isr)
        if current is not None and current.replicas == partition.replicas:
            # A reassignment in progress stays in progress (cluster/reassignment.py).
            state.adding, state.removing = list(current.adding), list(current.removing)

        leader_state = partition.leader_state
        partition.propose_isr(isr)  # the HW waits for a joining replica from now on (KIP-497)

        async def propose() -> None:
            # Back to the committed ISR only when the proposal surely did not land (Kafka's
            # Partition.handleAlterPartitionError). An answer lost after etcd applied it leaves the
            # store with the new ISR: dropping the joining replica from the high watermark's count
            # then could acknowledge records the controller's next leader, from that ISR, lacks.
            # So an unknown outcome is asked again; a refusal after it means the revision moved
            # (perhaps by our own write), and the watch brings the outcome (apply_isr).
            # It is asked until the store answers, as Kafka's AlterPartitionManager does: giving up
            # after a few attempts left the maximal ISR pending with nothing to settle it when no
            # attempt had landed (no metadata change comes), so the high watermark waited for the
            # joining replica until the next ISR change, for good if that replica stopped fetching.
            # A later attempt either lands (the watch applies it) or is refused (the revision
            # moved; then ours can never land, and the watch brings whatever did).
            ok: bool | None = None
            ambiguous = False
            attempt = 0
            try:
                while partition.leader_state is leader_state and not self._stopping:
                    try:
                        async with self._isr_slots:
                            ok = await self.backend.update_partition(partition.topic, partition.index, state, expected)
                        break
                    except Exception as exc:
                        ambiguous = True
                        if attempt % ISR_PROPOSAL_LOG_EVERY == 0:
                            log.info(
                                "ISR proposal outcome unknown, asking again",
                                topic=partition.topic,
                                partition=partition.index,
                                attempt=attempt + 1,
                                error=str(exc),
                            )
                        attempt += 1
                        await asyncio.sleep(ISR_PROPOSAL_RETRY_S)
                if ok:
                    log.info("ISR changed", topic=partition.topic, partition=partition.index, isr=isr)
            finally:
                self._isr_updates.discard(key)
                if ok is False and not ambiguous and leader_state is not None:
                    partition.isr_proposal_failed(leader_state)

        task = asyncio.create_task(propose())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def apply_retention(self) -> int:
        deleted = 0
        now = self.now_ms()
        for key, partition in list(self.replicas.partitions.items()):
            try:
                deleted += partition.log.apply_retention(now)
            except OSError:
                log.exception("retention failed", partition=key)
        if deleted:
            RETENTION_DELETED_SEGMENTS.inc(deleted)
        return deleted

    def flush_dirty_logs(self) -> int:
        """fsync the logs whose last flush is older than their flush.ms (Kafka's
        LogManager.flushDirtyLogs); returns how many were flushed. On the event loop, as appends
        are: a flush must not race an append, a roll or a deletion of the same segment."""
        return self._over_logs(PartitionLog.flush_if_stale, "flush failed")

    def remove_retired_segments(self) -> int:
        """Remove the files of segments dropped (retention, DeleteRecords, truncation, tiering) at
        least file.delete.delay.ms ago; returns how many segments went."""
        return self._over_logs(PartitionLog.remove_retired_segments, "removing deleted segments failed")

    def _over_logs(self, step: Callable[[PartitionLog, int], int | bool], failure: str) -> int:
        """``step(log, now_ms)`` on every hosted log, summed; an I/O error is logged, the rest go on."""
        done = 0
        now = self.now_ms()
        for key, partition in list(self.replicas.partitions.items()):
            try:
                done += step(partition.log, now)
            except OSError:
                log.exception(failure, partition=key)
        return done

    # --- controller ----------------------------------------------------------------------------

    async def _campaign(self) -> None:
        if self._stopping:
            return
        if await self.backend.campaign(self.node_id):
            log.info("became controller", node_id=self.node_id)
            await self._reconcile()

    def _is_controller(self) -> bool:
        return self.metadata.controller_id == self.node_id and not self._stopping

    async def _controller_loop(self) -> None:
        """Periodic safety net: re-run elections in case a CAS lost a race with another writer."""
        while True:
            await asyncio.sleep(1.0)
            try:
                if self.metadata.controller_id == -1:
                    await self._campaign()
                elif self._is_controller():
                    await self._reconcile()
                    await self.operations.controller_pass()
            except Exception:
                log.exception("controller pass failed")

    def _unclean_election_enabled(self, topic: TopicMetadata) -> bool:
        """The topic's effective ``unclean.leader.election.enable``: its override, else the broker
        default, dynamic (cluster-wide, then this controller's own) over static."""
        return self.log_config(topic).unclean_leader_election_enable

    async def _reconcile(self, topics: Collection[str] | None = None) -> None:
        """Store the controller's elections for the live brokers (of ``topics`` only, if given)."""
        live = set(self.metadata.brokers)
        decided = [
            (change, self.backend.revision_of(change.topic, change.partition))
            for change in elect_on_broker_change(self.metadata, live, self._unclean_election_enabled, topics)
        ]
        for change, expected in decided:
            if not await self.backend.update_partition(change.topic, change.partition, change.state, expected):
                continue
            report, event = (
                (
                    log.warning,
                    "unclean leader election: an out-of-sync replica leads, records only the ISR had are lost",
                )
                if change.unclean
                else (log.info, "partition state changed by controller")
            )
            report(
                event,
                topic=change.topic,
                partition=change.partition,
                leader=change.state.leader,
                epoch=change.state.leader_epoch,
                isr=change.state.isr,
            )

    # --- admin operations ----------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        async with self._pid_lock:
            pid = self._pid_block.take()
            if pid is None:
                self._pid_block = await self.backend.reserve_producer_id_block()
                pid = self._pid_block.take()
                assert pid is not None
            return pid

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str | None],
        assignments: Sequence[Sequence[int]] = (),
        validate_only: bool = False,
        internal: bool = False,
    ) -> TopicMetadata:
        topic = self.metadata.create_topic(
            name,
            partitions,
            replication_factor,
            self._with_kind_pinned(configs),
            assignments,
            validate_only=True,
            internal=internal,
        )
        if validate_only:
            return topic
        if not await self.backend.create_topic(topic):
            raise MetadataError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        await self._wait_for(lambda: self._topic_applied(name, topic.topic_id), 10)
        log.info("topic created", topic=name, partitions=len(topic.partitions), configs=topic.configs)
        return self.metadata.topics[name]

    def _topic_applied(self, name: str, topic_id: str) -> bool:
        topic = self.metadata.topics.get(name)
        return topic is not None and topic.topic_id == topic_id and all(p.replicas for p in topic.partitions)

    async def delete_topic(self, name: str) -> TopicMetadata:
        topic = self.metadata.topics.get(name)
        if topic is None or not await self.backend.delete_topic(name):
            raise MetadataError(ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist.")
        await self._wait_for(lambda: name not in self.metadata.topics, 10)
        log.info("topic deleted", topic=name)
        return topic

    async def add_partitions(
        self, name: str, count: int, validate_only: bool, assignments: Sequence[Sequence[int]] | None = None
    ) -> None:
        new = self.metadata.plan_new_partitions(name, count, assignments)
        if validate_only:
            return
        current = self.metadata.topics[name]
        grown = TopicMetadata(
            current.name, current.topic_id, list(current.partitions), dict(current.configs), current.internal
        )
        grown.partitions.extend(state for _, state in sorted(new.items()))
        if not await self.backend.update_topic(grown, new):
            raise MetadataError(ErrorCode.invalid_partitions, "topic changed concurrently; retry")
        await self._wait_for(
            lambda: self._topic_applied(name, current.topic_id) and len(self.metadata.topics[name].partitions) >= count,
            10,
        )

    def _with_kind_pinned(self, configs: Mapping[str, str | None]) -> dict[str, str | None]:
        """``configs`` with ``diskless.enabled`` set, to this broker's default where not given.

        Whether a topic is diskless must not depend on which broker looks: each decides from the
        topic's configs or else from its own default (``log_config``), and brokers whose defaults
        differ (a per-broker setting, a rolling change) would treat one topic as both kinds, the
        representatives of some committing pointers while its leader appends records."""
        if any(canonical_name(key) == DISKLESS_ENABLED and value is not None for key, value in configs.items()):
            return dict(configs)
        default = effective_values({}, self.config.broker_value)[DISKLESS_ENABLED][0]
        pinned = {key: value for key, value in configs.items() if canonical_name(key) != DISKLESS_ENABLED}
        pinned[DISKLESS_ENABLED] = "true" if default else "false"
        return pinned

    async def alter_topic_configs(self, name: str, updates: Mapping[str, str | None], validate_only: bool) -> None:
        configs = self.metadata.plan_configs(name, updates)
        if DISKLESS_ENABLED not in configs:
            # Deleted: the kind becomes this broker's default, pinned as at creation.
            configs = self.metadata.plan_configs(name, self._with_kind_pinned(updates))
        if validate_only:
            return
        current = self.metadata.topics[name]
        changed = TopicMetadata(current.name, current.topic_id, list(current.partitions), configs, current.internal)
        if not await self.backend.update_topic(changed, {}):
            raise MetadataError(ErrorCode.invalid_config, "topic changed concurrently; retry")
        await self._wait_for(
            lambda: self.metadata.topics.get(name) is not None and self.metadata.topics[name].configs == configs, 10
        )
        self.replicas.update_config(name, self.log_config(self.metadata.topics[name]))
        log.info("topic configs altered", topic=name, configs=configs)

    def describe_broker_config(self) -> list[tuple[str, str, bool]]:
        """(name, value, explicitly set) for every broker property."""
        out: list[tuple[str, str, bool]] = []
        defaults = BrokerConfig()
        for f in fields(self.config):
            prop = f.metadata.get("property")
            if prop is None:
                continue
            value: Any = getattr(self.config, f.name)
            rendered = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            out.append((prop, rendered, value != getattr(defaults, f.name)))
        known = {name for name, _, _ in out}
        out.extend(
            (name, value, True) for name, value in sorted(self.config.topic_defaults.items()) if name not in known
        )
        return out

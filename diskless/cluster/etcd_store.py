"""Cluster metadata in etcd: broker leases, controller election, topics and partition states.

Layout under ``/diskless/<cluster.id>/``::

    brokers/<id>            broker endpoint and rack, attached to the broker's lease
    controller              {"node_id": n}, attached to the controller's lease
    topics/<name>           topic id, config overrides, every partition's replicas
    partitions/<name>/<p>   leader, leader epoch, ISR (and topic id), once it left its initial state
    producer-id-block       next free producer id block
    broker-configs/<id>     dynamic broker configs of one broker, ``default`` for the cluster's
    client-quotas/<entity>  client quotas of one entity (cluster/client_quotas.py: user, client id, defaults)
    broker-incarnations/<id> the incarnation of broker <id> that started last (no lease): an older
                            one may not register again

A topic is created by one put of one key, whatever its partition count: etcd refuses a
transaction of more than ``--max-txn-ops`` (128 by default) operations, and one key also makes the
creation atomic for readers. A partition without a key of its own is in its initial state (first
replica leads, all replicas in sync, epoch 0).

Every change is a compare-and-swap transaction, so concurrent writers (controller electing, leader
changing its ISR, brokers creating topics) never overwrite each other: on the key's absence
(creation), on the topic key's mod revision (configs, added partitions), and for partition states
on the partition key's mod revision or, while it has none, on its absence plus the creation
revision of the topic incarnation the change was decided for. Each broker keeps a local copy of
the whole prefix, loaded once and then kept current by a watch; ``on_change`` is told what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping

import aetcd
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from diskless.aio import cancel_and_wait
from diskless.metrics import METADATA_APPLY_ERRORS

from .client_quotas import Entity, encode_values, record_path
from .lease import LeaseFence
from .lease_keeper import LeaseKeeper
from .metadata import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    RecordKey,
    TopicMetadata,
    UnreadableRecord,
    apply_record,
    broker_from_record,
    broker_record,
    is_initial,
    partition_record,
    topic_record,
)
from .producer_ids import BLOCK_SIZE, ProducerIdBlock

log = structlog.get_logger(__name__)

ChangeCallback = Callable[[list[RecordKey]], Awaitable[None]]
# Changes handed to on_change between yields to the event loop. Small: applying one partition can
# take milliseconds of disk under load, and a lease refresh needs several loop turns to complete.
NOTIFY_SLICE = 16
# HTTP/2 pings on the etcd connection. The metadata watch is a stream the broker never sends on:
# after an etcd host reboot (or a NAT/firewall forgetting the connection) nothing ever resets it,
# and a broker that does not write to etcd itself would keep a silent watch for ever. A ping
# unanswered within the timeout (or reset by the rebooted host) fails the connection, so the watch
# errors and resynchronises (``_follow``). etcd refuses pings closer than 5 s apart
# (--grpc-keepalive-min-time): 6 s keeps clear of that; pings continue while no data flows.
GRPC_KEEPALIVE = {
    "grpc.keepalive_time_ms": 6000,
    "grpc.keepalive_timeout_ms": 4000,
    "grpc.http2.max_pings_without_data": 0,
}
_LOAD_ORDER = {
    "brokers": 0,
    "controller": 1,
    "wal-manager": 1,
    "broker-configs": 1,
    "client-quotas": 1,
    "topics": 2,
    "partitions": 3,
}


# Startup steps (loading, registering) wait out a busy etcd ("etcdserver: request timed out"
# while its disk is slow) for ~30 s, as a Kafka broker keeps asking the controller to register it;
# a broker that gave up at the first such answer exited before it had started.
STARTUP_ATTEMPTS = 20


def _retrying(attempts: int = 8) -> AsyncRetrying:
    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.05, max=2),
        retry=retry_if_exception_type(
            (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError)
        ),
        reraise=True,
    )


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _incarnation_of(record: bytes) -> str:
    """The incarnation a stored broker record names ("" if unreadable or from an older version)."""
    try:
        return broker_from_record(record).incarnation
    except (ValueError, TypeError, AttributeError):
        return ""


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Hand ``callback`` to ``loop`` from another thread; nothing to do once the loop has closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


class EtcdMetadataStore:
    def __init__(
        self,
        endpoint: str,
        cluster_id: str,
        metadata: ClusterMetadata,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        host, _, port = endpoint.replace("http://", "").rpartition(":")
        # etcd's own authentication (user, password), when it has it on; the keeper's separate
        # connection authenticates with them too (lease_keeper.py).
        self._credentials = credentials
        user, password = credentials if credentials is not None else (None, None)
        self.client = aetcd.Client(
            host=host or "127.0.0.1",
            port=int(port),
            timeout=10,
            username=user,
            password=password,
            options=GRPC_KEEPALIVE,
        )
        self._target = f"{host or '127.0.0.1'}:{int(port)}"  # the keepalive thread's own connection
        self.prefix = f"/diskless/{cluster_id}/"
        self.metadata = metadata
        self.revisions: dict[str, int] = {}
        self.created: dict[str, int] = {}  # topic path -> create revision of its incarnation
        self._lease: aetcd.leases.Lease | None = None
        self._keeper: LeaseKeeper | None = None  # refreshes the lease from its own thread
        self._reregistering: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.on_change: ChangeCallback | None = None
        self._registration: tuple[BrokerInfo, int] = (BrokerInfo(-1, "", 0), 1)
        self.fence: LeaseFence | None = None  # brokers: whether our lease may have expired (lease.py)
        # Told once when another incarnation of our node id registered (we must stop, see lease.py).
        self.on_superseded: Callable[[], None] | None = None
        self._registered_revision: int | None = None  # etcd revision of our latest registration put

    def _key(self, path: str) -> bytes:
        return (self.prefix + path).encode()

    # --- lifecycle ------------------------------------------------------------------------------

    async def connect(self) -> None:
        async for attempt in _retrying():
            with attempt:
                await self.client.connect()
                await self.client.status()

    async def close(self) -> None:
        await self._stop_keeper()
        await cancel_and_wait(self._reregistering, self._watch_task)
        with contextlib.suppress(Exception):
            await self.client.close()

    async def load_and_watch(self) -> None:
        """Read the whole prefix, apply it, then follow changes from the next revision."""
        revision = await self._load()
        self._watch_task = asyncio.create_task(self._follow(revision + 1))

    async def _load(self) -> int:
        """Replace the local copy with the stored state; returns the revision it was read at."""
        async for attempt in _retrying(STARTUP_ATTEMPTS):
            with attempt:
                result = await self.client.get_prefix(self.prefix.encode())
        records = []
        for kv in result:
            path = kv.key.decode()[len(self.prefix) :]
            records.append((path, kv.value, kv.mod_revision, kv.create_revision))
        records.sort(key=lambda r: (_LOAD_ORDER.get(r[0].split("/")[0], 9), r[0]))
        self.metadata.brokers.clear()
        self.metadata.topics.clear()
        self.metadata.controller_id = -1
        self.metadata.wal_manager = None
        self.metadata.broker_configs.clear()
        self.metadata.client_quotas.clear()
        self.revisions.clear()
        self.created.clear()
        for path, value, revision, created in records:
            self.revisions[path] = revision
            if path.startswith("topics/"):
                self.created[path] = created
            self._apply(path, value)
        self._check_registration()
        return int(result.header.revision)

    def _apply(self, path: str, value: bytes | None) -> list[RecordKey]:
        """Apply one record; one this broker cannot read is logged and counted, and the others are
        applied (KRaft brokers count such records the same way and go on). Raised, it would stop a
        load half-way, with the brokers and topics already cleared."""
        try:
            return apply_record(self.metadata, path, value)
        except UnreadableRecord as exc:
            log.error("metadata record not applied", path=path, error=str(exc))
            METADATA_APPLY_ERRORS.labels("read").inc()
            return []

    async def _resync(self) -> tuple[int, list[RecordKey]]:
        """After a lost watch: reload everything and report every key as changed."""
        before = set(self.metadata.topics)
        revision = await self._load()
        changes: list[RecordKey] = [("topic", name) for name in before - set(self.metadata.topics)]
        changes += [("broker", str(b)) for b in self.metadata.brokers] + [("controller",)]
        changes.append(("broker-config", "*"))  # dynamic broker configs are laid over again whole
        changes.append(("client-quota",))
        for topic in self.metadata.topics.values():
            changes.append(("topic", topic.name))
            changes += [("partition", topic.name, str(i)) for i in range(len(topic.partitions))]
        return revision, changes

    async def _follow(self, start_revision: int) -> None:
        while True:
            try:
                watch = await self.client.watch_prefix(self.prefix.encode(), start_revision=start_revision)
                async for event in watch:
                    start_revision = event.kv.mod_revision + 1
                    await self._on_event(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("metadata watch lost; resynchronising", error=str(exc))
                await asyncio.sleep(0.5)
                try:
                    revision, changes = await self._resync()
                except Exception as resync_error:
                    log.warning("metadata resync failed", error=str(resync_error))
                    continue
                start_revision = revision + 1
                await self._notify(changes)
                if self.fence is not None:
                    self.fence.on_metadata_revision(revision)

    async def _on_event(self, event: object) -> None:
        kv = event.kv  # type: ignore[attr-defined]
        path = kv.key.decode()[len(self.prefix) :]
        deleted = event.kind == "DELETE"  # type: ignore[attr-defined]
        if deleted:
            self.revisions.pop(path, None)
            self.created.pop(path, None)
        else:
            self.revisions[path] = kv.mod_revision
            if path.startswith("topics/"):
                self.created[path] = kv.create_revision
        changed = self._apply(path, None if deleted else kv.value)
        if path.startswith("brokers/"):
            self._check_registration()
        if changed:
            await self._notify(changed)
        if self.fence is not None:
            self.fence.on_metadata_revision(kv.mod_revision)

    async def _notify(self, changes: list[RecordKey]) -> None:
        """Tell ``on_change`` in slices, yielding between them: applying a topic of thousands of
        partitions (logs to create, fetchers to move) must not starve the lease keepalive and
        the requests being served for seconds."""
        if self.on_change is None or not changes:
            return
        for start in range(0, len(changes), NOTIFY_SLICE):
            part = changes[start : start + NOTIFY_SLICE]
            try:
                await self.on_change(part)
            except Exception:
                log.exception("metadata change handler failed", changes=part[:20], count=len(part))
            if start + NOTIFY_SLICE < len(changes):
                await asyncio.sleep(0)

    # --- brokers and controller -------------------------------------------------------------

    async def register_broker(self, info: BrokerInfo, ttl_seconds: int) -> None:
        """Register under a fresh lease. A previous incarnation's key (a restart faster than the
        lease TTL) is revoked first, so the controller sees the restart and fences the old one."""
        self._registration = (info, ttl_seconds)
        if self.fence is None:
            self.fence = LeaseFence(ttl_seconds * 1000)
        # Each step may be repeated: a lease granted by an attempt that failed later expires unused.
        async for attempt in _retrying(STARTUP_ATTEMPTS):
            with attempt:
                await self._register_once(info, ttl_seconds)
        if self._keeper is None:
            # Keepalives on their own thread and connection: a busy event loop cannot lose the lease
            # (lease_keeper.py). The fence stops leader duties once none succeeded for the TTL.
            loop = asyncio.get_running_loop()
            self._keeper = LeaseKeeper(
                self._target,
                self.fence,
                max(ttl_seconds / 3, 0.2),
                on_expired=lambda: _call_soon(loop, self._register_again),
                credentials=self._credentials,
            )
            assert self._lease is not None
            self._keeper.keep(int(self._lease.id))
            self._keeper.start()

    async def _register_once(self, info: BrokerInfo, ttl_seconds: int) -> None:
        key = self._key(f"brokers/{info.node_id}")
        previous = await self.client.get(key)
        if previous is not None and previous.lease:
            with contextlib.suppress(Exception):
                await self.client.revoke_lease(previous.lease)
        # We are now the incarnation that started last: a stale copy of this node id may not
        # register again (``_claim_registration``).
        await self.client.put(self._key(f"broker-incarnations/{info.node_id}"), info.incarnation.encode())
        await self._grant_and_put(info, ttl_seconds)

    async def _grant_and_put(self, info: BrokerInfo, ttl_seconds: int, *, again: bool = False) -> None:
        """A new lease and our broker key under it; the fence learns when the lease started.

        ``again``: our lease expired and we register once more, only if no other incarnation of
        our node id holds the key meanwhile (then we were superseded and stop instead)."""
        sent = _monotonic_ms()
        self._lease = await self.client.lease(ttl_seconds)
        if again:
            revision = await self._claim_registration(info, self._lease)
            if revision is None:
                with contextlib.suppress(Exception):
                    await self._lease.revoke()
                self._superseded(info)
                return
        else:
            put = await self.client.put(self._key(f"brokers/{info.node_id}"), broker_record(info), lease=self._lease)
            revision = int(put.header.revision)
        assert self.fence is not None
        self.fence.on_registered(sent, revision)
        self._registered_revision = revision
        if self._keeper is not None:
            self._keeper.keep(int(self._lease.id))
        self._check_registration()  # the watch may have shown a newer incarnation's put already

    async def _claim_registration(self, info: BrokerInfo, lease: object) -> int | None:
        """Put our broker key under ``lease`` if we are still the incarnation of our node id that
        started last; the put's revision, or None if a later one started (we are superseded). The
        latest incarnation is kept in a key without a lease, so a stale copy stays out even after
        the later incarnation's own lease expired: it would lead with an old log at the later
        incarnation's leader epochs."""
        key = self._key(f"brokers/{info.node_id}")
        latest = self._key(f"broker-incarnations/{info.node_id}")
        tx = self.client.transactions
        won, _ = await self.client.transaction(
            compare=[tx.value(latest) == info.incarnation.encode()],
            success=[tx.put(key, broker_record(info), lease=lease)],
            failure=[],
        )
        if not won:
            return None
        after = await self.client.get(key)
        if after is None or _incarnation_of(after.value) != info.incarnation:
            return None  # a later incarnation registered right after our put
        return int(after.mod_revision)

    def _superseded(self, info: BrokerInfo) -> None:
        """Another incarnation of our node id registered: fence for good and tell the broker."""
        if self.fence is None or self.fence.superseded:
            return
        log.error(
            "another incarnation of this node id registered; this process stops acting as the broker",
            node_id=info.node_id,
            incarnation=info.incarnation,
        )
        self.fence.on_superseded()
        if self._keeper is not None:
            self._keeper.forget()
        if self.on_superseded is not None:
            self.on_superseded()

    def _check_registration(self) -> None:
        """Whether the metadata shows our node id registered by another incarnation *after* our
        own registration. An earlier one (a stale copy's put that ours overwrote, still on its way
        through the watch) is not: the incarnation registered last wins."""
        info = self._registration[0]
        ours = self._registered_revision
        if not info.incarnation or ours is None:
            return
        holder = self.metadata.brokers.get(info.node_id)
        held_since = self.revisions.get(f"brokers/{info.node_id}", -1)
        if holder is not None and holder.incarnation not in ("", info.incarnation) and held_since > ours:
            self._superseded(info)

    def _register_again(self) -> None:
        """The keeper saw our lease expire: register under a new one (on the event loop)."""
        if self._reregistering is not None and not self._reregistering.done():
            return
        if self.fence is not None and self.fence.superseded:
            return
        expired = int(self._lease.id) if self._lease is not None else -1

        async def register() -> None:
            try:
                await self._grant_and_put(*self._registration, again=True)
            except Exception as exc:
                log.warning("registering again failed", error=str(exc) or type(exc).__name__)
                if self._keeper is not None:
                    self._keeper.registration_failed(expired)  # the next refresh reports it again

        self._reregistering = asyncio.create_task(register())

    async def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.forget()
            await asyncio.to_thread(keeper.stop)

    async def deregister_broker(self, node_id: int) -> None:
        """Controlled shutdown: drop our lease so the controller moves leadership away now."""
        await self._stop_keeper()
        if self._lease is not None:
            with contextlib.suppress(Exception):
                await self._lease.revoke()

    async def campaign(self, node_id: int) -> bool:
        """Try to become controller; True if we hold the controller key (under our lease)."""
        assert self._lease is not None
        key = self._key("controller")
        tx = self.client.transactions
        won, _ = await self.client.transaction(
            compare=[tx.version(key) == 0],
            success=[tx.put(key, json.dumps({"node_id": node_id}).encode(), lease=self._lease)],
            failure=[],
        )
        return bool(won) or self.metadata.controller_id == node_id

    # --- topics and partitions -----------------------------------------------------------------

    async def create_topic(self, topic: TopicMetadata) -> bool:
        key = self._key(f"topics/{topic.name}")
        tx = self.client.transactions
        ops = [tx.put(key, topic_record(topic))]
        ops += self._non_initial(topic, dict(enumerate(topic.partitions)))
        created, _ = await self.client.transaction(compare=[tx.version(key) == 0], success=ops, failure=[])
        return bool(created)

    def _non_initial(self, topic: TopicMetadata, states: dict[int, PartitionState]) -> list[object]:
        """Puts for new partitions whose state is not the one the topic record implies (none for
        topics created by assignment; kept so that no state is ever silently replaced)."""
        tx = self.client.transactions
        return [
            tx.put(self._key(f"partitions/{topic.name}/{i}"), partition_record(p, topic.topic_id))
            for i, p in states.items()
            if not is_initial(p)
        ]

    async def delete_topic(self, name: str) -> bool:
        key = self._key(f"topics/{name}")
        tx = self.client.transactions
        prefix = self._key(f"partitions/{name}/")
        range_end = prefix[:-1] + bytes([prefix[-1] + 1])
        deleted, _ = await self.client.transaction(
            compare=[tx.version(key) > 0],
            success=[tx.delete(key), tx.delete(prefix, range_end)],
            failure=[],
        )
        return bool(deleted)

    async def update_topic(self, topic: TopicMetadata, new_partitions: dict[int, PartitionState]) -> bool:
        """CAS the topic record (configs, partition count) and add partition records."""
        path = f"topics/{topic.name}"
        key = self._key(path)
        tx = self.client.transactions
        ops = [tx.put(key, topic_record(topic))]
        ops += self._non_initial(topic, new_partitions)
        ok, _ = await self.client.transaction(
            compare=[tx.mod(key) == self.revisions.get(path, 0)], success=ops, failure=[]
        )
        return bool(ok)

    def revision_of(self, topic: str, partition: int) -> int:
        """The revision of a partition's state as we last saw it (what a CAS must compare to).

        Positive: the mod revision of the partition's own key. Otherwise the partition is still
        in its initial state and this is minus the creation revision of the topic incarnation,
        so that a change decided for a deleted topic never lands on a re-created one."""
        revision = self.revisions.get(f"partitions/{topic}/{partition}", 0)
        return revision if revision > 0 else -self.created.get(f"topics/{topic}", 0)

    async def update_partition(
        self, topic: str, partition: int, state: PartitionState, expected_revision: int | None = None
    ) -> bool:
        """CAS one partition state against the revision its change was decided on (AlterPartition)."""
        path = f"partitions/{topic}/{partition}"
        key = self._key(path)
        meta = self.metadata.topics.get(topic)
        if meta is None:
            return False
        tx = self.client.transactions
        expected = self.revision_of(topic, partition) if expected_revision is None else expected_revision
        if expected > 0:
            compare = [tx.mod(key) == expected]
        else:
            compare = [tx.version(key) == 0, tx.create(self._key(f"topics/{topic}")) == -expected]
        ok, _ = await self.client.transaction(
            compare=compare,
            success=[tx.put(key, partition_record(state, meta.topic_id))],
            failure=[],
        )
        return bool(ok)

    async def update_broker_configs(self, name: str, configs: dict[str, str]) -> bool:
        """CAS the dynamic configs of broker ``name`` ("default": cluster-wide) against the revision
        we last saw; an empty set deletes the key."""
        return await self._replace({f"broker-configs/{name}": json.dumps(configs).encode() if configs else None})

    async def update_client_quotas(self, changes: Mapping[Entity, dict[str, float]]) -> bool:
        """CAS the quotas of every entity named (empty: deleted) in one transaction, as Kafka applies
        one AlterClientQuotas atomically."""
        return await self._replace(
            {record_path(e): encode_values(values) if values else None for e, values in changes.items()}
        )

    async def _replace(self, values: Mapping[str, bytes | None]) -> bool:
        """Put (None: delete) keys, each compared against the revision we last saw of it."""
        tx = self.client.transactions
        compare, success = [], []
        for path, value in values.items():
            key = self._key(path)
            revision = self.revisions.get(path, 0)
            compare.append(tx.mod(key) == revision if revision > 0 else tx.version(key) == 0)
            success.append(tx.put(key, value) if value is not None else tx.delete(key))
        ok, _ = await self.client.transaction(compare=compare, success=success, failure=[])
        return bool(ok)

    async def reserve_producer_id_block(self) -> ProducerIdBlock:
        key = self._key("producer-id-block")
        tx = self.client.transactions
        for _ in range(20):
            current = await self.client.get(key)
            start = int(current.value) if current is not None else 0
            compare = [tx.mod(key) == current.mod_revision] if current is not None else [tx.version(key) == 0]
            ok, _ = await self.client.transaction(
                compare=compare, success=[tx.put(key, str(start + BLOCK_SIZE).encode())], failure=[]
            )
            if ok:
                return ProducerIdBlock(start, BLOCK_SIZE)
        raise RuntimeError("could not reserve a producer id block")

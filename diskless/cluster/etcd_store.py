"""Cluster metadata in etcd: broker leases, controller election, topics and partition states.

Layout under ``/diskless/<cluster.id>/``::

    brokers/<id>            broker endpoint and rack, attached to the broker's lease
    controller              {"node_id": n}, attached to the controller's lease
    topics/<name>           topic id, config overrides, partition count
    partitions/<name>/<p>   replicas, leader, leader epoch, ISR
    producer-id-block       next free producer id block

Every change is a compare-and-swap transaction on the key's mod revision (partition states) or
its absence (creation), so concurrent writers (controller electing, leader changing its ISR,
brokers creating topics) never overwrite each other. Each broker keeps a local copy of the whole
prefix, loaded once and then kept current by a watch; ``on_change`` is told what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

import aetcd
import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from diskless.aio import cancel_and_wait

from .metadata import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    RecordKey,
    TopicMetadata,
    apply_record,
    broker_record,
    partition_record,
    topic_record,
)
from .producer_ids import BLOCK_SIZE, ProducerIdBlock

log = structlog.get_logger(__name__)

ChangeCallback = Callable[[list[RecordKey]], Awaitable[None]]
_LOAD_ORDER = {"brokers": 0, "controller": 1, "wal-manager": 1, "topics": 2, "partitions": 3}


def _retrying() -> AsyncRetrying:
    return AsyncRetrying(
        stop=stop_after_attempt(8),
        wait=wait_exponential(multiplier=0.05, max=2),
        retry=retry_if_exception_type(
            (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError)
        ),
        reraise=True,
    )


class EtcdMetadataStore:
    def __init__(self, endpoint: str, cluster_id: str, metadata: ClusterMetadata) -> None:
        host, _, port = endpoint.replace("http://", "").rpartition(":")
        self.client = aetcd.Client(host=host or "127.0.0.1", port=int(port), timeout=10)
        self.prefix = f"/diskless/{cluster_id}/"
        self.metadata = metadata
        self.revisions: dict[str, int] = {}
        self._lease: aetcd.leases.Lease | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.on_change: ChangeCallback | None = None
        self._registration: tuple[BrokerInfo, int] = (BrokerInfo(-1, "", 0), 1)

    def _key(self, path: str) -> bytes:
        return (self.prefix + path).encode()

    # --- lifecycle ------------------------------------------------------------------------------

    async def connect(self) -> None:
        async for attempt in _retrying():
            with attempt:
                await self.client.connect()
                await self.client.status()

    async def close(self) -> None:
        await cancel_and_wait(self._keepalive, self._watch_task)
        with contextlib.suppress(Exception):
            await self.client.close()

    async def load_and_watch(self) -> None:
        """Read the whole prefix, apply it, then follow changes from the next revision."""
        revision = await self._load()
        self._watch_task = asyncio.create_task(self._follow(revision + 1))

    async def _load(self) -> int:
        """Replace the local copy with the stored state; returns the revision it was read at."""
        result = await self.client.get_prefix(self.prefix.encode())
        records = []
        for kv in result:
            path = kv.key.decode()[len(self.prefix) :]
            records.append((path, kv.value, kv.mod_revision))
        records.sort(key=lambda r: (_LOAD_ORDER.get(r[0].split("/")[0], 9), r[0]))
        self.metadata.brokers.clear()
        self.metadata.topics.clear()
        self.metadata.controller_id = -1
        self.metadata.wal_manager = None
        self.revisions.clear()
        for path, value, revision in records:
            self.revisions[path] = revision
            apply_record(self.metadata, path, value)
        return int(result.header.revision)

    async def _resync(self) -> tuple[int, list[RecordKey]]:
        """After a lost watch: reload everything and report every key as changed."""
        before = set(self.metadata.topics)
        revision = await self._load()
        changes: list[RecordKey] = [("topic", name) for name in before - set(self.metadata.topics)]
        changes += [("broker", str(b)) for b in self.metadata.brokers] + [("controller",)]
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

    async def _on_event(self, event: object) -> None:
        kv = event.kv  # type: ignore[attr-defined]
        path = kv.key.decode()[len(self.prefix) :]
        deleted = event.kind == "DELETE"  # type: ignore[attr-defined]
        if deleted:
            self.revisions.pop(path, None)
        else:
            self.revisions[path] = kv.mod_revision
        changed = apply_record(self.metadata, path, None if deleted else kv.value)
        if changed is not None:
            await self._notify([changed])

    async def _notify(self, changes: list[RecordKey]) -> None:
        if self.on_change is None or not changes:
            return
        try:
            await self.on_change(changes)
        except Exception:
            log.exception("metadata change handler failed", changes=changes)

    # --- brokers and controller -------------------------------------------------------------

    async def register_broker(self, info: BrokerInfo, ttl_seconds: int) -> None:
        """Register under a fresh lease. A previous incarnation's key (a restart faster than the
        lease TTL) is revoked first, so the controller sees the restart and fences the old one."""
        key = self._key(f"brokers/{info.node_id}")
        previous = await self.client.get(key)
        if previous is not None and previous.lease:
            with contextlib.suppress(Exception):
                await self.client.revoke_lease(previous.lease)
        self._registration = (info, ttl_seconds)
        self._lease = await self.client.lease(ttl_seconds)
        await self.client.put(key, broker_record(info), lease=self._lease)
        if self._keepalive is None:
            self._keepalive = asyncio.create_task(self._keep_alive(max(ttl_seconds / 3, 0.2)))

    async def _keep_alive(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                assert self._lease is not None
                reply = await self._lease.refresh()
                if reply is not None and getattr(reply, "TTL", 1) <= 0:
                    # Fenced (e.g. a long pause): come back as a new incarnation.
                    log.error("broker lease expired; registering again")
                    info, ttl = self._registration
                    self._lease = await self.client.lease(ttl)
                    await self.client.put(self._key(f"brokers/{info.node_id}"), broker_record(info), lease=self._lease)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("lease refresh failed", error=str(exc))

    async def deregister_broker(self, node_id: int) -> None:
        """Controlled shutdown: drop our lease so the controller moves leadership away now."""
        if self._keepalive is not None:
            self._keepalive.cancel()
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
        ops += [
            tx.put(self._key(f"partitions/{topic.name}/{i}"), partition_record(p))
            for i, p in enumerate(topic.partitions)
        ]
        created, _ = await self.client.transaction(compare=[tx.version(key) == 0], success=ops, failure=[])
        return bool(created)

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
        ops += [
            tx.put(self._key(f"partitions/{topic.name}/{i}"), partition_record(p)) for i, p in new_partitions.items()
        ]
        ok, _ = await self.client.transaction(
            compare=[tx.mod(key) == self.revisions.get(path, 0)], success=ops, failure=[]
        )
        return bool(ok)

    def revision_of(self, topic: str, partition: int) -> int:
        """The revision of a partition's state as we last saw it (what a CAS must compare to)."""
        return self.revisions.get(f"partitions/{topic}/{partition}", 0)

    async def update_partition(
        self, topic: str, partition: int, state: PartitionState, expected_revision: int | None = None
    ) -> bool:
        """CAS one partition state against the revision its change was decided on (AlterPartition)."""
        path = f"partitions/{topic}/{partition}"
        key = self._key(path)
        tx = self.client.transactions
        expected = self.revisions.get(path, 0) if expected_revision is None else expected_revision
        ok, _ = await self.client.transaction(
            compare=[tx.mod(key) == expected],
            success=[tx.put(key, partition_record(state))],
            failure=[],
        )
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

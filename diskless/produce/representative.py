"""The diskless produce representative: any broker accepting Produce for diskless partitions.

Batches of many partitions are buffered (``WalBuffer``) and flushed as one WAL object: one PUT,
then one CommitBatches RPC per leader broker (a direct call when the leader is this broker). A
producer is answered only after its batch's pointer is appended by the leader (and replicated,
for acks=all): data is in object storage before any pointer to it exists (safety rule 1).

Ordering (safety rule 2): flushes are numbered; a flush sends its commits only after every
earlier flush has sent its own, and commits to one leader share one connection whose requests
the leader starts in order, so a partition's commits are applied in arrival order even when
uploads finish out of order. Retries after a leadership move are ordered the same way. A failed
upload leaves no pointer and fails its batches with a retriable error; the uploaded-but-never-
committed object is garbage for the WAL file manager.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.metrics import DISKLESS_COMMIT_RPCS, DISKLESS_FLUSH_SECONDS, DISKLESS_WAL_OBJECT_BYTES
from diskless.protocol import internal
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.storage.object_store import ObjectStore
from diskless.storage.wal_format import WalObjectWriter, wal_object_key

from .wal_buffer import BufferedBatch, CommitOrder, WalBuffer

if TYPE_CHECKING:
    from diskless.broker.broker import Broker

log = structlog.get_logger(__name__)

RETRIABLE_LEADERSHIP = {
    int(ErrorCode.not_leader_or_follower),
    int(ErrorCode.leader_not_available),
    int(ErrorCode.fenced_leader_epoch),
    int(ErrorCode.unknown_leader_epoch),
}
LEADERSHIP_RETRY_S = 10.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Ordered:
    """An asyncio gate over ``CommitOrder``: run sections strictly in flush order."""

    def __init__(self) -> None:
        self.order = CommitOrder()
        self.changed = asyncio.Condition()

    async def wait_turn(self, sequence: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.order.may_commit(sequence))

    async def done(self, sequence: int) -> None:
        async with self.changed:
            self.order.finished(sequence)
            self.changed.notify_all()


class Representative:
    def __init__(self, broker: Broker, store: ObjectStore, on_uploaded: Callable[[str, bytes], None]) -> None:
        config = broker.config
        self.broker = broker
        self.store = store
        self.on_uploaded = on_uploaded  # lets the broker cache what it just wrote
        self.buffer = WalBuffer(config.diskless_wal_linger_ms, config.diskless_wal_max_bytes)
        self.az = config.broker_rack or "none"
        self._send_order = _Ordered()
        self._retry_order = _Ordered()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._manager_conn: KafkaClientConnection | None = None
        self.stats = {"flushes": 0, "puts": 0, "commit_rpcs": 0, "objects": 0}

    # --- accepting batches ------------------------------------------------------------------

    def submit(
        self, topic: str, topic_id: str, partition: int, batch: bytes, acks: int
    ) -> asyncio.Future[dict[str, Any]]:
        """Buffer one validated batch; the future resolves to {error_code, base_offset, ...}."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        full = self.buffer.add(BufferedBatch(topic, topic_id, partition, batch, (future, acks)), _now_ms())
        if full:
            self._flush_now()
        elif self._timer is None:
            deadline = self.buffer.deadline_ms()
            assert deadline is not None
            delay = max(0.0, (deadline - _now_ms()) / 1000)
            self._timer = asyncio.get_running_loop().call_later(delay, self._flush_now)
        return future

    def _flush_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        flush = self.buffer.drain()
        if flush is None:
            return
        task = asyncio.create_task(self._flush(flush.sequence, flush.batches))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._flush_now()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._manager_conn is not None:
            await self._manager_conn.close()

    # --- one flush ----------------------------------------------------------------------------

    async def _flush(self, sequence: int, batches: list[BufferedBatch]) -> None:
        started = time.monotonic()
        created = _now_ms()
        key = wal_object_key(created, self.az, self.broker.node_id)
        uploaded = False
        size = 0
        refs: list[Any] = []
        try:
            writer = WalObjectWriter()
            for item in batches:
                writer.add(uuid.UUID(item.topic_id), item.partition, item.data)
            finished = writer.finish(created, self.broker.node_id, self.az)
            refs = finished.refs
            size = len(finished.data)
            await self.store.put(key, finished.data)
            self.stats["puts"] += 1
            self.stats["objects"] += 1
            DISKLESS_WAL_OBJECT_BYTES.observe(len(finished.data))
            uploaded = True
            self.on_uploaded(key, finished.data)
        except Exception as exc:
            log.warning("WAL object upload failed", key=key, error=str(exc))
        retry: list[int] = []
        await self._send_order.wait_turn(sequence)
        try:
            if uploaded:
                retry = await self._commit_all(key, created, batches, refs, list(range(len(batches))), sequence)
            else:
                for item in batches:
                    _resolve(item, {"error_code": int(ErrorCode.kafka_storage_error)})
        finally:
            await self._send_order.done(sequence)
        await self._retry_order.wait_turn(sequence)
        try:
            deadline = time.monotonic() + LEADERSHIP_RETRY_S
            while retry and time.monotonic() < deadline:
                await self.broker.metadata_changed(0.5)
                await self.connect_leaders()
                retry = await self._commit_all(key, created, batches, refs, retry, sequence, retrying=True)
            for index in retry:
                _resolve(batches[index], {"error_code": int(ErrorCode.not_leader_or_follower)})
        finally:
            await self._retry_order.done(sequence)
        self.stats["flushes"] += 1
        DISKLESS_FLUSH_SECONDS.observe(time.monotonic() - started)
        if uploaded:
            partitions = sorted({(item.topic_id, item.partition) for item in batches})
            self._notify_manager({"key": key, "size": size, "partitions": [list(p) for p in partitions]})

    def _notify_manager(self, notice: dict[str, Any]) -> None:
        """Tell the WAL file manager about the object now, so it need not wait for a scan. Best
        effort: a lost notice only delays cleanup until the next scan finds the object."""
        address = self.broker.metadata.wal_manager
        if address is None:
            return

        async def send() -> None:
            conn = self._manager_conn
            if conn is None or not conn.connected or (conn.host, conn.port) != address:
                if conn is not None:
                    await conn.close()
                conn = KafkaClientConnection(
                    address[0], address[1], internal.broker_client_id(self.broker.node_id, "notice")
                )
                await conn.connect(timeout=2)
                self._manager_conn = conn
            await conn.wait(conn.send_internal(internal.INTERNAL_WAL_NOTICE, notice), timeout=5)

        task = asyncio.create_task(send())
        self._tasks.add(task)
        task.add_done_callback(lambda t: (self._tasks.discard(t), t.cancelled() or t.exception()))

    async def _commit_all(
        self,
        key: str,
        created: int,
        batches: list[BufferedBatch],
        refs: list[Any],
        indexes: list[int],
        sequence: int,
        retrying: bool = False,
    ) -> list[int]:
        """Send one commit per leader for ``indexes``; returns indexes to retry after a leader move."""
        by_leader: dict[int, list[int]] = {}
        retry: list[int] = []
        for index in indexes:
            item = batches[index]
            # Routed by topic id: a batch accepted for a topic since deleted (perhaps re-created
            # under its name) fails, and never goes to the new incarnation's leader.
            state = self.broker.metadata.partition_by_id(item.topic_id, item.partition)
            if state is None:
                _resolve(item, {"error_code": int(ErrorCode.unknown_topic_or_partition)})
            elif state.leader < 0:
                retry.append(index)
            else:
                by_leader.setdefault(state.leader, []).append(index)
        waits: list[tuple[list[int], Awaitable[dict[str, Any]]]] = []
        for leader, members in by_leader.items():
            body = {
                "key": key,
                "created_ms": created,
                "entries": [
                    {
                        "topic": batches[i].topic,
                        "topic_id": batches[i].topic_id,
                        "partition": batches[i].partition,
                        "header": batches[i].data[:61],
                        "position": refs[i].offset,
                        "acks": batches[i].token[1],
                    }
                    for i in members
                ],
            }
            self.stats["commit_rpcs"] += 1
            DISKLESS_COMMIT_RPCS.labels("local" if leader == self.broker.node_id else "remote").inc()
            try:
                waits.append((members, self._send_commit(leader, body)))
            except (ClientError, OSError) as exc:
                log.info("commit send failed", leader=leader, error=str(exc))
                retry.extend(members)
        for members, pending in waits:
            try:
                response = await pending
            except (ClientError, OSError, TimeoutError) as exc:
                log.info("commit failed", error=str(exc))
                retry.extend(members)
                continue
            for index, result in zip(members, response["results"], strict=True):
                if result["error_code"] in RETRIABLE_LEADERSHIP:
                    retry.append(index)
                else:
                    _resolve(batches[index], result)
        return sorted(retry)

    def _send_commit(self, leader: int, body: dict[str, Any]) -> Awaitable[dict[str, Any]]:
        """Start a commit now (appends happen in call order); returns what to await for the answer."""
        if leader == self.broker.node_id:
            return self.broker.apis.diskless.commit_batches_now(body)
        conn = self.broker.peers.connected(leader)
        if conn is None:
            raise ClientError(f"no connection to leader {leader}")
        future = conn.send_internal(internal.INTERNAL_COMMIT_BATCHES, body)
        return conn.wait(future, timeout=60)

    async def connect_leaders(self) -> None:
        """Keep a connection to every other broker (commits must not wait for a TCP handshake)."""
        await self.broker.peers.connect_all(list(self.broker.metadata.brokers))


def _resolve(item: BufferedBatch, result: dict[str, Any]) -> None:
    future = item.token[0]
    if not future.done():
        future.set_result(result)

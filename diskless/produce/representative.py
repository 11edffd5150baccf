"""The diskless produce representative: any broker accepting Produce for diskless partitions.

Batches of many partitions are buffered (``WalBuffer``) and flushed as one WAL object: one PUT,
then CommitBatches to each partition's leader (a direct call when the leader is this broker). A
producer is answered only after its batch's pointer is appended by the leader (and replicated,
for acks=all): data is in object storage before any pointer to it exists (safety rule 1).

This module is the asyncio shell. It sees its broker only through ``RepresentativeHost``
(``host.py``: config, cluster metadata, peer connections, this broker's own leaders); the
decisions live in sans-IO pieces:
- ``WalBuffer`` (when to flush) and ``Admission`` (``diskless.produce.buffer.max.bytes``: batches
  buffered plus batches without an ordering outcome; beyond it new batches wait their turn, so
  producers are answered later, never queued without bound in the pipeline);
- ``CommitPipeline`` (which commit may be sent when, what a producer is told on failure; its
  docstring holds the ordering rules R1-R5 and why per-partition order holds).

Safety argument of the shell. (1) Every send the pipeline returns is started before the shell
yields, in the returned order: a local commit is a synchronous call that appends before it
returns, a remote one is written to that leader's connection, whose requests the leader starts
in order (``server.py``). So the leader starts a partition's commits in the pipeline's order.
(2) Every started commit reports back exactly once: an answer (``answered``) or, for any
exception, timeout or lost connection, ``lost`` (outcome unknown: sent again in order, a leader
that applied it meanwhile sees a duplicate) or ``failed``. (3) Every flush reports its upload
exactly once (``uploaded`` or ``upload_failed``), whatever raises in encoding or the PUT, and
the PUT is bounded by ``diskless.wal.commit.timeout.ms`` (a later commit would be refused).
(4) A timer wakes the pipeline at its next back-off or deadline, and a metadata change ends
back-offs at once. So every batch gets an ordering outcome in bounded time, and nothing holds
a gate: there is no gate, only the pipeline's state, which each report moves forward.

Reset after a bug. An unexpected exception in the pump fails every batch held and starts a fresh
pipeline (``CommitPipeline.restart``), which knows nothing of the old one's commits still in flight
to remote leaders and may send a later commit of the same partition before they are applied. That
keeps the order: on the same channel (leader, connection, epoch) the leader applies the old commit
first; on another epoch or leader the old commit's stamped epoch is refused, or its append is
truncated (KIP-320), or it was replicated before the new epoch began, so before the new commit;
another connection to the same leader and epoch exists only once the old one closed, which is the
lost-answer case R3/R6 already handle (a late application is a duplicate an idempotent producer's
sequence reveals). The producers of the failed batches are answered retriably, REQUEST_TIMED_OUT
when their commit was started (possibly appended), and ``tests/unit/test_representative_reset.py``
drives each interleaving.

Liveness with slow followers. The leader answers CommitBatches once the pointers are appended;
that is all the ordering needs (a remote leader may hold the answer up to
``REPLICATION_PIGGYBACK_MS`` to report acks=all entries already replicated; later commits of the
same partitions are sent meanwhile, R1). For entries not yet replicated the representative asks
the leader to await replication (AwaitReplicated) for those partitions only; the leader answers as soon as any of
them is decided, so one partition whose follower is stalled delays only its own producers.
Internal requests on a peer connection are answered as they finish (``server.py``), so a long
AwaitReplicated never holds back a later CommitBatches answer on the same connection.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.log.txn_verification_order import VerificationLines
from diskless.metrics import (
    DISKLESS_COMMIT_RPCS,
    DISKLESS_COMMIT_RPCS_IN_FLIGHT,
    DISKLESS_FLUSH_SECONDS,
    DISKLESS_WAL_OBJECT_BYTES,
    PRODUCE_STAGE,
)
from diskless.protocol import internal, records
from diskless.protocol.client import KafkaClientConnection
from diskless.storage.hedging import HedgePolicy
from diskless.storage.object_store import ObjectStore
from diskless.storage.wal_format import WalObjectWriter, wal_object_key

from .commit_pipeline import (
    NOT_LEADER,
    STORAGE_ERROR,
    TIMED_OUT,
    UNKNOWN_PARTITION,
    CommitPipeline,
    NoRoute,
    PartitionKey,
    Route,
    Send,
)
from .wal_buffer import Admission, BufferedBatch, WalBuffer

if TYPE_CHECKING:
    from collections.abc import Callable

    from .host import RepresentativeHost

log = structlog.get_logger(__name__)

LEADERSHIP_RETRY_S = 10.0  # a ready batch without an append outcome this long fails (retriably)
RETRY_BACKOFF_MS = 100  # after a leadership answer, unless the metadata changes first
COMMIT_ANSWER_TIMEOUT_S = 30.0  # a commit answer is an append, never a replication wait
REPLICATION_TIMEOUT_S = 30.0  # acks=all: how long replication is awaited when no request timeout is given
REPLICATION_POLL_MS = 5000  # the leader answers an AwaitReplicated at the latest after this
# A remote leader may hold a CommitBatches answer this long for acks=all replication, sparing an
# AwaitReplicated round trip when followers are healthy; never more (a slow follower's partition
# would hold the answer for the request's other partitions).
REPLICATION_PIGGYBACK_MS = 50
LOCAL = "local"  # channel (LOCAL, epoch): commits to this broker's own leaders


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Item:
    batch: BufferedBatch
    future: asyncio.Future[dict[str, Any]]
    acks: int
    flush: int = -1
    position: int = -1
    channel: Hashable | None = None
    # Monotonic seconds at each stage's start (diskless_produce_stage_seconds); 0.0 not yet.
    submitted: float = 0.0
    buffered: float = 0.0
    sent: float = 0.0
    appended: float = 0.0
    # Transaction verification (TxnCheck): the leader's guard, carried by the commit; while
    # ``verifying`` the item waits in its producer's queue, later batches of that producer behind it.
    guard: list[int] | None = None
    verifying: bool = False
    verify_error: int | None = None
    # Not buffered yet (verifying, or waiting for room): ``admitted`` is done once it is buffered
    # or answered (``until_buffered``); ``withdrawn`` when its request ended first (``withdraw``).
    admitted: asyncio.Future[None] | None = None
    withdrawn: bool = False
    # acks=all: replication is awaited this long after submission (the Produce request's timeout).
    timeout_s: float = REPLICATION_TIMEOUT_S


@dataclass(frozen=True)
class TxnCheck:
    """A transactional batch to verify with its partition's leader before it is buffered."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    deadline_ms: int  # when the producer's request times out (wall clock)


@dataclass
class _FlushInfo:
    key: str = ""
    created_ms: int = 0
    started: float = 0.0
    uploaded_at: float = 0.0
    size: int = 0
    uploaded: bool = False
    put_ended: bool = False
    released: int = 0  # bytes of its batches answered while its PUT still ran (held_bytes)
    remaining: set[int] = field(default_factory=set)
    partitions: set[tuple[str, int]] = field(default_factory=set)


class Representative:
    def __init__(self, host: RepresentativeHost, store: ObjectStore, on_uploaded: Callable[[str, bytes], None]) -> None:
        config = host.config
        self.host = host
        self.store = store
        self.on_uploaded = on_uploaded  # lets the broker cache what it just wrote
        self.buffer = WalBuffer(
            config.diskless_wal_linger_ms,
            config.diskless_wal_max_bytes,
            config.diskless_wal_gather_ms,
            aligned=config.diskless_wal_linger_aligned,
        )
        self.admission = Admission(config.diskless_produce_buffer_max_bytes)
        self.pipeline = CommitPipeline(
            retry_timeout_ms=int(LEADERSHIP_RETRY_S * 1000), retry_backoff_ms=RETRY_BACKOFF_MS
        )
        self.az = config.broker_rack or "none"
        self._upload_timeout_s = config.diskless_wal_commit_timeout_ms / 1000
        self.hedge = HedgePolicy(
            quantile=config.diskless_s3_hedge_quantile, max_ratio=config.diskless_s3_hedge_max_ratio
        )
        self._ids = itertools.count()
        self._items: dict[int, _Item] = {}
        self._flushes: dict[int, _FlushInfo] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._wakeup: asyncio.TimerHandle | None = None
        self._pumping = False
        self._pump_again = False
        self._connecting: set[int] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._manager_conn: KafkaClientConnection | None = None
        self._closed = False
        # Bytes of batches answered (a failed earlier flush fails the later ones of its partitions)
        # while their own flush's PUT still runs: the PUT holds them until it ends.
        self._released_uploading = 0
        # Per (topic id, partition, producer id): batches in arrival order, held while the first
        # of them is being verified, so that verification never reorders a producer's batches.
        self._verifying: VerificationLines[tuple[str, int, int], _Item] = VerificationLines()
        # Batches submitted but not buffered yet (being verified, or waiting for room), by their
        # futures: their requests may end first (``withdraw``) or wait for them (``until_buffered``).
        self._unbuffered: dict[asyncio.Future[dict[str, Any]], _Item] = {}
        self.stats = {"flushes": 0, "puts": 0, "commit_rpcs": 0, "objects": 0, "delayed": 0, "max_held_bytes": 0}

    # --- accepting batches ------------------------------------------------------------------

    def submit(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        batch: bytes,
        acks: int,
        txn: TxnCheck | None = None,
        timeout_s: float | None = None,
    ) -> asyncio.Future[dict[str, Any]]:
        """Take one validated batch; the future resolves to {error_code, base_offset, ...}.

        A transactional batch (``txn``) is first verified with the partition's leader, which
        hands back the guard its commit carries (``log/txn_verification.py``): a commit that
        arrives after its transaction ended is then refused instead of opening or joining one.
        ``timeout_s``: the Produce request's timeout, for which acks=all replication is awaited."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if self._closed:
            future.set_result({"error_code": STORAGE_ERROR})
            return future
        item = _Item(
            BufferedBatch(topic, topic_id, partition, batch, next(self._ids)),
            future,
            acks,
            submitted=time.monotonic(),
            timeout_s=REPLICATION_TIMEOUT_S if timeout_s is None else timeout_s,
        )
        if txn is None and not self._verifying:  # the common case: no transaction being verified here
            self._admit(item)
            return future
        key = (topic_id, partition, txn.producer_id if txn is not None else _producer_id(batch))
        if txn is None and not self._verifying.has_line(key):
            self._admit(item)
            return future
        item.verifying = txn is not None
        self._verifying.join(key, item)
        self._track(item)
        if txn is not None:
            self._spawn(self._verify(key, item, txn))
        self._release(key)
        return future

    def _admit(self, item: _Item) -> None:
        if self._closed:
            _resolve(item, {"error_code": STORAGE_ERROR})
        elif self.admission.offer(len(item.batch.data), item, self.held_bytes):
            self._buffer(item)
        else:
            self.stats["delayed"] += 1
            self._track(item)

    def _track(self, item: _Item) -> None:
        if item.future not in self._unbuffered:
            self._unbuffered[item.future] = item
            # Answered without being buffered (a failed verification, shutdown): out of the line.
            item.future.add_done_callback(lambda future: self._leave_line(item))

    def _leave_line(self, item: _Item) -> None:
        if self._unbuffered.pop(item.future, None) is None:
            return
        if item.admitted is not None and not item.admitted.done():
            item.admitted.set_result(None)

    def until_buffered(self, future: asyncio.Future[dict[str, Any]]) -> asyncio.Future[None] | None:
        """Done once the batch ``submit`` returned ``future`` for is buffered (or answered); None
        when it is already. An acks=0 request is handled until then: its frame stays counted in
        ``queued.max.request.bytes``, the only bound on batches waiting for room."""
        item = self._unbuffered.get(future)
        if item is None:
            return None
        if item.admitted is None:
            item.admitted = asyncio.get_running_loop().create_future()
        return item.admitted

    def withdraw(self, future: asyncio.Future[dict[str, Any]]) -> None:
        """The request of ``future``'s batch ended (timed out, or its connection closed) while the
        batch was not buffered yet: it is never written, and answered REQUEST_TIMED_OUT.

        Its frame no longer counts in ``queued.max.request.bytes``, so a batch left waiting for
        room would be held by nothing bounded (S3 stalled: every retry of a timed-out producer
        piled up here). A batch already buffered stays and may still be committed, as Kafka may
        append the batch of a request it answered REQUEST_TIMED_OUT."""
        item = self._unbuffered.get(future)
        if item is None or future.done():
            return
        if not self.admission.remove(item):
            item.withdrawn = True  # in its producer's verification queue: leaves it in turn (_release)
            return
        self._leave_line(item)
        self._fail_unbuffered(item, TIMED_OUT)
        self._admit_waiting()  # a smaller batch behind it may fit now

    def _fail_unbuffered(self, item: _Item, code: int) -> None:
        # Later batches of its producer may reach the leader and be refused out of order: the hint
        # makes them report this failure instead (CommitPipeline, R4).
        self.pipeline.note_failure((item.batch.topic_id, item.batch.partition), item.batch.data, code, _now_ms())
        _resolve(item, {"error_code": code})

    def _release(self, key: tuple[str, int, int]) -> None:
        """Admit a producer's verified batches from the front of its queue, in arrival order."""
        while (item := self._verifying.next_turn(key)) is not None:
            if item.withdrawn:
                self._leave_line(item)
                self._fail_unbuffered(item, TIMED_OUT)
            elif item.verify_error is None:
                self._admit(item)
            else:
                self._fail_unbuffered(item, item.verify_error)

    async def _verify(self, key: tuple[str, int, int], item: _Item, txn: TxnCheck) -> None:
        try:
            answer = await self._ask_guard(item.batch, txn)
            code = int(answer.get("error_code", 0))
            if code == 0:
                item.guard = [int(v) for v in answer["guard"]]
            else:
                item.verify_error = code
        except Exception as exc:
            log.info("transaction verification failed", error=repr(exc))
            item.verify_error = NOT_LEADER
        finally:
            item.verifying = False
            self._release(key)

    async def _ask_guard(self, batch: BufferedBatch, txn: TxnCheck) -> dict[str, Any]:
        state = self.host.metadata.partition_by_id(batch.topic_id, batch.partition)
        if state is None:
            return {"error_code": UNKNOWN_PARTITION}
        if state.leader < 0:
            return {"error_code": NOT_LEADER}
        body = {
            "transactional_id": txn.transactional_id,
            "producer_id": txn.producer_id,
            "producer_epoch": txn.producer_epoch,
            "topic": batch.topic,
            "topic_id": batch.topic_id,
            "partition": batch.partition,
            "deadline_ms": txn.deadline_ms,
        }
        if state.leader == self.host.node_id:
            return await self.host.leader.verify_txn_partition(body)
        timeout = max(1.0, (txn.deadline_ms - _now_ms()) / 1000)
        conn = await asyncio.wait_for(self.host.peers.get(state.leader), timeout)
        return await conn.wait(conn.send_internal(internal.INTERNAL_VERIFY_TXN_PARTITION, body), timeout=timeout)

    @property
    def held_bytes(self) -> int:
        """Buffered bytes plus bytes of batches without an ordering outcome or still in a running
        PUT (the bounded quantity)."""
        return self.buffer.size + self.pipeline.in_flight_bytes + self._released_uploading

    def _buffer(self, item: _Item) -> None:
        self._leave_line(item)
        item.buffered = time.monotonic()
        PRODUCE_STAGE["admission"].observe(item.buffered - item.submitted)
        self._items[item.batch.token] = item
        full = self.buffer.add(item.batch, _now_ms())
        self.stats["max_held_bytes"] = max(self.stats["max_held_bytes"], self.held_bytes)
        if full:
            self._flush_now()
        elif self._timer is None:
            deadline = self.buffer.deadline_ms()
            assert deadline is not None
            # Deadlines are wall-clock milliseconds: a clock stepped back must not hold a batch
            # longer than a linger (it waited an hour for an hour's step).
            delay = min(max(0.0, (deadline - _now_ms()) / 1000), self.buffer.linger_ms / 1000)
            self._timer = asyncio.get_running_loop().call_later(delay, self._flush_now)

    def _admit_waiting(self) -> None:
        for item in self.admission.admit(self.held_bytes):
            self._buffer(item)

    def _flush_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        flush = self.buffer.drain(_now_ms())
        if flush is None:
            return
        info = _FlushInfo(started=time.monotonic())
        self._flushes[flush.sequence] = info
        linger = PRODUCE_STAGE["linger"]
        for batch in flush.batches:
            item = self._items[batch.token]
            linger.observe(info.started - item.buffered)
            item.flush = flush.sequence
            info.remaining.add(batch.token)
            info.partitions.add((batch.topic_id, batch.partition))
        self.pipeline.add_flush(flush.sequence, [(b.token, (b.topic_id, b.partition), b.data) for b in flush.batches])
        self._spawn(self._upload(flush.sequence, flush.batches, info))

    async def close(self) -> None:
        self._flush_now()
        deadline = time.monotonic() + 10
        while (self.pipeline.pending or self.admission.waiting) and time.monotonic() < deadline:
            self._flush_now()
            await asyncio.sleep(0.01)
        self._closed = True
        for item in self.admission.drop_waiting():
            _resolve(item, {"error_code": STORAGE_ERROR})
        for item in self._verifying.drain():
            _resolve(item, {"error_code": STORAGE_ERROR})
        # As at a reset: a batch whose commit went out may be appended (REQUEST_TIMED_OUT, "possibly
        # persisted"); only the others were surely not written.
        sent = [token for token, item in self._items.items() if item.sent]
        self.pipeline.failed(sent, TIMED_OUT, _now_ms())
        self.pipeline.failed([token for token, item in self._items.items() if not item.sent], STORAGE_ERROR, _now_ms())
        self._deliver()
        for handle in (self._timer, self._wakeup):
            if handle is not None:
                handle.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for task in list(self._tasks):
            task.cancel()
        if self._manager_conn is not None:
            await self._manager_conn.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("representative task failed", error=repr(task.exception()))

    # --- one flush's upload ----------------------------------------------------------------------

    async def _upload(self, sequence: int, batches: list[BufferedBatch], info: _FlushInfo) -> None:
        try:
            # Not when every batch of it failed already (an earlier flush's failure, or a reset
            # after a bug) before this task began: there is nothing left to commit.
            if self._flushes.get(sequence) is info:
                await self._put_flush(sequence, batches, info)
        finally:
            info.put_ended = True
            if info.released:
                self._released_uploading -= info.released
                info.released = 0
                self._admit_waiting()

    async def _put_flush(self, sequence: int, batches: list[BufferedBatch], info: _FlushInfo) -> None:
        created = _now_ms()
        key = wal_object_key(created, self.az, self.host.node_id)
        try:
            writer = WalObjectWriter()
            for batch in batches:
                writer.add(uuid.UUID(batch.topic_id), batch.partition, batch.data)
            finished = writer.finish(created, self.host.node_id, self.az)
            for batch, ref in zip(batches, finished.refs, strict=True):
                self._items[batch.token].position = ref.offset
            await asyncio.wait_for(self.store.put(key, finished.data, self.hedge), self._upload_timeout_s)
        except Exception as exc:
            log.warning("WAL object upload failed", key=key, error=repr(exc))
            self.pipeline.upload_failed(sequence, _now_ms())
            self._pump()
            return
        info.uploaded_at = time.monotonic()
        upload = PRODUCE_STAGE["upload"]
        for _ in batches:
            upload.observe(info.uploaded_at - info.started)
        self.stats["puts"] += 1
        self.stats["objects"] += 1
        DISKLESS_WAL_OBJECT_BYTES.observe(len(finished.data))
        info.key, info.created_ms, info.size, info.uploaded = key, created, len(finished.data), True
        try:
            self.on_uploaded(key, finished.data)
        except Exception as exc:
            log.warning("caching an uploaded WAL object failed", key=key, error=repr(exc))
        try:
            self.pipeline.uploaded(sequence, _now_ms())
        except Exception:  # never leave the flush's batches uploading forever
            log.exception("recording an upload failed")
            self.pipeline.failed([b.token for b in batches], STORAGE_ERROR, _now_ms())
        self._pump()

    # --- the commit pump -------------------------------------------------------------------------

    def _pump(self) -> None:
        """Send every commit the pipeline allows now, deliver outcomes, and arm the wake-up timer.

        Re-entrant calls (a local commit answers inside a send) only ask for another round."""
        if self._pumping:
            self._pump_again = True
            return
        self._pumping = True
        try:
            while True:
                self._pump_again = False
                sends = self.pipeline.next_sends(_now_ms(), self._route)
                for send in sends:
                    self._send(send)
                self._deliver()
                if not sends and not self._pump_again:
                    break
        except Exception:
            # A bug: the pipeline's state cannot be trusted. Fail every batch held here, buffered
            # ones included (a later batch must not commit after an earlier one failed), and start
            # afresh; answers still to come for the old batches are ignored (their ids are never
            # reused), and the old commits still in flight need no waiting for (see "Reset after
            # a bug" above).
            log.exception("commit pipeline failed; failing every batch held")
            # The hints stay (R4): a producer's batch failed before the reset may have later
            # batches still coming, which the leader refuses out of order.
            fresh = self.pipeline.restart()
            for item in [*self._items.values(), *self.admission.drop_waiting()]:
                if item.future.done():
                    continue
                # A batch whose commit was started may be appended: REQUEST_TIMED_OUT ("possibly
                # persisted", what a Kafka client knows of a request that timed out at it), as R6
                # answers a lost commit. KAFKA_STORAGE_ERROR says it was not written (librdkafka's
                # NOT_PERSISTED: resending it would not duplicate it), true only of the others.
                code = TIMED_OUT if item.sent else STORAGE_ERROR
                fresh.note_failure((item.batch.topic_id, item.batch.partition), item.batch.data, code, _now_ms())
                _resolve(item, {"error_code": code})
            self._items.clear()
            self._flushes.clear()
            self.buffer.drain(_now_ms())
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.pipeline = fresh
        finally:
            self._pumping = False
        self._arm_wakeup()

    def _arm_wakeup(self) -> None:
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None
        at = self.pipeline.next_wakeup_ms()
        if at is None:
            return
        delay = max(0.0, (at - _now_ms()) / 1000) + 0.001
        self._wakeup = asyncio.get_running_loop().call_later(delay, self._pump)

    def leaders_changed(self) -> None:
        """Metadata changed (leaders, brokers): waiting commits may go now."""
        self.pipeline.leaders_changed()
        self._pump()

    def _route(self, key: PartitionKey) -> Route:
        # Routed by topic id: a batch accepted for a topic since deleted (perhaps re-created
        # under its name) fails, and never goes to the new incarnation's leader.
        state = self.host.metadata.partition_by_id(key[0], key[1])
        if state is None:
            return NoRoute.UNKNOWN
        if state.leader < 0:
            return NoRoute.NO_LEADER
        # The leader epoch is part of the channel and stamped on each entry: the leader refuses an
        # entry of another epoch, so of two commits sent at one epoch, a refused first one means a
        # refused second one even if leadership came back in between (CommitPipeline, R1).
        if state.leader == self.host.node_id:
            return (LOCAL, state.leader_epoch)
        conn = self.host.peers.connected(state.leader)
        if conn is None:
            self._connect(state.leader)
            return NoRoute.NO_LEADER
        return (state.leader, conn, state.leader_epoch)

    def _connect(self, node_id: int) -> None:
        if node_id in self._connecting:
            return
        self._connecting.add(node_id)

        async def connect() -> None:
            try:
                await self.host.peers.get(node_id)
            except Exception as exc:
                log.info("cannot reach leader", leader=node_id, error=repr(exc))
            finally:
                self._connecting.discard(node_id)
            self._pump()

        self._spawn(connect())

    def _send(self, send: Send) -> None:
        """Start one commit now (see the safety argument); its outcome comes back to the pipeline."""
        info = self._flushes[send.flush]
        items = [self._items[i] for i in send.ids]
        now = time.monotonic()
        order = PRODUCE_STAGE["order"]
        for item in items:
            item.channel = send.channel
            if not item.sent:  # a retried commit keeps its first send: retries count as commit time
                item.sent = now
                order.observe(now - info.uploaded_at)
        body = {
            "key": info.key,
            "created_ms": info.created_ms,
            "replication_wait_ms": REPLICATION_PIGGYBACK_MS,
            "entries": [
                {
                    "topic": item.batch.topic,
                    "topic_id": item.batch.topic_id,
                    "partition": item.batch.partition,
                    "header": item.batch.data[:61],
                    "position": item.position,
                    "acks": item.acks,
                    "leader_epoch": send.channel[-1],  # type: ignore[index]
                    **({"txn_guard": item.guard} if item.guard is not None else {}),
                }
                for item in items
            ],
        }
        self.stats["commit_rpcs"] += 1
        local = send.channel[0] == LOCAL  # type: ignore[index]
        DISKLESS_COMMIT_RPCS.labels("local" if local else "remote").inc()
        if local:
            try:
                answer = self.host.leader.commit_batches_now(body)
            except Exception:
                # Some appends may have happened: outcome unknown (commit_pipeline R3, R6).
                log.exception("local commit failed")
                self.pipeline.lost(send.ids, _now_ms())
                return
            self._on_answer(send, answer)
            return
        conn = send.channel[1]  # type: ignore[index]
        try:
            future = conn.send_internal(internal.INTERNAL_COMMIT_BATCHES, body)
        except Exception as exc:
            log.info("commit send failed", leader=send.channel[0], error=repr(exc))  # type: ignore[index]
            self.pipeline.lost(send.ids, _now_ms(), maybe_applied=False)  # nothing was written
            return
        self._spawn(self._await_answer(send, conn, future))

    async def _await_answer(self, send: Send, conn: Any, future: asyncio.Future[Any]) -> None:
        DISKLESS_COMMIT_RPCS_IN_FLIGHT.inc()
        try:
            answer = await conn.wait(future, timeout=COMMIT_ANSWER_TIMEOUT_S)
        except Exception as exc:
            log.info("commit answer lost", leader=send.channel[0], error=repr(exc))  # type: ignore[index]
            self.pipeline.lost(send.ids, _now_ms())
        else:
            try:
                self._on_answer(send, answer)
            except Exception:  # a bug must not leave these batches in flight forever (their chains would stall)
                log.exception("handling a commit answer failed")
                # The leader answered: these batches may well be appended ("possibly persisted").
                self.pipeline.failed(send.ids, TIMED_OUT, _now_ms())
        finally:
            DISKLESS_COMMIT_RPCS_IN_FLIGHT.dec()
        self._pump()

    def _on_answer(self, send: Send, answer: Any) -> None:
        now = _now_ms()
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(send.ids):
            # The leader may have appended them: outcome unknown (commit_pipeline R3, R6).
            log.warning("malformed commit answer", answer=str(answer)[:200])
            self.pipeline.lost(send.ids, now)
            return
        for batch_id, result in zip(send.ids, results, strict=True):
            self.pipeline.answered(batch_id, result if isinstance(result, dict) else {}, now)

    # --- outcomes --------------------------------------------------------------------------------

    def _deliver(self) -> None:
        """Answer producers whose batches have an ordering outcome (acks=all ones after replication)."""
        outcomes = self.pipeline.take_outcomes()
        if not outcomes:
            return
        replicate: dict[Hashable, list[tuple[_Item, dict[str, Any]]]] = {}
        now = time.monotonic()
        commit = PRODUCE_STAGE["commit"]
        for batch_id, result in outcomes:
            item = self._items.pop(batch_id, None)
            if item is None:
                continue
            appended = result.get("error_code") == 0
            if item.sent:
                commit.observe(now - item.sent)
            item.appended = now
            self._flush_progress(item, appended)
            if appended and item.acks == -1 and not result.get("committed", False):
                # The wait needs the partition and the offsets only. The bytes would be held for up
                # to its timeout outside diskless.produce.buffer.max.bytes: with replication stalled,
                # memory would grow by the ingest rate times that timeout.
                item.batch = replace(item.batch, data=b"")
                replicate.setdefault(item.channel, []).append((item, result))
            else:
                _resolve(item, _producer_answer(result))
        for channel, waiting in replicate.items():
            self._spawn(self._replicate(channel, waiting))
        self._admit_waiting()

    def _flush_progress(self, item: _Item, appended: bool) -> None:
        info = self._flushes.get(item.flush)
        if info is None:
            return
        if not info.put_ended:
            info.released += len(item.batch.data)
            self._released_uploading += len(item.batch.data)
        info.remaining.discard(item.batch.token)
        if info.remaining:
            return
        del self._flushes[item.flush]
        self.stats["flushes"] += 1
        DISKLESS_FLUSH_SECONDS.observe(time.monotonic() - info.started)
        if info.uploaded:
            notice = {"key": info.key, "size": info.size, "partitions": [list(p) for p in sorted(info.partitions)]}
            self._notify_manager(notice)

    async def _replicate(self, channel: Hashable, waiting: list[tuple[_Item, dict[str, Any]]]) -> None:
        """acks=all: ask the leader until each batch is replicated, refused, or the time is up.

        The leader answers as soon as any entry is decided, so each partition is answered at its
        own pace; the rest are asked again."""
        # Until the last of their requests times out (the Produce handler answers each at its own).
        deadline = max(item.submitted + item.timeout_s for item, _ in waiting)
        leader = self.host.node_id if channel[0] == LOCAL else channel[0]  # type: ignore[index]
        try:
            while waiting and time.monotonic() < deadline:
                left_ms = int((deadline - time.monotonic()) * 1000)
                body = {
                    "max_wait_ms": max(1, min(REPLICATION_POLL_MS, left_ms)),
                    "entries": [
                        {
                            "topic": item.batch.topic,
                            "topic_id": item.batch.topic_id,
                            "partition": item.batch.partition,
                            "offset": result.get("last_offset", result.get("base_offset", -1)),
                            "leader_epoch": result.get("leader_epoch", -1),
                        }
                        for item, result in waiting
                    ],
                }
                try:
                    answer = await self._ask_replicated(leader, body)
                    states = answer["results"]
                    if len(states) != len(waiting):
                        raise ValueError("malformed AwaitReplicated answer")
                except Exception as exc:
                    log.info("AwaitReplicated failed", leader=leader, error=repr(exc))
                    await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                    continue
                still = []
                for (item, result), state in zip(waiting, states, strict=True):
                    code = int(state.get("error_code", 0))
                    if code:
                        _resolve(item, {"error_code": code})
                    elif state.get("done"):
                        _resolve(item, _producer_answer(result))
                    else:
                        still.append((item, result))
                waiting = still
        finally:
            for item, _ in waiting:  # out of time, or cancelled at shutdown: never leave a producer waiting
                _resolve(item, {"error_code": int(ErrorCode.request_timed_out)})

    async def _ask_replicated(self, leader: int, body: dict[str, Any]) -> dict[str, Any]:
        if leader == self.host.node_id:
            return await self.host.leader.await_replicated(body)
        conn = await self.host.peers.get(leader)
        future = conn.send_internal(internal.INTERNAL_AWAIT_REPLICATED, body)
        return await conn.wait(future, timeout=body["max_wait_ms"] / 1000 + 10)

    def _notify_manager(self, notice: dict[str, Any]) -> None:
        """Tell the WAL file manager about the object now, so it need not wait for a scan. Best
        effort: a lost notice only delays cleanup until the next scan finds the object."""
        address = self.host.metadata.wal_manager
        if address is None:
            return

        async def send() -> None:
            conn = self._manager_conn
            if conn is None or not conn.connected or (conn.host, conn.port) != address:
                if conn is not None:
                    await conn.close()
                conn = KafkaClientConnection(
                    address[0],
                    address[1],
                    internal.broker_client_id(self.host.node_id, "notice"),
                    credentials=self.host.credentials,
                )
                await conn.connect(timeout=2)
                self._manager_conn = conn
            await conn.wait(conn.send_internal(internal.INTERNAL_WAL_NOTICE, notice), timeout=5)

        task = asyncio.create_task(send())
        self._tasks.add(task)
        task.add_done_callback(lambda t: (self._tasks.discard(t), t.cancelled() or t.exception()))

    async def connect_leaders(self) -> None:
        """Keep a connection to every other broker (commits must not wait for a TCP handshake)."""
        await self.host.peers.connect_all(list(self.host.metadata.brokers))
        self.leaders_changed()


def _producer_answer(result: dict[str, Any]) -> dict[str, Any]:
    if result.get("error_code"):
        return {"error_code": int(result["error_code"])}
    return {
        "error_code": 0,
        "base_offset": result.get("base_offset", -1),
        "log_append_time": result.get("log_append_time", -1),
        "log_start_offset": result.get("log_start_offset", -1),
    }


def _producer_id(batch: bytes) -> int:
    """The producer id of a batch (-1 for one without idempotence, or too short to say)."""
    return records.parse_header(batch).producer_id if len(batch) >= records.HEADER_SIZE else -1


def _resolve(item: _Item, result: dict[str, Any]) -> None:
    if not item.future.done():
        item.future.set_result(result)
        if result.get("error_code") == 0:
            now = time.monotonic()
            if item.acks == -1 and item.appended:
                PRODUCE_STAGE["replication"].observe(now - item.appended)
            PRODUCE_STAGE["total"].observe(now - item.submitted)

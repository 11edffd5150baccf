"""The WAL file manager service (``diskless wal-manager``): the asyncio shell around the core.

One instance is active at a time: it holds the ``wal-manager`` key in etcd under its lease (which
also tells representatives where to send commit notices); standbys wait for that key to vanish
and then campaign. The active instance starts with an empty ``WalManagerCore`` every time it wins
(its state may be lost at any moment, by design) and loops: scan the bucket (paged listing, only
the trailer of objects it does not know is read), ask the current leader of every partition named
in a due object whether it still references it (one WalReferences RPC per broker), and delete what
is confirmed unreferenced, rate limited, with batched DeleteObjects.

Every pass does a bounded amount of each kind of work: one page of trailer reads, the checks that
are due, one batch of deletes, while bucket scans run beside the passes. So a backlog of unknown
trailers (a new instance facing a full bucket) never holds up collection of what is known, and
one object that cannot be read (forbidden, corrupt, timing out) is reported to the core for that
object alone (quarantined, counted in ``diskless_wal_manager_object_errors_total``) while the
pass goes on with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from prometheus_client import Counter, Gauge, Histogram

from diskless.aio import cancel_and_wait
from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.metadata import ClusterMetadata
from diskless.config import BrokerConfig, ConfigError
from diskless.metrics import serve_metrics
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.protocol.framing import FrameDecoder, FrameError
from diskless.replication.follower_reads import max_staleness_ms
from diskless.security.cluster_secret import configured_secret, load_cluster_secret
from diskless.security.internal_auth import ClusterSecret, InternalAuthState
from diskless.security.tls import internal_client_context, server_context
from diskless.storage.object_store import InvalidRange, NoSuchKey, ObjectInfo, ObjectStore, S3Error
from diskless.storage.segment_object import SEGMENTS_PREFIX, parse_segment_key
from diskless.storage.wal_format import TAIL_READ_HINT, WAL_KEY_ROOT, CorruptWalObject, parse_tail

from .core import NO_EPOCH, Answer, LeaderView, ManagerConfig, PartitionRef, WalManagerCore, route_question

log = structlog.get_logger(__name__)

MANAGER_STATE = Gauge("diskless_wal_manager", "WAL file manager state", ["quantity"])
SCAN_SECONDS = Histogram("diskless_wal_manager_scan_seconds", "Duration of one bucket scan")
ACTIVE = Gauge("diskless_wal_manager_active", "1 while this instance is the active manager")
OBJECT_ERRORS = Counter(
    "diskless_wal_manager_object_errors",
    "Operations on one WAL object that failed (the object is retried or quarantined, the others go on)",
    ["operation", "reason"],
)
TRAILER_READ_CONCURRENCY = 16
VACANCY_CHECK_S = 1.0  # a standby asks etcd directly this often whether the manager key is gone
ETCD_CALL_TIMEOUT_S = 5.0
Answered = tuple[str, PartitionRef, Answer, int]


def _reason(exc: BaseException) -> str:
    """A bounded label for an error: the S3 error code if there is one, else the exception type."""
    if isinstance(exc, S3Error):
        return exc.code
    return type(exc).__name__


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def check_config(config: BrokerConfig) -> None:
    """Safety rule 3 at startup: a commit can never arrive for an object old enough to delete."""
    floor = config.diskless_wal_commit_timeout_ms + config.wal_manager_clock_skew_ms
    if config.wal_manager_grace_ms <= floor:
        raise ConfigError(
            f"wal.manager.grace.ms ({config.wal_manager_grace_ms}) must exceed diskless.wal.commit.timeout.ms "
            f"plus wal.manager.clock.skew.ms ({floor})"
        )
    staleness = max_staleness_ms(config.replica_fetch_wait_max_ms, config.replica_lag_time_max_ms)
    if config.wal_manager_confirm_ms < staleness:
        # Not refused: a read of a deleted object fails and is retried, nothing is lost. But
        # zone-aligned followers serve reads for this long after their last word from the leader
        # (replication/follower_reads.py), so a shorter delay lets one read an object just deleted.
        log.warning(
            "wal.manager.confirm.ms is shorter than how long a follower serves reads without news from its leader",
            confirm_ms=config.wal_manager_confirm_ms,
            follower_staleness_ms=staleness,
        )
    if not config.metadata_etcd_endpoints or not config.diskless_s3_endpoint:
        raise ConfigError("the WAL manager needs metadata.etcd.endpoints and diskless.s3.endpoint")
    try:
        manager_config(config)
    except ValueError as exc:
        # Found here, not when this instance first becomes active: its task would end there,
        # leaving a process that looks healthy and never collects anything.
        raise ConfigError(f"wal.manager settings: {exc}") from None


def manager_config(config: BrokerConfig) -> ManagerConfig:
    """The core's configuration (``ValueError`` for settings it cannot work with)."""
    return ManagerConfig(
        grace_ms=config.wal_manager_grace_ms,
        confirm_ms=config.wal_manager_confirm_ms,
        check_interval_ms=config.wal_manager_check_interval_ms,
    )


class WalManagerService:
    def __init__(self, config: BrokerConfig) -> None:
        check_config(config)
        self.config = config
        self.instance = uuid.uuid4().hex[:12]
        self.metadata = ClusterMetadata(config.cluster_id)
        assert config.metadata_etcd_endpoints and config.diskless_s3_endpoint
        self.etcd = EtcdMetadataStore(
            config.metadata_etcd_endpoints, config.cluster_id, self.metadata, config.etcd_credentials
        )
        self.store = ObjectStore(
            config.diskless_s3_endpoint,
            config.diskless_s3_bucket,
            config.diskless_s3_access_key,
            config.diskless_s3_secret_key,
            config.diskless_s3_region,
        )
        self.core: WalManagerCore | None = None
        self.port = -1
        self.metrics_port = -1
        self._server: asyncio.Server | None = None
        self._leaders: dict[int, KafkaClientConnection] = {}
        # Proved to the brokers (WalReferences) and checked on representatives' notices.
        self.cluster_secret = ClusterSecret(configured_secret(config), internal_client_context(config))
        self._stop = asyncio.Event()
        self.deleted_total = 0

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.etcd.connect()
        self.cluster_secret.set(await load_cluster_secret(self.config, self.etcd.client))
        await self.etcd.load_and_watch()
        await self.store.ensure_bucket()
        listener = self.config.listener
        # Notices come over the inter-broker protocol: TLS when that is SSL (security/tls.py).
        tls = server_context(self.config) if self.cluster_secret.tls is not None else None
        self._server = await asyncio.start_server(self._on_connection, listener.host, listener.port, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.config.metrics_port >= 0:
            self.metrics_port = serve_metrics(self.config.metrics_host or listener.host, self.config.metrics_port)
        log.info("WAL manager started", instance=self.instance, port=self.port, metrics_port=self.metrics_port)

    async def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        for conn in self._leaders.values():
            await conn.close()
        await self.store.close()
        await self.etcd.close()

    async def run(self) -> None:
        """Campaign, serve while active, fall back to standby when the lease is lost."""
        ttl = max(1, round(self.config.broker_session_timeout_ms / 1000))
        while not self._stop.is_set():
            # Every etcd call is bounded: one left hanging across an etcd restart stopped the
            # instance from ever campaigning again (and so all collection).
            try:
                lease = await asyncio.wait_for(self.etcd.client.lease(ttl), ETCD_CALL_TIMEOUT_S)
                won = await asyncio.wait_for(self._campaign(lease), ETCD_CALL_TIMEOUT_S)
            except Exception as exc:
                log.info("could not campaign for the WAL manager key; trying again", error=str(exc))
                await asyncio.sleep(1.0)
                continue
            if not won:
                ACTIVE.set(0)
                await self._wait_for_vacancy()
                await self._revoke(lease)
                continue
            log.info("became the active WAL manager", instance=self.instance)
            ACTIVE.set(1)
            self.core = WalManagerCore(manager_config(self.config))
            keepalive = asyncio.create_task(self._keep_alive(lease, ttl / 3))
            active = asyncio.create_task(self._active_loop())
            stopper = asyncio.create_task(self._stop.wait())
            await asyncio.wait([keepalive, active, stopper], return_when="FIRST_COMPLETED")
            for task, what in ((keepalive, "lease keep-alive"), (active, "active loop")):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    # cancel_and_wait marks it retrieved: say why this instance steps down.
                    log.warning("WAL manager step-down", reason=what, error=repr(task.exception()))
            await cancel_and_wait(keepalive, active, stopper)
            self.core = None
            ACTIVE.set(0)
            await self._revoke(lease)
            log.warning("no longer the active WAL manager", instance=self.instance)

    async def _revoke(self, lease: Any) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(lease.revoke(), ETCD_CALL_TIMEOUT_S)

    async def _campaign(self, lease: Any) -> bool:
        key = self.etcd._key("wal-manager")
        tx = self.etcd.client.transactions
        advertised = self.config.advertised(self.port)
        value = json.dumps({"host": advertised.host, "port": advertised.port, "instance": self.instance}).encode()
        won, _ = await self.etcd.client.transaction(
            compare=[tx.version(key) == 0], success=[tx.put(key, value, lease=lease)], failure=[]
        )
        return bool(won)

    async def _wait_for_vacancy(self) -> None:
        """Until the manager key is gone. The metadata watch normally tells; after an etcd restart
        it can be silently dead (no error, no events), which left every instance waiting forever,
        so etcd is also asked directly (a linearizable read) every ``VACANCY_CHECK_S``."""
        key = self.etcd._key("wal-manager")
        next_check = time.monotonic() + VACANCY_CHECK_S
        while not self._stop.is_set() and self.metadata.wal_manager is not None:
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + VACANCY_CHECK_S
                try:
                    if await asyncio.wait_for(self.etcd.client.get(key), ETCD_CALL_TIMEOUT_S) is None:
                        return
                except Exception as exc:  # etcd down or restarting: ask again next time
                    log.info("could not read the WAL manager key", error=str(exc))
            await asyncio.sleep(0.2)

    async def _keep_alive(self, lease: Any, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            # Unanswered before the lease could expire: it may be gone, so this instance steps down.
            reply = await asyncio.wait_for(lease.refresh(), 2 * interval)
            if reply is not None and getattr(reply, "TTL", 1) <= 0:
                return  # lease gone: another instance may take over

    # --- the active loop ----------------------------------------------------------------------

    async def _active_loop(self) -> None:
        """Passes every tick; bucket scans run beside them (a listing of a big bucket takes long)."""
        next_scan = 0
        tick = max(0.05, min(self.config.wal_manager_check_interval_ms, 1000) / 1000)
        scanner: asyncio.Task[None] | None = None
        try:
            while True:
                if scanner is not None and scanner.done():
                    if not scanner.cancelled() and scanner.exception() is not None:
                        log.warning("bucket scan failed", error=str(scanner.exception()))
                    scanner = None
                    next_scan = _now_ms() + self.config.wal_manager_scan_interval_ms
                if scanner is None and _now_ms() >= next_scan:
                    scanner = asyncio.create_task(self.scan())
                await self.run_pass()
                await asyncio.sleep(tick)
        finally:
            if scanner is not None:
                await cancel_and_wait(scanner)

    async def run_pass(self) -> None:
        """One pass: a page of trailer reads, the checks due, a batch of deletes. A step that fails
        is logged and the next one still runs: none depends on another having succeeded."""
        steps: list[Callable[[], Awaitable[None]]] = [self._read_trailers, self._check_references, self._delete]
        for step in steps:
            try:
                await step()
            except Exception:
                log.exception("WAL manager step failed", step=step.__name__)
        self._publish_stats()

    async def scan(self) -> None:
        core = self._core()
        started = time.monotonic()
        started_ms = _now_ms()
        listed: set[str] = set()
        async for info in self.store.list(WAL_KEY_ROOT):
            core.on_listed(info.key, info.size, _now_ms())
            listed.add(info.key)
        # Tiered segment objects (issue 12): same rule, their partition is in the key.
        async for info in self.store.list(SEGMENTS_PREFIX):
            if self._on_segment_listed(core, info):
                listed.add(info.key)
        core.on_scan_complete(listed, [WAL_KEY_ROOT, SEGMENTS_PREFIX], started_ms, _now_ms())
        SCAN_SECONDS.observe(time.monotonic() - started)

    def _on_segment_listed(self, core: WalManagerCore, info: ObjectInfo) -> bool:
        """Report a listed segment object to the core; False for keys that are not segments."""
        parsed = parse_segment_key(info.key)
        try:
            ref = PartitionRef(parsed[0], parsed[1]) if parsed is not None else None
        except ValueError:
            ref = None
        if ref is None:
            return False  # never ours to delete
        # Unreferenced segments wait for the tier commit timeout plus both clocks' skew.
        hold_ms = (
            self.config.diskless_tier_commit_timeout_ms
            + 2 * self.config.wal_manager_clock_skew_ms
            - self.config.wal_manager_grace_ms
        )
        core.on_segment_listed(info.key, info.size, info.last_modified_ms, ref, hold_ms, _now_ms())
        return True

    async def _recheck_segments(self, core: WalManagerCore, keys: list[str]) -> list[str]:
        """Segment objects rewritten since they were judged start over instead of being deleted:
        their write time is read again just before the delete. Tier job runs write keys of their
        own (segment_object), so only segments of older versions, keyed by range alone, can be put
        again by a rerun; a rewrite between this read and the delete is not caught for those."""
        out = []
        for key in keys:
            judged = core.created_ms(key)
            if not key.startswith(SEGMENTS_PREFIX) or judged is None:
                out.append(key)
                continue
            rewritten = False
            async for info in self.store.list(key):
                if info.key == key:
                    self._on_segment_listed(core, info)
                    rewritten = core.created_ms(key) != judged
            if not rewritten:
                out.append(key)
        return out

    async def _read_trailers(self) -> None:
        """Read one page of trailers (concurrently); each outcome is reported for its object alone."""
        core = self._core()
        keys = core.trailers_needed(_now_ms())
        if not keys:
            return
        limit = asyncio.Semaphore(TRAILER_READ_CONCURRENCY)

        async def read(key: str) -> None:
            async with limit:
                await self._read_trailer(core, key)

        await asyncio.gather(*(read(key) for key in keys))

    async def _read_trailer(self, core: WalManagerCore, key: str) -> None:
        try:
            size = await self.store.head(key)
            if size is None:
                core.on_gone(key, _now_ms())
                return
            if size == 0:
                raise CorruptWalObject("empty object")
            start = max(0, size - TAIL_READ_HINT)
            footer, trailer = parse_tail(await self.store.get_range(key, start, size - 1), size)
            if trailer is None:
                start = size - footer.tail_size
                footer, trailer = parse_tail(await self.store.get_range(key, start, size - 1), size)
            if trailer is None:
                raise CorruptWalObject("trailer unreadable")
            refs = [PartitionRef(str(topic_id), partition) for topic_id, partition in trailer.partitions()]
            core.on_trailer(key, refs, _now_ms())
        except NoSuchKey:
            core.on_gone(key, _now_ms())
        except (CorruptWalObject, InvalidRange, ValueError) as exc:
            log.warning("unreadable WAL object trailer: quarantined", key=key, error=str(exc))
            OBJECT_ERRORS.labels("trailer", "corrupt").inc()
            core.on_trailer_unreadable(key, _now_ms())
        except Exception as exc:  # forbidden, throttled, timed out: this object only, retried later
            log.warning("WAL object trailer could not be read", key=key, error=str(exc))
            OBJECT_ERRORS.labels("trailer", _reason(exc)).inc()
            core.on_trailer_failed(key, _now_ms())

    def _view_of(self, topic_id: str) -> list[LeaderView] | None:
        topic = self.metadata.topic_by_id(topic_id)
        if topic is None:
            return None
        return [LeaderView(p.leader, p.leader_epoch) for p in topic.partitions]

    async def _fresh_topic_ids(self) -> set[str] | None:
        """The ids of every topic now, from a linearizable etcd read (None if it fails)."""
        try:
            result = await self.etcd.client.get_prefix(self.etcd._key("topics/"))
            return {str(json.loads(kv.value)["topic_id"]) for kv in result}
        except Exception as exc:
            log.info("could not read the topics from etcd", error=str(exc))
            return None

    async def _check_references(self) -> None:
        core = self._core()
        answers: list[Answered] = []
        by_leader: dict[int, list[tuple[str, PartitionRef]]] = defaultdict(list)
        asked = core.checks_due(_now_ms())
        try:
            views = {ref.topic_id: self._view_of(ref.topic_id) for _, ref in asked}
            # Read after the questions were issued: an id missing from it was deleted before.
            fresh = await self._fresh_topic_ids() if any(v is None for v in views.values()) else None
            for key, ref in asked:
                routed = route_question(ref, views[ref.topic_id], fresh)
                if isinstance(routed, LeaderView):
                    core.on_leader_epoch(ref, routed.epoch)
                    by_leader[routed.leader].append((key, ref))
                else:
                    answers.append((key, ref, routed, NO_EPOCH))
            for replies in await asyncio.gather(*(self._ask(b, qs) for b, qs in by_leader.items())):
                answers += replies
            # Leadership may have moved while the questions were out: answers from an epoch older
            # than the one our view shows now come from a deposed leader and are discarded.
            now_views = {topic_id: self._view_of(topic_id) for topic_id in views}
            for ref in {ref for _, ref in asked}:
                view = now_views[ref.topic_id]
                if view is not None and ref.partition < len(view):
                    core.on_leader_epoch(ref, view[ref.partition].epoch)
        finally:
            # Every question gets exactly one answer, even if this pass dies half-way.
            answered = {(key, ref) for key, ref, _, _ in answers}
            answers += [(key, ref, Answer.UNKNOWN, NO_EPOCH) for key, ref in asked if (key, ref) not in answered]
            core.on_answers(answers, _now_ms())

    async def _ask(self, leader: int, queries: list[tuple[str, PartitionRef]]) -> list[Answered]:
        """One WalReferences RPC: each answer comes with the epoch the broker leads the partition at."""
        body = {"queries": [[key, ref.topic_id, ref.partition] for key, ref in queries]}
        try:
            conn = await self._connection(leader)
            reply = await conn.wait(conn.send_internal(internal.INTERNAL_WAL_REFERENCES, body), timeout=10)
            # A broker too old to send epochs fails here (KeyError): its answers count as UNKNOWN.
            return [
                (key, ref, Answer(code), int(epoch))
                for (key, ref), code, epoch in zip(queries, reply["answers"], reply["epochs"], strict=True)
            ]
        except (ClientError, OSError, TimeoutError, KeyError, ValueError) as exc:
            log.info("leader could not answer reference queries", leader=leader, error=str(exc))
            return [(key, ref, Answer.UNKNOWN, NO_EPOCH) for key, ref in queries]

    async def _connection(self, broker: int) -> KafkaClientConnection:
        info = self.metadata.brokers.get(broker)
        if info is None:
            raise ClientError(f"broker {broker} is not registered")
        conn = self._leaders.get(broker)
        if conn is None or not conn.connected or (conn.host, conn.port) != (info.host, info.port):
            if conn is not None:
                await conn.close()
            conn = KafkaClientConnection(
                info.host, info.port, f"diskless-wal-manager-{self.instance}", credentials=self.cluster_secret
            )
            await conn.connect()
            self._leaders[broker] = conn
        return conn

    async def _delete(self) -> None:
        core = self._core()
        keys = core.deletable(_now_ms())[: max(1, self.config.wal_manager_delete_rate)]
        keys = await self._recheck_segments(core, keys)
        if not keys:
            return
        started = time.monotonic()
        try:
            failed = set(await self.store.delete_many(keys))
        except Exception as exc:
            log.warning("deleting WAL objects failed", count=len(keys), error=str(exc))
            OBJECT_ERRORS.labels("delete", _reason(exc)).inc(len(keys))
            core.on_delete_failed(keys, _now_ms())
            return
        if failed:
            OBJECT_ERRORS.labels("delete", "failed").inc(len(failed))
            core.on_delete_failed(sorted(failed), _now_ms())
        done = [k for k in keys if k not in failed]
        core.on_deleted(done, _now_ms())
        self.deleted_total += len(done)
        log.info("deleted unreferenced WAL objects", count=len(done), failed=len(failed))
        # Rate limit: at most wal.manager.delete.rate objects per second.
        await asyncio.sleep(max(0.0, len(keys) / self.config.wal_manager_delete_rate - (time.monotonic() - started)))

    def _publish_stats(self) -> None:
        for name, value in self._core().stats().items():
            MANAGER_STATE.labels(name).set(value)

    def _core(self) -> WalManagerCore:
        assert self.core is not None
        return self.core

    # --- commit notices from representatives ------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(16 * 1024 * 1024)
        # Notices only from connections that proved the cluster secret (security/internal_auth.py).
        auth = InternalAuthState(self.cluster_secret)
        try:
            while data := await reader.read(65536):
                decoder.feed(data)
                for frame in decoder.frames():
                    header, pos = m.parse_header(frame)
                    body = internal.unpack(memoryview(frame)[pos:])
                    if header.api_key == internal.INTERNAL_AUTH_CHALLENGE:
                        writer.write(internal.encode_response(header.correlation_id, auth.challenge()))
                        continue
                    if header.api_key == internal.INTERNAL_AUTH_PROVE:
                        answer, close = auth.prove(body, header.client_id)
                        writer.write(internal.encode_response(header.correlation_id, answer))
                        if close:
                            log.warning("internal authentication failed", client_id=header.client_id)
                            return
                        continue
                    if header.api_key != internal.INTERNAL_WAL_NOTICE:
                        return
                    if not auth.authenticated:
                        writer.write(internal.encode_response(header.correlation_id, auth.refusal()))
                        continue
                    self._on_notice(body)
                    writer.write(internal.encode_response(header.correlation_id, {}))
        except (FrameError, m.MalformedRequest, ValueError, ConnectionError):
            pass
        finally:
            writer.close()

    def _on_notice(self, notice: dict[str, Any]) -> None:
        if self.core is None:
            return  # standby: the active instance gets the next notices
        refs = [PartitionRef(str(topic_id), int(partition)) for topic_id, partition in notice["partitions"]]
        self.core.on_notice(notice["key"], int(notice["size"]), refs, _now_ms())


async def run_service(config: BrokerConfig, ready_file: str | None) -> int:
    import signal

    service = WalManagerService(config)
    await service.start()
    if ready_file:
        with open(ready_file, "w") as f:
            f.write(f"{service.port} {service.metrics_port}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = asyncio.create_task(service.run())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([runner, stopper], return_when="FIRST_COMPLETED")
    failed = runner.done() and not runner.cancelled() and runner.exception() is not None
    if failed:
        # ``run`` only returns when stopped: ended on its own, it would leave a process that looks
        # healthy and collects nothing. Exit non-zero so that its supervisor starts another.
        log.error("the WAL manager stopped working", error=repr(runner.exception()))
    await cancel_and_wait(runner, stopper)
    await service.stop()
    return 1 if failed else 0

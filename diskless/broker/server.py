"""Kafka protocol connections over asyncio.

One task reads frames and starts a handler per request (so a long-polling fetch never blocks a
produce pipelined behind it); another writes responses strictly in request order, as Kafka
clients require.

Internal requests (broker to broker, ``protocol/internal.py``) are *started* in arrival order
too (a leader's pointer appends happen in its CommitBatches handler's first step, so commits on
one connection append in the order they were sent, which the representative's ordering relies
on), but each is answered as soon as it finishes: our internal client matches answers by
correlation id, and in-order answers would let one slow request (an acks=all wait on a stalled
follower) hold back every answer behind it on the shared peer connection for seconds. At most
``MAX_INTERNAL_IN_FLIGHT`` of them run per connection; beyond it reading pauses.

Internal requests, replica fetches (``replica_id`` >= 0) and WriteTxnMarkers are served only on a
connection that proved the cluster secret at its start (``security/internal_auth.py``); on any
other they are answered CLUSTER_AUTHORIZATION_FAILED and change nothing.

Each listener has a security protocol (``listener.security.protocol.map``): SSL and SASL_SSL
listeners wrap connections in TLS (``security/tls.py``); on SASL listeners nothing but
ApiVersions, SaslHandshake and SaslAuthenticate is served before authentication (anything else
closes the connection, as Kafka does). A connection's principal (``security/session.py``) is what
the authorizer checks every request against (``security_apis``).

Accepted connections are counted and expired by ``connection_quotas.py`` (max.connections,
max.connections.per.ip, connections.max.idle.ms): a connection over a limit is closed as it is
accepted; an idle one by a sweep that runs only when some connection may be due.

Client quotas (``throttle.py``, KIP-219): while any is set, a client's Produce request bytes,
consumer Fetch answer bytes and handler time are counted against it; an answer over a quota goes out
at once carrying its throttle time, and the connection is not read from for that long (Kafka mutes
the channel). Clients back off by themselves too. With no quota set, a request costs one attribute
read more.

Anything undecodable, an oversized frame, or an unsupported version of any API
other than ApiVersions closes that connection only. A handler that fails unexpectedly is answered
with the API's error code (``error_responses``); the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import struct
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.aio import StepTimer, cancel_and_wait
from diskless.cluster.client_az import ConnectionZone
from diskless.metrics import (
    CONNECTION_API_BYTES,
    CONNECTION_AZ_DECISIONS,
    CONNECTION_BYTES,
    CONNECTION_NETWORK_BYTES,
    CONNECTION_QUOTA_CLOSES,
    CONNECTIONS,
    CONNECTIONS_BY_AZ_SOURCE,
    REQUEST_ERRORS,
    REQUESTS,
    child,
)
from diskless.protocol import error_responses, internal, replica_fetch_wire
from diskless.protocol import messages as m
from diskless.protocol.framing import FrameDecoder, FrameError
from diskless.security.internal_auth import ClusterSecret, InternalAuthState
from diskless.security.session import CLUSTER_PRINCIPAL, CURRENT_SESSION, SecuritySession
from diskless.security.tls import principal_of, server_context

from .apis import CloseConnection, KafkaApis, api_version_entries
from .client_zone import CURRENT_ZONE
from .connection_quotas import Admission, ConnectionLimits, ConnectionQuotas, Expiry, Tracked, is_ip
from .idle_fetches import CURRENT_IDLE_FETCHES, IdleFetchMemo
from .metadata_cache import MetadataAnswerCache
from .request_budget import RequestBudget
from .throttle import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, ClientQuotaManager

log = structlog.get_logger(__name__)

# Requests per connection read ahead of their answers; reading pauses beyond this (backpressure).
# A diskless produce is answered after a flush, and librdkafka sends one partition per request (up
# to 1,000,000 in flight without idempotence): at 64, a producer of 1,000 partitions had its
# requests spread over flush after flush (454 records/s of the 900 offered, 0.5 MB/s at maximum in
# diskless bench; 838 and 14 MB/s at 512). Memory stays bounded by queued.max.request.bytes.
MAX_IN_FLIGHT = 512
# The connection's read buffer. asyncio's default (64 KiB) pauses the transport whenever 128 KiB
# are buffered, so a ~1 MB produce request took many pause/resume rounds of the event loop, each
# behind the loop's other work (issue 10: ~50-65 ms per MB on a busy loop, ~25-40 ms with this).
# A whole request of Kafka's default max.message.bytes fits below the pause mark (twice this);
# a connection buffers at most that much beyond what its handlers hold.
READ_LIMIT = 1024 * 1024
MAX_INTERNAL_IN_FLIGHT = 1024  # per connection, internal requests answered out of order
REFUSAL_LOG_INTERVAL_S = 10.0  # refused connections are logged at most this often (a flood must not flood the log)


class QuotaRefusal(Exception):
    """A connection over max.connections on the inter-broker listener did not start as a broker."""


class KafkaServer:
    def __init__(
        self,
        apis: KafkaApis,
        max_frame_bytes: int,
        secret: ClusterSecret | None = None,
        queued_max_request_bytes: int = -1,
    ) -> None:
        self.apis = apis
        # queued.max.request.bytes: client requests being handled (request_budget.py); -1: unbounded.
        self.request_budget = RequestBudget(queued_max_request_bytes) if queued_max_request_bytes > 0 else None
        # Without a secret (unit-test stand-ins) no connection can prove one: internal requests
        # are refused on every connection.
        self.secret = secret if secret is not None else ClusterSecret()
        self.max_frame_bytes = max_frame_bytes
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._open: dict[Tracked, Connection] = {}
        self.metadata_answers = MetadataAnswerCache()
        # max.connections(.per.ip), connections.max.idle.ms: configure_connections changes them.
        self.quotas = ConnectionQuotas(apis.broker.config.connection_limits())
        # Client quotas (throttle.py): the broker hands it the cluster's quotas as they change.
        config = apis.broker.config
        self.client_quotas = ClientQuotaManager(config.quota_window_num, config.quota_window_size_seconds)
        self._sweeper: asyncio.Task[None] | None = None
        self._resolver: asyncio.Task[None] | None = None
        self._refusals_logged_at = -REFUSAL_LOG_INTERVAL_S

    async def start(self, host: str, port: int, listener: str | None = None) -> int:
        """Listen on one listener (called once per listener); returns the port it bound.

        Connections remember the listener's name: it picks the addresses Metadata shows them and
        may decide their client's AZ (``diskless.listener.az.map``)."""

        config = self.apis.broker.config
        inter_broker = (listener or config.inter_broker_listener).upper() == config.inter_broker_listener

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._on_connection(reader, writer, listener, inter_broker)

        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop())
            self.configure_connections(self.quotas.limits)  # resolves host names of the overrides
        protocol = config.security_protocol(listener or config.inter_broker_listener)
        tls = server_context(config) if protocol.endswith("SSL") else None
        server = await asyncio.start_server(on_connection, host, port, reuse_address=True, ssl=tls, limit=READ_LIMIT)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop accepting, close every connection's transport, and let their loops wind down."""
        for server in self._servers:
            server.close()
        await cancel_and_wait(self._sweeper)
        await cancel_and_wait(self._resolver)
        for connection in list(self._open.values()):
            connection.writer.close()
        if self._connections:
            _done, stragglers = await asyncio.wait(list(self._connections), timeout=1)
            for task in stragglers:
                task.cancel()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _on_connection(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        listener: str | None = None,
        inter_broker: bool = True,
    ) -> None:
        loop = asyncio.get_running_loop()
        peername = writer.get_extra_info("peername")
        admission, tracked = self.quotas.accept(_host_of(peername), inter_broker, loop.time())
        if tracked is None:
            self._refused(admission.value, peername, loop.time())
            writer.close()  # nothing was read or written: closes at once
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            connection = Connection(self, reader, writer, str(peername), listener, tracked)
        except Exception:
            # Counted at accept: a connection that never ran must give its slot back too.
            log.exception("could not set up a connection", peer=str(peername))
            self.quotas.close(tracked)
            self._connections.discard(task)
            writer.close()
            return
        self._open[tracked] = connection
        CONNECTIONS.inc()
        try:
            await connection.run()
        finally:
            CONNECTIONS.dec()
            self.quotas.close(tracked)
            self._open.pop(tracked, None)
            self._connections.discard(task)

    def _refused(self, reason: str, peer: Any, now: float) -> None:
        CONNECTION_QUOTA_CLOSES.labels(reason).inc()
        if now - self._refusals_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._refusals_logged_at = now
            log.info(
                "connection refused (further refusals are counted in diskless_connections_closed_total)",
                peer=str(peer),
                reason=reason,
                connections=self.quotas.total,
            )

    def configure_connections(self, limits: ConnectionLimits) -> None:
        """New limits for connections accepted from now on. Overrides that name hosts apply once
        they are resolved (off the event loop); IP literals at once."""
        self.quotas.reconfigure(limits)
        names = [host for host in limits.per_ip_overrides if not is_ip(host)]
        if self._resolver is not None:
            self._resolver.cancel()
            self._resolver = None
        if names:
            self._resolver = asyncio.create_task(self._resolve(limits, names))

    async def _resolve(self, limits: ConnectionLimits, names: list[str]) -> None:
        loop = asyncio.get_running_loop()
        found: dict[str, list[str]] = {}
        for name in names:
            try:
                infos = await loop.getaddrinfo(name, None)
            except OSError as exc:
                log.warning(
                    "max.connections.per.ip.overrides: cannot resolve a host; ignored", host=name, error=str(exc)
                )
                continue
            found[name] = sorted({str(info[4][0]) for info in infos})
        if self.quotas.limits is limits:  # not reconfigured meanwhile
            self.quotas.reconfigure(limits.resolved(found))

    async def _sweep_loop(self) -> None:
        """Close idle connections, and those that stayed on probation too long (connection_quotas)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.quotas.sweep_interval)
            try:
                self._sweep(loop.time())
            except Exception:  # a bug here must not end idle expiry for the broker's lifetime
                log.exception("connection sweep failed")

    def _sweep(self, now: float) -> None:
        for tracked, why in self.quotas.expired(now):
            connection = self._open.get(tracked)
            if connection is None:
                self.quotas.close(tracked)  # its task is ending
            elif why is Expiry.IDLE and connection.writing_progressed():
                self.quotas.activity(tracked, now)  # a large answer still going out to a slow reader
            else:
                self.quotas.close(tracked)
                CONNECTION_QUOTA_CLOSES.labels(why.value).inc()
                log.debug("closing connection", peer=connection.peer, reason=why.value)
                connection.abort()


# Answers written together are joined into one buffer (copied): large fetch answers go alone.
COALESCE_MAX_BYTES = 256 * 1024
# A request read and its answer to come (None: nothing to answer), in the order requests arrived.
_Pending = tuple[m.RequestHeader, "asyncio.Future[bytes | None]"]


class Connection:
    def __init__(
        self,
        server: KafkaServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        listener: str | None = None,
        tracked: Tracked | None = None,
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self._loop = asyncio.get_running_loop()
        # Counted by the server's quotas (idle time, limits); a stand-in when made without a server's accept.
        self.tracked = tracked if tracked is not None else Tracked(peer, self._loop.time(), None)
        self._buffered_at_last_look = -1
        self.decoder = FrameDecoder(server.max_frame_bytes)
        self.pending: asyncio.Queue[_Pending | None] = asyncio.Queue(MAX_IN_FLIGHT)
        self.peer_az: str | None = None
        peer_host = _host_of(writer.get_extra_info("peername"))
        local_host = _host_of(writer.get_extra_info("sockname"))
        self.zone = ConnectionZone(server.apis.zone_policy, listener, peer_host)
        self._networks = (_network_of(local_host), _network_of(peer_host))
        self.internal_slots = asyncio.Semaphore(MAX_INTERNAL_IN_FLIGHT)
        self.internal_tasks: set[asyncio.Task[None]] = set()
        self.internal_auth = InternalAuthState(server.secret)
        config = server.apis.broker.config
        self.session = SecuritySession(
            config.security_protocol(listener or config.inter_broker_listener), peer_host or "*"
        )
        if writer.get_extra_info("ssl_object") is not None and not self.session.sasl:
            self.session.principal = principal_of(writer.get_extra_info("peercert"))
        self._refusal_logged = False
        # Topic aliases and constant fields of the compact replica fetches read on this connection.
        self.replica_fetch_state = replica_fetch_wire.ConnectionState()
        self.muted_until = 0.0  # loop time until which a throttled client's requests are not read (KIP-219)
        self._lost: asyncio.Future[None] | None = None  # done when the connection is lost (_wait_unmuted)

    async def run(self) -> None:
        # Every handler task started from here inherits this connection's zone (client_zone.py).
        CURRENT_ZONE.set(self.zone)
        CURRENT_SESSION.set(self.session)
        idle_fetches = IdleFetchMemo()
        CURRENT_IDLE_FETCHES.set(idle_fetches)
        writer_task = asyncio.create_task(self._write_loop())
        try:
            await self._read_loop()
        except (FrameError, m.MalformedRequest) as exc:
            REQUEST_ERRORS.labels(reason=type(exc).__name__).inc()
            log.warning("closing connection on bad frame", peer=self.peer, error=str(exc))
        except QuotaRefusal:
            self.server.quotas.close(self.tracked)
            CONNECTION_QUOTA_CLOSES.labels(Admission.REFUSED_MAX.value).inc()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if self.zone.source is not None:
                CONNECTIONS_BY_AZ_SOURCE.labels(self.zone.source).dec()
            await cancel_and_wait(writer_task)
            idle_fetches.close()  # its watches would keep it (and its answers) alive
            self._abandon_pending()
            for task in list(self.internal_tasks):
                task.cancel()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            if self._lost is not None:
                self._lost.cancel()

    def _abandon_pending(self) -> None:
        while not self.pending.empty():
            item = self.pending.get_nowait()
            if item is not None and isinstance(item[1], asyncio.Future):
                item[1].cancel()

    async def _read_loop(self) -> None:
        while True:
            data = await self.reader.read(2 * READ_LIMIT)
            if not data:
                return
            self.tracked.last_active = self._loop.time()  # ConnectionQuotas.activity, inlined (per read)
            self.decoder.feed(data)
            for frame in self.decoder.frames():
                if self.muted_until and not await self._wait_unmuted():
                    return  # closed while muted: what was read is not handled
                await self._dispatch(frame)
            self._count("in", len(data))
            if self.writer.is_closing():
                return

    async def _wait_unmuted(self) -> bool:
        """Hold what was read until a throttle ends: Kafka stops reading a throttled channel; a
        client that did not back off itself waits here, its next request unread. The wait ends
        early when the connection is lost (its client reset it, the idle sweep or a shutdown closed
        it): a throttle may last minutes, and the connection would stay counted, its requests
        handled after it closed. False: the connection is closing."""
        delay = self.muted_until - self._loop.time()
        self.muted_until = 0.0
        if delay > 0 and not self.writer.is_closing():
            if self._lost is None:
                # One per connection, never cancelled while it runs: it awaits the protocol's own
                # close future, which a cancellation would cancel (no later wait would hold).
                self._lost = asyncio.ensure_future(self.writer.wait_closed())
                self._lost.add_done_callback(_retrieved)  # a reset is the news here, not an error
            await asyncio.wait([self._lost], timeout=delay)
        return not self.writer.is_closing()

    def abort(self) -> None:
        """Close now (the sweep's decision): an answer stuck in the send buffer is dropped."""
        transport = self.writer.transport
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            self.writer.close()

    def writing_progressed(self) -> bool:
        """Whether bytes left the send buffer since the last look: a slow reader of a large answer
        is not idle (Kafka's Selector counts every writable event as activity)."""
        size = self.writer.transport.get_write_buffer_size()
        moved = size > 0 and size != self._buffered_at_last_look
        self._buffered_at_last_look = size
        return moved

    def _wrote(self) -> None:
        self.tracked.last_active = self._loop.time()

    def _handling(self, task: asyncio.Future[Any], *, counted: bool = False) -> None:
        """A request is being handled until ``task`` is done: the connection is not idle meanwhile
        (``counted``: it was in flight already, since it was read)."""
        tracked, loop = self.tracked, self._loop
        if not counted:
            ConnectionQuotas.request_started(tracked)
        task.add_done_callback(lambda _: ConnectionQuotas.request_finished(tracked, loop.time()))

    def _count(self, direction: str, size: int) -> None:
        apis = self.server.apis
        child(CONNECTION_BYTES, direction, apis.local_az, self.peer_az or apis.local_az).inc(size)
        child(CONNECTION_NETWORK_BYTES, direction, *self._networks).inc(size)

    def _count_api(self, direction: str, api: int | str, size: int) -> None:
        """Frame bytes by API key (length prefix included), so the bench can say what crosses AZs."""
        peer = "broker" if self.internal_auth.authenticated else "client"
        child(CONNECTION_API_BYTES, direction, str(api), peer, *self._networks).inc(size)

    def _decide_zone(self, header: m.RequestHeader) -> None:
        """At the first request: the connection's AZ, stable from now on (cluster/client_az.py)."""
        self.peer_az, source = self.server.apis.decide_zone(self.zone, header.client_id)
        CONNECTION_AZ_DECISIONS.labels(source).inc()
        CONNECTIONS_BY_AZ_SOURCE.labels(source).inc()

    def _observe_rack(self, request: Any) -> None:
        """A consumer's Fetch rack (KIP-392) may refine a weak decision, once."""
        rack = getattr(request, "rack_id", None)
        if not rack or getattr(request, "replica_id", -1) >= 0 or self.zone.source is None:
            return
        before = self.zone.source
        self.zone.on_rack(rack, self.server.apis.known_azs())
        if self.zone.source is not before:
            CONNECTIONS_BY_AZ_SOURCE.labels(before).dec()
            CONNECTIONS_BY_AZ_SOURCE.labels(self.zone.source).inc()
            CONNECTION_AZ_DECISIONS.labels(self.zone.source).inc()
            self.peer_az = self.zone.az

    async def _dispatch(self, frame: bytes) -> None:
        if self.session.raw_tokens:
            self._count_api("in", "sasl", len(frame) + 4)
            await self._raw_sasl_token(frame)
            return
        header, body_pos = m.parse_header(frame)
        if self.tracked.probation_until is not None and header.api_key not in internal.AUTH_APIS:
            # Accepted over max.connections on the inter-broker listener: only a broker proving the
            # cluster secret stays (connection_quotas.py).
            raise QuotaRefusal
        self._count_api("in", header.api_key, len(frame) + 4)
        if not self.zone.decided:
            self._decide_zone(header)
        if header.api_key == internal.INTERNAL_REPLICA_FETCH:
            await self._replica_fetch(header, memoryview(frame)[body_pos:])
            return
        if header.api_key in internal.INTERNAL_APIS:
            try:
                body = internal.unpack_request(header.api_key, memoryview(frame)[body_pos:])
            except Exception as exc:
                raise m.MalformedRequest(f"undecodable internal request: {exc}") from exc
            child(REQUESTS, str(header.api_key)).inc()
            if header.api_key in internal.AUTH_APIS:
                self._answer_auth(header, body)
                return
            if not self.internal_auth.authenticated:
                self._refuse_internal(header)
                return
            await self.internal_slots.acquire()
            # Started now, in arrival order (the task's first step runs before any later one's).
            task = asyncio.ensure_future(self._answer_internal(header, body))
            self._handling(task)
            self.internal_tasks.add(task)
            task.add_done_callback(self.internal_tasks.discard)
            return
        if not self.session.allows_before_authentication(header.api_key):
            raise m.MalformedRequest(f"api {header.api_key} before SASL authentication")
        if header.api_key == m.API_API_VERSIONS and not m.is_supported(header.api_key, header.api_version):
            # KIP-511: answer at v0 with the supported ranges so the client can downgrade.
            body = {"error_code": ErrorCode.unsupported_version, "api_keys": api_version_entries()}
            await self.pending.put((header, _ready(m.encode_response(header, body, version=0))))
            return
        if not m.is_supported(header.api_key, header.api_version):
            raise m.MalformedRequest(f"unsupported api {header.api_key} version {header.api_version}")
        request = m.decode_request(header, frame, body_pos)
        if not self.internal_auth.authenticated and _needs_cluster_action(header.api_key, request):
            self._log_refusal(header)
            body = error_responses.error_response(
                header.api_key, header.api_version, request, ErrorCode.cluster_authorization_failed
            )
            await self.pending.put((header, _ready(m.encode_response(header, body))))
            return
        if header.api_key == m.API_FETCH and self.zone.may_take_rack:
            self._observe_rack(request)
        child(REQUESTS, str(header.api_key)).inc()
        # Client quotas: brokers are never throttled (Kafka exempts its inter-broker principal).
        quotas = self.server.client_quotas if self.server.client_quotas.active else None
        throttle = 0
        if quotas is not None:
            if self.internal_auth.authenticated or not self.session.authenticated:
                # Nor is a SASL connection's handshake (ApiVersions, SaslHandshake,
                # SaslAuthenticate before it authenticated: Kafka's authenticator serves them
                # outside its quotas); counted, every client's would share User:ANONYMOUS's rate.
                quotas = None
            elif header.api_key == m.API_PRODUCE:
                # Counted as it is read, so a throttle holds the requests pipelined behind it
                # unread, as Kafka (one request at a time per connection) does.
                throttle = self._over_quota(quotas, PRODUCER_BYTE_RATE, header.client_id, len(frame))
        budget = self.server.request_budget
        if budget is not None and not self.internal_auth.authenticated:
            # Reading stops here until earlier requests give their bytes back. The request is in
            # flight meanwhile: its client waits for the answer, the connection is not idle.
            size = len(frame)
            ConnectionQuotas.request_started(self.tracked)
            try:
                await budget.take(size)
            except BaseException:
                ConnectionQuotas.request_finished(self.tracked, self._loop.time())
                raise
            task = asyncio.ensure_future(self._respond(header, request, quotas, throttle))
            task.add_done_callback(lambda _: budget.release(size))
            self._handling(task, counted=True)
        else:
            task = asyncio.ensure_future(self._respond(header, request, quotas, throttle))
            self._handling(task)
        await self.pending.put((header, task))

    async def _raw_sasl_token(self, token: bytes) -> None:
        # The client sends a token only after reading the handshake's answer: no answer can be
        # queued behind this one.
        answer = await self.server.apis.security.raw_sasl_token(token)
        if answer is None:
            log.info("closing connection after a failed SASL exchange", peer=self.peer)
            self.writer.close()
            return
        self._write_internal(struct.pack(">i", len(answer)) + answer, "sasl")

    async def _replica_fetch(self, header: m.RequestHeader, body: memoryview) -> None:
        """A follower's fetch in the compact form (``replica_fetch_wire``), answered in request
        order like the Kafka APIs, by the Fetch handler."""
        if not self.internal_auth.authenticated:
            self._log_refusal(header)
            refusal = {"error_code": ErrorCode.cluster_authorization_failed}
            answer = replica_fetch_wire.encode_answer(header.correlation_id, refusal, self.replica_fetch_state)
            await self.pending.put((header, _ready(answer)))
            return
        if header.api_version > internal.OPTIONAL_APIS[header.api_key]:
            # A follower uses only the versions this broker listed: another is a form it cannot
            # read, and the connection's aliases would no longer be in step. As Kafka does with an
            # unsupported version, the connection is closed.
            raise m.MalformedRequest(f"unsupported replica fetch version {header.api_version}")
        try:
            request = replica_fetch_wire.decode_request(body, self.replica_fetch_state)
        except replica_fetch_wire.ReplicaFetchWireError as exc:
            raise m.MalformedRequest(f"undecodable replica fetch: {exc}") from exc
        child(REQUESTS, str(header.api_key)).inc()
        task = asyncio.ensure_future(self._answer_replica_fetch(header, request))
        self._handling(task)
        await self.pending.put((header, task))

    async def _answer_replica_fetch(self, header: m.RequestHeader, request: Any) -> bytes | bytearray:
        try:
            body = await self.server.apis.fetch.replica_fetch(request)
            return replica_fetch_wire.encode_answer(header.correlation_id, body, self.replica_fetch_state)
        except Exception as exc:
            # As for a Kafka API (``_respond``): an error answer, and the connection goes on.
            error = {"error_code": self._handler_failed(header, exc)}
            return replica_fetch_wire.encode_answer(header.correlation_id, error, self.replica_fetch_state)

    def _answer_auth(self, header: m.RequestHeader, body: dict[str, Any]) -> None:
        """The internal handshake, answered here and now: requests behind it see its outcome."""
        if header.api_key == internal.INTERNAL_AUTH_CHALLENGE:
            # With the internal APIs this server answers that older versions do not.
            answer = {**self.internal_auth.challenge(), internal.SERVED_APIS: dict(internal.OPTIONAL_APIS)}
            close = False
        else:
            answer, close = self.internal_auth.prove(body, header.client_id)
            if self.internal_auth.authenticated:
                self.session.became(CLUSTER_PRINCIPAL)
                self.server.quotas.proved_broker(self.tracked)  # max.connections never closes it
        self._write_internal(internal.encode_response(header.correlation_id, answer), header.api_key)
        if close:
            REQUEST_ERRORS.labels(reason="internal_auth_failed").inc()
            log.warning("internal authentication failed; closing", peer=self.peer, client_id=header.client_id)
            self.writer.close()  # after the answer: a transport flushes what it holds before closing

    def _refuse_internal(self, header: m.RequestHeader) -> None:
        self._log_refusal(header)
        self._write_internal(
            internal.encode_response(header.correlation_id, self.internal_auth.refusal()), header.api_key
        )

    def _log_refusal(self, header: m.RequestHeader) -> None:
        REQUEST_ERRORS.labels(reason="cluster_authorization_failed").inc()
        if not self._refusal_logged:  # once per connection: a hostile client must not flood the log
            self._refusal_logged = True
            log.warning(
                "internal request on a connection that did not prove the cluster secret; refused",
                peer=self.peer,
                api=header.api_key,
                client_id=header.client_id,
            )

    def _write_internal(self, frame: bytes, api: int | str) -> None:
        if not self.writer.is_closing():
            self.writer.write(frame)
            self._wrote()
            self._count("out", len(frame))
            self._count_api("out", api, len(frame))

    async def _respond(
        self, header: m.RequestHeader, request: Any, quotas: ClientQuotaManager | None = None, throttle: int = 0
    ) -> bytes | None:
        try:
            if header.api_key == m.API_METADATA:
                return await self._respond_metadata(header, request)
            if quotas is None:
                body = await self.server.apis.handle(header, request)
            else:
                # Handler time is the handler's own steps: waits (a Fetch's long poll, a produce's
                # acks or diskless flush) cost no thread in Kafka's purgatory either.
                if header.api_key == m.API_FETCH and getattr(request, "replica_id", -1) < 0:
                    request = self._within_fetch_quota(quotas, header, request)
                timer = StepTimer()
                body = await timer.run(self.server.apis.handle(header, request))
                self._throttle(quotas, header, request, body, throttle, timer.busy)
            return None if body is None else m.encode_response(header, body)
        except CloseConnection:
            raise
        except Exception as exc:
            # As Kafka does: an unexpected failure answers this request with the API's error code
            # (per topic/partition/group where the response has them), and the connection and
            # every request pipelined on it carry on.
            code = self._handler_failed(header, exc)
            if header.api_key == m.API_PRODUCE and getattr(request, "acks", -1) == 0:
                # acks=0 producers read no answers: closing is their only signal (Kafka does so).
                raise CloseConnection(f"acks=0 produce failed: {exc!r}") from exc
            body = error_responses.error_response(header.api_key, header.api_version, request, code)
            return m.encode_response(header, body)

    def _throttle(
        self,
        quotas: ClientQuotaManager,
        header: m.RequestHeader,
        request: Any,
        body: dict[str, Any] | None,
        throttle: int,
        handler_s: float,
    ) -> None:
        """Count a handled request against its client's quotas (throttle.py); over one (``throttle``:
        its produce bytes were), its answer carries the throttle time (KIP-219)."""
        client_id = header.client_id
        throttle = max(throttle, self._over_quota(quotas, REQUEST_PERCENTAGE, client_id, max(handler_s, 0.0) * 100.0))
        if header.api_key == m.API_FETCH and body is not None and getattr(request, "replica_id", -1) < 0:
            fetched = sum(len(p.get("records") or b"") for t in body.get("responses", ()) for p in t["partitions"])
            throttle = max(throttle, self._over_quota(quotas, CONSUMER_BYTE_RATE, client_id, fetched))
        if throttle and body is not None:
            body["throttle_time"] = throttle

    def _within_fetch_quota(self, quotas: ClientQuotaManager, header: m.RequestHeader, request: Any) -> Any:
        """A consumer's fetch asks for at most what its consumer_byte_rate lets through in a quota
        window (Kafka caps fetch.max.bytes so): a 50 MB answer to a 1 kB/s consumer would mute its
        connection for half a day."""
        if not hasattr(request, "max_bytes"):  # Fetch v0-v2: partition limits only, as in Kafka
            return request
        cap = quotas.max_value_in_window(CONSUMER_BYTE_RATE, self._user(), header.client_id or "")
        if cap is None or request.max_bytes <= cap:
            return request
        cap = max(int(cap), 1)
        return dataclasses.replace(request, max_bytes=cap, min_bytes=min(request.min_bytes, cap))

    def _user(self) -> str:
        principal = self.session.principal
        return principal[5:] if principal.startswith("User:") else principal

    def _over_quota(self, quotas: ClientQuotaManager, quota_type: str, client_id: str | None, value: float) -> int:
        """Record ``value``; over the quota, the connection is muted for the throttle time returned."""
        now = self._loop.time()
        throttle = quotas.record(quota_type, self._user(), client_id or "", value, now * 1000.0)
        if throttle:
            self.muted_until = max(self.muted_until, now + throttle / 1000.0)
        return throttle

    def _handler_failed(self, header: m.RequestHeader, exc: Exception) -> ErrorCode:
        """Count and log a handler's unexpected failure; the error code its answer carries."""
        REQUEST_ERRORS.labels(reason="handler_exception").inc()
        log.error("request handler failed; answering with an error", peer=self.peer, api=header.api_key, exc_info=exc)
        return error_responses.code_for(exc)

    async def _respond_metadata(self, header: m.RequestHeader, request: Any) -> bytes:
        """Metadata answers are reused while the cluster metadata is unchanged (metadata_cache)."""
        cache = self.server.metadata_answers
        metadata = self.server.apis.broker.metadata
        generation = (metadata.generation, metadata.topology_generation)
        # The answer shows this listener's addresses and this AZ's leaders; taken once, since a
        # Fetch rack may refine the AZ while the answer is built.
        variant = (self.zone.listener, self.zone.az)
        if not self.server.apis.security.metadata_shared():
            # This principal sees only the topics it may describe: its answer is its own.
            own = await self.server.apis.handle(header, request)
            assert own is not None
            return m.encode_response(header, own)
        cached = cache.get(header, request, generation, variant)
        if cached is not None:
            return cached
        body = await self.server.apis.handle(header, request)
        assert body is not None
        frame = m.encode_response(header, body)
        cache.put(header, request, generation, body, frame, variant)
        return frame

    async def _answer_internal(self, header: m.RequestHeader, body: dict[str, Any]) -> None:
        """Run one internal request and write its answer as soon as it is ready (out of order)."""
        try:
            try:
                result = await self.server.apis.handle_internal(header, body)
            except Exception:
                log.exception("internal request failed", peer=self.peer, api=header.api_key)
                result = {"error_code": int(ErrorCode.unknown_server_error)}
            if self.writer.is_closing():
                return
            frame = internal.encode_response(header.correlation_id, result, bool(body.get(internal.COMPACT_ANSWERS)))
            self.writer.write(frame)  # one whole frame: frames of concurrent answers never interleave
            self._wrote()
            self._count("out", len(frame))
            self._count_api("out", header.api_key, len(frame))
            await self.writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self.internal_slots.release()

    async def _write_loop(self) -> None:
        """Write the answers in request order. Answers already done when one is written go out
        with it in one write: a diskless flush answers every produce request it carried at once
        (librdkafka sends one partition per request), and one send per answer was a syscall and a
        wake-up of the client each."""
        carry: _Pending | None = None  # taken from the queue while not done yet: written next
        try:
            while True:
                item = carry if carry is not None else await self.pending.get()
                carry = None
                frames: list[bytes] = []
                gathered = 0
                close = False
                while item is not None:
                    header, response = item
                    try:
                        frame = await response
                    except CloseConnection as exc:
                        log.info("closing connection", peer=self.peer, api=header.api_key, reason=str(exc))
                        close = True
                        break
                    except Exception:
                        log.exception("request handler failed; closing connection", peer=self.peer, api=header.api_key)
                        close = True
                        break
                    if frame is not None:
                        frames.append(frame)
                        gathered += len(frame)
                        self._count("out", len(frame))
                        self._count_api("out", header.api_key, len(frame))
                    if self.session.close_after_answer:
                        log.info("closing connection after a failed SASL exchange", peer=self.peer)
                        close = True
                        break
                    if gathered >= COALESCE_MAX_BYTES:
                        break
                    try:
                        item = self.pending.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                    if item is not None and not item[1].done():
                        carry = item
                        break
                ended = item is None
                if frames:
                    self.writer.write(frames[0] if len(frames) == 1 else b"".join(frames))
                    self._wrote()
                if close:
                    self.writer.close()  # after the answers: a transport flushes what it holds first
                    return
                if ended:
                    return
                if frames:
                    await self.writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return


def _needs_cluster_action(api_key: int, request: Any) -> bool:
    """Kafka APIs only brokers send (Kafka's CLUSTER_ACTION): replica fetches, and WriteTxnMarkers
    that commit. An ABORT marker may also come from an operator ending a hanging transaction
    (KIP-664's abortTransaction); the ACL layer then wants CLUSTER_ACTION on the cluster, as Kafka
    does, where an authorizer is configured. A COMMIT from anyone but a broker could only expose a
    transaction its coordinator never committed."""
    if api_key == m.API_FETCH:
        return int(getattr(request, "replica_id", -1)) >= 0
    if api_key == m.API_WRITE_TXN_MARKERS:
        return any(marker.transaction_result for marker in request.markers)
    return False


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _ready(value: bytes) -> asyncio.Future[bytes | None]:
    """An answer known when its request is read, queued like any other (in request order)."""
    future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _host_of(address: Any) -> str | None:
    """The host of a socket address tuple (None for a Unix socket or an unknown one)."""
    return str(address[0]) if isinstance(address, tuple) and address else None


def _network_of(host: str | None) -> str:
    """A metric label for an address: its IPv4 /24 or IPv6 /64 (bounded however many clients)."""
    if host is None:
        return "unknown"
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return "unknown"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    prefix = 24 if address.version == 4 else 64
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))

"""Connection limits and idle expiry on the real KafkaServer/Connection (diskless/broker/server.py),
over raw sockets on 127.0.0.1 ports chosen at run time.

The decisions are connection_quotas.py's (test_connection_quotas.py); here: a connection over
max.connections.per.ip is closed as it is accepted, a client over max.connections too while a
broker proving the cluster secret is still taken, and an idle connection is closed after
connections.max.idle.ms but not while its request is parked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from integration.rawclient import build_batch, encode_request, produce_request

from diskless.broker import server as server_module
from diskless.broker.server import KafkaServer
from diskless.cluster.client_az import AzSource
from diskless.config import BrokerConfig
from diskless.metrics import CONNECTION_QUOTA_CLOSES
from diskless.protocol import internal
from diskless.protocol.client import KafkaClientConnection
from diskless.security.internal_auth import ClusterSecret

DEADLINE_S = 20.0


class ParkingApis:
    """Produce requests are parked until ``release`` (as a long-poll Fetch or a JoinGroup is)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.broker = SimpleNamespace(config=config)
        self.zone_policy = config.zone_policy()
        self.local_az = "none"
        self.parked = 0
        self.release = asyncio.Event()

    def decide_zone(self, zone: Any, client_id: str | None) -> tuple[str, AzSource]:
        return "none", AzSource.RECEIVING_BROKER

    async def handle(self, header: Any, request: Any) -> dict[str, Any]:
        self.parked += 1
        await self.release.wait()
        partition = {"index": 0, "error_code": 0, "base_offset": 0}
        return {"responses": [{"name": "t", "partition_responses": [partition]}], "throttle_time": 0}

    async def handle_internal(self, header: Any, body: dict[str, Any]) -> dict[str, Any]:
        return {"error_code": 0, "served": True}


def _closes(reason: str) -> float:
    return CONNECTION_QUOTA_CLOSES.labels(reason)._value.get()  # type: ignore[no-any-return]


async def _until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.005)


def _connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port))
    client.setblocking(False)
    return client


def _is_open(client: socket.socket) -> bool:
    """Open with nothing to read (raises if the server sent something)."""
    try:
        data = client.recv(1 << 16)
    except BlockingIOError:
        return True
    assert data == b"", "unexpected bytes from the server"
    return False


async def _read_until_closed(client: socket.socket) -> bytes:
    """What the server sends before closing the connection (the deadline fails the test)."""
    loop = asyncio.get_running_loop()
    received = b""
    while True:
        chunk = await asyncio.wait_for(loop.sock_recv(client, 1 << 16), DEADLINE_S)
        if not chunk:
            return received
        received += chunk


def _produce_frame(correlation_id: int) -> bytes:
    return encode_request(produce_request("t", 0, build_batch([(None, b"v")]), acks=1, version=8), correlation_id)


def test_a_connection_over_the_per_ip_limit_is_closed_at_accept() -> None:
    async def scenario() -> None:
        server = KafkaServer(ParkingApis(BrokerConfig(max_connections_per_ip=2)), max_frame_bytes=1 << 20)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        refused_before = _closes("max_connections_per_ip")
        kept = [_connect(port), _connect(port)]
        try:
            await _until(lambda: server.quotas.per_ip.get("127.0.0.1") == 2, "two connections counted")
            extra = _connect(port)
            assert await _read_until_closed(extra) == b""
            extra.close()
            assert _closes("max_connections_per_ip") == refused_before + 1
            assert all(_is_open(c) for c in kept)
            kept.pop().close()  # a slot frees when a connection ends
            await _until(lambda: server.quotas.per_ip.get("127.0.0.1") == 1, "the closed one uncounted")
            kept.append(_connect(port))
            await _until(lambda: server.quotas.per_ip.get("127.0.0.1") == 2, "a new one admitted")
            assert _is_open(kept[-1])
        finally:
            for c in kept:
                c.close()
            await server.stop()

    asyncio.run(scenario())


def test_max_connections_refuses_clients_but_not_brokers() -> None:
    config = dataclasses.replace(
        BrokerConfig(max_connections=1),
        listeners="BROKER://127.0.0.1:0,CLIENT://127.0.0.1:0",
        inter_broker_listener_name="BROKER",
    )
    secret = ClusterSecret(b"cluster-secret")

    async def scenario() -> None:
        server = KafkaServer(ParkingApis(config), max_frame_bytes=1 << 20, secret=secret)  # type: ignore[arg-type]
        broker_port = await server.start("127.0.0.1", 0, "BROKER")
        client_port = await server.start("127.0.0.1", 0, "CLIENT")
        refused_before = _closes("max_connections")
        first = _connect(client_port)
        peer = KafkaClientConnection("127.0.0.1", broker_port, "broker-2-peer", credentials=secret)
        try:
            await _until(lambda: server.quotas.total == 1, "the first client counted")
            flood = [_connect(client_port) for _ in range(20)]  # on a client listener: closed at accept
            for extra in flood:
                assert await _read_until_closed(extra) == b""
                extra.close()
            # On the inter-broker listener: a client's first request closes it...
            sneaky = _connect(broker_port)
            await asyncio.get_running_loop().sock_sendall(sneaky, _produce_frame(1))
            assert await _read_until_closed(sneaky) == b""
            sneaky.close()
            assert _closes("max_connections") == refused_before + 21
            # ... and a broker proving the cluster secret is served, over the limit.
            await peer.connect()
            answer = await peer.wait(peer.send_internal(internal.INTERNAL_WAL_REFERENCES, {}), DEADLINE_S)
            assert answer == {"error_code": 0, "served": True}
            assert server.quotas.total == 2 and peer.connected and _is_open(first)
            assert _closes("max_connections") == refused_before + 21
        finally:
            await peer.close()
            first.close()
            await server.stop()

    asyncio.run(scenario())


def test_an_idle_connection_is_closed_but_not_while_its_request_is_parked() -> None:
    apis = ParkingApis(BrokerConfig(connections_max_idle_ms=300))

    async def scenario() -> None:
        server = KafkaServer(apis, max_frame_bytes=1 << 20)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        idle_before = _closes("idle")
        idle = _connect(port)
        busy = _connect(port)
        probe: socket.socket | None = None
        try:
            await loop.sock_sendall(busy, _produce_frame(7))
            await _until(lambda: apis.parked == 1, "the request parked")
            assert await _read_until_closed(idle) == b""  # nothing read or written for 300 ms
            # A connection opened after the parked request was read: once it is closed for
            # idleness, the busy one would have been too, were it idle.
            probe = _connect(port)
            assert await _read_until_closed(probe) == b""
            assert _is_open(busy)
            assert _closes("idle") == idle_before + 2
            apis.release.set()
            # Answered, then idle from the answer on: closed in turn.
            answer = await _read_until_closed(busy)
            assert len(answer) == 4 + struct.unpack_from(">i", answer)[0]  # one answer, whole
            assert struct.unpack_from(">i", answer, 4)[0] == 7  # the parked request's
            assert _closes("idle") == idle_before + 3
            await _until(lambda: server.quotas.total == 0, "every closed connection uncounted")
        finally:
            for c in (idle, busy, probe):
                if c is not None:
                    c.close()
            await server.stop()

    asyncio.run(scenario())


def test_a_request_waiting_for_the_request_budget_keeps_its_connection_open() -> None:
    """queued.max.request.bytes spent by another connection's parked request: this connection's
    request is read and waits for its share before its handler starts. It is in flight all the
    same (the client waits for its answer): idleness must not close the connection under it."""
    apis = ParkingApis(BrokerConfig(connections_max_idle_ms=300))

    async def scenario() -> None:
        server = KafkaServer(apis, max_frame_bytes=1 << 20, queued_max_request_bytes=1)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        assert server.request_budget is not None
        busy, waiting = _connect(port), _connect(port)
        probe: socket.socket | None = None
        try:
            await loop.sock_sendall(busy, _produce_frame(1))
            await _until(lambda: apis.parked == 1, "the first request parked, holding the budget")
            await loop.sock_sendall(waiting, _produce_frame(2))
            await _until(lambda: server.request_budget.waiting == 1, "the second request waiting for the budget")  # type: ignore[union-attr]
            probe = _connect(port)  # opened after the waiting request was read
            assert await _read_until_closed(probe) == b""
            assert _is_open(waiting) and _is_open(busy)
            apis.release.set()
            for client, correlation_id in ((busy, 1), (waiting, 2)):
                answer = await _read_until_closed(client)  # answered, then idle: closed
                assert len(answer) == 4 + struct.unpack_from(">i", answer)[0]
                assert struct.unpack_from(">i", answer, 4)[0] == correlation_id
        finally:
            for c in (busy, waiting, probe):
                if c is not None:
                    c.close()
            await server.stop()

    asyncio.run(scenario())


def test_a_connection_that_fails_to_set_up_is_closed_and_uncounted(monkeypatch: Any) -> None:
    """An exception between the accept and the connection's loop (setting up its session, zone...)
    must neither keep the socket open nor its slot counted against max.connections(.per.ip)."""
    apis = ParkingApis(BrokerConfig(max_connections_per_ip=1, connections_max_idle_ms=-1))

    def broken_zone(*args: Any) -> None:
        raise RuntimeError("set-up failed")

    async def scenario() -> None:
        server = KafkaServer(apis, max_frame_bytes=1 << 20)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        client = _connect(port)
        retry: socket.socket | None = None
        try:
            assert await _read_until_closed(client) == b""
            await _until(lambda: server.quotas.total == 0, "the failed connection uncounted")
            assert server.quotas.per_ip == {} and not server._open
            monkeypatch.undo()
            retry = _connect(port)  # its one slot is free again
            await _until(lambda: server.quotas.per_ip.get("127.0.0.1") == 1, "the retry admitted")
            assert _is_open(retry)
        finally:
            client.close()
            if retry is not None:
                retry.close()
            await server.stop()

    monkeypatch.setattr(server_module, "ConnectionZone", broken_zone)
    asyncio.run(scenario())

"""Client quotas at a connection's edges (diskless/broker/server.py): what is not counted."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from diskless.cluster import client_quotas as cq
from diskless.config import load_config
from diskless.protocol import messages as m
from diskless.protocol.client import KafkaClientConnection


async def test_a_sasl_handshake_is_not_counted_against_anonymous(tmp_path: Path) -> None:
    """Before a SASL connection authenticated, its principal is User:ANONYMOUS: a default user's
    request_percentage counted every connecting client's ApiVersions and SASL exchange in one rate
    shared by all of them, and muted connections in their handshake (Kafka's authenticator serves
    these outside the quotas)."""
    from diskless.broker.broker import Broker

    config = load_config(
        environ={},
        overrides={"node.id": "1", "log.dirs": str(tmp_path), "listeners": "SASL_PLAINTEXT://127.0.0.1:0"},
    )
    broker = Broker(config)
    await broker.start()
    broker.server.client_quotas.update({cq.entity_of([(cq.USER, None)]): {cq.REQUEST_PERCENTAGE: 1e-9}})
    conn = KafkaClientConnection("127.0.0.1", broker.port, "c")
    try:
        await conn.connect()
        for _ in range(3):
            answer = await conn.request(
                m.API_API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
            )
            assert answer.error_code == 0
            assert answer.throttle_time.total_seconds() == 0
        assert [c.muted_until for c in broker.server._open.values()] == [0.0]
        assert not broker.server.client_quotas._rates
    finally:
        await conn.close()
        await broker.stop()


async def test_a_consumers_fetch_is_cut_to_its_quota_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetch asks for at most what the consumer's consumer_byte_rate lets through in a quota
    window, as Kafka's fetch.max.bytes cap (getMaxValueInQuotaWindow): uncut, a 1 kB/s consumer's
    first 50 MB answer muted its connection for about 140 hours."""
    from diskless.broker.broker import Broker

    config = load_config(
        environ={},
        overrides={"node.id": "1", "log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"},
    )
    broker = Broker(config)
    await broker.start()
    asked: list[tuple[int, int]] = []

    async def handle(header: m.RequestHeader, request: Any) -> Any:
        asked.append((request.max_bytes, request.min_bytes))
        return {"error_code": 0, "session_id": 0, "responses": []}

    monkeypatch.setattr(broker.apis, "handle", handle)
    broker.server.client_quotas.update({cq.entity_of([(cq.CLIENT_ID, "slow")]): {cq.CONSUMER_BYTE_RATE: 1000.0}})
    fetch = {"replica_id": -1, "max_wait": 0, "min_bytes": 1 << 20, "max_bytes": 50 << 20, "topics": []}
    conns = [KafkaClientConnection("127.0.0.1", broker.port, client) for client in ("slow", "other")]
    try:
        for conn in conns:
            await conn.connect()
            await conn.request(m.API_FETCH, 12, fetch)
        # quota.window.num 11 of 1 s: 10 windows' worth, as Kafka counts it
        assert asked == [(10_000, 10_000), (50 << 20, 1 << 20)]
    finally:
        for conn in conns:
            await conn.close()
        await broker.stop()


async def test_a_muted_connection_ends_when_its_client_resets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A throttled connection holds its next request unread for the throttle time; a client that
    gave up meanwhile (reset the connection) left it open, counted and then handling that request,
    until the throttle ended: here 10,000 s."""
    from diskless.broker.broker import Broker
    from diskless.broker.server import Connection

    config = load_config(
        environ={},
        overrides={"node.id": "1", "log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"},
    )
    broker = Broker(config)
    await broker.start()
    handled: list[int] = []

    async def handle(header: m.RequestHeader, request: Any) -> Any:
        handled.append(header.correlation_id)
        return {"responses": []}

    monkeypatch.setattr(broker.apis, "handle", handle)
    muted = asyncio.Event()
    wait_unmuted = Connection._wait_unmuted

    async def entered(self: Connection) -> bool:
        muted.set()
        return await wait_unmuted(self)

    monkeypatch.setattr(Connection, "_wait_unmuted", entered)
    broker.server.client_quotas.update({cq.entity_of([(cq.CLIENT_ID, "p")]): {cq.PRODUCER_BYTE_RATE: 1.0}})
    produce = {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 30000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x" * 10_000}]}],
    }
    conn = KafkaClientConnection("127.0.0.1", broker.port, "p")
    try:
        await conn.connect()
        answer = await conn.request(m.API_PRODUCE, 9, produce)
        assert answer.throttle_time.total_seconds() > 1000
        pipelined = asyncio.ensure_future(conn.request(m.API_PRODUCE, 9, produce))
        await asyncio.wait_for(muted.wait(), 10)  # the second request is read, and held
        tasks = list(broker.server._connections)
        writer = conn._writer
        assert writer is not None
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset
        done, _ = await asyncio.wait(tasks, timeout=10)
        assert len(done) == len(tasks) == 1, "the muted connection outlived its client"
        assert len(handled) == 1
        pipelined.cancel()
    finally:
        await conn.close()
        await broker.stop()

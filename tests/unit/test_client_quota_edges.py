"""Client quotas at a connection's edges (diskless/broker/server.py): what is not counted."""

from __future__ import annotations

from pathlib import Path

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

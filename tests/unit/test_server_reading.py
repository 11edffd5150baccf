"""How a broker connection reads large requests (diskless/broker/server.py).

A producer at its limit sends requests of up to ~1 MB (librdkafka's message.max.bytes). asyncio's
default StreamReader limit (64 KiB) paused the socket transport whenever more than 128 KiB were
buffered, so such a request was read in many pause/resume rounds of the event loop, each behind
whatever else the loop had to do (issue 10: on a busy loop ~50-65 ms per MB instead of ~25-40).
The connection's reader now buffers a whole such request without pausing the transport; reading
still pauses on the connection's own back-pressure (requests in flight).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from types import SimpleNamespace
from typing import Any

import pytest

from diskless.broker.server import KafkaServer
from diskless.cluster.client_az import AzSource
from diskless.config import BrokerConfig


def _stub_apis() -> Any:
    config = BrokerConfig()

    def decide_zone(zone: Any, client_id: str | None) -> tuple[str, AzSource]:
        return "none", AzSource.RECEIVING_BROKER

    return SimpleNamespace(
        broker=SimpleNamespace(config=config),
        zone_policy=config.zone_policy(),
        local_az="none",
        decide_zone=decide_zone,
    )


@pytest.mark.parametrize("size", [1_000_000, 1_048_588])
def test_a_max_size_request_is_read_without_pausing_the_transport(size: int, monkeypatch: Any) -> None:
    pauses: list[int] = []
    transport_class = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    original = transport_class.pause_reading

    def counting_pause(self: Any) -> None:
        pauses.append(1)
        original(self)

    monkeypatch.setattr(transport_class, "pause_reading", counting_pause)

    async def scenario() -> None:
        server = KafkaServer(_stub_apis(), max_frame_bytes=100 * 1024 * 1024)
        port = await server.start("127.0.0.1", 0)
        # API key -1 (0xffff), which no broker supports: the connection reads the whole frame, then
        # closes on it.
        frame = struct.pack(">i", size) + b"\xff" * size
        loop = asyncio.get_running_loop()
        client = socket.create_connection(("127.0.0.1", port))
        try:
            client.setblocking(False)
            await loop.sock_sendall(client, frame)
            # The server closes the connection once it has read and refused the frame.
            got = await asyncio.wait_for(loop.sock_recv(client, 1), 30)
            assert got == b""
        finally:
            client.close()
            await server.stop()

    asyncio.run(scenario())
    assert pauses == [], f"the transport paused reading {len(pauses)} times for one {size}-byte request"

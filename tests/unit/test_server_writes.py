"""How a broker connection writes its answers (diskless/broker/server.py).

A diskless flush answers every produce request it carried at the same moment, and librdkafka
puts one partition in each ProduceRequest: ~15 answers per flush per producer connection at the
bench's low rate. Each answer went out in a send of its own, a syscall and a wake-up of the
client apiece. Answers already done when one is written now go out with it in one write, still
in request order; an answer not ready yet is waited for and never overtaken.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from types import SimpleNamespace
from typing import Any

from integration.rawclient import build_batch, encode_request, produce_request

from diskless.broker.server import COALESCE_MAX_BYTES, KafkaServer
from diskless.cluster.client_az import AzSource
from diskless.config import BrokerConfig

REQUESTS = 40


class FlushingApis:
    """Produce answered when ``release`` says so, in whatever order it releases them."""

    def __init__(self, answer_bytes: int = 0) -> None:
        config = BrokerConfig()
        self.broker = SimpleNamespace(config=config)
        self.zone_policy = config.zone_policy()
        self.local_az = "none"
        self.gates: dict[int, asyncio.Event] = {}
        self.answer_bytes = answer_bytes

    def decide_zone(self, zone: Any, client_id: str | None) -> tuple[str, AzSource]:
        return "none", AzSource.RECEIVING_BROKER

    def gate(self, correlation_id: int) -> asyncio.Event:
        return self.gates.setdefault(correlation_id, asyncio.Event())

    async def handle(self, header: Any, request: Any) -> dict[str, Any]:
        await self.gate(header.correlation_id).wait()
        partition = {"index": 0, "error_code": 0, "base_offset": header.correlation_id}
        if self.answer_bytes:
            partition["error_message"] = "x" * self.answer_bytes  # a large answer (v8+), for the size cap
        return {"responses": [{"name": "t", "partition_responses": [partition]}], "throttle_time": 0}


def _count_writes(monkeypatch: Any) -> list[int]:
    sizes: list[int] = []
    transport_class = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    original = transport_class.write

    def counting_write(self: Any, data: Any) -> None:
        sizes.append(len(data))
        original(self, data)

    monkeypatch.setattr(transport_class, "write", counting_write)
    return sizes


async def _read_answers(loop: asyncio.AbstractEventLoop, client: socket.socket, count: int) -> list[int]:
    """The correlation ids of ``count`` answers, in the order they arrive."""
    buffer = b""
    ids: list[int] = []
    while len(ids) < count:
        chunk = await asyncio.wait_for(loop.sock_recv(client, 1 << 20), 30)
        assert chunk, "connection closed before every answer arrived"
        buffer += chunk
        while len(buffer) >= 8 and len(buffer) >= 4 + struct.unpack_from(">i", buffer)[0]:
            size = struct.unpack_from(">i", buffer)[0]
            ids.append(struct.unpack_from(">i", buffer, 4)[0])
            buffer = buffer[4 + size :]
    return ids


def _scenario(apis: FlushingApis, release: Any) -> list[int]:
    async def run() -> list[int]:
        server = KafkaServer(apis, max_frame_bytes=100 * 1024 * 1024)  # type: ignore[arg-type]
        port = await server.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        client = socket.create_connection(("127.0.0.1", port))
        try:
            client.setblocking(False)
            batch = build_batch([(None, b"v")])
            frames = [encode_request(produce_request("t", 0, batch, acks=1, version=8), cid) for cid in range(REQUESTS)]
            await loop.sock_sendall(client, b"".join(frames))
            deadline = loop.time() + 30
            while len(apis.gates) < REQUESTS:  # every request read and handed to its handler
                assert loop.time() < deadline, f"{len(apis.gates)} of {REQUESTS} requests handled"
                await asyncio.sleep(0.001)
            reading = asyncio.ensure_future(_read_answers(loop, client, REQUESTS))
            await release(apis)
            return await reading
        finally:
            client.close()
            await server.stop()

    return asyncio.run(run())


def test_answers_done_together_go_out_in_one_write(monkeypatch: Any) -> None:
    sizes = _count_writes(monkeypatch)

    async def flush(apis: FlushingApis) -> None:
        for cid in range(REQUESTS):  # one flush answers them all at once
            apis.gate(cid).set()

    ids = _scenario(FlushingApis(), flush)
    assert ids == list(range(REQUESTS))
    assert len(sizes) == 1, f"{REQUESTS} answers done together took {len(sizes)} writes"


def test_a_later_answer_done_first_waits_for_the_earlier_one(monkeypatch: Any) -> None:
    sizes = _count_writes(monkeypatch)

    async def out_of_order(apis: FlushingApis) -> None:
        for cid in range(1, REQUESTS):  # everything but the first request's answer
            apis.gate(cid).set()
        for _ in range(50):  # loop rounds enough for the released handlers and a write loop that would overtake
            await asyncio.sleep(0)
        assert sizes == [], "answers were written before the first request's"
        apis.gate(0).set()

    ids = _scenario(FlushingApis(), out_of_order)
    assert ids == list(range(REQUESTS))
    assert len(sizes) == 1


def test_large_answers_are_not_joined_beyond_the_cap(monkeypatch: Any) -> None:
    sizes = _count_writes(monkeypatch)

    async def flush(apis: FlushingApis) -> None:
        for cid in range(REQUESTS):
            apis.gate(cid).set()

    answer = 20_000  # an int16-long error message: 40 answers are ~3 caps' worth
    ids = _scenario(FlushingApis(answer_bytes=answer), flush)
    assert ids == list(range(REQUESTS))
    assert sum(sizes) > REQUESTS * answer
    assert len(sizes) >= REQUESTS * answer // (COALESCE_MAX_BYTES + answer)
    assert max(sizes) < COALESCE_MAX_BYTES + 2 * answer

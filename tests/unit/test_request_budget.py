"""Bytes of client requests being handled are bounded by queued.max.request.bytes (Kafka's name;
issue 10: produce data buffered, in flight or waiting for the produce buffer is bounded by
configuration): beyond it the broker stops reading client requests until earlier ones finish."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.broker.request_budget import RequestBudget
from diskless.config import load_config
from diskless.protocol import messages as m
from diskless.protocol.client import KafkaClientConnection

FRAME = 300_000  # records bytes per request; its frame is a little larger


def _produce(size: int) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 30000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x" * size}]}],
    }


async def _until(condition: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_client_requests_beyond_the_budget_wait_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diskless.broker.broker import Broker

    config = load_config(
        environ={},
        overrides={
            "node.id": "1",
            "log.dirs": str(tmp_path),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "queued.max.request.bytes": str(1 << 20),
        },
    )
    broker = Broker(config)
    await broker.start()
    started: list[int] = []
    release = asyncio.Event()
    real = broker.apis.handle

    async def handle(header: m.RequestHeader, request: Any) -> Any:
        if header.api_key != m.API_PRODUCE:
            return await real(header, request)
        started.append(header.correlation_id)
        await release.wait()  # a produce request waiting for the produce buffer, say
        return {"responses": [], "throttle_time_ms": 0}

    monkeypatch.setattr(broker.apis, "handle", handle)
    conns = [KafkaClientConnection("127.0.0.1", broker.port, f"c{i}") for i in range(2)]
    try:
        for conn in conns:
            await conn.connect()
        sends = [asyncio.ensure_future(conns[i % 2].request(m.API_PRODUCE, 9, _produce(FRAME))) for i in range(8)]
        budget = broker.server.request_budget
        assert budget is not None
        # 2.4 MB of requests on two connections against a 1 MiB budget: three are handled, the
        # next waits for room and its connection reads nothing more.
        await _until(lambda: budget.waiting >= 1 and len(started) == 3)
        assert budget.held <= 1 << 20
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*sends), 30)
        assert len(answers) == 8 and len(started) == 8
        await _until(lambda: budget.held == 0)
    finally:
        for conn in conns:
            await conn.close()
        await broker.stop()


async def test_broker_connections_are_not_held_back(tmp_path: Path) -> None:
    # Replica fetches and commits must never wait behind client produce requests that wait for
    # them (acks=all): only connections that did not prove the cluster secret are budgeted.
    budget = RequestBudget(100)
    await budget.take(100)
    waiter = asyncio.ensure_future(budget.take(10))
    await asyncio.sleep(0)
    assert not waiter.done() and budget.waiting == 1
    budget.release(100)
    await asyncio.wait_for(waiter, 5)
    assert budget.held == 10


@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 500))
def test_held_bytes_stay_within_the_bound_and_grants_come_in_order(sizes: list[int], bound: int) -> None:
    async def run() -> None:
        budget = RequestBudget(bound)
        order: list[int] = []

        async def one(i: int, size: int) -> None:
            await budget.take(size)
            order.append(i)
            # Over the bound only when a single request larger than it runs alone.
            assert budget.held <= bound or budget.held == size
            await asyncio.sleep(0)
            budget.release(size)

        await asyncio.gather(*(one(i, size) for i, size in enumerate(sizes)))
        assert order == list(range(len(sizes)))
        assert budget.held == 0 and budget.waiting == 0

    asyncio.run(run())

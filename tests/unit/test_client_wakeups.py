"""The inter-broker client hands an answer to its waiter in the loop turn after it is read
(issue 10, commit latency). Every hop of an acks=all commit ends in one (the representative's
CommitBatches answer, a follower's replica fetch answer), and on a busy machine each extra turn
between reading an answer and acting on it is a chance for other work to run first.

A real connection to a local server that never answers by itself: the test resolves the
request's future as the read loop does when the answer's frame arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from loop_turns import turns_until_done

from diskless.protocol import internal
from diskless.protocol.client import ClientError, KafkaClientConnection


@pytest.fixture
async def conn() -> AsyncIterator[KafkaClientConnection]:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads requests, answers nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = KafkaClientConnection("127.0.0.1", port, "test-client")
    await client.connect()
    yield client
    await client.close()
    server.close()
    await server.wait_closed()


async def test_an_answer_reaches_its_waiter_in_the_next_loop_turn(conn: KafkaClientConnection) -> None:
    future = conn.send_internal(internal.INTERNAL_AWAIT_REPLICATED, {"entries": []})
    task = asyncio.ensure_future(conn.wait(future, timeout=5))
    assert await turns_until_done(task, 3) == 3  # parked

    future.set_result({"results": []})  # what _read_loop does with the answer's frame
    turns = await turns_until_done(task)

    assert turns <= 1, f"the waiter resumed {turns} loop turns after its answer was read"
    assert task.result() == {"results": []}
    assert not conn._waiting


async def test_a_wait_still_times_out_and_forgets_the_request(conn: KafkaClientConnection) -> None:
    future = conn.send_internal(internal.INTERNAL_AWAIT_REPLICATED, {"entries": []})
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await conn.wait(future, timeout=0.05)
    assert 0.04 <= time.monotonic() - started < 2
    assert not conn._waiting  # a late answer is dropped by the read loop


async def test_a_cancelled_waiter_forgets_its_request(conn: KafkaClientConnection) -> None:
    future = conn.send_internal(internal.INTERNAL_AWAIT_REPLICATED, {"entries": []})
    task = asyncio.ensure_future(conn.wait(future, timeout=5))
    await turns_until_done(task, 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not conn._waiting


async def test_a_lost_connection_fails_the_waiter(conn: KafkaClientConnection) -> None:
    future = conn.send_internal(internal.INTERNAL_AWAIT_REPLICATED, {"entries": []})
    task = asyncio.ensure_future(conn.wait(future, timeout=5))
    await turns_until_done(task, 2)
    conn._fail_all(ClientError("connection closed by peer"))
    with pytest.raises(ClientError):
        await asyncio.wait_for(task, 1)

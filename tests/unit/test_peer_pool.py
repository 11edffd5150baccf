"""The broker's pool of peer connections (broker/peers.py) while the broker stops: a caller still
running may ask for a connection while the pool closes the others; closing must finish, and no
connection may be opened (and left open) after it began."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from diskless.broker.peers import PeerPool
from diskless.cluster.metadata import BrokerInfo
from diskless.protocol.client import ClientError


@pytest.fixture
async def listener() -> AsyncIterator[tuple[str, int, list[asyncio.StreamWriter]]]:
    """A TCP server that accepts and holds connections (no internal handshake: no credentials)."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        yield host, port, accepted
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_connection_asked_for_while_the_pool_closes(listener: tuple[str, int, list]) -> None:
    host, port, _ = listener
    pool = PeerPool(0, lambda node: BrokerInfo(node, host, port))
    first = await pool.get(1)
    await pool.get(2)

    # While the first connection closes, another caller asks for a new peer connection: before
    # the fix, that changed the dict being iterated and close() raised RuntimeError.
    closing = asyncio.Event()
    asked: list[BaseException | None] = []
    real_close = first.close

    async def slow_close() -> None:
        closing.set()
        try:
            await pool.get(3)
        except ClientError as exc:
            asked.append(exc)
        else:
            asked.append(None)
        await real_close()

    first.close = slow_close  # type: ignore[method-assign]
    await pool.close()

    assert closing.is_set()
    assert len(asked) == 1 and isinstance(asked[0], ClientError), asked  # refused, not opened and left open
    assert pool.connected(1) is None and pool.connected(2) is None and pool.connected(3) is None
    with pytest.raises(ClientError):
        await pool.get(2)

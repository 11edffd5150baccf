"""The Spark side's connection caches (spark/cluster.py ClusterClient, spark/tier_job.py Driver)
while they close: a caller still connecting when ``close()`` runs must not leave a connection
open in a cache nobody will close again (the broker's PeerPool had this race, session 15)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import diskless.spark.cluster as spark_cluster
from diskless.protocol.client import ClientError
from diskless.spark.cluster import ClusterClient, Settings
from diskless.spark.tier_job import Driver, TierJobError, TierSettings

ADDRESS = ("127.0.0.1", 9)


class SlowConnection:
    """Connects once ``go`` is set; remembers whether it was closed."""

    def __init__(self, go: asyncio.Event, connecting: asyncio.Event) -> None:
        self.go, self.connecting = go, connecting
        self.connected = False
        self.closed = False

    async def connect(self, timeout: float) -> None:
        self.connecting.set()
        await self.go.wait()
        self.connected = True

    async def close(self) -> None:
        self.closed = True
        self.connected = False


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> tuple[list[SlowConnection], asyncio.Event, asyncio.Event]:
    made: list[SlowConnection] = []
    go, connecting = asyncio.Event(), asyncio.Event()

    def open_connection(*_args: Any, **_kwargs: Any) -> SlowConnection:
        made.append(SlowConnection(go, connecting))
        return made[-1]

    monkeypatch.setattr(spark_cluster, "open_connection", open_connection)
    return made, go, connecting


async def _close_while_connecting(client: Any, connect: Any, refused: type[Exception], opened: Any) -> None:
    made, go, connecting = opened
    caller = asyncio.ensure_future(connect())
    await connecting.wait()
    await client.close()  # nothing cached yet: the connection is still on its way
    go.set()
    with pytest.raises(refused):
        await caller
    assert len(made) == 1 and made[0].closed  # closed, not cached and left open
    with pytest.raises(refused):
        await connect()  # and no new one once closed
    assert len(made) == 1


async def test_the_cluster_client_closes_a_connection_that_finished_after_close(opened: Any) -> None:
    client = ClusterClient(Settings(bootstrap=(ADDRESS,), secret=b"s"))
    await _close_while_connecting(client, lambda: client._connection(ADDRESS), ClientError, opened)


async def test_the_tier_driver_closes_a_connection_that_finished_after_close(opened: Any) -> None:
    driver = Driver(TierSettings(bootstrap=(ADDRESS,), secret=b"s"))
    await _close_while_connecting(driver, lambda: driver._conn(ADDRESS), TierJobError, opened)

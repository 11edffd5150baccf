"""Connections from this broker to the others, one per peer, reused by every internal caller.

The representative's commits, forwarded admin requests and pointer fetches all go through here,
so each pair of brokers shares one TCP connection per direction (which also keeps the cross-AZ
byte accounting per connection meaningful).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from diskless.cluster.metadata import BrokerInfo
from diskless.protocol import internal
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.security.internal_auth import ClusterSecret


class PeerPool:
    def __init__(
        self,
        node_id: int,
        lookup: Callable[[int], BrokerInfo | None],
        local_host: str | None = None,
        credentials: ClusterSecret | None = None,
    ) -> None:
        self.node_id = node_id
        self.credentials = credentials  # peer connections carry internal requests: they prove the secret
        self.local_host = local_host
        self.lookup = lookup
        self._connections: dict[int, KafkaClientConnection] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._closed = False  # once the broker stops: no new connections (they would be left open)

    def connected(self, node_id: int) -> KafkaClientConnection | None:
        """The live connection to ``node_id`` if there is one (no waiting)."""
        conn = self._connections.get(node_id)
        return conn if conn is not None and conn.connected else None

    async def get(self, node_id: int) -> KafkaClientConnection:
        conn = self.connected(node_id)
        if conn is not None:
            return conn
        lock = self._locks.setdefault(node_id, asyncio.Lock())
        async with lock:
            conn = self.connected(node_id)
            if conn is not None:
                return conn
            if self._closed:
                raise ClientError("the broker is stopping: no new peer connections")
            info = self.lookup(node_id)
            if info is None:
                raise ClientError(f"broker {node_id} is not registered")
            old = self._connections.pop(node_id, None)
            if old is not None:
                await old.close()
            conn = KafkaClientConnection(
                info.host,
                info.port,
                internal.broker_client_id(self.node_id, "peer"),
                local_host=self.local_host,
                credentials=self.credentials,
            )
            try:
                await conn.connect()
            except (OSError, TimeoutError) as exc:
                raise ClientError(f"cannot reach broker {node_id}: {exc}") from exc
            if self._closed:  # closed while this one was connecting
                await conn.close()
                raise ClientError("the broker is stopping: no new peer connections")
            self._connections[node_id] = conn
            return conn

    async def connect_all(self, node_ids: list[int]) -> None:
        for node_id in node_ids:
            if node_id != self.node_id:
                with contextlib.suppress(ClientError):
                    await self.get(node_id)

    async def close(self) -> None:
        # A snapshot: callers still running (a commit, a forwarded request) may reach ``get``
        # while each connection closes.
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            await conn.close()

"""A small asyncio Kafka protocol client used broker-to-broker (replica fetching, forwarding).

Requests are plain dicts fitted to the chosen version by ``messages.build``; responses come back
as kio entities. Requests are pipelined on one connection and matched by correlation id.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import io
import os
import struct
from collections.abc import Callable
from typing import Any

from kio.serial import entity_reader, entity_writer

from diskless.aio import cancel_and_wait
from diskless.security.internal_auth import NONCE_BYTES, ClusterSecret, client_proof, server_proof

from . import internal
from . import messages as m
from .framing import FrameDecoder, encode_frame

_HEADER = struct.Struct(">hhi")
_NULL_CLIENT_ID = struct.pack(">h", -1)


class ClientError(Exception):
    pass


class KafkaClientConnection:
    def __init__(
        self,
        host: str,
        port: int,
        client_id: str,
        max_frame_bytes: int = 200 * 1024 * 1024,
        local_host: str | None = None,
        credentials: ClusterSecret | None = None,
    ) -> None:
        self.host = host
        # With credentials the connection proves the cluster secret before anything else, which
        # internal requests (and replica fetches) need (security/internal_auth.py).
        self.credentials = credentials
        self.local_host = local_host  # bind here so peers see which AZ a connection comes from
        self.port = port
        self.client_id = client_id
        self._max = max_frame_bytes
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._next_correlation = 0
        self._waiting: dict[int, tuple[asyncio.Future[Any], Any]] = {}
        self._read_task: asyncio.Task[None] | None = None
        # The optional internal APIs the server answers, with the highest version of each
        # (``internal.SERVED_APIS``), learnt at the authentication; none without it.
        self.served_apis: dict[int, int] = {}

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self, timeout: float = 5.0) -> None:
        local = (self.local_host, 0) if self.local_host else None
        tls = self.credentials.tls if self.credentials is not None else None
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(
                self.host, self.port, local_addr=local, ssl=tls, server_hostname=self.host if tls else None
            ),
            timeout,
        )
        self._read_task = asyncio.create_task(self._read_loop())
        self.served_apis = {}  # a server reached again may be another version
        if self.credentials is not None:
            try:
                await self._authenticate(timeout)
            except BaseException:
                await self.close()
                raise

    async def _authenticate(self, timeout: float) -> None:
        """The internal handshake: prove the cluster secret, and check the server knows it too."""
        assert self.credentials is not None
        secret = self.credentials.value
        if secret is None:
            raise ClientError("internal authentication: the cluster secret is not known yet")
        challenge = await self.wait(self.send_internal(internal.INTERNAL_AUTH_CHALLENGE, {}), timeout)
        server_nonce = challenge.get("nonce")
        if challenge.get("error_code") or not isinstance(server_nonce, bytes):
            raise ClientError(f"internal authentication refused by the server: {challenge.get('error_code')}")
        served = challenge.get(internal.SERVED_APIS)
        if isinstance(served, dict):
            self.served_apis = {k: v for k, v in served.items() if isinstance(k, int) and isinstance(v, int)}
        client_nonce = os.urandom(NONCE_BYTES)
        proof = client_proof(secret, server_nonce, client_nonce, self.client_id)
        body = {"nonce": client_nonce, "proof": proof}
        answer = await self.wait(self.send_internal(internal.INTERNAL_AUTH_PROVE, body), timeout)
        expected = server_proof(secret, server_nonce, client_nonce, self.client_id)
        theirs = answer.get("proof")
        if answer.get("error_code") or not isinstance(theirs, bytes) or not hmac.compare_digest(theirs, expected):
            raise ClientError(f"internal authentication failed (error {answer.get('error_code')})")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        await cancel_and_wait(self._read_task)
        self._fail_all(ClientError("connection closed"))
        self._writer = None

    def _fail_all(self, exc: Exception) -> None:
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(exc)
        self._waiting.clear()

    def _send(
        self, api_key: int, version: int, flexible: bool, body: bytes, decode: Any, named: bool = True
    ) -> asyncio.Future[Any]:
        """Write one request now (so request order on the wire is call order); returns its future.
        Not ``named``: the header's client id is null."""
        if not self.connected:
            raise ClientError("not connected")
        assert self._writer is not None
        self._next_correlation = (self._next_correlation + 1) & 0x7FFFFFFF
        correlation = self._next_correlation
        if named:
            client_id = self.client_id.encode()
            header = _HEADER.pack(api_key, version, correlation) + struct.pack(">h", len(client_id)) + client_id
        else:
            header = _HEADER.pack(api_key, version, correlation) + _NULL_CLIENT_ID
        if flexible:
            header += b"\x00"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[correlation] = (future, decode)
        self._writer.write(encode_frame(header + body))
        return future

    async def _await(self, future: asyncio.Future[Any], timeout: float) -> Any:
        """The answer of the request ``future`` stands for, awaited directly: it resumes the caller
        in the loop turn after the read loop sets it (wait_for over a shield took three turns, paid
        on every hop of an acks=all commit). Each request's future has this one waiter, so a timeout
        fails it outright and a cancelled caller cancels it; a late answer finds it forgotten."""
        assert self._writer is not None
        await self._writer.drain()
        timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            for correlation, (waiting, _) in list(self._waiting.items()):
                if waiting is future:
                    self._waiting.pop(correlation, None)

    async def request(self, api_key: int, version: int, body: Any, timeout: float = 30.0) -> Any:
        """Send ``body`` (a dict, or the request entity already built) and await the decoded answer."""
        # Cached: kio's loaders resolve a module path on every call (~40 us a pair), once per fetch round.
        request_cls = m._request_type(api_key, version)
        response_cls = m._response_type(api_key, version)
        out = io.BytesIO()
        # Replica fetchers pass entities they keep between fetches (replication/fetcher.py).
        entity = body if isinstance(body, request_cls) else m.build(request_cls, body)
        entity_writer(request_cls)(out, entity)
        skip = 5 if response_cls.__flexible__ and api_key != m.API_API_VERSIONS else 4

        def decode(frame: bytes) -> Any:
            return entity_reader(response_cls)(memoryview(frame)[skip:], 0)[0]

        future = self._send(api_key, version, bool(request_cls.__flexible__), out.getvalue(), decode)
        return await self._await(future, timeout)

    async def request_unnamed(
        self, api_key: int, body: bytes, decode: Callable[[memoryview], Any], timeout: float = 30.0, version: int = 0
    ) -> Any:
        """Send an internal request of ``body``'s bytes with no client id (the server knows this
        connection's from its authentication) and await ``decode`` of the answer after its
        correlation id."""
        future = self._send(api_key, version, False, body, lambda frame: decode(memoryview(frame)[4:]), named=False)
        return await self._await(future, timeout)

    def send_internal(self, api_key: int, body: dict[str, Any]) -> asyncio.Future[Any]:
        """Write an internal (msgpack) request now; await ``wait`` on the returned future."""
        request = internal.pack_request(api_key, body)
        return self._send(api_key, 0, False, request, lambda frame: internal.unpack_response(memoryview(frame)[4:]))

    async def wait(self, future: asyncio.Future[Any], timeout: float = 30.0) -> Any:
        return await self._await(future, timeout)

    async def _read_loop(self) -> None:
        assert self._reader is not None
        decoder = FrameDecoder(self._max)
        try:
            while True:
                data = await self._reader.read(262144)
                if not data:
                    raise ClientError("connection closed by peer")
                decoder.feed(data)
                for frame in decoder.frames():
                    (correlation,) = struct.unpack_from(">i", frame, 0)
                    waiting = self._waiting.get(correlation)
                    if waiting is None:
                        continue
                    future, decode = waiting
                    if not future.done():
                        try:
                            future.set_result(decode(frame))
                        except Exception as exc:
                            future.set_exception(ClientError(f"undecodable response: {exc}"))
        except Exception as exc:  # connection lost or garbage: fail every waiter
            self._fail_all(exc if isinstance(exc, ClientError) else ClientError(str(exc)))
            if self._writer is not None:
                self._writer.close()


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())

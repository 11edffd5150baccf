"""A fault-injecting HTTP proxy in front of an S3 server, for chaos runs and tests.

Brokers and the WAL manager point ``diskless.s3.endpoint`` at the proxy. For each request a
seeded ``FaultInjector`` (sans-IO) decides: forward it untouched, answer 500 (InternalError) or
503 (SlowDown) without forwarding, forward it and *then* answer 500 (``ambiguous``: the write
happened but the client is told it failed, as a real S3 front end can), reset the connection
(RST, no answer), or forward it after a delay. ``pause`` holds every new request until
``resume`` (an unreachable S3, without stopping the server). The same seed gives the same
sequence of decisions; which request gets which decision depends on arrival order.

Each client connection carries one request: the proxy answers with ``Connection: close`` and
forwards the upstream answer byte for byte until the upstream closes, so it never has to
understand response framing (chunked, HEAD, ranges). S3 clients reconnect transparently.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import structlog

log = structlog.get_logger(__name__)

MAX_HEAD_BYTES = 64 * 1024
FAULT_KINDS = ("error_500", "error_503", "ambiguous", "reset", "slow")


@dataclass(frozen=True)
class FaultRates:
    """Fractions of requests (each in [0, 1], summing to at most 1) that get each fault."""

    error_500: float = 0.0
    error_503: float = 0.0
    ambiguous: float = 0.0  # forwarded, then answered 500
    reset: float = 0.0
    slow: float = 0.0
    slow_s: float = 1.0

    def __post_init__(self) -> None:
        shares = [getattr(self, kind) for kind in FAULT_KINDS]
        if any(not 0.0 <= share <= 1.0 for share in shares) or sum(shares) > 1.0 + 1e-9:
            raise ValueError(f"fault rates must be fractions summing to at most 1: {self}")


@dataclass(frozen=True)
class Decision:
    kind: str  # "none" or one of FAULT_KINDS
    delay_s: float = 0.0


class FaultInjector:
    """Seeded decisions, one per request, in request order."""

    def __init__(self, rates: FaultRates, seed: int) -> None:
        self.rates = rates
        self._random = random.Random(seed)

    def decide(self) -> Decision:
        draw = self._random.random()
        for kind in FAULT_KINDS:
            share = getattr(self.rates, kind)
            if draw < share:
                return Decision(kind, self.rates.slow_s if kind == "slow" else 0.0)
            draw -= share
        return Decision("none")


_ERRORS = {
    500: ("Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    503: ("Slow Down", "SlowDown", "Please reduce your request rate."),
}


def _error_response(status: int) -> bytes:
    reason, code, message = _ERRORS[status]
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body.encode()


@dataclass
class S3FaultProxy:
    """The proxy, run on its own event loop thread so synchronous code (a chaos run) can drive it."""

    upstream: str  # http://host:port of the real S3 server
    seed: int = 0
    rates: FaultRates = field(default_factory=FaultRates)
    host: str = "127.0.0.1"
    port: int = 0
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._injector = FaultInjector(self.rates, self.seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._open = threading.Event()
        self._open.set()
        self._resumed: asyncio.Event | None = None
        # Decisions for the next requests (of one HTTP method, or any), taken before the rates.
        self._scripted: deque[tuple[bytes | None, Decision]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        for key in ("requests", "forwarded", "held", "error", "upstream_error", *FAULT_KINDS):
            self.stats.setdefault(key, 0)
        parts = urlsplit(self.upstream)
        self._up_host = parts.hostname or "127.0.0.1"
        self._up_port = parts.port or 80

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- control (any thread) --------------------------------------------------------------------

    def start(self) -> S3FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self.resume()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def set_rates(self, rates: FaultRates, seed: int | None = None) -> None:
        """New fault rates from now on (the seeded sequence continues unless a seed is given)."""
        injector = FaultInjector(rates, self.seed if seed is None else seed)
        if seed is None:
            injector._random = self._injector._random
        self.rates = rates
        self._injector = injector

    def delay_next(self, seconds: float, count: int = 1, method: str | None = None) -> None:
        """The next ``count`` requests to arrive (of ``method`` only, if given) are held ``seconds``
        before being forwarded, whatever the rates say (one slow PUT among fast ones, as a hedging
        test needs)."""
        prefix = None if method is None else method.upper().encode() + b" "
        self._scripted.extend((prefix, Decision("slow", seconds)) for _ in range(count))

    def pause(self) -> None:
        """Hold every new request (and those not yet forwarded) until ``resume``."""
        self._open.clear()
        if self._loop is not None and self._resumed is not None:
            self._loop.call_soon_threadsafe(self._resumed.clear)

    def resume(self) -> None:
        self._open.set()
        if self._loop is not None and self._resumed is not None:
            self._loop.call_soon_threadsafe(self._resumed.set)

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    # --- the proxy (its own loop) ----------------------------------------------------------------

    async def _listen(self) -> None:
        self._resumed = asyncio.Event()
        if self._open.is_set():
            self._resumed.set()
        self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio holds connection tasks weakly: one waiting on a dead peer could be collected.
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            request = await _read_request(reader, writer)
            if request is None:
                return
            self.stats["requests"] += 1
            assert self._resumed is not None
            if not self._resumed.is_set():
                self.stats["held"] += 1
                await self._resumed.wait()
            decision = self._scripted_for(request) or self._injector.decide()
            if decision.kind != "none":
                self.stats[decision.kind] += 1
            if decision.kind in ("error_500", "error_503"):
                writer.write(_error_response(500 if decision.kind == "error_500" else 503))
                await writer.drain()
                return
            if decision.kind == "reset":
                _reset(writer)
                return
            if decision.kind == "slow":
                await asyncio.sleep(decision.delay_s)
            await self._forward(request, writer, ambiguous=decision.kind == "ambiguous")
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            self.stats["error"] += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _scripted_for(self, request: bytes) -> Decision | None:
        """The first scripted decision whose method ``request`` has, taken off the script."""
        for index, (prefix, decision) in enumerate(self._scripted):
            if prefix is None or request.startswith(prefix):
                del self._scripted[index]
                return decision
        return None

    async def _forward(self, request: bytes, writer: asyncio.StreamWriter, ambiguous: bool) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self._up_host, self._up_port)
        except OSError:
            # As a load balancer does when the server behind it is gone.
            self.stats["upstream_error"] += 1
            writer.write(_error_response(503))
            await writer.drain()
            return
        try:
            up_writer.write(request)
            await up_writer.drain()
            if ambiguous:
                # Let the server finish the request, then lie about its outcome.
                while await up_reader.read(65536):
                    pass
                writer.write(_error_response(500))
                await writer.drain()
                return
            self.stats["forwarded"] += 1
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0): what a crashed or overloaded front end looks like."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
    """One whole HTTP/1.1 request as bytes, rewritten to ``Connection: close``; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError as exc:
        raise ValueError("request head too long") from exc
    if len(head) > MAX_HEAD_BYTES:
        raise ValueError("request head too long")
    lines = head[:-4].split(b"\r\n")
    hop = (b"connection:", b"keep-alive:", b"expect:")
    headers = [line for line in lines[1:] if not line.lower().startswith(hop)]
    names = {line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip() for line in headers}
    if any(line.lower().replace(b" ", b"") == b"expect:100-continue" for line in lines[1:]):
        # The proxy takes the whole body before deciding anything; the client need not wait for
        # the server's go-ahead (botocore would wait a second for it on every PUT).
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = b""
    if b"chunked" in names.get(b"transfer-encoding", b"").lower():
        body = await _read_chunked(reader)
    elif b"content-length" in names:
        length = int(names[b"content-length"])
        if length < 0:
            raise ValueError("negative content-length")
        body = await reader.readexactly(length)
    out = b"\r\n".join([lines[0], *headers, b"Connection: close"]) + b"\r\n\r\n"
    return out + body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, kept in its chunked form (forwarded as it came)."""
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        parts.append(size_line)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers, up to the empty line
                line = await reader.readuntil(b"\r\n")
                parts.append(line)
                if line == b"\r\n":
                    return b"".join(parts)
        parts.append(await reader.readexactly(size + 2))

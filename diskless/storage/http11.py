"""The small HTTP/1.1 client the object store speaks S3 with: a sans-IO response parser, one asyncio
protocol per connection, and a keep-alive pool of them. No threads.

Why not a general client: a WAL upload is one request on an idle kept-alive connection, and its cost
is per-request overhead. Measured against ``weed mini`` on this 2-core box (load average ~27), aiohttp
spent 350-460 us of CPU and 4-8 ms of wall time per small GET in its request machinery; this client
spends 50-90 us and 1-2 ms. It does only what S3 needs: one request at a time per connection (no
pipelining), bodies framed by Content-Length, chunked encoding or connection close, HEAD answers,
interim 1xx answers skipped, ``Connection: close`` honoured, TLS through ``ssl``.

Failure semantics, which ``ObjectStore`` maps onto its retry classification:

- a connection the server closed (or reset) before any byte of the answer raises
  ``ConnectionClosedWithoutAnswer``. On a reused keep-alive connection that is the ordinary race with
  the server's idle timeout, so the pool sends the request once more on a new connection; S3 requests
  are idempotent (a PUT of the same bytes, a DeleteObjects of the same keys), so a request that did
  reach the server and lost only its answer is safe to send again;
- an answer cut short or malformed raises ``HttpProtocolError``; other socket errors propagate as the
  ``OSError`` they are; silence for ``read_timeout`` seconds (no answer byte, no upload progress) and a
  connection not made within ``connect_timeout`` raise ``TimeoutError``;
- a cancelled request aborts its connection: half an answer is never left on a pooled connection.

Hosts given by name are resolved by asyncio (``getaddrinfo`` in its default executor) when a new
connection is made, i.e. rarely, since connections are kept alive; IP literals need no resolution.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import NamedTuple, cast

__all__ = [
    "Answer",
    "ConnectionClosedWithoutAnswer",
    "HttpPool",
    "HttpProtocolError",
    "ResponseParser",
    "request_head",
]

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 4 * 1024
# A body up to this size goes out in the same write (one segment, one syscall) as the request head.
SINGLE_WRITE_BYTES = 64 * 1024
# Idle connections older than this are closed rather than reused: servers time idle connections out
# (AWS after about 20 s), and a request sent as the server closes costs a resend.
IDLE_TIMEOUT_S = 10.0


class HttpProtocolError(Exception):
    """The answer broke HTTP/1.1 framing, or the connection closed in the middle of it."""


class ConnectionClosedWithoutAnswer(ConnectionError):
    """The connection closed or was reset before the first byte of the answer arrived."""


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    body: bytes


_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ResponseParser:
    """Sans-IO parser of one HTTP/1.1 answer: ``feed`` bytes as they arrive, ``eof`` when the peer
    closes; ``done`` once the answer (``status``, ``headers``, ``body``, ``keep_alive``) is complete."""

    def __init__(self, *, head: bool) -> None:
        self._head_request = head  # an answer to HEAD has no body whatever its Content-Length says
        self._buf = bytearray()
        self._state = _HEAD
        self._remaining = 0
        self._parts: list[bytes] = []
        self.started = False
        self.done = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.body = b""

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.started = True
        if self._state == _BODY and not self._buf:
            # The common case for object bodies: no copy into the buffer, one join at the end.
            take = min(self._remaining, len(data))
            self._parts.append(data if take == len(data) else data[:take])
            self._remaining -= take
            if self._remaining == 0:
                self._finish()
            data = data[take:]
            if not data:
                return
        self._buf += data
        self._advance()

    def eof(self) -> None:
        """The peer closed the connection."""
        if self._state == _UNTIL_CLOSE:
            self._parts.append(bytes(self._buf))
            self._buf.clear()
            self._finish()
        elif self._state != _DONE:
            if not self.started:
                raise ConnectionClosedWithoutAnswer("connection closed before any answer")
            raise HttpProtocolError("connection closed before the answer was complete")

    def _finish(self) -> None:
        self.body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts = []
        self._state = _DONE
        self.done = True

    def _advance(self) -> None:
        buf = self._buf
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0 or end > MAX_HEAD_BYTES:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise HttpProtocolError("answer head too large")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._parse_head(head)
            elif state == _BODY:
                if not self._take_body(buf):
                    return
                self._finish()
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_CHUNK_LINE_BYTES:
                        raise HttpProtocolError("chunk size line too long")
                    return
                size = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 2]
                if not size or size.strip(b"0123456789abcdefABCDEF"):
                    raise HttpProtocolError(f"bad chunk size {size!r}")
                self._remaining = int(size, 16)
                self._state = _CHUNK_DATA if self._remaining else _TRAILERS
            elif state == _CHUNK_DATA:
                if not self._take_body(buf):
                    return
                self._state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise HttpProtocolError("chunk not followed by CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise HttpProtocolError("trailers too large")
                    return
                del buf[: end + 2]
                if end == 0:  # the empty line after the (ignored) trailers
                    self._finish()
            elif state == _UNTIL_CLOSE:
                self._parts.append(bytes(buf))
                buf.clear()
                return
            else:  # _DONE
                if buf:
                    # Only one request is ever outstanding, so nothing may follow its answer.
                    raise HttpProtocolError("bytes after the end of the answer")
                return

    def _take_body(self, buf: bytearray) -> bool:
        """Move body bytes (of a Content-Length body or of one chunk) out of ``buf``; True once
        all ``_remaining`` of them have arrived."""
        take = min(self._remaining, len(buf))
        if take:
            self._parts.append(bytes(buf[:take]))
            del buf[:take]
            self._remaining -= take
        return not self._remaining

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not (parts[1].isdigit() and len(parts[1]) == 3):
            raise HttpProtocolError(f"bad status line {lines[0][:100]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise HttpProtocolError(f"bad header line {line[:100]!r}")
            key = name.decode("latin-1").lower()
            text = value.strip().decode("latin-1")
            if key in headers:
                if key == "content-length" and headers[key] != text:
                    raise HttpProtocolError("conflicting Content-Length headers")
                if key != "content-length":
                    headers[key] = f"{headers[key]}, {text}"
            else:
                headers[key] = text
        if 100 <= status < 200:
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        self.status = status
        self.headers = headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.keep_alive = "keep-alive" in tokens if parts[0] == b"HTTP/1.0" else "close" not in tokens
        if self._head_request or status in (204, 304):
            self._finish()
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise HttpProtocolError(f"bad Content-Length {length!r}")
            self._remaining = int(length)
            if self._remaining:
                self._state = _BODY
            else:
                self._finish()
        else:
            self._state = _UNTIL_CLOSE
            self.keep_alive = False


def request_head(method: str, target: str, headers: dict[str, str], content_length: int | None) -> bytes:
    """The request line and headers; ``content_length`` None sends no Content-Length (no body)."""
    lines = [f"{method} {target} HTTP/1.1\r\n"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent")
        lines.append(f"{name}: {value}\r\n")
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("ascii")


class _Connection(asyncio.Protocol):
    """One connection; at most one request in flight on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self._loop = loop
        self._read_timeout = read_timeout
        self._transport: asyncio.Transport | None = None
        self._parser: ResponseParser | None = None
        self._waiter: asyncio.Future[Answer] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes of the request still in the transport's buffer when the timer was armed
        self.closed = False
        self.answers = 0
        self.idle_since = 0.0

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport by construction (create_connection); uvloop's do not subclass asyncio's.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted
            return
        try:
            parser.feed(data)
        except HttpProtocolError as exc:
            self._fail(exc)
            return
        if parser.done:
            self._complete(parser)
        else:
            self._arm_timer()

    def eof_received(self) -> bool:
        parser = self._parser
        self.closed = True
        if parser is not None:
            try:
                parser.eof()
            except (HttpProtocolError, ConnectionClosedWithoutAnswer) as exc:
                self._fail(exc)
                return False
            if parser.done:
                self._complete(parser)
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            parser = self._parser
            if parser is not None and parser.started:
                error: Exception = HttpProtocolError(f"connection lost in the middle of the answer: {exc!r}")
            else:
                error = ConnectionClosedWithoutAnswer(f"connection lost before any answer: {exc!r}")
            waiter.set_exception(error)

    # -- helpers

    def _complete(self, parser: ResponseParser) -> None:
        self._cancel_timer()
        self._parser = None
        self.answers += 1
        if not parser.keep_alive:
            self.close()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(Answer(parser.status, parser.headers, parser.body))

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.abort()

    def _timed_out(self) -> None:
        self._timer = None
        if self._transport is not None and self._transport.get_write_buffer_size() < self._unsent:
            # The server took more of a large body meanwhile: slow, not silent. (resume_writing would
            # only tell once the buffer is nearly empty.) One that stops reading lets the timer fire.
            self._arm_timer()
            return
        self._fail(TimeoutError(f"no answer for {self._read_timeout} s"))

    def _arm_timer(self) -> None:
        self._cancel_timer()
        self._unsent = self._transport.get_write_buffer_size() if self._transport is not None else 0
        self._timer = self._loop.call_later(self._read_timeout, self._timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self._transport is not None:
            self._transport.abort()

    async def exchange(self, head: bytes, body: bytes | None, head_request: bool) -> Answer:
        assert self._transport is not None and self._waiter is None
        self._parser = ResponseParser(head=head_request)
        self._waiter = self._loop.create_future()
        try:
            if body and len(body) > SINGLE_WRITE_BYTES:
                self._transport.write(head)
                self._transport.write(body)
            else:
                self._transport.write(head + body if body else head)
            self._arm_timer()
            return await self._waiter
        except BaseException:
            # Cancelled, timed out or failed: whatever is left of the answer must not reach the next
            # request, so the connection goes.
            self.abort()
            raise
        finally:
            self._waiter = None
            self._parser = None


class HttpPool:
    """Keep-alive connections to one server, for one event loop; the caller bounds the concurrency."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float,
        read_timeout: float,
        max_idle: int,
    ) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl_context
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self.connections_made = 0

    async def request(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> Answer:
        """Send one request and read its whole answer (``body`` None: no body, no Content-Length)."""
        head = request_head(method, target, headers, None if body is None else len(body))
        head_request = method == "HEAD"
        reused = self._take_idle()
        if reused is not None:
            try:
                return await self._exchange(reused, head, body, head_request)
            except ConnectionClosedWithoutAnswer:
                pass  # the server closed the idle connection as we reused it: once more on a new one
        return await self._exchange(await self._connect(), head, body, head_request)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def _exchange(self, connection: _Connection, head: bytes, body: bytes | None, head_request: bool) -> Answer:
        answer = await connection.exchange(head, body, head_request)
        if not connection.closed and len(self._idle) < self._max_idle:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    def _take_idle(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            connection = self._idle.pop()  # the most recently used: the least likely to be timed out
            if not connection.closed and now - connection.idle_since < IDLE_TIMEOUT_S:
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop, self._read_timeout),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise TimeoutError(f"no connection to {self.host}:{self.port} within {self._connect_timeout} s") from None
        self.connections_made += 1
        return connection

"""The object store's HTTP/1.1 client: the sans-IO response parser (framing by Content-Length, chunked,
HEAD, until-close; interim 1xx answers; keep-alive; malformed input) and the asyncio pool against tiny
local servers (keep-alive reuse, a connection the server closed while idle, timeouts, cancellation)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.storage.http11 import (
    ConnectionClosedWithoutAnswer,
    HttpPool,
    HttpProtocolError,
    ResponseParser,
    request_head,
)


def parse(data: bytes, *, head: bool = False, split: int = 0) -> ResponseParser:
    parser = ResponseParser(head=head)
    chunks = [data] if not split else [data[i : i + split] for i in range(0, len(data), split)]
    for chunk in chunks:
        parser.feed(chunk)
    return parser


def test_content_length_body() -> None:
    p = parse(b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: "x"\r\n\r\nhello')
    assert (p.done, p.status, p.body, p.keep_alive) == (True, 200, b"hello", True)
    assert p.headers["etag"] == '"x"' and p.headers["content-length"] == "5"


def test_chunked_body_with_extensions_and_trailers() -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n"
    )
    for split in (0, 1, 3, 7):
        p = parse(data, split=split)
        assert (p.done, p.body, p.keep_alive) == (True, b"hello world", True)


def test_head_and_no_body_statuses_ignore_content_length() -> None:
    p = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", head=True)
    assert (p.done, p.body, p.headers["content-length"]) == (True, b"", "1234")
    assert parse(b"HTTP/1.1 204 No Content\r\n\r\n").done
    assert parse(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n").body == b""


def test_interim_answers_are_skipped() -> None:
    p = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", split=4)
    assert (p.done, p.status, p.body) == (True, 200, b"ok")


def test_until_close_body_ends_at_eof_and_is_not_kept_alive() -> None:
    p = parse(b"HTTP/1.1 200 OK\r\n\r\npart one, ")
    p.feed(b"part two")
    assert not p.done
    p.eof()
    assert (p.done, p.body, p.keep_alive) == (True, b"part one, part two", False)


def test_connection_close_and_http10_are_not_kept_alive() -> None:
    assert not parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").keep_alive
    assert not parse(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive
    assert parse(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n").keep_alive


def test_short_body_at_eof_is_an_error() -> None:
    p = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
    with pytest.raises(HttpProtocolError):
        p.eof()
    p = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
    with pytest.raises(HttpProtocolError):
        p.eof()
    with pytest.raises(ConnectionClosedWithoutAnswer):
        ResponseParser(head=False).eof()  # closed before any answer: the pool may resend on a new connection


@pytest.mark.parametrize(
    "data",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab",  # bytes after the answer: nothing was asked
    ],
)
def test_malformed_answers(data: bytes) -> None:
    with pytest.raises(HttpProtocolError):
        parse(data)


def test_oversized_head_is_an_error() -> None:
    with pytest.raises(HttpProtocolError):
        parse(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 70_000)


@given(st.binary(max_size=3000), st.integers(1, 50), st.booleans())
def test_any_body_any_split(body: bytes, split: int, chunked: bool) -> None:
    if chunked:
        pieces = [body[i : i + 700] for i in range(0, len(body), 700)]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        data = b"HTTP/1.1 206 Partial\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
    else:
        data = b"HTTP/1.1 206 Partial\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    p = parse(data, split=split)
    assert (p.done, p.status, p.body) == (True, 206, body)


def test_request_head() -> None:
    head = request_head("PUT", "/b/k%20x", {"Host": "h:1", "x-amz-date": "d"}, 3)
    assert head == b"PUT /b/k%20x HTTP/1.1\r\nHost: h:1\r\nx-amz-date: d\r\nContent-Length: 3\r\n\r\n"
    assert request_head("GET", "/", {"Host": "h"}, None) == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    with pytest.raises(ValueError):
        request_head("GET", "/", {"Host": "h\r\nInjected: 1"}, None)


# -- the pool against local servers -----------------------------------------------------------------


class Server:
    """An asyncio server answering each request by a script: ``answers`` pops one raw reply per request
    (None: close the connection without answering; "hang": never answer)."""

    def __init__(self, answers: list[bytes | str | None]) -> None:
        self.answers = answers
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                answer = self.answers.pop(0)
                if answer is None:
                    writer.close()
                    return
                if answer == "hang":
                    await asyncio.sleep(3600)
                assert isinstance(answer, bytes)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def pool_for(server: Server, **kwargs: float) -> HttpPool:
    return HttpPool("127.0.0.1", server.port, None, kwargs.get("connect", 2.0), kwargs.get("read", 2.0), 4)


async def test_pool_reuses_a_kept_alive_connection() -> None:
    async with Server([OK, OK, OK]) as server:
        pool = pool_for(server)
        for _ in range(3):
            answer = await pool.request("GET", "/x", {"Host": "h"}, None)
            assert (answer.status, answer.body) == (200, b"ok")
        assert server.connections == 1
        await pool.close()


async def test_pool_sends_the_body() -> None:
    async with Server([OK, OK]) as server:
        pool = pool_for(server)
        await pool.request("PUT", "/k", {"Host": "h"}, b"payload")
        await pool.request("PUT", "/k", {"Host": "h"}, memoryview(b"payload"))  # type: ignore[arg-type]
        assert server.requests == [b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 7\r\n\r\npayload"] * 2
        await pool.close()


async def test_a_connection_closed_while_idle_is_replaced_without_an_error() -> None:
    # The server closes the kept-alive connection instead of answering the second request: the pool
    # resends it once on a new connection (the request never reached a handler that answered).
    async with Server([OK, None, OK]) as server:
        pool = pool_for(server)
        assert (await pool.request("GET", "/a", {"Host": "h"}, None)).body == b"ok"
        assert (await pool.request("GET", "/b", {"Host": "h"}, None)).body == b"ok"
        assert server.connections == 2 and len(server.requests) == 3
        await pool.close()


async def test_a_fresh_connection_closed_without_answer_is_an_error() -> None:
    async with Server([None]) as server:
        pool = pool_for(server)
        with pytest.raises(ConnectionError):
            await pool.request("GET", "/a", {"Host": "h"}, None)
        await pool.close()


async def test_read_timeout() -> None:
    async with Server(["hang"]) as server:
        pool = pool_for(server, read=0.2)
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/a", {"Host": "h"}, None)
        await pool.close()


async def test_connect_refused() -> None:
    async with Server([]) as server:
        port = server.port
    pool = HttpPool("127.0.0.1", port, None, 2.0, 2.0, 4)
    with pytest.raises(ConnectionError):
        await pool.request("GET", "/a", {"Host": "h"}, None)
    await pool.close()


async def test_cancelled_request_does_not_leave_its_connection_in_the_pool() -> None:
    async with Server(["hang", OK]) as server:
        pool = pool_for(server)
        task = asyncio.create_task(pool.request("GET", "/slow", {"Host": "h"}, None))
        while not server.requests:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await pool.request("GET", "/fast", {"Host": "h"}, None)).body == b"ok"
        assert server.connections == 2
        await pool.close()


class FakeTransport(asyncio.Transport):
    """A transport whose unsent-bytes count the test sets, standing for a body draining slowly."""

    def __init__(self) -> None:
        super().__init__()
        self.unsent = 0
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.unsent += len(data)

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


async def test_a_draining_upload_is_progress_and_a_stalled_one_times_out() -> None:
    """The read timeout measures silence: while the server keeps taking the body (the transport's
    buffer shrinks) it does not fire; once the buffer stops shrinking it does."""
    from diskless.storage.http11 import _Connection

    loop = asyncio.get_running_loop()
    connection = _Connection(loop, read_timeout=0.2)
    transport = FakeTransport()
    connection.connection_made(transport)
    request = asyncio.create_task(connection.exchange(b"PUT / HTTP/1.1\r\n\r\n", bytes(1_000_000), False))
    await asyncio.sleep(0)
    for _ in range(10):  # 0.5 s of slow progress: more than twice the timeout
        await asyncio.sleep(0.05)
        transport.unsent -= 50_000
    assert not request.done()
    transport.unsent = 0
    connection.data_received(OK)
    assert (await request).body == b"ok"

    stalled = asyncio.create_task(connection.exchange(b"PUT / HTTP/1.1\r\n\r\n", bytes(1_000_000), False))
    await asyncio.sleep(0.05)
    transport.unsent -= 1_000  # a little progress, then none
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stalled, 5)
    assert transport.aborted

"""``ObjectStore`` against a real SeaweedFS (``weed mini``) started by ``diskless.local.servers.S3Server``.

One server serves the module; each test works under its own key prefix. The retry tests use an
address where nothing listens, a tiny HTTP server that always answers 503, and (once) a second
SeaweedFS that is stopped and restarted while a request is retrying.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from diskless.local.servers import S3Server, free_port
from diskless.storage.object_store import (
    InvalidRange,
    NoSuchKey,
    ObjectStore,
    S3ConnectionError,
    S3Error,
    is_retriable,
)

pytestmark = pytest.mark.integration

BUCKET = "diskless-test"
MiB = 1024 * 1024


def processes_using(path: Path) -> list[str]:
    """PIDs of processes whose command line mentions ``path`` (our server's data dir)."""
    result = subprocess.run(["pgrep", "-f", str(path)], capture_output=True, text=True, check=False)
    return [pid for pid in result.stdout.split() if pid != str(os.getpid())]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    data_dir = tmp_path_factory.mktemp("object-store") / "s3"
    server = S3Server(data_dir).start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()
        assert processes_using(data_dir) == [], "the S3 server outlived its fixture"


def make_store(server: S3Server, **kwargs: object) -> ObjectStore:
    return ObjectStore(server.endpoint, BUCKET, server.access_key, server.secret_key, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def store(s3: S3Server) -> AsyncIterator[ObjectStore]:
    async with make_store(s3) as object_store:
        yield object_store


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}/"


async def test_put_get_head(store: ObjectStore, prefix: str) -> None:
    body = os.urandom(MiB + 7)
    await store.put(prefix + "big", body)
    await store.put(prefix + "empty", b"")
    assert await store.get(prefix + "big") == body
    assert await store.get(prefix + "empty") == b""
    assert await store.head(prefix + "big") == len(body)
    assert await store.head(prefix + "empty") == 0
    assert await store.head(prefix + "missing") is None
    # Overwrite replaces.
    await store.put(prefix + "big", b"small")
    assert await store.get(prefix + "big") == b"small"
    assert store.stats.puts == 3 and store.stats.gets == 3 and store.stats.heads == 3
    assert store.stats.put_bytes == len(body) + 5
    assert store.stats.get_bytes == len(body) + 5
    assert store.stats.retries == 0 and store.stats.failures == 0


async def test_get_range_edges(store: ObjectStore, prefix: str) -> None:
    body = bytes(range(256)) * 40  # 10240 bytes
    key = prefix + "obj"
    await store.put(key, body)
    assert await store.get_range(key, 0, 0) == body[:1]
    assert await store.get_range(key, 0, len(body) - 1) == body
    assert await store.get_range(key, len(body) - 1, len(body) - 1) == body[-1:]
    assert await store.get_range(key, 1000, 4999) == body[1000:5000]
    # Past the end: cut at the end, as HTTP ranges are; starting at the end is unsatisfiable.
    assert await store.get_range(key, len(body) - 3, len(body) + 100) == body[-3:]
    with pytest.raises(InvalidRange):
        await store.get_range(key, len(body), len(body) + 10)
    with pytest.raises(ValueError):
        await store.get_range(key, 10, 9)
    with pytest.raises(ValueError):
        await store.get_range(key, -1, 9)
    # InvalidRange is an answer: no retries, not a failure.
    assert store.stats.retries == 0 and store.stats.failures == 0


async def test_get_ranges_coalesces(store: ObjectStore, prefix: str) -> None:
    body = os.urandom(100_000)
    key = prefix + "wal"
    await store.put(key, body)
    ranges = [(90_000, 95_000), (0, 100), (200, 300), (300, 300), (50_000, 50_010), (150, 250)]
    gets_before = store.stats.gets
    parts = await store.get_ranges(key, ranges, max_gap=1_000, max_size=50_000)
    assert parts == [body[s:e] for s, e in ranges]
    # [0, 300) in one GET, then 50_000 and 90_000 alone.
    assert store.stats.gets - gets_before == 3
    with pytest.raises(InvalidRange):
        await store.get_ranges(key, [(99_990, 100_010)])


async def test_missing_key_raises_no_such_key_without_retries(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(NoSuchKey) as info:
        await store.get(prefix + "missing")
    assert info.value.key == prefix + "missing"
    with pytest.raises(NoSuchKey):
        await store.get_range(prefix + "missing", 0, 10)
    assert store.stats.gets == 2 and store.stats.retries == 0 and store.stats.failures == 0


async def test_missing_bucket_is_not_retried(s3: S3Server) -> None:
    async with ObjectStore(s3.endpoint, "no-such-bucket-here", s3.access_key, s3.secret_key) as store:
        with pytest.raises(S3Error) as info:
            await store.put("k", b"v")
        # SeaweedFS answers AccessDenied here, S3 and MinIO NoSuchBucket: a 4xx either way, not retried.
        assert info.value.code in ("NoSuchBucket", "AccessDenied") and 400 <= info.value.status < 500
        assert store.stats.puts == 1 and store.stats.retries == 0 and store.stats.failures == 1


async def test_ensure_bucket_creates_once(s3: S3Server) -> None:
    bucket = f"made-{uuid.uuid4().hex[:8]}"
    async with ObjectStore(s3.endpoint, bucket, s3.access_key, s3.secret_key) as store:
        await store.ensure_bucket()
        await store.ensure_bucket()  # idempotent
        await store.put("k", b"v")
        assert await store.get("k") == b"v"


async def test_list_pagination_prefix_start_after_and_delete_many(store: ObjectStore, prefix: str) -> None:
    keys = [f"{prefix}wal/{i:05d}" for i in range(2_500)]
    others = [f"{prefix}other/{i}" for i in range(5)]
    await asyncio.gather(*(store.put(key, key.encode()) for key in keys + others))

    lists_before = store.stats.lists
    listed = [info async for info in store.list(prefix + "wal/", page_size=1000)]
    assert [info.key for info in listed] == keys  # complete, sorted, nothing from other/
    assert store.stats.lists - lists_before == 3  # 1000 + 1000 + 500
    assert all(info.size == len(info.key) for info in listed)
    now_ms = time.time() * 1000
    assert all(now_ms - 600_000 < info.last_modified_ms <= now_ms + 5_000 for info in listed)

    assert [info.key async for info in store.list(prefix + "other/")] == others
    assert [info.key async for info in store.list(prefix + "wal/", start_after=keys[1_234])] == keys[1_235:]
    assert [info.key async for info in store.list(prefix + "wal/", start_after=keys[-1])] == []
    assert [info.key async for info in store.list(prefix + "nothing/")] == []
    # Stopping early fetches no further page.
    lists_before = store.stats.lists
    async for _ in store.list(prefix + "wal/", page_size=100):
        break
    assert store.stats.lists - lists_before == 1

    # 2,500 keys -> 3 DeleteObjects requests; missing and duplicate keys are not failures.
    deletes_before = store.stats.deletes
    failed = await store.delete_many(keys + keys[:10] + [prefix + "wal/never-existed"])
    assert failed == []
    assert store.stats.deletes - deletes_before == 3
    assert [info.key async for info in store.list(prefix)] == others
    assert await store.delete_many([]) == []


async def test_concurrency_is_bounded(s3: S3Server, prefix: str) -> None:
    async with make_store(s3, max_concurrency=4) as store:
        in_flight, peak = 0, 0
        real_exchange = store._exchange

        async def counting_exchange(*args: Any, **kwargs: Any) -> Any:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await asyncio.sleep(0.01)  # keep requests overlapping so the bound is actually reached
                return await real_exchange(*args, **kwargs)
            finally:
                in_flight -= 1

        store._exchange = counting_exchange  # type: ignore[method-assign]
        bodies = {f"{prefix}c/{i:02d}": os.urandom(1_000 + i) for i in range(64)}
        await asyncio.gather(*(store.put(k, v) for k, v in bodies.items()))
        assert peak == 4
        assert store.stats.puts == 64 and store.stats.put_bytes == sum(map(len, bodies.values()))
        got = await asyncio.gather(*(store.get(k) for k in bodies))
        assert got == list(bodies.values())
        assert store.stats.gets == 64 and store.stats.get_bytes == store.stats.put_bytes


class _Stalling(http.server.BaseHTTPRequestHandler):
    """GET answers the request's path as its body, except that a path ending in ``/slow`` is held
    until ``release`` is set; records each request's path and client port."""

    protocol_version = "HTTP/1.1"  # keep-alive, as S3 servers: a connection may be reused
    release = threading.Event()
    seen: list[tuple[str, int]] = []

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.client_address[1]))
        if self.path.endswith("/slow"):
            self.release.wait(30)
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_cancelled_request_frees_its_slot_and_its_connection() -> None:
    """Cancelling a caller cancels its request: the slot is free at once (no thread is left running
    it), and the connection with the unread answer on it is closed, never handed to the next request."""
    _Stalling.release = threading.Event()
    _Stalling.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stalling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        async with ObjectStore(endpoint, BUCKET, "k", "s", max_concurrency=1, max_attempts=1) as store:
            assert await store.get("warm") == f"/{BUCKET}/warm".encode()
            slow = asyncio.create_task(store.get("slow"))
            await _until(lambda: len(_Stalling.seen) == 2)
            slow.cancel()
            # The stalled answer is still unsent, yet the next request gets the only slot and its own answer.
            assert await asyncio.wait_for(store.get("fast"), 10) == f"/{BUCKET}/fast".encode()
            assert slow.cancelled() and not _Stalling.release.is_set()
            (_, warm_port), (_, slow_port), (_, fast_port) = _Stalling.seen
            assert slow_port == warm_port  # the idle connection was reused ...
            assert fast_port != slow_port  # ... but not the one the cancelled request left mid-answer
            assert store.stats.gets == 3 and store.stats.failures == 0
    finally:
        _Stalling.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


async def test_unreachable_endpoint_fails_after_max_attempts() -> None:
    port = free_port()  # nothing listens here
    store = ObjectStore(
        f"http://127.0.0.1:{port}", BUCKET, "k", "s", max_attempts=3, backoff_initial=0.01, backoff_max=0.05
    )
    async with store:
        started = time.monotonic()
        with pytest.raises(S3ConnectionError):
            await store.put("k", b"v")
        elapsed = time.monotonic() - started
        assert store.stats.puts == 3 and store.stats.retries == 2 and store.stats.failures == 1
        assert store.stats.put_bytes == 0
        assert elapsed < 2.0
        # delete_many reports the keys instead of raising.
        assert await store.delete_many(["a", "b"]) == ["a", "b"]
        assert store.stats.deletes == 3


class _Always503(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that is permanently overloaded."""

    requests = 0

    def _slow_down(self) -> None:
        type(self).requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _slow_down

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_503_slow_down_is_retried_up_to_max_attempts() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Always503)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        async with ObjectStore(endpoint, BUCKET, "k", "s", max_attempts=4, backoff_initial=0.01) as store:
            with pytest.raises(S3Error) as info:
                await store.get("k")
            assert (info.value.status, info.value.code) == (503, "SlowDown")
            assert store.stats.gets == 4 and store.stats.retries == 3
            assert _Always503.requests == 4  # the HTTP client itself did not retry
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_request_survives_s3_restart(tmp_path: Path) -> None:
    server = S3Server(tmp_path / "s3").start()
    try:
        server.create_bucket(BUCKET)
        async with make_store(server, max_attempts=30, backoff_initial=0.05, backoff_max=0.5) as store:
            await store.put("k", b"survives")
            await asyncio.to_thread(server.stop)
            reading = asyncio.create_task(store.get("k"))
            await asyncio.sleep(0.5)
            assert not reading.done()  # retrying against a dead endpoint
            await asyncio.to_thread(server.start)
            assert await asyncio.wait_for(reading, 30) == b"survives"
            assert store.stats.retries >= 1 and store.stats.failures == 0
    finally:
        server.stop()
    assert processes_using(tmp_path / "s3") == []


async def test_closed_store_refuses_calls(s3: S3Server) -> None:
    store = make_store(s3)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(RuntimeError):
        await store.head("k")


def test_retriable_classification() -> None:
    def client_error(status: int, code: str) -> S3Error:
        return S3Error("GetObject", status, code)

    assert is_retriable(client_error(503, "SlowDown"))
    assert is_retriable(client_error(500, "InternalError"))
    assert is_retriable(client_error(502, "BadGateway"))
    assert is_retriable(client_error(400, "RequestTimeout"))
    assert is_retriable(client_error(429, "TooManyRequests"))
    assert is_retriable(S3ConnectionError("refused, reset or short body"))
    assert is_retriable(ConnectionResetError())
    assert is_retriable(TimeoutError())
    assert not is_retriable(client_error(404, "NoSuchKey"))
    assert not is_retriable(client_error(403, "AccessDenied"))
    assert not is_retriable(client_error(416, "InvalidRange"))
    assert not is_retriable(NoSuchKey("k"))
    assert not is_retriable(ValueError("bug"))


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every PUT 200 and every GET with a fixed body, keeping each request's headers."""

    protocol_version = "HTTP/1.1"  # as S3 servers: an ``Expect: 100-continue`` gets its interim answer
    seen: list[tuple[str, dict[str, str], bytes]] = []
    body = b"recorded body"

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else b""
        type(self).seen.append(("PUT", {k.lower(): v for k, v in self.headers.items()}, data))
        self.send_response(200)
        self.send_header("ETag", '"0"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        type(self).seen.append(("GET", {k.lower(): v for k, v in self.headers.items()}, b""))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_put_and_get_send_no_avoidable_per_request_work() -> None:
    """A WAL PUT is one request with its body, signed, and nothing else computed over the body.

    ``Expect: 100-continue`` costs a round trip to the server (and a scheduling of its handler) before
    the body goes out, for a body we send anyway; a CRC32 trailer/header (botocore >= 1.36's default
    "when_supported") is a second pass over every byte, redundant with the SigV4 payload hash on http
    and with TLS on https. GETs must not ask for (and then verify) a checksum either.
    """
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        payload = os.urandom(64 * 1024)
        async with ObjectStore(endpoint, BUCKET, "k", "s", max_attempts=1) as store:
            await store.put("wal/1", payload)
            assert await store.get("wal/1") == _Recorder.body
        (put_method, put_headers, put_body), (get_method, get_headers, _) = _Recorder.seen
        assert (put_method, get_method) == ("PUT", "GET")
        assert put_body == payload and put_headers["content-length"] == str(len(payload))
        assert "expect" not in put_headers, put_headers
        assert not [h for h in put_headers if h.startswith(("x-amz-checksum", "x-amz-sdk-checksum"))], put_headers
        assert put_headers.get("content-encoding") != "aws-chunked"
        assert put_headers["x-amz-content-sha256"] != "UNSIGNED-PAYLOAD"  # http: the payload stays signed
        assert "x-amz-checksum-mode" not in get_headers, get_headers
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_requests_run_on_the_event_loop_without_threads(s3: S3Server, prefix: str) -> None:
    """50 concurrent PUTs (and GETs) start no thread: requests are sockets on the loop, not pool jobs.

    Threads per request fought the event loop for the GIL (issue 10: a 13 ms PUT took 50 ms behind a
    busy broker loop), so the client must not need any.
    """
    async with make_store(s3, max_concurrency=16) as store:
        await store.put(prefix + "warm-up", b"x")  # connection set-up and lazy initialisation done
        before = threading.active_count()
        peak = before
        bodies = {f"{prefix}t/{i:02d}": os.urandom(9 * 1024) for i in range(50)}

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, threading.active_count())
                await asyncio.sleep(0)

        sampler = asyncio.create_task(sample())
        try:
            await asyncio.gather(*(store.put(k, v) for k, v in bodies.items()))
            got = await asyncio.gather(*(store.get(k) for k in bodies))
        finally:
            sampler.cancel()
        assert got == list(bodies.values())
        assert store.stats.puts == 51 and store.stats.gets == 50
        assert (peak, threading.active_count()) == (before, before)


async def test_faults_through_the_chaos_proxy_are_retried_and_bodies_stay_exact(s3: S3Server, prefix: str) -> None:
    """Through ``diskless/chaos/s3proxy.py`` (one request per connection, then ``Connection: close``)
    with 500s, 503s, resets, writes answered 500 after they happened, and delays: every operation
    succeeds within its attempts and every byte comes back as written."""
    from diskless.chaos.s3proxy import FaultRates, S3FaultProxy

    proxy = S3FaultProxy(s3.endpoint, seed=11).start()
    try:
        proxy.set_rates(FaultRates(error_500=0.08, error_503=0.08, ambiguous=0.08, reset=0.08, slow=0.05, slow_s=0.05))
        endpoint = proxy.endpoint
        store = ObjectStore(
            endpoint, BUCKET, s3.access_key, s3.secret_key, max_attempts=12, backoff_initial=0.01, backoff_max=0.05
        )
        async with store:
            bodies = {f"{prefix}f/{i:02d}": os.urandom(5_000 + i) for i in range(40)}
            await asyncio.gather(*(store.put(k, v) for k, v in bodies.items()))
            assert await asyncio.gather(*(store.get(k) for k in bodies)) == list(bodies.values())
            key, body = next(iter(bodies.items()))
            assert await store.get_range(key, 100, 199) == body[100:200]
            assert await store.head(key) == len(body)
            assert [info.key async for info in store.list(prefix + "f/", page_size=7)] == sorted(bodies)
            assert await store.delete_many(bodies) == []
            assert [info.key async for info in store.list(prefix + "f/")] == []
            assert store.stats.failures == 0
            assert store.stats.retries >= 10, store.stats  # the faults really hit requests
            injected = sum(proxy.stats[kind] for kind in ("error_500", "error_503", "ambiguous", "reset"))
            assert injected >= 10 and proxy.stats["ambiguous"] >= 1, proxy.stats
    finally:
        proxy.stop()


async def test_a_stalled_put_is_hedged_and_the_hedge_answers(s3: S3Server, prefix: str) -> None:
    """One PUT (then one GET) held 30 s by the chaos proxy among fast ones: once it has been out longer than the
    policy's quantile of the earlier PUTs, an identical PUT goes out, is answered, and ends the call
    long before the held one could have; the object is the body, and the held PUT is cancelled.
    Without hedging the same PUT takes the whole 30 s (the last assertion of the test)."""
    from diskless.chaos.s3proxy import S3FaultProxy
    from diskless.storage.hedging import HedgePolicy

    proxy = S3FaultProxy(s3.endpoint, seed=3).start()
    try:
        store = ObjectStore(proxy.endpoint, BUCKET, s3.access_key, s3.secret_key)
        async with store:
            policy = HedgePolicy(quantile=0.9, max_ratio=0.1, min_samples=20)
            for i in range(20):  # the latencies the quantile is taken from
                await store.put(f"{prefix}h/warm-{i}", b"w" * 40_000, policy)  # the held PUT's size class
            assert store.stats.hedges == 0, "no PUT was slow, none may be hedged"
            body = os.urandom(40_000)
            proxy.delay_next(30.0)
            started = time.monotonic()
            await asyncio.wait_for(store.put(f"{prefix}h/held", body, policy), 20)
            assert time.monotonic() - started < 20
            assert (store.stats.hedges, store.stats.hedge_wins) == (1, 1)
            assert proxy.stats["slow"] == 1
            assert await store.get(f"{prefix}h/held") == body
            assert store.stats.puts == 22  # 20 + the held one + its hedge
            # A held GET likewise, with a policy of its own.
            reads = HedgePolicy(quantile=0.9, max_ratio=0.1, min_samples=20)
            for _ in range(20):
                await store.get(f"{prefix}h/held", reads)
            proxy.delay_next(30.0, method="GET")
            assert await asyncio.wait_for(store.get(f"{prefix}h/held", reads), 20) == body
            assert (store.stats.hedges, store.stats.hedge_wins) == (2, 2)
            # No policy, no hedge: the same held PUT takes the full delay (bounded here at 3 s).
            proxy.delay_next(30.0)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(store.put(f"{prefix}h/unhedged", body), 3)
            assert store.stats.hedges == 2
    finally:
        proxy.stop()


class _ShortThenWhole(http.server.BaseHTTPRequestHandler):
    """The first GET promises 1000 bytes, sends 10 and closes; later GETs send all 1000."""

    protocol_version = "HTTP/1.1"
    body = bytes(range(250)) * 4
    requests = 0

    def do_GET(self) -> None:
        type(self).requests += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        if type(self).requests == 1:
            self.wfile.write(self.body[:10])
            self.close_connection = True
        else:
            self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_short_body_is_retried() -> None:
    _ShortThenWhole.requests = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ShortThenWhole)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        async with ObjectStore(endpoint, BUCKET, "k", "s", max_attempts=3, backoff_initial=0.01) as store:
            assert await store.get("k") == _ShortThenWhole.body
            assert store.stats.gets == 2 and store.stats.retries == 1 and store.stats.get_bytes == 1000
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_https_verifies_the_server_against_aws_ca_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """https: the server's certificate is checked against AWS_CA_BUNDLE (else the system's CAs); a
    certificate that does not verify fails at once, since every retry would fail the same way."""
    import ssl

    from diskless.security.tls import make_dev_certs

    certs = make_dev_certs(tmp_path / "tls", ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.keystore)
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"https://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("AWS_CA_BUNDLE", str(certs.ca))
        async with ObjectStore(endpoint, BUCKET, "k", "s", max_attempts=3) as store:
            await store.put("wal/tls", b"over tls")
            assert await store.get("wal/tls") == _Recorder.body
        (_, put_headers, put_body), _ = _Recorder.seen
        assert put_body == b"over tls" and put_headers["host"] == f"127.0.0.1:{server.server_address[1]}"
        assert put_headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=k/")

        monkeypatch.delenv("AWS_CA_BUNDLE")
        async with ObjectStore(endpoint, BUCKET, "k", "s", max_attempts=3, backoff_initial=0.01) as store:
            with pytest.raises(ssl.SSLCertVerificationError):
                await store.put("wal/untrusted", b"x")
            assert store.stats.puts == 1 and store.stats.retries == 0 and store.stats.failures == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

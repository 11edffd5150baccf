"""Asyncio access to one S3-compatible bucket (MinIO, SeaweedFS, AWS S3), on the event loop itself.

Brokers PUT WAL objects and read byte ranges of them; the WAL file manager lists and deletes them.
Requests are HTTP/1.1 on keep-alive connections of ``http11.HttpPool`` (up to ``max_concurrency``
of them), signed by ``sigv4.SigV4Signer``, with the XML bodies of ``s3_xml``. No thread runs per
request: a request is a socket write and a read the loop is told about, so it neither waits for the
GIL behind a busy event loop nor takes it from the loop (with boto3 in a thread pool a 13 ms PUT
took about 50 ms in a broker, and botocore spent ~3 ms of CPU per request on its own machinery).
Only a body above 256 KiB is hashed in a worker thread, since hashlib releases the GIL and the loop
should not stop for a megabyte's SHA-256.

An ``asyncio.Semaphore`` of ``max_concurrency`` admits a request only when a connection is free, so
no unbounded queue builds up inside the HTTP pool. A cancelled caller cancels its request: the
connection is closed rather than reused with half an answer on it, and its slot is free at once.

Retries are tenacity's: a request is retried with exponential backoff and full jitter, only on
errors that can succeed on a second try (connection errors, timeouts, short bodies, 5xx,
throttling). Missing keys, bad ranges and access errors fail at once. A backing-off request gives its
slot back, so one struggling call does not starve the others.

Errors: ``NoSuchKey`` and ``InvalidRange`` are answers; ``S3Error`` is any other error answer (HTTP
status and S3 code); a lost connection, a short body or a garbled answer raise ``S3ConnectionError``
(a ``ConnectionError``), a timeout ``TimeoutError``.

Counting: every HTTP attempt is counted, per instance in ``ObjectStore.stats`` (plain integers the
broker and tests read directly) and process-wide in the Prometheus counters of ``diskless.metrics``.

``coalesce_ranges`` is the sans-IO planner that merges byte ranges of one object into fewer ranged
GETs; ``ObjectStore.get_ranges`` uses it.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import hashlib
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_random_exponential

from diskless import metrics
from diskless.aio import cancel_and_wait
from diskless.storage import s3_xml
from diskless.storage.hedging import HedgePolicy
from diskless.storage.http11 import Answer, HttpPool, HttpProtocolError
from diskless.storage.s3_xml import ObjectInfo
from diskless.storage.sigv4 import EMPTY_SHA256, SigV4Signer, canonical_query, uri_encode

__all__ = [
    "InvalidRange",
    "NoSuchKey",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreStats",
    "S3ConnectionError",
    "S3Error",
    "coalesce_ranges",
    "is_retriable",
]

log = structlog.get_logger(__name__)

T = TypeVar("T")

# S3 caps both a listing page and a DeleteObjects request at 1000 keys.
MAX_KEYS_PER_REQUEST = 1000

# Bodies larger than this are hashed in a worker thread (hashlib releases the GIL): about 1 ms of
# SHA-256 on this class of machine, the most we let one request hold the event loop for.
HASH_IN_THREAD_BYTES = 256 * 1024

# Error codes that say "try again later" although some servers send them with a 4xx status.
_RETRIABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "500",
        "502",
        "503",
        "504",
    }
)
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


class ObjectStoreError(Exception):
    """Base of the answers from the store this module raises as errors."""


class NoSuchKey(ObjectStoreError):
    """The object does not exist."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no such key: {key}")
        self.key = key


class InvalidRange(ObjectStoreError):
    """The requested byte range is not satisfiable (starts at or past the end of the object)."""


class S3Error(ObjectStoreError):
    """The store answered a request with an error.

    ``code`` is the S3 error code of the answer's body, or the HTTP status as text when the body has
    none (HEAD answers, a proxy's error page), as botocore reported it.
    """

    def __init__(self, operation: str, status: int, code: str, message: str = "") -> None:
        super().__init__(f"{operation}: HTTP {status} {code}" + (f": {message}" if message else ""))
        self.operation = operation
        self.status = status
        self.code = code
        self.message = message


class S3ConnectionError(ConnectionError):
    """A request or its answer was lost: refused or reset connection, short body, unparsable answer."""


@dataclass
class ObjectStoreStats:
    """Per-instance counters. Request counts include retried attempts (each one is a billed request).

    Updated only on the event loop thread, so plain ints are safe.
    """

    puts: int = 0  # requests (attempts) per operation
    gets: int = 0
    heads: int = 0
    lists: int = 0
    deletes: int = 0
    put_bytes: int = 0
    get_bytes: int = 0
    retries: int = 0  # attempts that failed and were tried again
    failures: int = 0  # operations that raised after their last attempt (NoSuchKey/InvalidRange excluded)
    hedges: int = 0  # second PUTs or GETs sent for one still unanswered (``hedge=``)
    hedge_wins: int = 0  # of them, those answered first


def is_retriable(exc: BaseException) -> bool:
    """Whether a failed request may succeed if sent again unchanged."""
    if isinstance(exc, S3Error):
        return exc.status >= 500 or exc.status == 429 or exc.code in _RETRIABLE_CODES
    # ConnectionError covers refused/reset connections, short bodies and garbled answers
    # (S3ConnectionError); TimeoutError connect and read timeouts.
    return isinstance(exc, ConnectionError | TimeoutError | asyncio.IncompleteReadError)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def coalesce_ranges(ranges: Sequence[tuple[int, int]], max_gap: int, max_size: int) -> list[tuple[int, int, list[int]]]:
    """Plan ranged GETs for byte ranges ``[start, end)`` of one object.

    Returns ``(start, end_exclusive, indexes)`` per GET, sorted by start: each merged range is the hull
    of the input ranges at ``indexes`` (listed in order of their start). Neighbours are merged when the
    gap between them is at most ``max_gap`` bytes (reading the gap costs less than another request)
    and the merged range stays within ``max_size`` bytes. Overlapping inputs are always merged, since
    two GETs would read the overlap twice, so a merged range exceeds ``max_size`` only when it is one
    input, or a chain of overlapping inputs, larger than that. Touching ranges count as a gap of 0.
    """
    if max_gap < 0 or max_size < 0:
        raise ValueError("max_gap and max_size must be >= 0")
    for start, end in ranges:
        if start < 0 or end < start:
            raise ValueError(f"bad range [{start}, {end})")
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], ranges[i][1], i))

    # Pass 1: clusters of overlapping ranges; these must be read by a single GET whatever their size.
    clusters: list[tuple[int, int, list[int]]] = []
    for i in order:
        start, end = ranges[i]
        if clusters and start < clusters[-1][1]:
            c_start, c_end, members = clusters[-1]
            members.append(i)
            clusters[-1] = (c_start, max(c_end, end), members)
        else:
            clusters.append((start, end, [i]))

    # Pass 2: greedily merge consecutive clusters across small gaps while the size allows.
    merged: list[tuple[int, int, list[int]]] = []
    for start, end, members in clusters:
        if merged:
            m_start, m_end, m_members = merged[-1]
            if start - m_end <= max_gap and end - m_start <= max_size:
                m_members.extend(members)
                merged[-1] = (m_start, end, m_members)
                continue
        merged.append((start, end, members))
    return merged


class ObjectStore:
    """One bucket of an S3-compatible store, used from one asyncio event loop.

    ``max_concurrency`` bounds the requests in flight (and the pooled HTTP connections);
    ``max_attempts`` bounds the tries per request. Errors: see the module docstring.
    """

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        max_concurrency: int = 16,
        max_attempts: int = 5,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        if max_concurrency < 1 or max_attempts < 1:
            raise ValueError("max_concurrency and max_attempts must be >= 1")
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be an http(s) URL, got {endpoint_url!r}")
        self.endpoint_url = endpoint_url
        self.bucket = bucket
        self.region = region
        self.max_concurrency = max_concurrency
        self.max_attempts = max_attempts
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stats = ObjectStoreStats()
        # The Host header is signed, so it is set here, exactly as sent.
        self._host = parts.netloc.rpartition("@")[2]
        self._origin = f"{parts.scheme}://{self._host}"
        context = None
        if parts.scheme == "https":
            # AWS_CA_BUNDLE is where AWS tools look for a private CA; else the system's certificates.
            context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
        port = parts.port or (443 if context is not None else 80)
        self._pool = HttpPool(parts.hostname, port, context, connect_timeout, read_timeout, max_concurrency)
        # Path-style addressing: local servers are addressed by IP or "localhost", where bucket
        # subdomains fail. An endpoint with a path (a store behind a path-routing proxy) keeps it.
        self._bucket_path = parts.path.rstrip("/") + "/" + uri_encode(bucket, slash=False)
        self._signer = SigV4Signer(access_key, secret_key, region)
        self._slots = asyncio.Semaphore(max_concurrency)
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for requests in flight, then close the connection pool; later calls raise RuntimeError."""
        if self._closed:
            return
        self._closed = True
        try:
            for _ in range(self.max_concurrency):
                await self._slots.acquire()
        finally:
            await self._pool.close()

    async def __aenter__(self) -> ObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- public operations -------------------------------------------------------------------------

    async def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (idempotent; losing a creation race is fine)."""
        await self._call("bucket", self._ensure_bucket_once)

    async def put(self, key: str, data: bytes, hedge: HedgePolicy | None = None) -> None:
        """Store ``data`` under ``key``, replacing any existing object.

        With ``hedge``, a PUT still unanswered after the policy's delay gets a second, identical
        one, and the first to succeed ends the call (``storage/hedging.py`` says why that is safe
        for keys written once, as WAL objects are)."""
        # Hashed once for all attempts.
        payload_hash = await asyncio.to_thread(_sha256, data) if len(data) > HASH_IN_THREAD_BYTES else _sha256(data)
        call = functools.partial(self._call, "put", functools.partial(self._put_once, key, data, payload_hash))
        await self._hedged("put", call, hedge, len(data), lambda _answer: len(data))
        self.stats.put_bytes += len(data)
        metrics.child(metrics.OBJECT_STORE_BYTES, "put").inc(len(data))

    async def _hedged(
        self,
        operation: str,
        call: Callable[[], Awaitable[T]],
        policy: HedgePolicy | None,
        size: int | None,
        size_of: Callable[[T], int],
    ) -> T:
        """Run ``call``; if it is still out after ``policy.delay_ms(size)``, run it again beside it.
        The first success wins and the other is cancelled; only if both fail does this fail (with
        the first call's error). ``size_of`` gives the size an answer's latency is filed under.
        Without a policy, just ``call``."""
        if policy is None:
            return await call()
        delay_ms = policy.delay_ms(size)
        started = time.perf_counter()

        def elapsed_ms(since: float) -> float:
            return (time.perf_counter() - since) * 1000

        if delay_ms is None:  # no hedge for this one: no task either
            result = await call()
            policy.finished(elapsed_ms(started), size_of(result))
            return result
        primary = asyncio.ensure_future(call())
        calls = [(primary, started)]
        try:
            await asyncio.wait([primary], timeout=delay_ms / 1000)
            if not primary.done() and policy.try_hedge():
                self.stats.hedges += 1
                metrics.child(metrics.OBJECT_STORE_HEDGES, operation).inc()
                calls.append((asyncio.ensure_future(call()), time.perf_counter()))
            pending = {task for task, _ in calls}
            while pending:
                _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                winner = next((t for t, _ in calls if t.done() and not t.cancelled() and t.exception() is None), None)
                if winner is None:
                    continue
                result = winner.result()
                for task, since in calls:
                    if task is winner or not task.done():
                        policy.finished(elapsed_ms(since), size_of(result))  # a loser's: how long it was out
                if winner is not primary:
                    self.stats.hedge_wins += 1
                    metrics.child(metrics.OBJECT_STORE_HEDGE_WINS, operation).inc()
                return result
            return primary.result()  # both failed: raises the first call's error
        finally:
            await cancel_and_wait(*(task for task, _ in calls))

    async def get(self, key: str, hedge: HedgePolicy | None = None) -> bytes:
        """The whole object; ``NoSuchKey`` if it does not exist. With ``hedge``, a GET still
        unanswered after the policy's delay gets a second one, and the first answer wins."""
        call = functools.partial(self._call, "get", functools.partial(self._get_once, key, None))
        # The size is known only from the answer: the delay is that of the last GET's size.
        data, _ranged = await self._hedged("get", call, hedge, None, lambda answer: len(answer[0]))
        self._count_get_bytes(len(data))
        return data

    async def get_range(self, key: str, start: int, end_inclusive: int) -> bytes:
        """Bytes ``start..end_inclusive`` of the object (an HTTP Range GET).

        As in HTTP, a range running past the end of the object is cut at the end; one starting at or
        past the end raises ``InvalidRange``. ``NoSuchKey`` if the object does not exist.
        """
        if start < 0 or end_inclusive < start:
            raise ValueError(f"bad range {start}-{end_inclusive}")
        header = f"bytes={start}-{end_inclusive}"
        data, ranged = await self._call("get", functools.partial(self._get_once, key, header))
        if not ranged:
            # A server that ignores Range answers 200 with the whole body; cut it here.
            data = data[start : end_inclusive + 1]
        self._count_get_bytes(len(data))
        return data

    async def get_ranges(
        self,
        key: str,
        ranges: Sequence[tuple[int, int]],
        *,
        max_gap: int = 256 * 1024,
        max_size: int = 8 * 1024 * 1024,
    ) -> builtins.list[bytes]:
        """The bytes of each ``[start, end)`` range of one object, in input order.

        Nearby ranges are fetched by one GET (see ``coalesce_ranges``) and the GETs run concurrently.
        Every range must lie within the object, else ``InvalidRange``.
        """
        plan = coalesce_ranges(ranges, max_gap, max_size)
        out: builtins.list[bytes] = [b""] * len(ranges)

        async def fetch(start: int, end: int, members: builtins.list[int]) -> None:
            if end == start:
                return  # only empty ranges: nothing to read
            chunk = await self.get_range(key, start, end - 1)
            if len(chunk) != end - start:
                raise InvalidRange(f"{key}: range [{start}, {end}) runs past the end of the object")
            for i in members:
                r_start, r_end = ranges[i]
                out[i] = chunk[r_start - start : r_end - start]

        await asyncio.gather(*(fetch(*p) for p in plan))
        return out

    async def head(self, key: str) -> int | None:
        """The object's size in bytes, or None if it does not exist."""
        return await self._call("head", functools.partial(self._head_once, key))

    async def list(
        self, prefix: str = "", start_after: str | None = None, page_size: int = MAX_KEYS_PER_REQUEST
    ) -> AsyncIterator[ObjectInfo]:
        """Objects whose key starts with ``prefix`` and sorts after ``start_after``, in key order.

        Pages of up to ``page_size`` keys (S3 caps it at 1000) are fetched lazily as iteration proceeds;
        each page request is retried on its own, so a long listing survives a transient error.
        """
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        token: str | None = None
        while True:
            items, token = await self._call(
                "list", functools.partial(self._list_page_once, prefix, start_after, page_size, token)
            )
            for item in items:
                yield item
            if token is None:
                return

    async def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        """Delete objects, 1000 per DeleteObjects request; returns the keys that could not be deleted.

        Deleting a missing key is a success. A batch whose request fails (after retries) reports all
        its keys as failed rather than raising, so a caller such as the WAL manager retries just those.
        """
        unique = builtins.list(dict.fromkeys(keys))  # duplicates in one request are rejected by some servers
        batches = [unique[i : i + MAX_KEYS_PER_REQUEST] for i in range(0, len(unique), MAX_KEYS_PER_REQUEST)]
        results = await asyncio.gather(*(self._delete_batch(batch) for batch in batches))
        return [key for failed in results for key in failed]

    # -- the retry/slot machinery ------------------------------------------------------------------

    async def _call(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn`` (one attempt: one or two HTTP exchanges) in a slot, retrying retriable failures."""
        if self._closed:
            raise RuntimeError("object store is closed")
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts),
            # Full jitter: clients that failed together do not retry together.
            wait=wait_random_exponential(multiplier=self.backoff_initial, max=self.backoff_max),
            retry=retry_if_exception(is_retriable),
            before_sleep=functools.partial(self._before_sleep, operation),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._run(operation, fn)
        except (NoSuchKey, InvalidRange):
            raise  # a missing key or an unsatisfiable range is an answer, not a failure of the store
        except Exception:
            self.stats.failures += 1
            metrics.OBJECT_STORE_FAILURES.labels(operation=operation).inc()
            raise
        raise AssertionError("unreachable: tenacity either returns or re-raises")

    async def _run(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T:
        async with self._slots:
            if self._closed:
                raise RuntimeError("object store is closed")  # queued behind requests that close() waited for
            self._count_request(operation)
            started = time.perf_counter()
            try:
                return await fn()
            finally:
                metrics.child(metrics.OBJECT_STORE_SECONDS, operation).observe(time.perf_counter() - started)

    async def _exchange(
        self,
        method: str,
        path: str,
        query: str = "",
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        payload_hash: str | None = None,
    ) -> Answer:
        """One signed HTTP request, answer read whole; ``path`` is URI-encoded, ``query`` canonical."""
        send = {"Host": self._host, **(headers or {})}
        if payload_hash is None:
            payload_hash = _sha256(body) if body else EMPTY_SHA256
        self._signer.sign(method, path, query, send, payload_hash, time.time())
        try:
            # The answer is read whole inside the attempt: a connection that breaks mid-body is retried
            # like any other lost request.
            return await self._pool.request(method, f"{path}?{query}" if query else path, send, body)
        except (TimeoutError, ssl.SSLCertVerificationError):
            raise  # a timeout is retried as one; a certificate error would fail every retry the same way
        except (HttpProtocolError, OSError) as exc:
            raise S3ConnectionError(f"{method} {self._origin}{path}: {type(exc).__name__}: {exc}") from exc

    def _error(self, operation: str, answer: Answer) -> S3Error:
        code, message = s3_xml.parse_error(answer.body) if answer.body else ("", "")
        return S3Error(operation, answer.status, code or str(answer.status), message)

    def _before_sleep(self, operation: str, state: RetryCallState) -> None:
        self.stats.retries += 1
        metrics.OBJECT_STORE_RETRIES.labels(operation=operation).inc()
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "object store request failed, retrying",
            operation=operation,
            attempt=state.attempt_number,
            max_attempts=self.max_attempts,
            error=repr(exc),
        )

    def _count_request(self, operation: str) -> None:
        metrics.child(metrics.OBJECT_STORE_REQUESTS, operation).inc()
        match operation:
            case "put":
                self.stats.puts += 1
            case "get":
                self.stats.gets += 1
            case "head":
                self.stats.heads += 1
            case "list":
                self.stats.lists += 1
            case "delete":
                self.stats.deletes += 1

    def _count_get_bytes(self, n: int) -> None:
        self.stats.get_bytes += n
        metrics.child(metrics.OBJECT_STORE_BYTES, "get").inc(n)

    async def _delete_batch(self, batch: builtins.list[str]) -> builtins.list[str]:
        try:
            return await self._call("delete", functools.partial(self._delete_once, batch))
        except Exception as exc:
            log.warning("object store delete failed", keys=len(batch), first=batch[0], error=repr(exc))
            return batch

    # -- one attempt of each operation -------------------------------------------------------------

    def _key_path(self, key: str) -> str:
        return f"{self._bucket_path}/{uri_encode(key)}"

    async def _ensure_bucket_once(self) -> None:
        answer = await self._exchange("HEAD", self._bucket_path)
        if answer.status == 200:
            return
        if answer.status != 404:
            raise self._error("HeadBucket", answer)
        answer = await self._exchange("PUT", self._bucket_path, body=s3_xml.create_bucket_body(self.region))
        if answer.status != 200:
            error = self._error("CreateBucket", answer)
            if error.code != "BucketAlreadyOwnedByYou":
                raise error

    async def _put_once(self, key: str, data: bytes, payload_hash: str) -> None:
        answer = await self._exchange("PUT", self._key_path(key), body=data, payload_hash=payload_hash)
        if answer.status != 200:
            raise self._error("PutObject", answer)

    async def _get_once(self, key: str, range_header: str | None) -> tuple[bytes, bool]:
        headers = {"Range": range_header} if range_header else None
        answer = await self._exchange("GET", self._key_path(key), headers=headers)
        if answer.status in (200, 206):
            return answer.body, answer.status == 206
        error = self._error("GetObject", answer)
        if error.code in _MISSING_KEY_CODES:
            raise NoSuchKey(key) from error
        if error.code == "InvalidRange" or error.status == 416:
            raise InvalidRange(f"{key}: {range_header} not satisfiable") from error
        raise error

    async def _head_once(self, key: str) -> int | None:
        answer = await self._exchange("HEAD", self._key_path(key))
        if answer.status == 200:
            return int(answer.headers["content-length"])
        error = self._error("HeadObject", answer)
        if error.status == 404 or error.code in _MISSING_KEY_CODES:
            return None
        raise error

    async def _list_page_once(
        self, prefix: str, start_after: str | None, page_size: int, token: str | None
    ) -> tuple[builtins.list[ObjectInfo], str | None]:
        params = {"list-type": "2", "prefix": prefix, "max-keys": str(page_size)}
        if token is not None:
            params["continuation-token"] = token
        elif start_after is not None:
            params["start-after"] = start_after  # first page only: the token carries the position after
        answer = await self._exchange("GET", self._bucket_path, canonical_query(params))
        if answer.status != 200:
            raise self._error("ListObjectsV2", answer)
        return s3_xml.parse_list_page(answer.body)

    async def _delete_once(self, batch: builtins.list[str]) -> builtins.list[str]:
        body, md5 = s3_xml.delete_objects_body(batch)
        headers = {"Content-MD5": md5, "Content-Type": "application/xml"}
        answer = await self._exchange("POST", self._bucket_path, "delete=", headers=headers, body=body)
        if answer.status != 200:
            raise self._error("DeleteObjects", answer)
        return [
            key
            for key, code in s3_xml.parse_delete_errors(answer.body)
            if code not in _MISSING_KEY_CODES  # already gone is what we wanted
        ]

"""Asyncio access to one S3-compatible bucket (MinIO, SeaweedFS, AWS S3) over boto3.

Brokers PUT WAL objects and read byte ranges of them; the WAL file manager lists and deletes them.
boto3 is synchronous, so every request runs in a dedicated thread pool of ``max_concurrency``
threads, and an ``asyncio.Semaphore`` of the same size admits a call only when a thread is free:
the event loop never blocks, and no unbounded queue of requests builds up inside the executor.

Retries are ours, not botocore's (its retries are switched off): tenacity retries a request with
exponential backoff and full jitter, only on errors that can succeed on a second try (connection
errors, timeouts, 5xx, throttling). Missing keys, bad ranges and access errors fail at once. A
backing-off request gives its thread slot back, so one struggling call does not starve the others.

Counting: every HTTP attempt is counted, per instance in ``ObjectStore.stats`` (plain integers the
broker and tests read directly) and process-wide in the Prometheus counters of ``diskless.metrics``.

``coalesce_ranges`` is the sans-IO planner that merges byte ranges of one object into fewer ranged
GETs; ``ObjectStore.get_ranges`` uses it.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import boto3
import botocore.exceptions
import botocore.handlers
import structlog
from botocore.config import Config
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_random_exponential

from diskless import metrics

__all__ = [
    "InvalidRange",
    "NoSuchKey",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreStats",
    "coalesce_ranges",
    "is_retriable",
]

log = structlog.get_logger(__name__)

T = TypeVar("T")

# S3 caps both a listing page and a DeleteObjects request at 1000 keys.
MAX_KEYS_PER_REQUEST = 1000

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
    """Base of the errors this module raises itself (transport errors propagate as botocore's)."""


class NoSuchKey(ObjectStoreError):
    """The object does not exist."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no such key: {key}")
        self.key = key


class InvalidRange(ObjectStoreError):
    """The requested byte range is not satisfiable (starts at or past the end of the object)."""


class ObjectInfo(NamedTuple):
    """One listed object."""

    key: str
    size: int
    last_modified_ms: int


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


def _status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def is_retriable(exc: BaseException) -> bool:
    """Whether a failed request may succeed if sent again unchanged."""
    if isinstance(exc, botocore.exceptions.ClientError):
        status = _status(exc)
        return status >= 500 or status == 429 or _code(exc) in _RETRIABLE_CODES
    # ConnectionError covers refused/unreachable endpoints and connect timeouts; HTTPClientError covers
    # resets, read timeouts and a body stream that broke half way; IncompleteReadError a short body.
    retriable = (
        botocore.exceptions.ConnectionError,
        botocore.exceptions.HTTPClientError,
        botocore.exceptions.IncompleteReadError,
        ConnectionError,
        TimeoutError,
    )
    return isinstance(exc, retriable)


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

    ``max_concurrency`` bounds the requests in flight (threads and HTTP connections); ``max_attempts``
    bounds the tries per request. Errors: ``NoSuchKey`` and ``InvalidRange`` from this module, other
    failures as the botocore exception of the last attempt.
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
        self.endpoint_url = endpoint_url
        self.bucket = bucket
        self.region = region
        self.max_concurrency = max_concurrency
        self.max_attempts = max_attempts
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stats = ObjectStoreStats()
        config = Config(
            region_name=region,
            # Path style: local servers are addressed by IP or "localhost", where bucket subdomains fail.
            s3={"addressing_style": "path"},
            # One pooled connection per thread, so no thread waits for a connection.
            max_pool_connections=max_concurrency,
            # A single attempt: tenacity retries, with backoff that releases the thread slot meanwhile.
            # total_max_attempts, not max_attempts: the latter counts *retries*, so max_attempts=1 still
            # sent every failed request twice (seen against a server answering 503).
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            # botocore >= 1.36 defaults to "when_supported": a CRC32 over every PUT body (a second pass
            # over each byte) and a checksum verified over every GET body. Integrity is already covered:
            # on http the SigV4 payload SHA-256 signs the body, on https TLS protects it, and record
            # batches carry their own CRC32C. Operations that require a checksum (DeleteObjects) still
            # get one.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        # A private session: the default boto3 session is shared module state and not thread-safe to
        # create clients from; the client itself is thread-safe and shared by all worker threads.
        session = boto3.session.Session()
        self._client: Any = session.client(
            "s3",
            endpoint_url=endpoint_url,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name=region,
            config=config,
        )
        # botocore sends ``Expect: 100-continue`` with every file-like body (a bytes body becomes one),
        # so each PUT waited a round trip, and the server's scheduling of its handler, before sending a
        # body it sends anyway. A refusal (auth, missing bucket) still arrives, after the body.
        self._client.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="object-store")
        self._slots = asyncio.Semaphore(max_concurrency)
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for requests in flight, then stop the threads and close the connection pool."""
        if self._closed:
            return
        self._closed = True
        # Joining worker threads blocks, so it happens off the event loop.
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    async def __aenter__(self) -> ObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- public operations -------------------------------------------------------------------------

    async def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (idempotent; losing a creation race is fine)."""
        await self._call("bucket", self._ensure_bucket_sync)

    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any existing object."""
        await self._call("put", functools.partial(self._put_sync, key, data))
        self.stats.put_bytes += len(data)
        metrics.child(metrics.OBJECT_STORE_BYTES, "put").inc(len(data))

    async def get(self, key: str) -> bytes:
        """The whole object; ``NoSuchKey`` if it does not exist."""
        data, _ranged = await self._call("get", functools.partial(self._get_sync, key, None))
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
        data, ranged = await self._call("get", functools.partial(self._get_sync, key, header))
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
        return await self._call("head", functools.partial(self._head_sync, key))

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
                "list", functools.partial(self._list_page_sync, prefix, start_after, page_size, token)
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

    # -- the retry/thread machinery ----------------------------------------------------------------

    async def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one blocking boto3 request) in the pool, retrying retriable failures."""
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
        except ObjectStoreError:
            raise  # a missing key or an unsatisfiable range is an answer, not a failure of the store
        except Exception:
            self.stats.failures += 1
            metrics.OBJECT_STORE_FAILURES.labels(operation=operation).inc()
            raise
        raise AssertionError("unreachable: tenacity either returns or re-raises")

    async def _run(self, operation: str, fn: Callable[[], T]) -> T:
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        seconds = metrics.child(metrics.OBJECT_STORE_SECONDS, operation)

        def timed() -> T:
            started = time.perf_counter()
            try:
                return fn()
            finally:
                seconds.observe(time.perf_counter() - started)

        try:
            future = self._executor.submit(timed)
        except BaseException:
            self._slots.release()
            raise
        self._count_request(operation)  # counted when a thread takes it, i.e. when it is really sent

        def release(_: concurrent.futures.Future[T]) -> None:
            # The slot is freed when the thread is done, not when the awaiting task is: a cancelled
            # task cannot cancel a request already running, and that request still holds a thread.
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody left to wake
                loop.call_soon_threadsafe(self._slots.release)

        future.add_done_callback(release)
        return await asyncio.wrap_future(future)

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
            return await self._call("delete", functools.partial(self._delete_sync, batch))
        except Exception as exc:
            log.warning("object store delete failed", keys=len(batch), first=batch[0], error=repr(exc))
            return batch

    # -- blocking boto3 calls (run in the worker threads) ------------------------------------------

    def _ensure_bucket_sync(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
            return
        except botocore.exceptions.ClientError as exc:
            if _status(exc) != 404 and _code(exc) not in ("NoSuchBucket", "NotFound", "404"):
                raise
        kwargs: dict[str, Any] = {}
        if self.region != "us-east-1":
            # us-east-1 is the one region that rejects an explicit LocationConstraint.
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self._client.create_bucket(Bucket=self.bucket, **kwargs)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) != "BucketAlreadyOwnedByYou":
                raise

    def _put_sync(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def _get_sync(self, key: str, range_header: str | None) -> tuple[bytes, bool]:
        kwargs: dict[str, Any] = {"Range": range_header} if range_header else {}
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key, **kwargs)
        except botocore.exceptions.ClientError as exc:
            code = _code(exc)
            if code in _MISSING_KEY_CODES:
                raise NoSuchKey(key) from exc
            if code == "InvalidRange" or _status(exc) == 416:
                raise InvalidRange(f"{key}: {range_header} not satisfiable") from exc
            raise
        # The body is read here, inside the retried call: a connection that breaks mid-body is retried.
        with contextlib.closing(response["Body"]) as body:
            data: bytes = body.read()
        return data, "ContentRange" in response

    def _head_sync(self, key: str) -> int | None:
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if _status(exc) == 404 or _code(exc) in _MISSING_KEY_CODES:
                return None
            raise
        return int(response["ContentLength"])

    def _list_page_sync(
        self, prefix: str, start_after: str | None, page_size: int, token: str | None
    ) -> tuple[builtins.list[ObjectInfo], str | None]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page_size}
        if token is not None:
            kwargs["ContinuationToken"] = token
        elif start_after is not None:
            kwargs["StartAfter"] = start_after  # first page only: the token carries the position after
        response = self._client.list_objects_v2(**kwargs)
        items = [
            ObjectInfo(obj["Key"], int(obj["Size"]), int(obj["LastModified"].timestamp() * 1000))
            for obj in response.get("Contents", [])
        ]
        next_token = response.get("NextContinuationToken") if response.get("IsTruncated") else None
        return items, next_token

    def _delete_sync(self, batch: builtins.list[str]) -> builtins.list[str]:
        response = self._client.delete_objects(
            Bucket=self.bucket,
            # Quiet: the response lists only the failures, which is all we need.
            Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
        )
        return [
            error["Key"]
            for error in response.get("Errors", [])
            if error.get("Code") not in _MISSING_KEY_CODES  # already gone is what we wanted
        ]

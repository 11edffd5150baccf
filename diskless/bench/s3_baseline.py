"""Raw S3 baseline: PUT and GET latency and throughput of the same S3 server at WAL-object sizes.

Goes through the project's own ``ObjectStore`` (HTTP/1.1 and SigV4 on the event loop, no threads),
the client the brokers use, so the baseline includes the same client overhead as a WAL upload. Per size: sequential PUTs
then GETs for latency, then ``concurrency`` requests in flight for a fixed time for throughput (as
"raw 8-thread PUTs" in issue 10). Objects go under ``bench/`` and are deleted afterwards, so the
WAL manager never sees them.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

from diskless.bench.stats import percentiles
from diskless.storage.object_store import ObjectStore


async def _timed(call: Any) -> float:
    began = time.perf_counter()
    await call
    return time.perf_counter() - began


async def _throughput(
    store: ObjectStore, keys: list[str], data: bytes | None, seconds: float, workers: int
) -> dict[str, float]:
    """``workers`` loops PUTting ``data`` (or GETting ``keys``) until ``seconds`` have passed."""
    deadline = time.perf_counter() + seconds
    done = 0
    written: list[str] = []

    async def worker(index: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            if data is not None:
                key = f"bench/{uuid.uuid4().hex}"
                await store.put(key, data)
                written.append(key)
            else:
                await store.get(keys[(index + i * workers) % len(keys)])
            done += 1
            i += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    took = time.perf_counter() - began
    keys.extend(written)
    return {"requests": done, "seconds": took, "requests_per_s": done / took}


async def _one_size(store: ObjectStore, size: int, samples: int, seconds: float, workers: int) -> dict[str, Any]:
    data = os.urandom(size)
    keys = [f"bench/{uuid.uuid4().hex}" for _ in range(samples)]
    put_lat = [await _timed(store.put(key, data)) for key in keys]
    get_lat = [await _timed(store.get(key)) for key in keys]
    put_tp = await _throughput(store, keys, data, seconds, workers)
    get_tp = await _throughput(store, keys, None, seconds, workers)
    await store.delete_many(keys)
    mb = size / 1e6
    return {
        "size_bytes": size,
        "put_latency_ms": percentiles([x * 1000 for x in put_lat]),
        "get_latency_ms": percentiles([x * 1000 for x in get_lat]),
        "put_mb_per_s": put_tp["requests_per_s"] * mb,
        "get_mb_per_s": get_tp["requests_per_s"] * mb,
        "put_requests_per_s": put_tp["requests_per_s"],
        "get_requests_per_s": get_tp["requests_per_s"],
        "concurrency": workers,
    }


async def run_baseline(
    endpoint: str,
    bucket: str,
    access_key: str,
    secret_key: str,
    sizes: tuple[int, ...],
    samples: int,
    seconds: float,
    concurrency: int,
) -> list[dict[str, Any]]:
    async with ObjectStore(endpoint, bucket, access_key, secret_key, max_concurrency=concurrency) as store:
        # One warm-up request: connection setup is not what a steady WAL upload pays.
        await store.put("bench/warm-up", b"x")
        await store.delete_many(["bench/warm-up"])
        return [await _one_size(store, size, samples, seconds, concurrency) for size in sizes]

"""The fault-injecting S3 proxy (``diskless/chaos/s3proxy.py``) in front of the real S3 server.

Through the proxy with no faults, objects round-trip byte for byte; with faults, a seeded share
of requests gets 500/503, a reset connection or a delay, and the same seed makes the same
sequence of decisions; ``pause`` holds every request until ``resume``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from diskless.chaos.s3proxy import FaultInjector, FaultRates, S3FaultProxy
from diskless.local.servers import S3Server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(Path(tmp_path_factory.mktemp("s3proxy")) / "s3").start()
    server.create_bucket("chaos")
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[S3FaultProxy]:
    started = S3FaultProxy(s3.endpoint, seed=7).start()
    try:
        yield started
    finally:
        started.stop()


def client(endpoint: str, attempts: int = 1) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3Server.access_key,
        aws_secret_access_key=S3Server.secret_key,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": attempts, "mode": "standard"},
            connect_timeout=2,
            read_timeout=5,
        ),
    )


def test_without_faults_objects_round_trip(proxy: S3FaultProxy) -> None:
    s3 = client(proxy.endpoint)
    body = bytes(range(256)) * 4096  # 1 MiB
    s3.put_object(Bucket="chaos", Key="plain", Body=body)
    assert s3.get_object(Bucket="chaos", Key="plain")["Body"].read() == body
    assert s3.get_object(Bucket="chaos", Key="plain", Range="bytes=10-19")["Body"].read() == body[10:20]
    assert s3.head_object(Bucket="chaos", Key="plain")["ContentLength"] == len(body)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="chaos", Prefix="pla").get("Contents", [])]
    assert keys == ["plain"]
    s3.delete_object(Bucket="chaos", Key="plain")
    assert proxy.stats["forwarded"] >= 6 and proxy.stats["error"] == 0


def test_seeded_faults_hit_a_share_of_requests_and_retries_hide_them(proxy: S3FaultProxy) -> None:
    from botocore.exceptions import ClientError, ConnectionClosedError, ConnectionError, ReadTimeoutError

    proxy.set_rates(FaultRates(error_500=0.1, error_503=0.1, reset=0.1, slow=0.1, slow_s=0.05))
    s3 = client(proxy.endpoint)
    outcomes: dict[str, int] = {}
    for i in range(200):
        try:
            s3.put_object(Bucket="chaos", Key=f"k{i}", Body=b"x" * 100)
            what = "ok"
        except ClientError as exc:
            what = str(exc.response["ResponseMetadata"]["HTTPStatusCode"])
        except (ConnectionError, ConnectionClosedError, ReadTimeoutError):
            what = "reset"
        outcomes[what] = outcomes.get(what, 0) + 1
    assert 10 <= outcomes.get("500", 0) <= 35, outcomes
    assert 10 <= outcomes.get("503", 0) <= 35, outcomes
    assert 10 <= outcomes.get("reset", 0) <= 35, outcomes
    assert proxy.stats["slow"] >= 8, proxy.stats
    # With retries (as brokers use), every write lands despite the faults.
    retrying = client(proxy.endpoint, attempts=10)
    for i in range(10):
        retrying.put_object(Bucket="chaos", Key=f"r{i}", Body=f"r{i}".encode())
    proxy.set_rates(FaultRates())
    assert [retrying.get_object(Bucket="chaos", Key=f"r{i}")["Body"].read() for i in range(10)] == [
        f"r{i}".encode() for i in range(10)
    ]


def test_same_seed_same_decisions() -> None:
    rates = FaultRates(error_500=0.2, error_503=0.1, reset=0.1, slow=0.2, ambiguous=0.1)
    first = [FaultInjector(rates, seed=42).decide() for _ in range(1)]
    a = FaultInjector(rates, seed=42)
    b = FaultInjector(rates, seed=42)
    c = FaultInjector(rates, seed=43)
    seq_a = [a.decide() for _ in range(500)]
    assert seq_a == [b.decide() for _ in range(500)]
    assert seq_a != [c.decide() for _ in range(500)]
    assert seq_a[:1] == first
    kinds = {d.kind for d in seq_a}
    assert kinds == {"none", "error_500", "error_503", "reset", "slow", "ambiguous"}


def test_pause_holds_requests_until_resume(proxy: S3FaultProxy) -> None:
    s3 = client(proxy.endpoint, attempts=1)
    s3.put_object(Bucket="chaos", Key="before", Body=b"1")
    proxy.pause()
    done = threading.Event()

    def put() -> None:
        s3.put_object(Bucket="chaos", Key="during", Body=b"2")
        done.set()

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    wait_until(lambda: proxy.stats["held"] >= 1, 5)
    assert not done.wait(0.5)
    began = time.monotonic()
    proxy.resume()
    assert done.wait(5)
    assert time.monotonic() - began < 2
    assert s3.get_object(Bucket="chaos", Key="during")["Body"].read() == b"2"

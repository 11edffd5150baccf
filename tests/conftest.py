"""Shared fixtures: ``broker`` starts one real broker process; ``broker_factory`` starts more;
``cluster_factory`` starts ``support.LocalCluster``s (etcd, optional S3, N brokers in AZs)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import BrokerProcess, LocalCluster

SERVER_SITE = Path(__file__).parent / "server_site"


@pytest.fixture(scope="session", autouse=True)
def _server_environment() -> Iterator[None]:
    """Processes the tests start get ``server_site`` first on PYTHONPATH (see its module), and
    Go servers a GOMEMLIMIT that does not keep their garbage collector busy.

    Set in a fixture, not at import: it runs in each pytest-xdist worker after the workers
    started, so the test processes themselves still import hypothesis.
    """
    before = {name: os.environ.get(name) for name in ("PYTHONPATH", "GOMEMLIMIT")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SERVER_SITE), *filter(None, [before["PYTHONPATH"]])])
    # SeaweedFS (and etcd) soft memory bound, as S3Server sets it (diskless/local/servers.py):
    # at 128MiB SeaweedFS's garbage collector runs all the time (5-7% of a core per idle S3
    # server, ~0.3% at 256MiB), and under load 512MiB halves its CPU per request against 256MiB.
    os.environ["GOMEMLIMIT"] = "512MiB"
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def make(overrides: dict[str, str] | None = None, name: str = "broker") -> BrokerProcess:
        proc = BrokerProcess(tmp_path / f"{name}-{len(started)}", overrides)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        proc.kill()


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    started: list[LocalCluster] = []

    def make(
        brokers: int = 3,
        azs: int = 3,
        overrides: dict[str, str] | None = None,
        s3: bool = False,
        s3_front: Callable[[str], str] | None = None,
    ) -> LocalCluster:
        defaults = {"broker.session.timeout.ms": "3000", "replica.lag.time.max.ms": "5000", "metrics.port": "0"}
        root = tmp_path / f"cluster-{len(started)}"
        cluster = LocalCluster(root, brokers, azs, {**defaults, **(overrides or {})}, s3, s3_front)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.kill_all()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession for the whole run: starting one costs ~15 s of JVM start-up."""
    from diskless.spark.session import build_session

    session = build_session()
    yield session
    session.stop()

"""Shared fixtures: ``broker`` starts one real broker process; ``broker_factory`` starts more."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support import BrokerProcess


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


class LocalCluster:
    """etcd plus N brokers spread over AZs, each AZ on its own loopback network (127.0.<az>.x)."""

    def __init__(self, root: Path, brokers: int, azs: int, overrides: dict[str, str], s3: bool = False) -> None:
        from diskless.local.servers import BrokerServer, EtcdServer, S3Server

        self.root = root
        self.etcd = EtcdServer(root / "etcd")
        self.s3 = S3Server(root / "s3") if s3 else None
        self.brokers = []
        for node_id in range(brokers):
            az = node_id % azs
            host = f"127.0.{az + 1}.{node_id // azs + 1}"
            self.brokers.append(
                BrokerServer(node_id, root / f"broker-{node_id}", host, f"az-{az + 1}", None, dict(overrides))
            )

    def start(self) -> LocalCluster:
        self.etcd.start()
        if self.s3 is not None:
            self.s3.start()
        for broker in self.brokers:
            broker.etcd = self.etcd.endpoint
            if self.s3 is not None:
                broker.overrides.setdefault("diskless.s3.endpoint", self.s3.endpoint)
            broker.start()
        return self

    def bootstrap_in(self, az: str) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.rack == az and b.alive())

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.alive())

    def rack_of(self, node_id: int) -> str:
        rack = self.brokers[node_id].rack
        assert rack is not None
        return rack

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        self.etcd.stop()
        if self.s3 is not None:
            self.s3.stop()

    def kill_all(self) -> None:
        for broker in self.brokers:
            broker.kill()
        self.etcd.kill()
        if self.s3 is not None:
            self.s3.kill()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    started: list[LocalCluster] = []

    def make(brokers: int = 3, azs: int = 3, overrides: dict[str, str] | None = None, s3: bool = False) -> LocalCluster:
        defaults = {"broker.session.timeout.ms": "3000", "replica.lag.time.max.ms": "5000", "metrics.port": "0"}
        root = tmp_path / f"cluster-{len(started)}"
        cluster = LocalCluster(root, brokers, azs, {**defaults, **(overrides or {})}, s3)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.kill_all()

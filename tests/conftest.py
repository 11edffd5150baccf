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

    def __init__(self, root: Path, brokers: int, azs: int, overrides: dict[str, str]) -> None:
        from diskless.local.servers import BrokerServer, EtcdServer

        self.root = root
        self.etcd = EtcdServer(root / "etcd")
        self.brokers = []
        for node_id in range(brokers):
            az = node_id % azs
            host = f"127.0.{az + 1}.{node_id // azs + 1}"
            self.brokers.append(
                BrokerServer(node_id, root / f"broker-{node_id}", host, f"az-{az + 1}", None, dict(overrides))
            )

    def start(self) -> LocalCluster:
        self.etcd.start()
        for broker in self.brokers:
            broker.etcd = self.etcd.endpoint
            broker.start()
        return self

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

    def kill_all(self) -> None:
        for broker in self.brokers:
            broker.kill()
        self.etcd.kill()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    started: list[LocalCluster] = []

    def make(brokers: int = 3, azs: int = 3, overrides: dict[str, str] | None = None) -> LocalCluster:
        defaults = {"broker.session.timeout.ms": "3000", "replica.lag.time.max.ms": "5000"}
        cluster = LocalCluster(tmp_path / f"cluster-{len(started)}", brokers, azs, {**defaults, **(overrides or {})})
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.kill_all()

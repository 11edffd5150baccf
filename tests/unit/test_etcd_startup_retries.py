"""A broker's first steps against etcd wait out a busy etcd instead of exiting.

etcd answers UNAVAILABLE ("etcdserver: request timed out") while its disk is slow. The broker's
registration and the first load of the metadata gave up at the first such answer, so the process
exited with status 1 before it had started (seen in CI on a loaded machine). A Kafka broker keeps
asking its controller to register it; here each step is asked again, a bounded number of times."""

from __future__ import annotations

from typing import Any

import aetcd.exceptions
import pytest
from fake_etcd import FakeEtcd
from test_broker_incarnations import _Keeper

from diskless.cluster import etcd_store
from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.metadata import BrokerInfo, ClusterMetadata


class BusyEtcd(FakeEtcd):
    """Answers the first ``busy`` calls of each named method with etcd's request timeout."""

    def __init__(self, busy: int, methods: tuple[str, ...]) -> None:
        super().__init__()
        self.left = dict.fromkeys(methods, busy)

    def _busy(self, method: str) -> None:
        if self.left.get(method, 0) > 0:
            self.left[method] -= 1
            raise aetcd.exceptions.ConnectionFailedError("etcdserver: request timed out")

    async def lease(self, ttl: int) -> Any:
        self._busy("lease")
        return await super().lease(ttl)

    async def get_prefix(self, prefix: bytes) -> Any:
        self._busy("get_prefix")
        return await super().get_prefix(prefix)


def _store(etcd: FakeEtcd) -> EtcdMetadataStore:
    store = EtcdMetadataStore("127.0.0.1:2379", "c", ClusterMetadata("c"))
    store.client = etcd  # type: ignore[assignment]
    store._keeper = _Keeper()  # type: ignore[assignment]
    return store


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    real = etcd_store._retrying
    monkeypatch.setattr(etcd_store, "_retrying", lambda attempts=8: real(attempts).copy(wait=lambda state: 0))


async def test_registration_waits_out_a_busy_etcd() -> None:
    etcd = BusyEtcd(3, ("lease",))
    store = _store(etcd)
    await store.register_broker(BrokerInfo(1, "h", 9092, incarnation="a"), 6)
    stored = await etcd.get(store._key("brokers/1"))
    assert stored is not None and stored.lease == store._lease.id  # type: ignore[union-attr]


async def test_the_first_load_waits_out_a_busy_etcd() -> None:
    etcd = BusyEtcd(3, ("get_prefix",))
    await etcd.put(b"/diskless/c/brokers/2", b"{}")
    store = _store(etcd)
    assert await store._load() >= 0
    assert etcd.left["get_prefix"] == 0


async def test_a_registration_that_never_succeeds_still_ends() -> None:
    etcd = BusyEtcd(10**6, ("lease",))
    with pytest.raises(aetcd.exceptions.ConnectionFailedError):
        await _store(etcd).register_broker(BrokerInfo(1, "h", 9092, incarnation="a"), 6)
    assert etcd.left["lease"] == 10**6 - etcd_store.STARTUP_ATTEMPTS

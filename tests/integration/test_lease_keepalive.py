"""A broker's etcd lease survives an event loop that is blocked or saturated for longer than the TTL.

At 10,000 partitions a broker lost its lease because the keepalive needed turns of an event loop
busy applying metadata and serving fetches. The keepalive now runs on its own thread with its own
etcd connection (``cluster/lease_keeper.py``), so neither a blocking call on the loop nor a loop
hogging the GIL with Python work lets the lease expire, and the fence (``cluster/lease.py``) stays
open. Real etcd; the store is the one brokers use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.metadata import BrokerInfo, ClusterMetadata
from diskless.local.servers import EtcdServer

pytestmark = pytest.mark.integration

TTL_S = 2
STALL_S = 1.5 * TTL_S  # longer than the whole TTL, let alone half of it


@pytest.fixture
def etcd(tmp_path: Path):  # type: ignore[no-untyped-def]
    server = EtcdServer(tmp_path / "etcd").start()
    yield server
    server.kill()


@pytest.fixture
async def store(etcd: EtcdServer) -> AsyncIterator[EtcdMetadataStore]:
    store = EtcdMetadataStore(etcd.endpoint, "keepalive", ClusterMetadata("keepalive"))
    await store.connect()
    await store.load_and_watch()
    yield store
    await store.close()


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


async def _registered(store: EtcdMetadataStore) -> int:
    await store.register_broker(BrokerInfo(1, "127.0.0.1", 9092, "az-1"), TTL_S)
    deadline = time.monotonic() + 15
    while store.fence is None or store.fence.fenced(_now_ms()):
        assert time.monotonic() < deadline, "the fence never opened after registering"
        await asyncio.sleep(0.02)
    assert store._lease is not None
    return int(store._lease.id)


def _spin(seconds: float) -> int:
    """Pure Python work that holds the GIL between the interpreter's switch points."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(range(200))
    return n


@pytest.mark.parametrize("stall", ["blocked", "busy"])
async def test_the_lease_outlives_a_stalled_event_loop(store: EtcdMetadataStore, stall: str) -> None:
    lease_id = await _registered(store)
    started = time.monotonic()
    if stall == "blocked":
        time.sleep(STALL_S)  # a synchronous call on the loop (disk, a slow library)
    else:
        _spin(STALL_S)
    assert time.monotonic() - started >= STALL_S
    assert store.fence is not None
    # Still allowed to lead right after the stall: keepalives went on meanwhile.
    assert not store.fence.fenced(_now_ms()), f"fenced after the loop was {stall} for {STALL_S} s"
    info = await store.client.get_lease_info(lease_id, keys=False)
    assert info.TTL > 0, f"etcd expired the lease while the loop was {stall}"
    assert store._lease is not None and int(store._lease.id) == lease_id  # never had to register again


async def test_a_stale_incarnation_stops_when_a_new_one_registers(etcd: EtcdServer) -> None:
    """Real etcd and keepalive threads: a new incarnation of node 1 revokes the running one's
    lease; the old one's keeper sees it gone, and instead of registering again (taking the key
    back, so two processes led node 1's partitions) it finds itself superseded and stays fenced."""
    old = EtcdMetadataStore(etcd.endpoint, "incarnations", ClusterMetadata("incarnations"))
    new = EtcdMetadataStore(etcd.endpoint, "incarnations", ClusterMetadata("incarnations"))
    superseded = asyncio.Event()
    old.on_superseded = superseded.set
    try:
        for store in (old, new):
            await store.connect()
            await store.load_and_watch()
        await old.register_broker(BrokerInfo(1, "old-host", 9092, "az-1", incarnation="old"), TTL_S)
        await new.register_broker(BrokerInfo(1, "new-host", 9093, "az-1", incarnation="new"), TTL_S)
        await asyncio.wait_for(superseded.wait(), 5 * TTL_S)
        assert old.fence is not None and old.fence.superseded and old.fence.fenced(_now_ms())
        # Longer than a keepalive round and a registration attempt: the key stays the new one's.
        deadline = time.monotonic() + TTL_S
        while time.monotonic() < deadline:
            stored = await new.client.get(new._key("brokers/1"))
            assert stored is not None and b"new-host" in stored.value
            assert new.fence is not None and not new.fence.superseded
            await asyncio.sleep(0.1)
        assert old.metadata.brokers[1].host == "new-host"
    finally:
        await old.close()
        await new.close()

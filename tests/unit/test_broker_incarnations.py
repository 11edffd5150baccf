"""Only the incarnation of a node id that started last may hold its registration.

A new process for node 1 revokes the old one's lease and registers. The old process, if still
running (paused by SIGSTOP or a frozen VM, or a second copy a supervisor started), sees its lease
gone and registers again. Unconditionally, as it used to, it overwrote the new registration: both
fences open, two processes leading node 1's partitions at the same leader epoch. Kafka refuses a
stale incarnation (incarnation id, DuplicateBrokerRegistration); here the stale one finds itself
superseded, stays fenced for good and stops (``etcd_store._claim_registration``).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from fake_etcd import FakeEtcd

from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.lease import LeaseFence
from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, broker_record

NODE = 1


class _Keeper:
    """Stands in for the keepalive thread (``lease_keeper.py``): records what it is asked."""

    def __init__(self) -> None:
        self.leases: list[int | None] = []

    def keep(self, lease_id: int) -> None:
        self.leases.append(lease_id)

    def forget(self) -> None:
        self.leases.append(None)

    def registration_failed(self, lease_id: int) -> None:
        pass

    def stop(self) -> None:
        pass


def _store(etcd: FakeEtcd, incarnation: str) -> tuple[EtcdMetadataStore, list[str]]:
    store = EtcdMetadataStore("127.0.0.1:2379", "c", ClusterMetadata("c"))
    store.client = etcd  # type: ignore[assignment]
    store._keeper = _Keeper()  # type: ignore[assignment]
    told: list[str] = []
    store.on_superseded = lambda: told.append(incarnation)
    return store, told


async def _register(store: EtcdMetadataStore, incarnation: str) -> None:
    await store.register_broker(BrokerInfo(NODE, f"host-{incarnation}", 9092, incarnation=incarnation), 6)


async def _lease_lost_and_registered_again(store: EtcdMetadataStore) -> None:
    """What the keeper thread triggers when etcd answers that our lease is gone."""
    assert store.fence is not None
    store.fence.on_expired()
    store._register_again()
    if store._reregistering is not None:
        await store._reregistering


def _holder(etcd: FakeEtcd, store: EtcdMetadataStore) -> bytes:
    return etcd.kv[(store.prefix + f"brokers/{NODE}").encode()].value


def test_a_stale_incarnation_does_not_take_the_registration_back() -> None:
    async def scenario() -> None:
        etcd = FakeEtcd()
        old, old_told = _store(etcd, "old")
        new, new_told = _store(etcd, "new")
        await _register(old, "old")
        await _register(new, "new")  # revokes the old incarnation's lease

        await _lease_lost_and_registered_again(old)

        assert b"host-new" in _holder(etcd, new), "the stale incarnation overwrote the new registration"
        assert old.fence is not None and old.fence.superseded and old.fence.fenced(0)
        assert old_told == ["old"] and new_told == []
        assert old._keeper.leases[-1] is None  # type: ignore[union-attr]  # stopped refreshing
        # Whatever the keeper reports later, the stale incarnation stays out.
        await _lease_lost_and_registered_again(old)
        assert b"host-new" in _holder(etcd, new)
        assert len(etcd.leases) == 1, "the refused attempt's lease was left alive"

    asyncio.run(scenario())


def test_a_stale_incarnation_stays_out_after_the_newer_ones_lease_expired() -> None:
    """The newer incarnation's key is gone with its lease (it paused too): the stale one, whose
    log lacks what the newer one appended at its leader epochs, still may not come back."""

    async def scenario() -> None:
        etcd = FakeEtcd()
        old, old_told = _store(etcd, "old")
        new, _ = _store(etcd, "new")
        await _register(old, "old")
        await _register(new, "new")
        assert new._lease is not None
        await etcd.revoke_lease(int(new._lease.id))
        assert (new.prefix + f"brokers/{NODE}").encode() not in etcd.kv

        await _lease_lost_and_registered_again(old)

        assert (old.prefix + f"brokers/{NODE}").encode() not in etcd.kv
        assert old_told == ["old"]
        # The newer incarnation registers again as usual.
        await _lease_lost_and_registered_again(new)
        assert b"host-new" in _holder(etcd, new)
        assert new.fence is not None and not new.fence.superseded

    asyncio.run(scenario())


def test_the_latest_incarnation_registers_again_after_its_lease_expired() -> None:
    async def scenario() -> None:
        etcd = FakeEtcd()
        store, told = _store(etcd, "only")
        await _register(store, "only")
        assert store._lease is not None
        await etcd.revoke_lease(int(store._lease.id))

        await _lease_lost_and_registered_again(store)

        assert b"host-only" in _holder(etcd, store)
        key = (store.prefix + f"brokers/{NODE}").encode()
        assert etcd.kv[key].lease == int(store._lease.id)
        assert told == []
        # The fence opens once the metadata reached the new registration (lease.py).
        assert store.fence is not None
        store.fence.on_metadata_revision(etcd.kv[key].mod_revision)
        store.fence.on_refreshed(0)
        assert not store.fence.fenced(1)

    asyncio.run(scenario())


def _event(store: EtcdMetadataStore, incarnation: str, revision: int) -> SimpleNamespace:
    kv = SimpleNamespace(
        key=(store.prefix + f"brokers/{NODE}").encode(),
        value=broker_record(BrokerInfo(NODE, f"host-{incarnation}", 9092, incarnation=incarnation)),
        mod_revision=revision,
        create_revision=revision,
    )
    return SimpleNamespace(kv=kv, kind="PUT")


def test_the_watch_shows_a_later_incarnation_and_the_stale_one_stops() -> None:
    """A stale copy still inside its TTL learns from the watch that a later incarnation's put
    replaced its own, and fences itself before its keeper notices the revoked lease."""

    async def scenario() -> None:
        etcd = FakeEtcd()
        store, told = _store(etcd, "old")
        await _register(store, "old")
        ours = store._registered_revision
        assert ours is not None
        # A put older than our registration, still on its way through the watch: not a takeover.
        await store._on_event(_event(store, "older", ours - 1))
        assert told == []
        await store._on_event(_event(store, "old", ours))
        assert told == []
        await store._on_event(_event(store, "new", ours + 5))
        assert told == ["old"]
        assert store.fence is not None and store.fence.fenced(0)

    asyncio.run(scenario())


def test_a_superseded_fence_never_opens_again() -> None:
    fence = LeaseFence(6000)
    fence.on_registered(0, 5)
    fence.on_metadata_revision(5)
    assert not fence.fenced(10)
    fence.on_superseded()
    fence.on_registered(20, 9)
    fence.on_refreshed(30)
    fence.on_metadata_revision(9)
    assert fence.fenced(40) and fence.remaining_ms(40) == 0

"""The metadata layout in a real etcd: topics of any size are one atomic write, and a partition
state decided for one incarnation of a topic never lands on the next one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, PartitionState
from diskless.local.servers import EtcdServer

pytestmark = pytest.mark.integration


@pytest.fixture
def etcd(tmp_path: Path):
    server = EtcdServer(tmp_path / "etcd").start()
    yield server
    server.kill()


@pytest.fixture
async def stores(etcd: EtcdServer) -> AsyncIterator[tuple[EtcdMetadataStore, EtcdMetadataStore]]:
    opened = []
    for _ in range(2):
        store = EtcdMetadataStore(etcd.endpoint, "layout", ClusterMetadata("layout"))
        await store.connect()
        await store.load_and_watch()
        for i in range(3):  # what assignment needs of brokers (they register under leases otherwise)
            store.metadata.brokers[i] = BrokerInfo(i, "127.0.0.1", 9092 + i, f"az-{i}")
        opened.append(store)
    yield opened[0], opened[1]
    for store in opened:
        await store.close()


async def wait_for(condition: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.02)


async def test_a_topic_of_5000_partitions_is_created_atomically(stores) -> None:  # type: ignore[no-untyped-def]
    writer, reader = stores
    seen_sizes: list[int] = []

    async def on_change(changes) -> None:  # type: ignore[no-untyped-def]
        topic = reader.metadata.topics.get("wide")
        if topic is not None:
            seen_sizes.append(sum(1 for p in topic.partitions if p.replicas))

    reader.on_change = on_change
    topic = writer.metadata.create_topic("wide", 5000, 3, {}, validate_only=True)
    assert await writer.create_topic(topic)
    assert not await writer.create_topic(topic)  # exists: the CAS on the topic key refuses
    await wait_for(lambda: "wide" in reader.metadata.topics)
    assert reader.metadata.topics["wide"].partitions == topic.partitions
    assert seen_sizes and set(seen_sizes) == {5000}  # never a half-created topic


async def test_a_state_decided_for_a_deleted_topic_never_lands_on_its_successor(stores) -> None:  # type: ignore[no-untyped-def]
    store, _ = stores
    first = store.metadata.create_topic("reborn", 2, 3, {}, validate_only=True)
    assert await store.create_topic(first)
    await wait_for(lambda: store.metadata.topics.get("reborn") is not None)
    stale_token = store.revision_of("reborn", 0)  # partition 0 still in its initial state
    keyed = PartitionState([0, 1, 2], 1, 1, [1, 2])
    assert await store.update_partition("reborn", 1, keyed, store.revision_of("reborn", 1))
    await wait_for(lambda: store.metadata.topics["reborn"].partitions[1] == keyed)
    stale_keyed_token = store.revision_of("reborn", 1)

    assert await store.delete_topic("reborn")
    await wait_for(lambda: "reborn" not in store.metadata.topics)
    second = store.metadata.create_topic("reborn", 2, 3, {}, validate_only=True)
    assert await store.create_topic(second)
    await wait_for(lambda: getattr(store.metadata.topics.get("reborn"), "topic_id", None) == second.topic_id)

    elected = PartitionState([0, 1, 2], 2, 5, [2])
    assert not await store.update_partition("reborn", 0, elected, stale_token)
    assert not await store.update_partition("reborn", 1, elected, stale_keyed_token)
    assert store.metadata.topics["reborn"].partitions == second.partitions
    # Decided on the current incarnation, the same change goes through.
    assert await store.update_partition("reborn", 0, elected, store.revision_of("reborn", 0))
    await wait_for(lambda: store.metadata.topics["reborn"].partitions[0] == elected)

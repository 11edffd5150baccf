"""A leader's AlterPartition (``Broker._propose_isr``) pairs the leader epoch/replicas of its
*applied* Partition with the *current* store revision of the partition. After a lost etcd watch,
``EtcdMetadataStore._resync`` loads the whole state (metadata and revisions) at once and only then
tells the broker about it in slices (yielding to the loop between them, and awaiting the
controller's reconcile / the representative's reconnect first). In that window a stale leader's
ISR proposal CASes successfully over a newer election: the leader epoch goes backwards and the
new leader's committed records are truncated away.

Kafka: the controller rejects an AlterPartition whose leader epoch is not the current one
(FENCED_LEADER_EPOCH) or whose partition epoch is stale (INVALID_UPDATE_VERSION).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from fake_etcd import FakeEtcd

from diskless.broker.broker import Broker
from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.metadata import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicMetadata,
    broker_record,
    partition_record,
    topic_record,
)
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.replication.partition import Partition

TOPIC_ID = "00000000-0000-0000-0000-00000000000a"


def _stored_state(fake: FakeEtcd, prefix: str) -> dict:
    return json.loads(fake.kv[(prefix + "partitions/t/0").encode()].value)


def test_isr_proposal_from_a_not_yet_applied_state_overwrites_a_newer_election(tmp_path) -> None:
    async def scenario() -> None:
        fake = FakeEtcd()
        metadata = ClusterMetadata("c")
        store = EtcdMetadataStore("127.0.0.1:2379", "c", metadata)
        store.client = fake  # type: ignore[assignment]
        p = store.prefix
        for node in (1, 2, 3):
            await fake.put(f"{p}brokers/{node}".encode(), broker_record(BrokerInfo(node, "h", 9000 + node)))
        topic = TopicMetadata("t", TOPIC_ID, [PartitionState([1, 2, 3], 1, 0, [1, 2, 3])])
        await fake.put(f"{p}topics/t".encode(), topic_record(topic))
        # Broker 1 leads t-0 at epoch 5 (a few elections ago).
        await fake.put(
            f"{p}partitions/t/0".encode(), partition_record(PartitionState([1, 2, 3], 1, 5, [1, 2, 3]), TOPIC_ID)
        )
        await store._load()

        replica = Partition("t", 0, PartitionLog(str(tmp_path / "t-0"), LogConfig(), 0), 1, TOPIC_ID)
        replica.apply_state(metadata.partition("t", 0), 0)
        assert replica.leader_state is not None and replica.leader_epoch == 5

        # Broker 1's metadata watch is lost for a while. Meanwhile a preferred election (or an
        # operator's ElectLeaders / the leader rebalancer) moves t-0 to broker 2 at epoch 6.
        await fake.put(
            f"{p}partitions/t/0".encode(), partition_record(PartitionState([1, 2, 3], 2, 6, [1, 2, 3]), TOPIC_ID)
        )

        # The watch comes back: _resync loads the new state (metadata + revisions) ...
        await store._load()
        assert metadata.partition("t", 0).leader == 2
        # ... and before the slice with t-0 reaches ReplicaManager.apply, broker 1's periodic
        # _shrink_isrs runs: followers 2 and 3 stopped fetching from it, so it drops them.
        broker = SimpleNamespace(
            _isr_updates=set(), backend=store, node_id=1, metadata=metadata, _isr_slots=asyncio.Semaphore(8)
        )
        Broker._propose_isr(broker, replica, [1])  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)

        stored = _stored_state(fake, p)
        assert (stored["leader"], stored["leader_epoch"]) == (2, 6), (
            f"a stale leader's ISR change overwrote the newer election: stored {stored}"
        )

    asyncio.run(scenario())


def test_isr_proposal_of_a_deleted_incarnation_lands_on_the_recreated_topic(tmp_path) -> None:
    """Same window, across a delete + re-create under the same name (the resync lists the
    re-created topic with the others, after the brokers): the old incarnation's replica proposes
    an ISR change, ``revision_of`` answers for the *new* incarnation and ``update_partition`` stamps
    the new topic id, so the old replica set, leader and epoch become the new topic's state."""

    async def scenario() -> None:
        fake = FakeEtcd()
        metadata = ClusterMetadata("c")
        store = EtcdMetadataStore("127.0.0.1:2379", "c", metadata)
        store.client = fake  # type: ignore[assignment]
        p = store.prefix
        for node in (1, 2, 3, 4):
            await fake.put(f"{p}brokers/{node}".encode(), broker_record(BrokerInfo(node, "h", 9000 + node)))
        old = TopicMetadata("t", TOPIC_ID, [PartitionState([1, 2, 3], 1, 0, [1, 2, 3])])
        await fake.put(f"{p}topics/t".encode(), topic_record(old))
        await fake.put(
            f"{p}partitions/t/0".encode(), partition_record(PartitionState([1, 2, 3], 1, 5, [1, 2, 3]), TOPIC_ID)
        )
        await store._load()
        replica = Partition("t", 0, PartitionLog(str(tmp_path / "t-0"), LogConfig(), 0), 1, TOPIC_ID)
        replica.apply_state(metadata.partition("t", 0), 0)

        # While broker 1's watch is down, t is deleted and re-created on brokers 2, 3, 4.
        fake._delete(f"{p}topics/t".encode(), None)
        fake._delete(f"{p}partitions/t/0".encode(), None)
        fake.revision += 1
        new_id = "00000000-0000-0000-0000-0000000000ff"
        await fake.put(
            f"{p}topics/t".encode(),
            topic_record(TopicMetadata("t", new_id, [PartitionState([2, 3, 4], 2, 0, [2, 3, 4])])),
        )

        await store._load()  # the resync; the ("topic", "t") change that drops the old replica comes later
        broker = SimpleNamespace(
            _isr_updates=set(), backend=store, node_id=1, metadata=metadata, _isr_slots=asyncio.Semaphore(8)
        )
        Broker._propose_isr(broker, replica, [1])  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)

        key = (p + "partitions/t/0").encode()
        if key in fake.kv:
            stored = json.loads(fake.kv[key].value)
            assert stored["replicas"] == [2, 3, 4] and stored["leader"] == 2, (
                f"the deleted incarnation's state was written into the re-created topic: {stored}"
            )

    asyncio.run(scenario())

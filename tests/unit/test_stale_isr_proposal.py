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

from isr_store import leader_replica, open_store, proposer, put_topic, stored_record

from diskless.broker.broker import Broker
from diskless.cluster.metadata import PartitionState, TopicMetadata, partition_record, topic_record

TOPIC_ID = "00000000-0000-0000-0000-00000000000a"


def test_isr_proposal_from_a_not_yet_applied_state_overwrites_a_newer_election(tmp_path) -> None:
    async def scenario() -> None:
        fake, store, metadata = await open_store()
        p = store.prefix
        # Broker 1 leads t-0 at epoch 5 (a few elections ago).
        await put_topic(fake, store, TOPIC_ID, PartitionState([1, 2, 3], 1, 5, [1, 2, 3]))
        await store._load()

        replica = leader_replica(tmp_path, metadata, TOPIC_ID)
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
        broker = proposer(store, metadata)
        Broker._propose_isr(broker, replica, [1])  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)

        stored = stored_record(fake, store)
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
        fake, store, metadata = await open_store((1, 2, 3, 4))
        p = store.prefix
        await put_topic(fake, store, TOPIC_ID, PartitionState([1, 2, 3], 1, 5, [1, 2, 3]))
        await store._load()
        replica = leader_replica(tmp_path, metadata, TOPIC_ID)

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
        broker = proposer(store, metadata)
        Broker._propose_isr(broker, replica, [1])  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)

        key = (p + "partitions/t/0").encode()
        if key in fake.kv:
            stored = stored_record(fake, store)
            assert stored["replicas"] == [2, 3, 4] and stored["leader"] == 2, (
                f"the deleted incarnation's state was written into the re-created topic: {stored}"
            )

    asyncio.run(scenario())

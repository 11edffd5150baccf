"""An ISR expansion whose outcome is unknown must keep counting the joining follower (KIP-497).

``Broker._propose_isr`` resets the leader's maximal ISR in ``finally`` whenever ``ok`` is not
True, including when ``update_partition`` *raised* (a timeout or a lost connection after etcd
applied the transaction). The store then holds ISR {1,2,3} while the leader advances the high
watermark (acks=all answers) from {1,2} alone; if the leader's lease then expires (it lost etcd:
the same outage that lost the answer), the controller elects follower 3 from the stored ISR and
the acknowledged records are gone.

The same reset happens when the unchanged state is applied again while the proposal is in flight
(``EtcdMetadataStore._resync`` re-applies every partition): ``LeaderState.apply_isr`` clears the
maximal ISR although nothing newer was applied.

Kafka (Partition.handleAlterPartitionError) goes back to the committed ISR only on errors that
prove the request was not applied (OPERATION_NOT_ATTEMPTED, INELIGIBLE_REPLICA, ...); otherwise it
keeps the pending (maximal) ISR and retries until it learns the outcome, and a metadata update with
an unchanged partition epoch does not touch the pending state.
"""

from __future__ import annotations

import asyncio

from isr_store import leader_replica, open_store, proposer, put_topic, stored_state

from diskless.broker import broker as broker_module
from diskless.broker.broker import Broker
from diskless.cluster.controller import next_state
from diskless.cluster.metadata import PartitionState

TOPIC_ID = "00000000-0000-0000-0000-00000000000b"
REPLICAS = [1, 3, 2]


async def _setup(tmp_path):
    fake, store, metadata = await open_store()
    # Follower 3 fell out of the ISR earlier; broker 1 leads at epoch 1.
    await put_topic(fake, store, TOPIC_ID, PartitionState(REPLICAS, 1, 1, [1, 2]))
    await store._load()
    replica = leader_replica(tmp_path, metadata, TOPIC_ID)
    return fake, store, metadata, replica, proposer(store, metadata)


def _stored(fake, store) -> PartitionState:
    return stored_state(fake, store)


def test_lost_answer_to_an_applied_expansion_must_not_drop_the_maximal_isr(tmp_path) -> None:
    async def scenario() -> None:
        fake, store, _metadata, replica, broker = await _setup(tmp_path)
        leader = replica.leader_state
        assert leader is not None
        # Follower 3 caught up (log end 0 = HW): the leader proposes ISR {1,2,3}.
        leader.on_follower_fetch(3, 0, 0, 1)
        assert leader.may_rejoin(3)
        fake.fail_after_commit = True  # etcd applies it; the answer is lost (deadline exceeded)
        Broker._propose_isr(broker, replica, [1, 2, 3])  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)
        assert _stored(fake, store).isr == [1, 2, 3]  # the store has the expansion

        # The leader appends offsets 0..9; follower 2 fetches them all, follower 3 nothing yet.
        leader.on_follower_fetch(2, 10, 10, 2)
        acknowledged = leader.high_watermark

        # The leader's lease then expires; the controller elects from the stored ISR.
        elected = next_state(_stored(fake, store), live={2, 3})
        assert elected is not None and elected.leader == 3
        assert acknowledged <= 0, (
            f"HW {acknowledged} acknowledged records the stored-ISR member 3 (log end 0) never had;"
            " the controller just made 3 the leader"
        )

    asyncio.run(scenario())


def test_reapplying_the_same_state_during_a_proposal_must_not_drop_the_maximal_isr(tmp_path) -> None:
    async def scenario() -> None:
        fake, store, metadata, replica, broker = await _setup(tmp_path)
        leader = replica.leader_state
        assert leader is not None
        leader.on_follower_fetch(3, 0, 0, 1)
        Broker._propose_isr(broker, replica, [1, 2, 3])  # type: ignore[arg-type]  # in flight
        # A watch resync re-applies every partition as stored (unchanged: the CAS has not landed).
        replica.apply_state(metadata.partition("t", 0), 2)
        for _ in range(5):
            await asyncio.sleep(0)  # the CAS lands: the store's ISR is {1,2,3}
        assert _stored(fake, store).isr == [1, 2, 3]
        # Before the watch delivers it, follower 2 fetches offsets 0..9.
        leader.on_follower_fetch(2, 10, 10, 3)
        assert leader.high_watermark <= 0, (
            f"HW {leader.high_watermark} advanced without follower 3, which the store has in the ISR"
        )

    asyncio.run(scenario())


def test_expansion_whose_every_attempt_was_lost_does_not_stay_pending(tmp_path, monkeypatch) -> None:
    """Every attempt of an expansion fails with an unknown outcome and none landed (etcd never
    applied them). The proposal ended, yet the leader kept the maximal ISR {1,2,3} against the
    store's {1,2}: nothing would ever settle it (no metadata change comes, and follower 3, out of
    the stored ISR, is never shrunk), so the high watermark waited for 3 until the next ISR change
    — for good, once 3 stopped fetching. Kafka keeps asking (AlterPartitionManager) until the
    controller answers; the leader stays pending only while it does not know the outcome."""
    monkeypatch.setattr(broker_module, "ISR_PROPOSAL_RETRY_S", 0)

    async def scenario() -> None:
        fake, store, metadata, replica, broker = await _setup(tmp_path)
        leader = replica.leader_state
        assert leader is not None
        leader.on_follower_fetch(3, 0, 0, 1)  # follower 3 caught up: propose ISR {1,2,3}
        fake.fail_before_commit = 5  # more attempts than were ever made (3): each lost, none applied
        Broker._propose_isr(broker, replica, [1, 2, 3])  # type: ignore[arg-type]
        for _ in range(100):
            if ("t", 0) not in broker._isr_updates:
                break
            await asyncio.sleep(0)  # a loop turn: the proposal's attempts run
        assert ("t", 0) not in broker._isr_updates, "the proposal never ended"

        stored = _stored(fake, store)
        assert leader.maximal_isr is None or set(leader.maximal_isr) <= set(stored.isr), (
            f"no proposal in flight, the store has ISR {stored.isr}, yet the high watermark waits for"
            f" {leader.maximal_isr}"
        )
        # Whatever the outcome, applying the store's state leaves the leader with it alone.
        state = metadata.partition("t", 0)
        assert state is not None
        replica.apply_state(PartitionState(state.replicas, 1, 1, stored.isr), 2)
        assert leader.maximal_isr is None and leader.isr == stored.isr

    asyncio.run(scenario())


def test_another_change_to_the_partition_ends_the_pending_isr(tmp_path) -> None:
    """A reassignment's write moves the partition's revision without touching its ISR: a proposal
    in flight against the old revision can no longer land, so the leader stops counting the
    joining follower (Kafka: a new partition epoch clears the pending state). Kept, the high
    watermark waited for that follower until the next ISR change."""

    async def scenario() -> None:
        _fake, _store, metadata, replica, _broker = await _setup(tmp_path)
        leader = replica.leader_state
        assert leader is not None
        leader.on_follower_fetch(3, 0, 0, 1)
        leader.propose_isr([1, 2, 3])  # in flight; its answer is lost
        assert leader.maximal_isr == [1, 2, 3]
        replica.apply_state(metadata.partition("t", 0), 2)  # the same state again: still pending
        assert leader.maximal_isr == [1, 2, 3]

        replica.apply_state(PartitionState([*REPLICAS, 4], 1, 1, [1, 2]), 3)  # a reassignment adds 4

        assert leader.maximal_isr is None

    asyncio.run(scenario())

"""Sans-IO replication rules: high watermark and ISR on the leader, elections in the controller."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.cluster.controller import NO_LEADER, elect_on_broker_change, next_state
from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, PartitionState
from diskless.replication.leader_state import LeaderState


def leader(isr: list[int], hw: int = 0, now: int = 0) -> LeaderState:
    return LeaderState(
        leader_id=0,
        leader_epoch=1,
        replicas=[0, 1, 2],
        isr=isr,
        epoch_start_offset=0,
        high_watermark=hw,
        became_leader_ms=now,
    )


def test_hw_waits_for_every_isr_follower() -> None:
    state = leader([0, 1, 2])
    assert not state.on_follower_fetch(1, 10, leader_leo=10, now_ms=1)
    assert state.high_watermark == 0
    assert state.on_follower_fetch(2, 7, leader_leo=10, now_ms=1)
    assert state.high_watermark == 7
    assert state.on_follower_fetch(2, 10, leader_leo=10, now_ms=2)
    assert state.high_watermark == 10


def test_a_single_replica_isr_commits_on_append() -> None:
    state = leader([0])
    assert state.maybe_advance_hw(42) and state.high_watermark == 42


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.integers(0, 100)), max_size=40))
def test_hw_never_moves_backwards(fetches: list[tuple[int, int]]) -> None:
    state = leader([0, 1, 2])
    last = 0
    for follower, offset in fetches:
        state.on_follower_fetch(follower, offset, leader_leo=100, now_ms=0)
        assert state.high_watermark >= last
        assert state.high_watermark <= 100
        last = state.high_watermark


def test_lagging_follower_leaves_and_caught_up_follower_returns() -> None:
    state = leader([0, 1, 2], now=0)
    state.on_follower_fetch(1, 10, leader_leo=10, now_ms=1000)
    state.on_follower_fetch(2, 3, leader_leo=10, now_ms=1000)
    assert state.isr_to_shrink(now_ms=20_000, lag_ms=30_000) == []
    # Follower 1 caught up at 1000, follower 2 never did (it was last caught up when we became leader).
    assert state.isr_to_shrink(now_ms=30_500, lag_ms=30_000) == [2]
    state.apply_isr([0, 1], leader_leo=10)
    assert state.high_watermark == 10  # the laggard no longer holds the HW back
    assert state.isr_to_expand() == []
    state.on_follower_fetch(2, 10, leader_leo=10, now_ms=32_000)
    assert state.isr_to_expand() == [2]


def test_election_picks_the_first_live_isr_replica_and_bumps_the_epoch() -> None:
    state = PartitionState(replicas=[0, 1, 2], leader=0, leader_epoch=4, isr=[0, 1, 2])
    new = next_state(state, live={1, 2})
    assert new == PartitionState([0, 1, 2], 1, 5, [1, 2])
    assert next_state(new, live={1, 2}) is None


def test_no_unclean_election_and_the_last_isr_member_comes_back() -> None:
    state = PartitionState(replicas=[0, 1, 2], leader=0, leader_epoch=4, isr=[0])
    offline = next_state(state, live={1, 2})
    assert offline == PartitionState([0, 1, 2], NO_LEADER, 5, [0])
    assert next_state(offline, live={1, 2}) is None  # out-of-sync replicas never lead
    back = next_state(offline, live={0, 1, 2})
    assert back == PartitionState([0, 1, 2], 0, 6, [0])


def test_dead_follower_leaves_the_isr_without_a_leader_change() -> None:
    state = PartitionState(replicas=[0, 1, 2], leader=0, leader_epoch=4, isr=[0, 1, 2])
    assert next_state(state, live={0, 1}) == PartitionState([0, 1, 2], 0, 4, [0, 1])


def test_topic_creation_spreads_replicas_over_racks_and_leaders_over_brokers() -> None:
    metadata = ClusterMetadata("c")
    for node_id, rack in enumerate(["a", "a", "b", "b", "c", "c"]):
        metadata.brokers[node_id] = BrokerInfo(node_id, "h", 1, rack)
    topic = metadata.create_topic("t", 12, 3, {})
    for partition in topic.partitions:
        assert len({metadata.brokers[r].rack for r in partition.replicas}) == 3
    leaders = [p.leader for p in topic.partitions]
    assert sorted(leaders.count(b) for b in range(6)) == [2] * 6
    assert elect_on_broker_change(metadata, set(metadata.brokers)) == []

"""LeaderState.low_watermark, Kafka's Partition.lowWatermarkIfLeader: what a DeleteRecords waits
for before answering (DelayedDeleteRecords), so no live replica still serves the old log start."""

from __future__ import annotations

from diskless.replication.leader_state import LeaderState


def leader() -> LeaderState:
    return LeaderState(
        leader_id=0,
        leader_epoch=1,
        replicas=[0, 1, 2],
        isr=[0, 1, 2],
        epoch_start_offset=0,
        high_watermark=10,
        became_leader_ms=0,
    )


def test_the_lowest_live_replica_start_is_the_low_watermark() -> None:
    state = leader()
    state.on_follower_fetch(1, 10, 10, 1, log_start_offset=10)
    state.on_follower_fetch(2, 10, 10, 1, log_start_offset=4)
    assert state.low_watermark(10, live={0, 1, 2}) == 4
    state.on_follower_fetch(2, 10, 10, 2, log_start_offset=10)
    assert state.low_watermark(10, live={0, 1, 2}) == 10


def test_a_follower_not_heard_from_holds_it_back_and_a_dead_one_does_not() -> None:
    state = leader()
    state.on_follower_fetch(1, 10, 10, 1, log_start_offset=10)
    assert state.low_watermark(10, live={0, 1, 2}) < 10  # broker 2 never fetched: start unknown
    assert state.low_watermark(10, live={0, 1}) == 10


def test_the_leader_start_bounds_it() -> None:
    state = leader()
    state.on_follower_fetch(1, 10, 10, 1, log_start_offset=10)
    state.on_follower_fetch(2, 10, 10, 1, log_start_offset=10)
    assert state.low_watermark(7, live={0, 1, 2}) == 7

"""When the leader counts a follower caught up (Kafka's Replica.updateFetchState): at a fetch
that reaches the leader's log end, or one that reaches the log end of the follower's previous
fetch, as of that previous fetch."""

from __future__ import annotations

from diskless.replication.leader_state import LeaderState


def _state() -> LeaderState:
    return LeaderState(
        leader_id=0,
        leader_epoch=1,
        replicas=[0, 1],
        isr=[0, 1],
        epoch_start_offset=0,
        high_watermark=0,
        became_leader_ms=0,
    )


def test_a_follower_keeping_pace_with_a_steadily_appending_leader_stays_in_the_isr() -> None:
    """The leader appends between every two fetches, so no fetch finds the follower at the
    leader's log end; each fetch asks for everything the previous answer carried. Before the fix
    the follower was never caught up and was listed to shrink after the lag time."""
    state = _state()
    leader_leo = fetched = 0
    now = 0
    for now in range(0, 60_000, 100):  # a fetch every 100 ms for 60 s
        leader_leo += 5
        state.on_follower_fetch(1, fetched, leader_leo, now)
        fetched = leader_leo  # the answer brings the follower to the leader's end as of now
    assert state.followers[1].last_caught_up_ms == now - 100
    assert state.isr_to_shrink(now_ms=60_000, lag_ms=30_000) == []


def test_a_follower_that_falls_behind_its_previous_answer_is_still_dropped() -> None:
    """A follower fetching at an offset below the previous fetch's leader end (it did not keep
    what it was sent, or it is slower than the appends) is not caught up."""
    state = _state()
    leader_leo = 0
    for now in range(0, 60_000, 100):
        leader_leo += 5
        state.on_follower_fetch(1, leader_leo // 2, leader_leo, now)  # half as fast as the leader
    assert state.followers[1].last_caught_up_ms == 0
    assert state.isr_to_shrink(now_ms=60_000, lag_ms=30_000) == [1]

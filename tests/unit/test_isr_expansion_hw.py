"""The high watermark while an ISR expansion is in flight (Kafka's maximal ISR, KIP-497).

Once a leader has asked the metadata store to add a follower to the ISR, the controller may act on
the stored ISR before the leader applies it: complete a reassignment and make that follower leader,
or elect it after the leader dies. So from the moment it proposes the expansion, the leader counts
the joining follower when it advances the high watermark; otherwise it could acknowledge records
(acks=all) that only the old ISR has, and the new leader would not have them.
"""

from __future__ import annotations

from diskless.replication.leader_state import LeaderState


def leader() -> LeaderState:
    state = LeaderState(
        leader_id=0,
        leader_epoch=1,
        replicas=[3, 1, 0],
        isr=[0, 1],
        epoch_start_offset=0,
        high_watermark=10,
        became_leader_ms=0,
    )
    state.on_follower_fetch(1, 10, 10, 1)
    state.on_follower_fetch(3, 10, 10, 1)
    return state


def test_a_proposed_expansion_holds_the_high_watermark_for_the_joining_follower() -> None:
    state = leader()
    assert state.isr_to_expand() == [3]
    state.propose_isr([0, 1, 3])
    # The leader appends 10..19; follower 1 has them all, the joining follower 3 none yet.
    state.on_follower_fetch(1, 20, 20, 2)
    assert state.high_watermark == 10
    state.on_follower_fetch(3, 15, 20, 3)
    assert state.high_watermark == 15
    # The store's answer arrives: the ISR is what was proposed.
    state.apply_isr([0, 1, 3], 20)
    state.on_follower_fetch(3, 20, 20, 4)
    assert state.high_watermark == 20


def test_a_failed_proposal_releases_the_joining_follower() -> None:
    state = leader()
    state.propose_isr([0, 1, 3])
    state.on_follower_fetch(1, 20, 20, 2)
    assert state.high_watermark == 10
    state.proposal_failed()
    assert state.maybe_advance_hw(20) and state.high_watermark == 20

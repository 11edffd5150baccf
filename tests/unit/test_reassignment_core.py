"""Reassignment and election decisions (cluster/reassignment.py, cluster/elections.py), sans-IO.

The property test drives a partition through random reassignments, cancellations, ISR catch-ups
and completions and checks Kafka's invariants after every step: the leader is a replica in the
ISR (or there is none), the ISR is within the replicas, target replicas come first, and a finished
reassignment leaves exactly the target.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.cluster.elections import PREFERRED, UNCLEAN, elect, imbalanced_partitions
from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, PartitionState, TopicMetadata, partition_record
from diskless.cluster.reassignment import (
    ReassignmentError,
    cancel,
    complete,
    describe,
    in_progress,
    original_replicas,
    reassign,
)

LIVE = {0, 1, 2, 3, 4}
PS = PartitionState


def state(replicas: list[int], leader: int | None = None, isr: list[int] | None = None, epoch: int = 3) -> PS:
    chosen = replicas[0] if leader is None else leader
    return PartitionState(replicas, chosen, epoch, list(replicas if isr is None else isr))


def test_adding_replica_joins_then_completion_drops_the_removed_one() -> None:
    started = reassign(state([0, 1, 2]), [3, 1, 2], LIVE)
    assert started == PartitionState([3, 1, 2, 0], 0, 3, [0, 1, 2], adding=[3], removing=[0])
    assert complete(started, LIVE) is None  # 3 has not caught up yet
    caught_up = replace(started, isr=[0, 1, 2, 3])
    done = complete(caught_up, LIVE)
    # The leader (0) leaves: the first target replica in the ISR leads, with a new epoch.
    assert done == PartitionState([3, 1, 2], 3, 4, [1, 2, 3])
    assert not in_progress(done)


def test_completion_keeps_a_leader_that_stays() -> None:
    started = reassign(state([0, 1, 2]), [0, 1, 3], LIVE)
    done = complete(replace(started, isr=[0, 1, 2, 3]), LIVE)
    assert done == PartitionState([0, 1, 3], 0, 3, [0, 1, 3])


def test_cancel_reverts_to_the_original_replicas() -> None:
    started = reassign(state([0, 1, 2]), [3, 4, 2], LIVE)
    # As Kafka's PartitionReassignmentRevert: the original replicas in their reassignment order.
    assert original_replicas(started) == [2, 0, 1]
    assert describe(started) is not None and describe(started).adding == [3, 4]
    reverted = cancel(replace(started, isr=[0, 1, 2, 3]), LIVE)
    assert reverted == PartitionState([2, 0, 1], 0, 3, [0, 1, 2])
    assert cancel(reverted, LIVE) is None


def test_a_new_target_replaces_the_reassignment_in_progress() -> None:
    started = reassign(state([0, 1, 2]), [3, 1, 2], LIVE)
    again = reassign(replace(started, isr=[0, 1, 2, 3]), [4, 1, 2], LIVE)
    assert again.replicas == [4, 1, 2, 0] and again.adding == [4] and again.removing == [0]
    assert 3 not in again.isr


def test_reorder_and_shrink_complete_at_once() -> None:
    assert reassign(state([0, 1, 2]), [1, 0, 2], LIVE) == PartitionState([1, 0, 2], 0, 3, [0, 1, 2])
    assert reassign(state([0, 1, 2]), [1, 2], LIVE) == PartitionState([1, 2], 1, 4, [1, 2])
    assert reassign(state([0, 1, 2]), [0, 1, 2], LIVE) is None


@pytest.mark.parametrize("target", [[], [1, 1], [9]])
def test_invalid_targets(target: list[int]) -> None:
    with pytest.raises(ReassignmentError) as info:
        reassign(state([0, 1, 2]), target, LIVE)
    assert info.value.code == ErrorCode.invalid_replica_assignment


def test_partition_records_only_carry_reassignment_fields_during_one() -> None:
    assert b"adding" not in partition_record(state([0, 1]), "id")
    started = reassign(state([0, 1]), [2, 1], LIVE)
    assert b'"adding": [2]' in partition_record(started, "id")


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, list[int]]]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["reassign", "cancel", "catch_up", "complete", "kill"]))
        arg = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4, unique=True))
        out.append((kind, arg))
    return out


@given(steps())
def test_invariants_hold_through_any_sequence(sequence: list[tuple[str, list[int]]]) -> None:
    current = state([0, 1, 2])
    live = set(LIVE)
    target: list[int] | None = None
    for kind, arg in sequence:
        new: PartitionState | None = None
        if kind == "reassign":
            try:
                new = reassign(current, arg, live)
            except ReassignmentError:
                continue
            target = arg
        elif kind == "cancel":
            new = cancel(current, live)
        elif kind == "catch_up":
            joiners = [r for r in arg if r in current.replicas and r in live and r not in current.isr]
            if current.leader >= 0 and joiners:
                new = replace(current, isr=current.isr + joiners)
        elif kind == "complete":
            new = complete(current, live)
        elif kind == "kill" and arg[0] != current.leader:
            live.discard(arg[0])
        if new is not None:
            current = new
        assert set(current.isr) <= set(current.replicas)
        assert current.leader == -1 or current.leader in current.isr
        assert set(current.adding) <= set(current.replicas) and set(current.removing) <= set(current.replicas)
        assert not set(current.adding) & set(current.removing)
        if in_progress(current):
            n = len(current.replicas) - len(current.removing)
            assert current.replicas[n:] == current.removing
        if kind == "complete" and new is not None and target is not None:
            assert current.replicas == target


def test_preferred_election() -> None:
    moved = elect(state([0, 1, 2], leader=1), PREFERRED, LIVE)
    assert moved.error == ErrorCode.none and moved.state is not None
    assert (moved.state.leader, moved.state.leader_epoch) == (0, 4)
    assert elect(state([0, 1, 2]), PREFERRED, LIVE).error == ErrorCode.election_not_needed
    unavailable = ErrorCode.preferred_leader_not_available
    assert elect(state([0, 1, 2], leader=1, isr=[1, 2]), PREFERRED, LIVE).error == unavailable
    assert elect(state([0, 1, 2], leader=1), PREFERRED, {1, 2}).error == unavailable


def test_unclean_election() -> None:
    assert elect(state([0, 1, 2]), UNCLEAN, LIVE).error == ErrorCode.election_not_needed
    offline = PartitionState([0, 1, 2], -1, 5, [0])
    chosen = elect(offline, UNCLEAN, {1, 2})
    assert chosen.error == ErrorCode.none and chosen.state == PartitionState([0, 1, 2], 1, 6, [1])
    in_sync = elect(PartitionState([0, 1, 2], -1, 5, [0, 2]), UNCLEAN, {1, 2})
    assert in_sync.state == PartitionState([0, 1, 2], 2, 6, [2])
    assert elect(offline, UNCLEAN, {7}).error == ErrorCode.eligible_leaders_not_available


def test_rebalance_picks_partitions_of_imbalanced_brokers() -> None:
    meta = ClusterMetadata("c")
    meta.brokers = {i: BrokerInfo(i, "h", 1) for i in range(3)}
    parts = [state([0, 1, 2], leader=1), state([0, 1, 2]), state([1, 0, 2]), state([2, 0, 1], leader=0)]
    meta.topics["t"] = TopicMetadata("t", "id", parts)
    assert imbalanced_partitions(meta, {0, 1, 2}, 10) == [("t", 0), ("t", 3)]
    # Broker 0 leads 1 of its 2 preferred partitions: a 50% imbalance is within 50%.
    assert imbalanced_partitions(meta, {0, 1, 2}, 50) == [("t", 3)]
    assert imbalanced_partitions(meta, {0, 1}, 10) == [("t", 0)]

"""Partition reassignment (KIP-455) as pure functions over a partition's state (sans-IO).

A reassignment to ``target`` first *adds*: the partition's replicas become the target followed by
the original replicas that are not in it, ``adding`` lists target replicas that were not replicas
before and ``removing`` the original ones that are not in the target. Added replicas are followers
like any other: they replicate the log (for a diskless partition that is its pointer log only) and
the leader puts them into the ISR once caught up. When every adding replica is in the ISR the
controller *completes* it: replicas become the target, the removed ones leave the ISR (and their
brokers drop the replica), and if the leader is leaving, leadership moves to the first target
replica in the ISR with a new leader epoch. Cancelling reverts to the original replicas the same
way. A reassignment that adds nothing (a reorder or a pure removal) completes at once.

Every function returns a new state (or None when nothing changes) that the caller CASes into the
metadata store against the revision it read, so a reassignment never overwrites a concurrent
leader election or ISR change: it is decided again from the newer state.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from .metadata import PartitionState

NO_LEADER = -1


class ReassignmentError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def in_progress(state: PartitionState) -> bool:
    return bool(state.adding or state.removing)


def original_replicas(state: PartitionState) -> list[int]:
    """The replicas before the reassignment in progress (all of them when there is none)."""
    return [r for r in state.replicas if r not in state.adding]


def target_replicas(state: PartitionState) -> list[int]:
    return [r for r in state.replicas if r not in state.removing]


def reassign(state: PartitionState, target: Sequence[int], known_brokers: Collection[int]) -> PartitionState | None:
    """The state that starts reassigning to ``target``; None if it is already the replica set.

    A new target while another reassignment is in progress replaces it, computed from the
    original replicas (Kafka's semantics): replicas the old one was adding and the new one does
    not want leave at once.
    """
    target = list(target)
    if not target:
        raise ReassignmentError(ErrorCode.invalid_replica_assignment, "The replica set cannot be empty.")
    if len(set(target)) != len(target):
        raise ReassignmentError(ErrorCode.invalid_replica_assignment, f"Duplicate replicas in {target}.")
    unknown = [b for b in target if b not in known_brokers]
    if unknown:
        raise ReassignmentError(ErrorCode.invalid_replica_assignment, f"Unknown or offline brokers {unknown}.")
    original = original_replicas(state)
    if target == state.replicas and not in_progress(state):
        return None
    adding = [r for r in target if r not in original]
    removing = [r for r in original if r not in target]
    replicas = target + removing
    isr = [r for r in state.isr if r in replicas]
    started = replace(state, replicas=replicas, isr=isr, adding=adding, removing=removing)
    if not adding:
        # Nothing to catch up: a reorder or a shrink completes now, unless the leader leaves and no
        # other target replica in the ISR is live to take over (then the controller completes it).
        done = _retarget(started, target, set(known_brokers))
        return done if done is not None else started
    if state.leader not in replicas:
        # The leader was a replica an earlier reassignment was adding that this one drops.
        return _elect(started, replicas, set(known_brokers))
    return started


def cancel(state: PartitionState, live: Collection[int]) -> PartitionState | None:
    """Revert to the original replicas; None if no reassignment is in progress."""
    if not in_progress(state):
        return None
    original = original_replicas(state)
    reverted = replace(state, replicas=original, isr=[r for r in state.isr if r in original], adding=[], removing=[])
    if reverted.leader in original and reverted.isr:
        return reverted
    return _elect(reverted, original, set(live))


def complete(state: PartitionState, live: Collection[int]) -> PartitionState | None:
    """The finished reassignment once every adding replica is in the ISR; None until then (or if
    no live target replica in the ISR could lead)."""
    if not in_progress(state) or any(r not in state.isr for r in state.adding):
        return None
    return _retarget(state, target_replicas(state), set(live))


def _retarget(state: PartitionState, target: list[int], live: set[int]) -> PartitionState | None:
    done = replace(state, replicas=target, isr=[r for r in state.isr if r in target], adding=[], removing=[])
    if done.leader in target:
        return done
    return _elect(done, target, live)


def _elect(state: PartitionState, candidates: list[int], live: set[int]) -> PartitionState | None:
    """Move leadership to the first live ISR member among ``candidates``, with a new epoch."""
    for replica in candidates:
        if replica in state.isr and replica in live:
            return replace(state, leader=replica, leader_epoch=state.leader_epoch + 1)
    return None


@dataclass(frozen=True)
class Ongoing:
    """A reassignment in progress as ListPartitionReassignments reports it."""

    replicas: list[int]
    adding: list[int]
    removing: list[int]


def describe(state: PartitionState) -> Ongoing | None:
    if not in_progress(state):
        return None
    return Ongoing(list(state.replicas), list(state.adding), list(state.removing))

"""Controller decisions as pure functions over cluster metadata (sans-IO).

When the set of live brokers changes, ``elect_on_broker_change`` computes the new partition
states: dead brokers leave every ISR; a partition whose leader died gets the first live ISR
member (in replica order) as leader with a bumped leader epoch. There is no unclean election: if
no ISR member is alive the partition goes offline (leader -1) and keeps its last ISR, so the first
of those brokers to come back leads it again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .metadata import ClusterMetadata, PartitionState

NO_LEADER = -1


@dataclass(frozen=True)
class PartitionChange:
    topic: str
    partition: int
    state: PartitionState


def next_state(state: PartitionState, live: set[int]) -> PartitionState | None:
    """The partition's state after brokers outside ``live`` are fenced; None when unchanged."""
    live_isr = [r for r in state.isr if r in live]
    leader_alive = state.leader in live and state.leader in live_isr
    if leader_alive:
        if live_isr == state.isr:
            return None
        return replace(state, isr=live_isr)
    candidates = [r for r in state.replicas if r in live_isr]
    if candidates:
        return replace(state, leader=candidates[0], leader_epoch=state.leader_epoch + 1, isr=live_isr)
    if state.leader == NO_LEADER:
        return None
    # Offline: keep the last ISR so that one of its members, and only one, can lead again.
    return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1, isr=list(state.isr))


def elect_on_broker_change(metadata: ClusterMetadata, live: set[int]) -> list[PartitionChange]:
    changes = []
    for topic in metadata.topics.values():
        for index, state in enumerate(topic.partitions):
            new = next_state(state, live)
            if new is not None:
                changes.append(PartitionChange(topic.name, index, new))
    return changes

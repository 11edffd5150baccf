"""Leader elections operators ask for (ElectLeaders, KIP-460) and automatic leader rebalancing
(``auto.leader.rebalance.enable``), as pure functions over partition states (sans-IO).

*Preferred*: leadership goes to the first replica (the preferred leader) when it is live and in
the ISR. *Unclean*: only for a partition without a live leader; the first live ISR member leads,
and if none is live, the first live replica does, with the ISR reset to it alone, accepting that
records it never received are lost (Kafka's ``unclean.leader.election.enable`` made explicit).
Results carry Kafka's error codes: ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE,
ELIGIBLE_LEADERS_NOT_AVAILABLE.

Rebalancing follows Kafka's controller: for each broker, the share of partitions it is the
preferred leader of that it does not lead; above ``leader.imbalance.per.broker.percentage`` the
controller runs preferred elections for those partitions.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from .metadata import ClusterMetadata, PartitionState

PREFERRED = 0
UNCLEAN = 1


@dataclass(frozen=True)
class Election:
    """The outcome for one partition: a new state to store, or the error explaining why not."""

    error: ErrorCode
    state: PartitionState | None = None
    message: str | None = None


def elect(state: PartitionState, election_type: int, live: Collection[int]) -> Election:
    if election_type == PREFERRED:
        return elect_preferred(state, live)
    if election_type == UNCLEAN:
        return elect_unclean(state, live)
    return Election(ErrorCode.invalid_request, message=f"Unknown election type {election_type}")


def elect_preferred(state: PartitionState, live: Collection[int]) -> Election:
    if not state.replicas:
        return Election(ErrorCode.preferred_leader_not_available, message="No replicas")
    preferred = state.replicas[0]
    if state.leader == preferred:
        return Election(ErrorCode.election_not_needed, message="Leader is already the preferred replica")
    if preferred not in live or preferred not in state.isr:
        return Election(
            ErrorCode.preferred_leader_not_available,
            message=f"Preferred replica {preferred} is not live or not in the ISR {state.isr}",
        )
    return Election(ErrorCode.none, replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1))


def elect_unclean(state: PartitionState, live: Collection[int]) -> Election:
    if state.leader >= 0 and state.leader in live:
        return Election(ErrorCode.election_not_needed, message=f"Partition has a live leader {state.leader}")
    for replica in state.replicas:
        if replica in state.isr and replica in live:
            isr = [r for r in state.isr if r in live]
            elected = replace(state, leader=replica, leader_epoch=state.leader_epoch + 1, isr=isr)
            return Election(ErrorCode.none, elected)
    for replica in state.replicas:
        if replica in live:
            return Election(
                ErrorCode.none, replace(state, leader=replica, leader_epoch=state.leader_epoch + 1, isr=[replica])
            )
    return Election(ErrorCode.eligible_leaders_not_available, message="No replica is live")


def imbalanced_partitions(metadata: ClusterMetadata, live: Collection[int], percentage: int) -> list[tuple[str, int]]:
    """Partitions to give back to their preferred leader: those of every live broker whose share of
    partitions led by someone else exceeds ``percentage`` (and whose election can succeed now)."""
    preferred_of: dict[int, list[tuple[str, int, PartitionState]]] = {}
    for topic in metadata.topics.values():
        for index, state in enumerate(topic.partitions):
            if state.replicas:
                preferred_of.setdefault(state.replicas[0], []).append((topic.name, index, state))
    out: list[tuple[str, int]] = []
    for broker, partitions in sorted(preferred_of.items()):
        if broker not in live:
            continue
        elsewhere = [(t, i) for t, i, s in partitions if s.leader != broker]
        if not elsewhere or len(elsewhere) * 100 <= percentage * len(partitions):
            continue
        by_key = {(t, i): s for t, i, s in partitions}
        out += [key for key in elsewhere if elect_preferred(by_key[key], live).state is not None]
    return out

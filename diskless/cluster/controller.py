"""Controller decisions as pure functions over cluster metadata (sans-IO).

When the set of live brokers changes, ``elect_on_broker_change`` computes the new partition
states: dead brokers leave every ISR; a partition whose leader died gets the first live ISR
member (in replica order) as leader with a bumped leader epoch. If no ISR member is alive the
partition goes offline (leader -1) and keeps its last ISR, so the first of those brokers to come
back leads it again.

Unclean election, as Kafka's controller does it for topics whose effective
``unclean.leader.election.enable`` is true: a partition without a live ISR member is led by its
first live replica instead (``elections.elect_unclean``: bumped epoch, ISR reset to that replica
alone), accepting that records only the lost ISR had are gone. It happens when brokers die, when
an out-of-sync replica comes back to an offline partition, and when the setting is turned on for
a topic that has such partitions (the broker runs ``elect_on_broker_change`` again on a config
change, with the same live set). The setting is passed in as a predicate over topics so that only
partitions without a live ISR member ask for it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from .elections import elect_unclean
from .metadata import ClusterMetadata, PartitionState, TopicMetadata

NO_LEADER = -1


@dataclass(frozen=True)
class PartitionChange:
    topic: str
    partition: int
    state: PartitionState
    unclean: bool = False  # the new leader was not in the ISR (records may have been lost)


def next_state(state: PartitionState, live: set[int], unclean: bool = False) -> PartitionState | None:
    """The partition's state after brokers outside ``live`` are fenced; None when unchanged.
    ``unclean``: the topic allows an out-of-sync replica to lead when no ISR member is live."""
    live_isr = [r for r in state.isr if r in live]
    leader_alive = state.leader in live and state.leader in live_isr
    if leader_alive:
        if live_isr == state.isr:
            return None
        return replace(state, isr=live_isr)
    candidates = [r for r in state.replicas if r in live_isr]
    if candidates:
        return replace(state, leader=candidates[0], leader_epoch=state.leader_epoch + 1, isr=live_isr)
    if unclean:
        # No ISR member is live here, so this picks the first live replica, if any.
        elected = elect_unclean(state, live).state
        if elected is not None:
            return elected
    if state.leader == NO_LEADER:
        return None
    # Offline: keep the last ISR so that one of its members, and only one, can lead again.
    return replace(state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1, isr=list(state.isr))


def elect_on_broker_change(
    metadata: ClusterMetadata,
    live: set[int],
    unclean_enabled: Callable[[TopicMetadata], bool] = lambda topic: False,
    topics: Collection[str] | None = None,
) -> list[PartitionChange]:
    """Every partition state that changes with ``live`` brokers (of ``topics`` only, when given:
    one topic's config changed). ``unclean_enabled`` tells whether a topic's effective
    ``unclean.leader.election.enable`` is true; asked only for topics with a partition that has
    no live ISR member (it parses configs), at most once per topic."""
    changes = []
    for topic in metadata.topics.values():
        if topics is not None and topic.name not in topics:
            continue
        unclean: bool | None = None
        for index, state in enumerate(topic.partitions):
            if unclean is None and not any(r in live for r in state.isr):
                unclean = unclean_enabled(topic)
            new = next_state(state, live, bool(unclean))
            if new is not None:
                out_of_sync = new.leader != NO_LEADER and new.leader not in state.isr
                changes.append(PartitionChange(topic.name, index, new, unclean=out_of_sync))
    return changes

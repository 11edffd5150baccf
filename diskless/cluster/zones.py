"""Zone alignment for diskless partitions (DESIGN.md, "Metadata crafting"), as pure functions.

A client in AZ z is told that the leader of a diskless partition is a broker in z: the
partition's own replica there if it has one, else a deterministic representative among z's live
brokers. Produce and fetch then never leave the zone; only pointers and commits cross AZs.

Among the zone's replicas an in-sync one is preferred: only a follower in the ISR serves reads
from its own log (``diskless.replication.follower_reads``). An out-of-sync replica still beats a
representative: it reads through the leader as a representative would, and serves locally again
as soon as it rejoins the ISR, without clients having to refresh their metadata.
"""

from __future__ import annotations

import zlib

from .metadata import BrokerInfo, PartitionState


def zone_aligned_leader(
    state: PartitionState, topic: str, partition: int, client_az: str, brokers: dict[int, BrokerInfo]
) -> int:
    in_zone = sorted(node_id for node_id, info in brokers.items() if info.rack == client_az)
    if not in_zone:
        return state.leader  # no broker in the client's zone: classic behaviour
    if state.leader in in_zone:
        return state.leader
    zone_replicas = [replica for replica in state.replicas if replica in in_zone]
    for replica in zone_replicas:
        if replica in state.isr:
            return replica
    if zone_replicas:
        return zone_replicas[0]
    return in_zone[zlib.crc32(f"{topic}-{partition}".encode()) % len(in_zone)]

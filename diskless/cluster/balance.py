"""Balanced, rack-aware replica placement for scale-out and decommission (sans-IO).

``plan`` takes every partition's current replicas and the brokers that should hold them (with
their racks) and returns new replica lists that

- keep each partition's replication factor (capped at the number of brokers),
- use only the given brokers (a decommissioned broker keeps nothing),
- spread each partition's replicas over as many racks as there are (one per AZ when possible),
- give every broker the same number of replicas, give or take one, and the same number of
  preferred leaderships (first replicas), give or take one where the placement allows,
- and move as little as possible: a replica stays where it is unless its broker is leaving, is
  above its share, or shares a rack with another replica of the partition that another rack could
  take.

The result is what ``kafka-reassign-partitions --generate`` proposes; ``diskless reassign``
applies it through AlterPartitionReassignments.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

PartitionKey = tuple[str, int]


def plan(
    current: Mapping[PartitionKey, Sequence[int]], brokers: Mapping[int, str | None]
) -> dict[PartitionKey, list[int]]:
    """New replica lists for every partition in ``current`` (unchanged ones included)."""
    if not brokers:
        raise ValueError("no brokers to place replicas on")
    keys = sorted(current)
    rf = {k: min(len(current[k]), len(brokers)) for k in keys}
    total = sum(rf.values())
    cap = math.ceil(total / len(brokers))
    rack_count = len({brokers[b] for b in brokers})

    def rack(b: int) -> str | None:
        return brokers[b]

    # 1. Keep replicas on staying brokers, one per rack while the partition could use more racks.
    kept: dict[PartitionKey, list[int]] = {}
    for k in keys:
        keep: list[int] = []
        for b in current[k]:
            if b not in brokers or len(keep) >= rf[k]:
                continue
            racks = [rack(x) for x in keep]
            if rack(b) in racks and len(set(racks)) < min(rf[k], rack_count):
                continue  # a rack duplicate that another rack could replace
            keep.append(b)
        kept[k] = keep
    # 2. Brokers above their share give up replicas, trailing ones (followers) first.
    load = Counter(b for keep in kept.values() for b in keep)
    for b in sorted(load, key=lambda x: -load[x]):
        if load[b] <= cap:
            continue
        for k in keys:
            if load[b] <= cap:
                break
            if b in kept[k] and kept[k][0] != b:
                kept[k].remove(b)
                load[b] -= 1
        for k in keys:
            if load[b] <= cap:
                break
            if b in kept[k]:
                kept[k].remove(b)
                load[b] -= 1
    # 3. Fill every partition up to its replication factor from the least loaded brokers, new
    # racks first. Emptiest partitions first so the most constrained choose first.
    for k in sorted(keys, key=lambda x: (len(kept[x]) - rf[x], x)):
        while len(kept[k]) < rf[k]:
            used_racks = {rack(x) for x in kept[k]}
            candidates = [b for b in brokers if b not in kept[k]]
            best = min(candidates, key=lambda b: (rack(b) in used_racks, load[b] >= cap, load[b], b))
            kept[k].append(best)
            load[best] += 1

    # 4. Even out what trimming to the ceiling left uneven (e.g. a new broker while the others
    # were all at or below the ceiling): move a replica from the fullest to the emptiest broker
    # while that keeps the partition's racks at least as spread.
    def movable(src: int, dst: int) -> list[PartitionKey]:
        return [
            k
            for k in keys
            if src in kept[k]
            and dst not in kept[k]
            and (rack(dst) == rack(src) or rack(dst) not in {rack(x) for x in kept[k] if x != src})
        ]

    for _ in range(total):
        by_load = sorted(brokers, key=lambda b: (load[b], b))
        pair = next(
            (
                (src, dst, found)
                for src in reversed(by_load)
                for dst in by_load
                if load[src] - load[dst] > 1 and (found := movable(src, dst))
            ),
            None,
        )
        if pair is None:
            break
        src, dst, found = pair
        k = min(found, key=lambda x: (kept[x][0] == src, x))  # followers move first
        kept[k][kept[k].index(src)] = dst
        load[src] -= 1
        load[dst] += 1
    # 5. Preferred leaders: keep a partition's first replica while its broker leads no more than
    # its share; otherwise put first the replica whose broker leads the fewest so far.
    lead_cap = math.ceil(len(keys) / len(brokers))
    leads: Counter[int] = Counter()
    out: dict[PartitionKey, list[int]] = {}
    for k in keys:
        replicas = kept[k]
        original_first = current[k][0] if current[k] else None
        first = original_first if original_first in replicas and leads[original_first] < lead_cap else None
        if first is None:
            first = min(replicas, key=lambda b: (leads[b], replicas.index(b)))
        leads[first] += 1
        out[k] = [first] + [b for b in replicas if b != first]

    # Then hand leaderships from the brokers leading most to those leading fewest, along a chain
    # when they share no partition (brokers of one AZ never do): a leads k1 that b replicates, b
    # leads k2 that c replicates... each handing one on.
    def chain(src: int, dst: int) -> list[PartitionKey] | None:
        path: dict[int, tuple[int, PartitionKey] | None] = {src: None}
        frontier = [src]
        while frontier:
            nxt = []
            for a in frontier:
                for k in keys:
                    if out[k][0] != a:
                        continue
                    for b in out[k][1:]:
                        if b not in path:
                            path[b] = (a, k)
                            nxt.append(b)
            if dst in path:
                steps = []
                at = dst
                while (step := path[at]) is not None:
                    steps.append(step[1])
                    at = step[0]
                return steps
            frontier = nxt
        return None

    for _ in range(len(keys)):
        by_leads = sorted(brokers, key=lambda b: (leads[b], b))
        found = next(
            (
                (src, dst, steps)
                for src in reversed(by_leads)
                for dst in by_leads
                if leads[src] - leads[dst] > 1 and (steps := chain(src, dst)) is not None
            ),
            None,
        )
        if found is None:
            break
        src, dst, steps = found
        # steps run from dst back to src: each partition's leadership passes to the next broker.
        receiver = dst
        for k in steps:
            giver = out[k][0]
            out[k] = [receiver] + [b for b in out[k] if b != receiver]
            receiver = giver
        leads[src] -= 1
        leads[dst] += 1
    return out


def moves(current: Mapping[PartitionKey, Sequence[int]], target: Mapping[PartitionKey, Sequence[int]]) -> int:
    """Replicas that change broker (what a reassignment copies; for diskless topics: pointers)."""
    return sum(len(set(target[k]) - set(current[k])) for k in target)


def to_json(assignment: Mapping[PartitionKey, Sequence[int]]) -> dict[str, object]:
    """kafka-reassign-partitions' plan format."""
    return {
        "version": 1,
        "partitions": [
            {"topic": t, "partition": p, "replicas": list(r), "log_dirs": ["any"] * len(r)}
            for (t, p), r in sorted(assignment.items())
        ],
    }


def from_json(data: Mapping[str, object]) -> dict[PartitionKey, list[int]]:
    partitions = data.get("partitions")
    if not isinstance(partitions, list):
        raise ValueError("a reassignment plan has a 'partitions' list")
    out: dict[PartitionKey, list[int]] = {}
    for entry in partitions:
        out[(str(entry["topic"]), int(entry["partition"]))] = [int(b) for b in entry["replicas"]]
    return out

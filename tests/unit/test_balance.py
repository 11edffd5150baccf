"""The scale-out/decommission planner (cluster/balance.py): replication factors kept, only target
brokers used, racks spread, replicas and preferred leaders balanced, little moved."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from diskless.cluster.balance import from_json, moves, plan, to_json

RACKS = {0: "az-1", 1: "az-2", 2: "az-3", 3: "az-1", 4: "az-2", 5: "az-3"}


def round_robin(partitions: int, rf: int, brokers: list[int]) -> dict[tuple[str, int], list[int]]:
    return {("t", p): [brokers[(p + r) % len(brokers)] for r in range(rf)] for p in range(partitions)}


def test_scale_out_moves_a_fair_share_onto_the_new_broker() -> None:
    current = round_robin(12, 3, [0, 1, 2])
    target = plan(current, {b: RACKS[b] for b in range(4)})
    load = Counter(b for r in target.values() for b in r)
    # One replica per AZ: az-2 and az-3 have one broker each; az-1's two brokers split its share.
    assert load == {0: 6, 1: 12, 2: 12, 3: 6}
    assert moves(current, target) == 6  # exactly the new broker's share, nothing shuffled
    assert Counter(r[0] for r in target.values()) == {0: 3, 1: 3, 2: 3, 3: 3}
    for replicas in target.values():
        assert len({RACKS[b] for b in replicas}) == 3  # still one replica per AZ


def test_scale_out_without_racks_balances_every_broker() -> None:
    current = round_robin(12, 3, [0, 1, 2])
    target = plan(current, dict.fromkeys(range(4)))
    assert Counter(b for r in target.values() for b in r) == {0: 9, 1: 9, 2: 9, 3: 9}
    assert moves(current, target) == 9


def test_decommission_leaves_nothing_on_the_removed_broker() -> None:
    current = round_robin(8, 3, [0, 1, 2, 3])
    target = plan(current, {b: RACKS[b] for b in (0, 1, 2)})
    assert all(3 not in r and len(r) == 3 for r in target.values())
    assert moves(current, target) == sum(3 in r for r in current.values())


def test_plan_json_round_trips() -> None:
    current = round_robin(3, 2, [0, 1, 2])
    data = to_json(current)
    assert data["version"] == 1 and data["partitions"][0] == {
        "topic": "t",
        "partition": 0,
        "replicas": [0, 1],
        "log_dirs": ["any", "any"],
    }
    assert from_json(data) == current


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[tuple[str, int], list[int]], dict[int, str | None]]:
    before = draw(st.integers(1, 6))
    after = draw(st.lists(st.integers(0, 7), min_size=1, max_size=6, unique=True))
    racked = draw(st.booleans())
    brokers = {b: (f"az-{b % 3}" if racked else None) for b in after}
    current = {}
    for p in range(draw(st.integers(1, 30))):
        rf = draw(st.integers(1, min(3, before)))
        current[("t", p)] = draw(st.permutations(list(range(before))))[:rf]
    return current, brokers


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_plans_are_valid_and_balanced(cluster: tuple[dict[tuple[str, int], list[int]], dict[int, str | None]]) -> None:
    current, brokers = cluster
    target = plan(current, brokers)
    assert set(target) == set(current)
    for key, replicas in target.items():
        assert len(replicas) == min(len(current[key]), len(brokers))
        assert len(set(replicas)) == len(replicas) and set(replicas) <= set(brokers)
        racks_available = len({brokers[b] for b in brokers})
        assert len({brokers[b] for b in replicas}) == min(len(replicas), racks_available)
    if all(rack is None for rack in brokers.values()):
        load = Counter({b: 0 for b in brokers}) + Counter(b for r in target.values() for b in r)
        counts = [load[b] for b in brokers]
        assert max(counts) - min(counts) <= 1, (current, brokers, target)

"""``coalesce_ranges``: merging byte ranges of one object into fewer ranged GETs (sans-IO, hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.storage.object_store import coalesce_ranges


@st.composite
def range_lists(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Ranges in a small address space, so overlaps, duplicates, touching and empty ranges all occur."""
    starts_and_lengths = draw(st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 300) | st.just(0)), max_size=40))
    return [(start, start + length) for start, length in starts_and_lengths]


@st.composite
def disjoint_range_lists(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Non-overlapping ranges in shuffled order, like the batches of one WAL object."""
    lengths = draw(st.lists(st.tuples(st.integers(0, 500), st.integers(1, 300)), max_size=40))
    ranges, position = [], 0
    for gap, length in lengths:
        position += gap
        ranges.append((position, position + length))
        position += length
    return draw(st.permutations(ranges))


def overlap_connected(members: list[tuple[int, int]]) -> bool:
    """Whether ranges (sorted by start) form one chain in which each overlaps what came before."""
    end = members[0][1]
    for start, stop in members[1:]:
        if start >= end:
            return False
        end = max(end, stop)
    return True


def check_plan(ranges: list[tuple[int, int]], max_gap: int, max_size: int) -> list[tuple[int, int, list[int]]]:
    plan = coalesce_ranges(ranges, max_gap, max_size)

    # Every input range is covered by exactly one output, which contains it.
    covered = sorted(i for _, _, members in plan for i in members)
    assert covered == list(range(len(ranges)))
    for start, end, members in plan:
        assert members, "no empty outputs"
        for i in members:
            assert start <= ranges[i][0] <= ranges[i][1] <= end
        # The output is the hull of its members: no bytes are read beyond them at either edge.
        assert start == min(ranges[i][0] for i in members)
        assert end == max(ranges[i][1] for i in members)
        # Members are listed in order of their start.
        assert [ranges[i][0] for i in members] == sorted(ranges[i][0] for i in members)

    # Outputs are sorted and do not overlap.
    for (_, a_end, _), (b_start, _, _) in itertools.pairwise(plan):
        assert a_end <= b_start

    for start, end, members in plan:
        # The holes inside an output (bytes read for nobody) are each at most max_gap long.
        reach = start
        for i in members:
            r_start, r_end = ranges[i]
            assert r_start - reach <= max_gap
            reach = max(reach, r_end)
        # Size bounded, unless the output is one input or a chain of overlapping inputs larger than it.
        if end - start > max_size:
            assert overlap_connected([ranges[i] for i in members])

    # Greedy maximality: neighbouring outputs could not have been merged.
    for (a_start, a_end, _), (b_start, b_end, _) in itertools.pairwise(plan):
        assert b_start - a_end > max_gap or b_end - a_start > max_size
    return plan


@given(range_lists(), st.integers(0, 400), st.integers(0, 3_000))
def test_arbitrary_ranges(ranges: list[tuple[int, int]], max_gap: int, max_size: int) -> None:
    check_plan(ranges, max_gap, max_size)


@given(disjoint_range_lists(), st.integers(0, 400), st.integers(1, 3_000))
def test_disjoint_ranges_exceed_max_size_only_alone(ranges: list[tuple[int, int]], max_gap: int, max_size: int) -> None:
    plan = check_plan(ranges, max_gap, max_size)
    for start, end, members in plan:
        if end - start > max_size:
            assert len(members) == 1


@given(disjoint_range_lists())
def test_no_gap_allowance_merges_only_touching_ranges(ranges: list[tuple[int, int]]) -> None:
    plan = check_plan(ranges, 0, 10**9)
    for _, _, members in plan:
        for a, b in itertools.pairwise(members):
            assert ranges[a][1] == ranges[b][0]


def test_examples() -> None:
    assert coalesce_ranges([], 10, 100) == []
    # Small gap merged; the range past a big gap starts a new GET; input order does not matter.
    assert coalesce_ranges([(50, 60), (0, 10), (15, 20)], 5, 100) == [(0, 20, [1, 2]), (50, 60, [0])]
    # The size limit splits a run of nearby ranges.
    assert coalesce_ranges([(0, 40), (40, 80), (80, 120)], 0, 80) == [(0, 80, [0, 1]), (80, 120, [2])]
    # An input larger than max_size is its own GET; overlapping inputs share one GET whatever the size.
    assert coalesce_ranges([(0, 500)], 0, 100) == [(0, 500, [0])]
    assert coalesce_ranges([(0, 80), (60, 150), (0, 80)], 0, 100) == [(0, 150, [0, 2, 1])]
    # Empty ranges are covered by a neighbour.
    assert coalesce_ranges([(10, 10), (0, 20)], 0, 100) == [(0, 20, [1, 0])]


@pytest.mark.parametrize(
    ("ranges", "max_gap", "max_size"), [([(5, 4)], 0, 10), ([(-1, 4)], 0, 10), ([(0, 1)], -1, 10), ([(0, 1)], 0, -1)]
)
def test_rejects_bad_input(ranges: list[tuple[int, int]], max_gap: int, max_size: int) -> None:
    with pytest.raises(ValueError):
        coalesce_ranges(ranges, max_gap, max_size)

"""The cache-miss read quota (diskless.fetch.lagging.max.bytes.per.second) as a token bucket."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.fetch.read_quota import BURST_S, QUANTUM_S, UNLIMITED, ReadQuota, prefixes_in_object_order

RATE = 1000  # B/s: the bucket holds 500 B, a quantum is 100 B


def test_unlimited_never_waits() -> None:
    quota = ReadQuota(UNLIMITED, now_ms=0)
    quota.record(10**12, now_ms=0)
    assert quota.wait_ms(now_ms=0) == 0 and quota.allowance(0) == UNLIMITED


def test_a_read_into_debt_makes_the_next_wait_until_it_is_paid_back() -> None:
    quota = ReadQuota(RATE, now_ms=0)
    assert quota.wait_ms(0) == 0
    quota.record(3000, 0)  # whole: 2,500 B of debt
    assert quota.wait_ms(0) == 2500 and quota.allowance(0) == 0
    assert quota.wait_ms(1500) == 1000
    assert quota.wait_ms(2500) == 0


def test_the_bucket_holds_a_burst_and_allows_at_least_a_quantum() -> None:
    quota = ReadQuota(RATE, now_ms=0)
    assert quota.allowance(60_000) == RATE * BURST_S  # idle for a minute: only a burst saved
    quota.record(int(RATE * BURST_S), 60_000)
    assert quota.wait_ms(60_000) == 0  # empty, not in debt
    assert quota.allowance(60_000) == RATE * QUANTUM_S  # a step of a quantum, not a sliver
    quota.record(1, 60_000)
    assert quota.allowance(60_000) == 0 and quota.wait_ms(60_000) == 1


@given(
    reads=st.lists(
        st.tuples(st.integers(min_value=0, max_value=500), st.integers(min_value=1, max_value=5000)),
        max_size=60,
    )
)
def test_bytes_let_through_stay_within_rate_plus_burst_plus_one_read(reads: list[tuple[int, int]]) -> None:
    """Whatever the readers' timing and sizes, a reader that starts only when told may read at
    most rate * elapsed + one burst + its last read."""
    quota = ReadQuota(RATE, now_ms=0)
    now = 0.0
    passed = 0
    largest = 0
    for gap, size in reads:
        now += gap
        now += quota.wait_ms(now)  # the reader waits as told
        assert quota.wait_ms(now) == 0 and quota.allowance(now) > 0
        quota.record(size, now)
        passed += size
        largest = max(largest, size)
        assert passed <= RATE * now / 1000 + RATE * BURST_S + largest


@st.composite
def _reads(draw: st.DrawFn) -> tuple[list[list[tuple[str, int, int]]], int]:
    """Partitions' entries as (object, byte offset, cost), and an allowance. Objects are
    ``o0``, ``o1``, ... in creation order; a partition's entries lie in order through them
    (cost 0: cached or inline)."""
    groups = []
    for p in range(draw(st.integers(1, 5))):
        objects = sorted(draw(st.lists(st.integers(0, 6), max_size=8)))
        groups.append(
            [(f"o{o}", 1000 * p + 10 * n, draw(st.sampled_from([0, 100, 700]))) for n, o in enumerate(objects)]
        )
    return groups, draw(st.integers(0, 3000))


@given(_reads())
def test_a_read_takes_prefixes_in_place_order_within_its_allowance_but_for_one_entry(
    case: tuple[list[list[tuple[str, int, int]]], int],
) -> None:
    groups, allowance = case
    counts = prefixes_in_object_order(groups, allowance, cost=lambda e: e[2], place=lambda e: (e[0], e[1]))
    taken = [entry for group, n in zip(groups, counts, strict=True) for entry in group[:n]]
    left = [group[n:] for group, n in zip(groups, counts, strict=True)]
    spent = sum(cost for _, _, cost in taken)
    # Progress: something costly is taken if anything costly was asked for.
    assert spent > 0 or not any(cost for group in groups for _, _, cost in group)
    # Within the allowance but for the last entry taken.
    assert spent - max((cost for *_, cost in taken), default=0) < max(allowance, 1)
    # Nothing free is left at the head of a partition: it costs nothing to serve.
    assert all(not rest or rest[0][2] > 0 for rest in left)
    # Place order: no costly entry left at a partition's head lies before a costly entry taken.
    heads = [rest[0][:2] for rest in left if rest]
    costly = [entry[:2] for entry in taken if entry[2] > 0]
    assert not heads or not costly or max(costly) <= min(heads)

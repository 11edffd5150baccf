"""The cache-miss read quota (diskless.fetch.lagging.max.bytes.per.second) as a token bucket."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.fetch.read_quota import UNLIMITED, ReadQuota


def test_unlimited_never_waits() -> None:
    quota = ReadQuota(UNLIMITED, now_ms=0)
    quota.record(10**12, now_ms=0)
    assert quota.wait_ms(now_ms=0) == 0


def test_a_read_into_debt_makes_the_next_wait_until_it_is_paid_back() -> None:
    quota = ReadQuota(1000, now_ms=0)  # 1,000 B/s, a bucket of 1,000 B
    assert quota.wait_ms(0) == 0
    quota.record(3000, 0)  # whole: 2,000 B of debt
    assert quota.wait_ms(0) == 2000
    assert quota.wait_ms(1500) == 500
    assert quota.wait_ms(2000) == 0


def test_the_bucket_holds_at_most_one_second() -> None:
    quota = ReadQuota(1000, now_ms=0)
    assert quota.wait_ms(60_000) == 0  # idle for a minute
    quota.record(2001, 60_000)  # the minute saved only one second's worth
    assert quota.wait_ms(60_000) > 1000


@given(
    reads=st.lists(
        st.tuples(st.integers(min_value=0, max_value=500), st.integers(min_value=1, max_value=5000)),
        max_size=60,
    )
)
def test_bytes_let_through_stay_within_rate_plus_burst_plus_one_read(reads: list[tuple[int, int]]) -> None:
    """Whatever the readers' timing, a reader that starts only when told may read at most
    rate * elapsed + one second's burst + its last read."""
    rate = 1000
    quota = ReadQuota(rate, now_ms=0)
    now = 0.0
    passed = 0
    largest = 0
    for gap, size in reads:
        now += gap
        now += quota.wait_ms(now)  # the reader waits as told
        assert quota.wait_ms(now) == 0
        quota.record(size, now)
        passed += size
        largest = max(largest, size)
        assert passed <= rate * now / 1000 + rate + largest

"""The replication throttle's token bucket (replication/throttle.py): over any stretch of time a
throttled follower is served at most the rate (plus one second's burst), whatever it asks for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.replication.throttle import ThrottleBucket


def test_allowance_refills_at_the_rate_and_caps_at_one_second() -> None:
    bucket = ThrottleBucket()
    assert bucket.allowance(1000, 0.0) == 1000
    bucket.consume(1000)
    assert bucket.allowance(1000, 0.5) == 500
    bucket.consume(1500)  # one whole batch beyond the allowance: debt
    assert bucket.allowance(1000, 1.0) == 0
    assert bucket.allowance(1000, 10.0) == 1000  # never more than one second's worth


@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(0, 5000)), min_size=1, max_size=60))
def test_served_bytes_never_exceed_rate_times_time_plus_a_burst(steps: list[tuple[float, int]]) -> None:
    rate = 2000
    bucket = ThrottleBucket()
    now = 0.0
    served = 0
    for gap, batch in steps:
        now += gap
        allowed = bucket.allowance(rate, now)
        if allowed == 0:
            continue
        size = min(batch, allowed) if batch <= allowed else batch  # a whole batch may overshoot once
        bucket.consume(size)
        served += size
        assert served <= rate * (now + 1) + 5000

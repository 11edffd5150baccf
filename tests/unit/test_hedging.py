"""Hedged WAL object PUTs: the sans-IO policy (``storage/hedging.py``) and the race that
``ObjectStore.put`` runs with it, with in-memory PUT attempts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskless.storage.hedging import HedgePolicy, size_class
from diskless.storage.object_store import ObjectStore

SIZE = 32 * 1024  # a WAL object at a low rate


def warmed(latencies: list[float], **kwargs: float) -> HedgePolicy:
    policy = HedgePolicy(**kwargs)  # type: ignore[arg-type]
    for latency in latencies:
        policy.delay_ms(SIZE)  # a PUT starts (counted for the budget) ...
        policy.finished(latency, SIZE)  # ... and ends
    return policy


def test_no_hedge_before_enough_latencies_are_known() -> None:
    policy = HedgePolicy(min_samples=5, max_ratio=1.0)
    for _ in range(4):
        assert policy.delay_ms(SIZE) is None
        policy.finished(10.0, SIZE)
    assert policy.delay_ms(SIZE) is None  # 4 known when asked
    policy.finished(10.0, SIZE)
    assert policy.delay_ms(SIZE) == 10.0


def test_the_delay_is_the_quantile_of_recent_latencies_and_old_ones_age_out() -> None:
    policy = warmed([float(i) for i in range(1, 101)], quantile=0.95, window=100, min_samples=1, max_ratio=1.0)
    assert policy.delay_ms(SIZE) == 95.0
    for _ in range(100):  # the store got faster: the old latencies leave the window
        policy.finished(2.0, SIZE)
    assert policy.delay_ms(SIZE) == 2.0
    assert warmed([5.0] * 30, min_samples=1, min_delay_ms=12.0).delay_ms(SIZE) == 12.0


def test_the_budget_is_a_share_of_the_puts_seen_so_far() -> None:
    """5% of 200: a policy that has seen 20 PUTs may hedge the 21st (1.05 allowed), not the 22nd."""
    policy = warmed([10.0] * 20, min_samples=1)
    assert policy.delay_ms(SIZE) is not None
    assert policy.try_hedge()
    policy.finished(10.0, SIZE)
    assert policy.delay_ms(SIZE) is None
    assert policy.hedged_share == pytest.approx(1 / 22)


def test_latencies_count_for_puts_of_their_size_only() -> None:
    """After a burst of 2 MiB objects at 300 ms, a 32 KiB PUT is still measured against the 32 KiB
    ones (8 ms), and a class with no history gets no hedge."""
    policy = warmed([8.0] * 30, quantile=0.9, max_ratio=1.0, min_samples=5)
    for _ in range(300):
        policy.delay_ms(2 << 20)
        policy.finished(300.0, 2 << 20)
    assert policy.delay_ms(SIZE) == 8.0
    assert policy.delay_ms(3 << 20) == 300.0  # 2 and 3 MiB: one class
    assert policy.delay_ms(512) is None
    assert size_class(32 * 1024) == size_class(127 * 1024) != size_class(128 * 1024)


def test_a_request_of_unknown_size_is_measured_against_the_last_answer() -> None:
    """A GET learns its size from its answer: its delay is that of the size class answered last."""
    policy = warmed([8.0] * 30, quantile=0.9, max_ratio=1.0, min_samples=5)
    assert policy.delay_ms(None) == 8.0
    for _ in range(10):
        policy.delay_ms(None)
        policy.finished(300.0, 2 << 20)
    assert policy.delay_ms(None) == 300.0
    assert HedgePolicy(min_samples=0, max_ratio=1.0).delay_ms(None) is None  # nothing answered yet


def test_hedging_off() -> None:
    assert warmed([1.0] * 50, quantile=0.0).delay_ms(SIZE) is None
    assert warmed([1.0] * 50, max_ratio=0.0).delay_ms(SIZE) is None
    for bad in ({"quantile": 1.0}, {"quantile": -0.1}, {"max_ratio": 1.5}, {"window": 0}):
        with pytest.raises(ValueError):
            HedgePolicy(**bad)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["start", "fire", "finish"]), st.integers(0, 50), st.floats(0.1, 500.0)),
        max_size=600,
    ),
    ratio=st.sampled_from([0.01, 0.05, 0.2, 1.0]),
    window=st.integers(5, 100),
)
def test_the_budget_holds_for_overlapping_requests(
    ops: list[tuple[str, int, float]], ratio: float, window: int
) -> None:
    """Requests start (asking for a delay), have their delay pass in any order (trying a hedge),
    and finish, overlapping freely: the hedges sent while the last ``window`` requests started
    never exceed ``max_ratio`` of them, and the policy's own share agrees."""
    policy = HedgePolicy(quantile=0.5, max_ratio=ratio, window=window, min_samples=1)
    armed: list[int] = []  # requests given a delay that has not passed yet
    starts, hedges_at = 0, []
    for op, pick, latency in ops:
        if op == "start":
            starts += 1
            if policy.delay_ms(SIZE) is not None:
                armed.append(starts)
        elif op == "fire" and armed:
            armed.pop(pick % len(armed))
            if policy.try_hedge():
                hedges_at.append(starts)
        elif op == "finish":
            policy.finished(latency, SIZE)
        recent = [at for at in hedges_at if at > starts - window]
        assert len(recent) <= ratio * min(starts, window) + 1e-9, (recent, starts, ratio)
        if starts:
            assert policy.hedged_share == pytest.approx(len(recent) / min(starts, window))


def test_overlapping_requests_each_count_their_hedge_and_share_one_budget() -> None:
    """A asks, B asks, B's delay passes first, then A's: two hedges, both counted (the first
    version counted a hedge against the request that asked last, so A's was lost: B's slot was
    already marked). And when the budget has room for one, only the first to try gets it."""
    policy = warmed([10.0] * 20, min_samples=1, max_ratio=1.0)
    assert policy.delay_ms(SIZE) is not None and policy.delay_ms(SIZE) is not None  # A, B
    assert policy.try_hedge() and policy.try_hedge()  # B's, then A's
    assert policy.hedged_share == pytest.approx(2 / 22)
    tight = warmed([10.0] * 20, min_samples=1)  # 5%: room for 1 hedge at 21 and 22 requests
    assert tight.delay_ms(SIZE) is not None and tight.delay_ms(SIZE) is not None
    assert tight.try_hedge() and not tight.try_hedge()


# --- the race in ObjectStore.put ------------------------------------------------------------------


def store() -> ObjectStore:
    return ObjectStore("http://127.0.0.1:9", "b", "k", "s")  # never connects: attempts are fakes


def attempts(*plan: tuple[float, BaseException | None]) -> tuple[Callable[[], Awaitable[None]], list[str]]:
    """A PUT whose n-th attempt takes ``plan[n][0]`` seconds, then raises ``plan[n][1]`` or succeeds;
    the log says how each ended."""
    log: list[str] = []
    count = 0

    async def call() -> None:
        nonlocal count
        index = count
        count += 1
        delay, error = plan[index]
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            log.append(f"{index} cancelled")
            raise
        if error is not None:
            log.append(f"{index} failed")
            raise error
        log.append(f"{index} ok")

    return call, log


def fast_policy() -> HedgePolicy:
    return warmed([10.0] * 30, quantile=0.9, max_ratio=0.5, min_samples=1)  # hedge after 10 ms


async def test_the_hedge_wins_and_the_stalled_attempt_is_cancelled() -> None:
    s = store()
    call, log = attempts((30.0, None), (0.01, None))
    await asyncio.wait_for(s._hedged("put", call, fast_policy(), SIZE, lambda _answer: SIZE), 5)
    assert log == ["1 ok", "0 cancelled"]
    assert (s.stats.hedges, s.stats.hedge_wins) == (1, 1)


async def test_a_hedged_get_returns_the_winner_answer() -> None:
    s = store()
    answers = iter([b"late", b"early"])

    async def get() -> bytes:
        answer = next(answers)
        await asyncio.sleep(30.0 if answer == b"late" else 0.01)
        return answer

    policy = fast_policy()
    assert await asyncio.wait_for(s._hedged("get", get, policy, None, len), 5) == b"early"
    assert (s.stats.hedges, s.stats.hedge_wins) == (1, 1)
    assert policy._last_class == size_class(len(b"early"))


async def test_a_fast_put_gets_no_hedge() -> None:
    s = store()
    call, log = attempts((0.0, None))
    await s._hedged("put", call, fast_policy(), SIZE, lambda _answer: SIZE)
    assert log == ["0 ok"] and s.stats.hedges == 0


async def test_the_slow_primary_still_wins_if_the_hedge_fails() -> None:
    s = store()
    call, log = attempts((0.1, None), (0.01, OSError("hedge refused")))
    await asyncio.wait_for(s._hedged("put", call, fast_policy(), SIZE, lambda _answer: SIZE), 5)
    assert log == ["1 failed", "0 ok"]
    assert (s.stats.hedges, s.stats.hedge_wins) == (1, 0)


async def test_both_failing_raise_the_primary_error() -> None:
    s = store()
    call, log = attempts((0.05, ValueError("primary")), (0.01, OSError("hedge")))
    with pytest.raises(ValueError, match="primary"):
        await asyncio.wait_for(s._hedged("put", call, fast_policy(), SIZE, lambda _answer: SIZE), 5)
    assert sorted(log) == ["0 failed", "1 failed"]


async def test_a_cancelled_caller_cancels_both_attempts() -> None:
    """The representative's upload timeout cancels the PUT: neither attempt may outlive it."""
    s = store()
    call, log = attempts((30.0, None), (30.0, None))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(s._hedged("put", call, fast_policy(), SIZE, lambda _answer: SIZE), 0.2)
    assert sorted(log) == ["0 cancelled", "1 cancelled"]


async def test_the_loser_latency_keeps_slow_puts_in_the_window() -> None:
    """A cancelled primary reports how long it had been out, so the quantile stays high after
    hedges win instead of falling until every PUT is hedged."""
    policy = warmed([10.0] * 9, quantile=0.5, max_ratio=1.0, min_samples=1, window=10)
    call, _log = attempts((30.0, None), (0.05, None))
    await asyncio.wait_for(store()._hedged("put", call, policy, SIZE, lambda _answer: SIZE), 5)
    recorded = sorted(policy._latencies[size_class(SIZE)])
    assert recorded[-1] >= 50.0  # the primary: out from its start until the hedge won (~60 ms)

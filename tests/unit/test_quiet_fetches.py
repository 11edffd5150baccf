"""When a leader may leave a partition out of its answer to a follower's fetch: only when the
follower would learn nothing from it, and never for longer than the refresh period."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.broker.quiet_fetches import REFRESH_MS, FetchedPartition, is_quiet

NOW = 1_000_000
QUIET = FetchedPartition(
    error=False,
    fetch_offset=50,
    follower_log_start=10,
    diverging=False,
    log_end_offset=50,
    log_start_offset=10,
    high_watermark=50,
    last_sent_hw=50,
    last_answered_ms=NOW - 100,
    last_sent_log_start=10,
)


def test_an_idle_caught_up_partition_is_quiet() -> None:
    assert is_quiet(QUIET, NOW)


@pytest.mark.parametrize(
    "news",
    [
        {"error": True},
        {"diverging": True},
        {"fetch_offset": 40},  # records to send
        {"follower_log_start": 5},  # retention or DeleteRecords moved the leader's start
        # The follower's own retention moved its start there first, but it never heard the leader's:
        # its reads answer EARLIEST with the start last heard (follower_reads).
        {"last_sent_log_start": 5},
        {"last_sent_log_start": -1},
        {"last_sent_hw": 45},  # a high watermark the follower was not sent
        {"last_answered_ms": -1},  # never answered (this leader epoch)
        {"last_answered_ms": NOW - REFRESH_MS},  # due for a full answer
        {"last_answered_ms": NOW + 1},  # the clock stepped back
    ],
)
def test_any_news_means_an_answer(news: dict[str, object]) -> None:
    assert not is_quiet(dataclasses.replace(QUIET, **news), NOW)


@given(
    fetch_offset=st.integers(0, 100),
    leo=st.integers(0, 100),
    hw=st.integers(0, 100),
    sent_hw=st.integers(-1, 100),
    start=st.integers(0, 100),
    follower_start=st.integers(0, 100),
    age=st.integers(-1, 2 * REFRESH_MS),
    sent_start=st.integers(-1, 100),
)
def test_quiet_only_when_the_answer_would_carry_nothing(
    fetch_offset: int, leo: int, hw: int, sent_hw: int, start: int, follower_start: int, age: int, sent_start: int
) -> None:
    p = FetchedPartition(False, fetch_offset, follower_start, False, leo, start, hw, sent_hw, NOW - age, sent_start)
    if is_quiet(p, NOW):
        assert fetch_offset == leo  # no records left out
        assert sent_hw >= hw  # the follower knows the high watermark
        assert follower_start == start  # and the log start
        assert sent_start >= start  # and was told it
        assert 0 <= age < REFRESH_MS  # and was answered in full recently

"""KIP-227 fetch sessions (replication/fetch_session.py): the leader's cache rules and a model of
a follower and a leader exchanging full and incremental fetches over a lossy connection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.replication.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchSessionCache,
    FetchSessionHandler,
    next_epoch,
)


@dataclass(frozen=True)
class Entry:
    partition: int
    fetch_offset: int


def _ids(start: int = 1) -> Any:
    counter = iter(range(start, 10**6))
    return lambda: next(counter)


def test_full_fetch_opens_a_session_and_incremental_fetches_need_the_next_epoch() -> None:
    cache = FetchSessionCache(10, _ids(7))
    ctx = cache.context(1, 0, INITIAL_EPOCH, [("t", [Entry(0, 5), Entry(1, 3)])], [], 0)
    assert ctx.error == ErrorCode.none and ctx.session is not None and ctx.session.session_id == 7
    assert ctx.session.epoch == 1
    assert cache.context(1, 7, 2, [], [], 1).error == ErrorCode.invalid_fetch_session_epoch
    assert cache.context(1, 8, 1, [], [], 1).error == ErrorCode.fetch_session_id_not_found
    assert cache.context(2, 7, 1, [], [], 1).error == ErrorCode.fetch_session_id_not_found  # another follower
    ctx = cache.context(1, 7, 1, [("t", [Entry(0, 9)]), ("u", [Entry(0, 0)])], [("t", [1])], 2)
    assert ctx.session is not None and ctx.session.epoch == 2
    assert ctx.session.topics() == [("t", (Entry(0, 9),)), ("u", (Entry(0, 0),))]
    # The same epoch again (an answer lost on the way) is refused.
    assert cache.context(1, 7, 1, [], [], 3).error == ErrorCode.invalid_fetch_session_epoch


def test_partitions_answered_with_records_move_to_the_end_of_the_session() -> None:
    # Kafka's IncrementalFetchContext: the next fetch reads the others first (no starving under max_bytes).
    cache = FetchSessionCache(10, _ids())
    session = cache.context(1, 0, INITIAL_EPOCH, [("t", [Entry(0, 0), Entry(1, 0)]), ("u", [Entry(0, 0)])], [], 0)
    assert session.session is not None
    session.session.to_the_end([("t", 0), ("v", 0), ("u", 1)])  # unknown partitions are no-ops
    assert session.session.topics() == [("u", (Entry(0, 0),)), ("t", (Entry(1, 0), Entry(0, 0)))]
    # An incremental fetch changing a partition keeps its place.
    session = cache.context(1, session.session.session_id, 1, [("t", [Entry(1, 4)])], [], 1)
    assert session.session is not None
    assert session.session.topics() == [("u", (Entry(0, 0),)), ("t", (Entry(1, 4), Entry(0, 0)))]


def test_sessionless_and_closing_fetches() -> None:
    cache = FetchSessionCache(10, _ids())
    first = cache.context(1, 0, INITIAL_EPOCH, [("t", [Entry(0, 0)])], [], 0).session
    assert first is not None
    assert cache.context(1, first.session_id, FINAL_EPOCH, [], [], 1).session is None
    assert first.session_id not in cache
    second = cache.context(1, 0, INITIAL_EPOCH, [], [], 2).session
    assert second is not None
    third = cache.context(1, second.session_id, INITIAL_EPOCH, [], [], 3).session  # close and reopen
    assert third is not None and second.session_id not in cache and len(cache) == 1


def test_cache_is_bounded_least_recently_used_evicted_and_zero_slots_keeps_none() -> None:
    cache = FetchSessionCache(2, _ids())
    a = cache.context(1, 0, 0, [], [], 0).session
    b = cache.context(2, 0, 0, [], [], 1).session
    assert a is not None and b is not None
    assert cache.context(1, a.session_id, 1, [], [], 2).session is a  # a used after b
    c = cache.context(3, 0, 0, [], [], 3).session
    assert c is not None and len(cache) == 2
    assert a.session_id in cache and b.session_id not in cache
    # A follower opening a new session (it restarted) replaces its old one.
    c2 = cache.context(3, 0, 0, [], [], 4).session
    assert c2 is not None and c.session_id not in cache and a.session_id in cache and len(cache) == 2
    none = FetchSessionCache(0)
    assert none.context(1, 0, 0, [("t", [Entry(0, 0)])], [], 0).session is None and len(none) == 0


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(0) == 1 and next_epoch(2**31 - 1) == 1 and next_epoch(-1) == -1


def test_handler_sends_only_moved_partitions_and_forgets_dropped_ones() -> None:
    h = FetchSessionHandler()
    wanted = {("t", 0): ((0,), "e0"), ("t", 1): ((0,), "e1")}
    plan = h.build(wanted)
    assert plan.full and plan.session_id == 0 and len(plan.send) == 2
    assert h.handle_response(ErrorCode.none, 42)
    plan = h.build(wanted)
    assert (plan.session_id, plan.epoch, plan.send, plan.forgotten) == (42, 1, [], [])
    assert h.handle_response(ErrorCode.none, 42)
    plan = h.build({("t", 0): ((5,), "e0'"), ("u", 0): ((0,), "u0")})
    assert plan.epoch == 2 and plan.send == [(("t", 0), "e0'"), (("u", 0), "u0")] and plan.forgotten == [("t", 1)]
    assert not h.handle_response(ErrorCode.invalid_fetch_session_epoch, 0)
    plan = h.build({("t", 0): ((5,), "e0'")})
    assert plan.full and plan.session_id == 42 and plan.epoch == INITIAL_EPOCH  # close 42, open anew
    assert not h.handle_response(ErrorCode.fetch_session_id_not_found, 0)
    assert h.build({}).session_id == 0


def test_a_leader_keeping_no_sessions_gets_full_fetches() -> None:
    h = FetchSessionHandler()
    for _ in range(3):
        plan = h.build({("t", 0): ((0,), "e")})
        assert plan.full and plan.send
        assert h.handle_response(ErrorCode.none, 0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.tuples(st.sampled_from("ab"), st.integers(0, 3)), st.integers(0, 3), max_size=6),
            st.sampled_from(["ok", "lost request", "lost answer", "evicted", "restart"]),
        ),
        max_size=25,
    )
)
def test_leader_session_always_matches_what_the_follower_fetches(steps: list[tuple[dict[Any, int], str]]) -> None:
    """Whatever the partitions wanted and the failures (requests or answers lost, the session
    evicted, the leader restarted), every fetch the leader serves reads exactly the partitions the
    follower wants, at the positions the follower has: an omitted partition is never stale."""
    cache = FetchSessionCache(3)
    h = FetchSessionHandler()
    for wanted_positions, fault in steps:
        wanted = {key: (pos, Entry(key[1], pos)) for key, pos in wanted_positions.items()}
        plan = h.build(wanted)
        if fault == "lost request":
            h.handle_error()
            continue
        if fault == "evicted":
            cache.remove(plan.session_id)
        if fault == "restart":
            cache = FetchSessionCache(3)
        by_topic: dict[str, list[Entry]] = {}
        for (topic, _index), entry in plan.send:
            by_topic.setdefault(topic, []).append(entry)
        forgotten: dict[str, list[int]] = {}
        for topic, index in plan.forgotten:
            forgotten.setdefault(topic, []).append(index)
        ctx = cache.context(1, plan.session_id, plan.epoch, by_topic.items(), forgotten.items(), 0)
        if ctx.error == ErrorCode.none:
            served = (
                {(t, e.partition): e for t, entries in ctx.session.topics() for e in entries}
                if ctx.session is not None
                else {(t, e.partition): e for t, entries in by_topic.items() for e in entries}
            )
            assert served == {key: entry for key, (_pos, entry) in wanted.items()}
        else:
            assert plan.epoch not in (INITIAL_EPOCH, FINAL_EPOCH)  # full fetches always succeed
        if fault == "lost answer":
            h.handle_error()
        else:
            h.handle_response(ctx.error, ctx.session.session_id if ctx.session is not None else 0)


def test_a_fetch_outside_the_sessions_is_answered_as_kafkas_fetch_manager() -> None:
    """A consumer's fetch, or a replica fetch below v13, is served sessionless: a full fetch naming
    a session is never an error (it closes the session, if it is the fetcher's own); an incremental
    one names a session it cannot use."""
    cache = FetchSessionCache(10, _ids(7))
    assert cache.context(1, 0, INITIAL_EPOCH, [("t", [Entry(0, 0)])], [], 0).session is not None
    assert cache.sessionless(-1, 0, FINAL_EPOCH) == ErrorCode.none
    assert cache.sessionless(-1, 5, INITIAL_EPOCH) == ErrorCode.none
    assert cache.sessionless(-1, 5, FINAL_EPOCH) == ErrorCode.none
    assert cache.sessionless(-1, 0, 3) == ErrorCode.fetch_session_id_not_found
    assert cache.sessionless(-1, 5, 3) == ErrorCode.fetch_session_id_not_found
    # Session 7 is follower 1's: nobody else may use or close it.
    assert cache.sessionless(-1, 7, 1) == ErrorCode.fetch_session_id_not_found
    assert cache.sessionless(2, 7, INITIAL_EPOCH) == ErrorCode.none and 7 in cache
    # Its own follower, fetching without topic ids (below v13) in it.
    assert cache.sessionless(1, 7, 2) == ErrorCode.invalid_fetch_session_epoch
    assert cache.sessionless(1, 7, 1) == ErrorCode.fetch_session_topic_id_error
    assert cache.sessionless(1, 7, FINAL_EPOCH) == ErrorCode.none and 7 not in cache

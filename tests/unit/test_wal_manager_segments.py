"""The WAL manager core on tiered segment objects: same rule as WAL objects, with the tier commit
timeout's hold, and a segment rewritten by a rerun starts over."""

from __future__ import annotations

from diskless.storage.segment_object import segment_keys
from wal_manager.core import Answer, ManagerConfig, PartitionRef, WalManagerCore

T0 = 1_700_000_000_000
TID = "6f1c2d3e-0000-4000-8000-000000000001"
GRACE = 10_000
HOLD = 5_000
CONFIRM = 1_000
REF = PartitionRef(TID, 3)
KEY = segment_keys(TID, 3, 0, 99)[0]


def core() -> WalManagerCore:
    return WalManagerCore(ManagerConfig(grace_ms=GRACE, confirm_ms=CONFIRM, check_interval_ms=500))


def unreferenced_rounds(c: WalManagerCore, now: int) -> int:
    """Answer every due question UNREFERENCED until the key is deletable; returns the time then."""
    for _ in range(20):
        for key, ref in c.checks_due(now):
            c.on_answers([(key, ref, Answer.UNREFERENCED, 0)], now)
        if KEY in c.deletable(now):
            return now
        now += 600
    raise AssertionError("never deletable")


def test_unreferenced_segment_goes_after_grace_plus_hold() -> None:
    c = core()
    c.on_segment_listed(KEY, 100, T0, REF, HOLD, T0)
    assert c.checks_due(T0 + GRACE) == []  # the hold: a TierCommit may still come
    due = c.checks_due(T0 + GRACE + HOLD + 1)
    assert due == [(KEY, REF)]
    c.on_answers([(KEY, REF, Answer.UNREFERENCED, 0)], T0 + GRACE + HOLD + 1)
    assert unreferenced_rounds(c, T0 + GRACE + HOLD + 2) >= T0 + GRACE + HOLD + CONFIRM


def test_referenced_segment_stays_and_a_rewrite_starts_over() -> None:
    c = core()
    c.on_segment_listed(KEY, 100, T0, REF, HOLD, T0)
    now = T0 + GRACE + HOLD + 1
    for key, ref in c.checks_due(now):
        c.on_answers([(key, ref, Answer.REFERENCED, 0)], now)
    assert KEY not in c.deletable(now + 10 * CONFIRM)
    # A rerun puts the same key again later: nothing is asked before its own grace and hold.
    rewritten = now + 2_000
    c.on_segment_listed(KEY, 100, rewritten, REF, HOLD, rewritten)
    assert all(k != KEY for k, _ in c.checks_due(rewritten + GRACE))
    assert unreferenced_rounds(c, rewritten + GRACE + HOLD + 1) > rewritten + GRACE + HOLD

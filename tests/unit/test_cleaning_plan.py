"""The cleaner's choice of what to clean and when (log/cleaning_plan.py), against Kafka's rules."""

from __future__ import annotations

from diskless.log.cleaning_plan import SegmentSummary, group_by_size, plan_cleaning, uncleanable_bound

LONG_MAX = 2**63 - 1


def seg(base: int, end: int, size: int = 1000, ts: int = 0, entries: int = 1) -> SegmentSummary:
    return SegmentSummary(base, end, size, ts, ts if end > base else None, entries)


def plan(segments: list[SegmentSummary], **overrides: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = dict(
        log_start_offset=0,
        checkpoint=0,
        last_stable_offset=LONG_MAX,
        now_ms=1_000_000,
        min_cleanable_dirty_ratio=0.5,
        min_compaction_lag_ms=0,
        max_compaction_lag_ms=LONG_MAX,
        segment_bytes=1 << 30,
        segment_index_bytes=10 << 20,
    )
    args.update(overrides)
    return plan_cleaning(segments, **args)  # type: ignore[arg-type]


def test_the_active_segment_is_never_cleaned() -> None:
    assert plan([seg(0, 100)]) is None
    result = plan([seg(0, 100), seg(100, 200), seg(200, 250)])
    assert result is not None
    assert result.cleanable == 2 and result.end == 200


def test_nothing_at_or_past_the_last_stable_offset_is_cleaned() -> None:
    segments = [seg(0, 100), seg(100, 200), seg(200, 300), seg(300, 310)]
    result = plan(segments, last_stable_offset=150)  # an open transaction started at 150
    assert result is not None and result.cleanable == 1 and result.end == 100
    assert plan(segments, last_stable_offset=50) is None


def test_min_compaction_lag_keeps_young_segments() -> None:
    now = 1_000_000
    segments = [seg(0, 100, ts=now - 10_000), seg(100, 200, ts=now - 500), seg(200, 300, ts=now - 100), seg(300, 301)]
    assert uncleanable_bound(segments, LONG_MAX, now, 1000) == 100
    result = plan(segments, min_compaction_lag_ms=1000)
    assert result is not None and result.cleanable == 1


def test_dirty_ratio_counts_bytes_after_the_checkpoint() -> None:
    segments = [seg(0, 100, size=3000), seg(100, 200, size=1000), seg(200, 201)]
    # checkpoint at 100: 1000 dirty of 4000 cleanable bytes
    assert plan(segments, checkpoint=100) is None
    lower = plan(segments, checkpoint=100, min_cleanable_dirty_ratio=0.25)
    assert lower is not None and lower.dirty_ratio == 0.25 and lower.first_dirty == 100
    assert plan(segments, checkpoint=200) is None  # nothing dirty at all


def test_max_compaction_lag_forces_a_pass_below_the_ratio() -> None:
    now = 1_000_000
    segments = [seg(0, 100, size=9000, ts=0), seg(100, 200, size=1000, ts=now - 50_000), seg(200, 201, ts=now)]
    assert plan(segments, checkpoint=100, now_ms=now) is None
    overdue = plan(segments, checkpoint=100, now_ms=now, max_compaction_lag_ms=10_000)
    assert overdue is not None and overdue.overdue


def test_the_log_start_bounds_the_dirty_part() -> None:
    segments = [seg(0, 100), seg(100, 200), seg(200, 201)]
    result = plan(segments, log_start_offset=150)
    assert result is not None and result.first_dirty == 150


def test_groups_fit_one_segment() -> None:
    segments = [seg(0, 10, size=400), seg(10, 20, size=400), seg(20, 30, size=400), seg(30, 40, size=900)]
    assert group_by_size(segments, 1000, 1 << 20) == ((0, 1), (2,), (3,))
    assert group_by_size(segments, 10_000, 1 << 20) == ((0, 1, 2, 3),)
    # index entries: 8 bytes each
    assert group_by_size(segments, 10_000, 16) == ((0, 1), (2, 3))


def test_groups_keep_offsets_within_32_bits() -> None:
    segments = [seg(0, 10), seg(2**31 - 5, 2**31 + 5)]
    assert group_by_size(segments, 1 << 30, 1 << 20) == ((0,), (1,))

"""The bench's end-to-end latency per tail consumer's AZ (bench/stats.py, bench/report.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from diskless.bench.report import _by_az_note
from diskless.bench.stats import ConsumerSamples, Window, e2e_ms, percentiles


def test_e2e_takes_the_records_sent_within_the_window_wherever_they_were_received() -> None:
    consumed = ConsumerSamples(np.array([9.9, 10.0, 10.5, 11.0]), np.array([10.0, 10.1, 12.0, 11.2]))
    assert e2e_ms(Window("low", 10.0, 11.0), consumed).round(3).tolist() == [100.0, 1500.0]


def test_one_slow_az_shows_per_az_though_the_pooled_p99_hides_it() -> None:
    """The lagging reader's broker once held its AZ's tail consumer for up to 1.8 s while the other
    two AZs saw ~340 ms: 1-2% of that AZ's records, under 1% of all three AZs' records."""
    window = Window("lagging", 0.0, 100.0)
    sent = np.arange(0.0, 100.0, 0.1)
    fast = ConsumerSamples(sent, sent + 0.3)
    slow = ConsumerSamples(sent, sent + np.where(np.arange(sent.size) % 60 == 0, 1.8, 0.3))  # 1 in 60 slow
    tails = {"az-1": slow, "az-2": fast, "az-3": fast}
    by_az = {az: percentiles(e2e_ms(window, c))["p99"] for az, c in tails.items()}
    pooled = percentiles(e2e_ms(window, ConsumerSamples.join(list(tails.values()))))["p99"]
    assert by_az == {"az-1": 1800.0, "az-2": 300.0, "az-3": 300.0} and pooled == 300.0
    control = {"end_to_end_p99_ms_by_az": {"az-1": 310.0, "az-2": 305.0, "az-3": 301.0}}
    note = _by_az_note({"end_to_end_p99_ms_by_az": by_az}, control, "control", "az-1")
    assert note == (
        "; tail e2e p99 by consumer AZ, ms (control in brackets):"
        " az-1 1800 (310), az-2 300 (305), az-3 300 (301), the reader in az-1"
    )


def test_results_without_the_split_get_no_per_az_note() -> None:
    assert _by_az_note({}, {"end_to_end_p99_ms_by_az": {"az-1": 1.0}}, "control", "az-1") == ""


def test_each_azs_samples_are_its_consumers_as_views_of_the_pooled_ones(tmp_path: Path) -> None:
    from diskless.bench.runner import _load_consumers_by_az

    controls = {}
    for n, az in enumerate(("az-1", "az-2", "az-3")):
        control = tmp_path / f"consumer-{az}"
        control.mkdir()
        sent = np.arange(n * 10, n * 10 + 3 + n, dtype=np.float64)
        np.savez(control / "out.npz", sent_at=sent, received_at=sent + 0.1 * (n + 1))
        controls[az] = control
    pooled, by_az = _load_consumers_by_az(controls)
    assert pooled.sent_at.size == 3 + 4 + 5
    assert by_az["az-2"].sent_at.tolist() == [10.0, 11.0, 12.0, 13.0]
    assert np.allclose(by_az["az-3"].received_at - by_az["az-3"].sent_at, 0.3)
    assert all(np.shares_memory(part.sent_at, pooled.sent_at) for part in by_az.values())  # no second copy


def test_the_lagging_note_sets_the_readers_object_reads_against_the_control() -> None:
    from diskless.bench.report import _object_reads_note

    during = {"s3_gets": 340, "s3_get_bytes": 190_000_000}
    control = {"s3_gets": 60, "s3_get_bytes": 2_500_000}
    assert _object_reads_note(during, control, "control") == ("; S3 GETs 340 (190.0 MB) against 60 (2.5 MB) in control")
    assert _object_reads_note(during, {"s3_gets": 60}, "control") == ""  # results from before the figure

"""How sure ``diskless bench`` is of the lagging reader's effect: p99 rises bootstrapped by blocks."""

from __future__ import annotations

import numpy as np

from diskless.bench.stats import ConsumerSamples, Window, e2e_blocks_ms, p99_rise_interval


def _blocks(rng: np.random.Generator, count: int, scale: float = 1.0, size: int = 500) -> list[np.ndarray]:
    return [rng.gamma(4.0, 25.0, size) * scale for _ in range(count)]


def test_records_are_cut_into_blocks_by_the_second_they_were_sent_in() -> None:
    sent = np.array([99.5, 100.1, 100.9, 101.2, 103.7, 104.0])  # none in 102-103, one after the window
    consumed = ConsumerSamples(sent, sent + np.array([0.5, 0.1, 0.2, 0.3, 0.4, 0.5]))
    blocks = e2e_blocks_ms(Window("lagging", 100.0, 104.0), consumed)
    assert [b.round(3).tolist() for b in blocks] == [[100.0, 200.0], [300.0], [400.0]]


def test_no_effect_gives_an_interval_around_zero_and_a_real_one_an_interval_around_it() -> None:
    rng = np.random.default_rng(7)
    control = _blocks(rng, 40)
    same = p99_rise_interval(_blocks(rng, 40), control)
    assert same is not None and same[0] < 0 < same[1]
    slower = p99_rise_interval(_blocks(rng, 40, scale=1.5), control)
    assert slower is not None and 0.3 < slower[0] < 0.5 < slower[1] < 0.7
    assert p99_rise_interval(_blocks(rng, 40, scale=1.5), control) != slower  # other samples
    assert p99_rise_interval([], control) is None


def test_a_stall_is_uncertain_by_its_block_not_by_its_records() -> None:
    # One second in twenty stalled: all its records ten times slower. That second alone lifts the p99;
    # whether a run has such a second at all is the uncertainty, and resampling records one by one
    # (each its own block) hides it.
    rng = np.random.default_rng(3)
    control = _blocks(rng, 20)
    stalled = [*_blocks(rng, 19), rng.gamma(4.0, 25.0, 500) * 10]
    by_block = p99_rise_interval(stalled, control)
    by_record = p99_rise_interval([np.array([v]) for b in stalled for v in b], control, rounds=50)
    assert by_block is not None and by_record is not None
    assert by_block[0] < 0.2 < 1.0 < by_block[1]  # could be nothing, could be large
    assert by_record[0] > 1.0  # falsely sure


def test_the_same_samples_give_the_same_interval() -> None:
    rng = np.random.default_rng(11)
    with_reader, control = _blocks(rng, 30, scale=1.2), _blocks(rng, 30)
    assert p99_rise_interval(with_reader, control) == p99_rise_interval(with_reader, control)

"""The representative's buffer and commit ordering, sans-IO."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from diskless.produce.wal_buffer import DEFAULT_GATHER_MS, Admission, BufferedBatch, WalBuffer


def batch(partition: int, size: int) -> BufferedBatch:
    return BufferedBatch("t", "id", partition, b"x" * size, None)


def test_flush_by_gather_linger_and_size() -> None:
    buffer = WalBuffer(linger_ms=100, max_bytes=1000, gather_ms=10)
    assert buffer.deadline_ms() is None and buffer.drain(0) is None
    assert not buffer.add(batch(0, 10), now_ms=5)
    # Nothing flushed before: only the gather.
    assert buffer.deadline_ms() == 15 and not buffer.due(14) and buffer.due(15)
    assert buffer.add(batch(1, 990), now_ms=12)  # full
    flush = buffer.drain(12)
    assert flush is not None and flush.sequence == 0 and flush.size == 1000 and len(flush.batches) == 2
    assert buffer.deadline_ms() is None and buffer.size == 0
    buffer.add(batch(0, 1), now_ms=60)
    assert buffer.deadline_ms() == 112  # a linger after the previous flush
    assert buffer.drain(112).sequence == 1  # type: ignore[union-attr]
    buffer.add(batch(0, 1), now_ms=500)
    assert buffer.deadline_ms() == 510  # the previous flush is long ago: the gather again


def test_gather_never_exceeds_the_linger() -> None:
    buffer = WalBuffer(linger_ms=3, max_bytes=1000, gather_ms=10)
    buffer.add(batch(0, 1), now_ms=0)
    assert buffer.deadline_ms() == 3


@given(
    st.lists(st.tuples(st.integers(1, 500), st.booleans()), max_size=60),
    st.integers(100, 2000),
)
def test_admission_bounds_held_bytes_and_keeps_arrival_order(steps: list[tuple[int, bool]], bound: int) -> None:
    """Whatever arrives and whenever bytes are released, held bytes stay within the bound (a
    lone oversized batch aside) and batches are taken in arrival order."""
    admission = Admission(bound)
    held: list[tuple[int, int]] = []  # (item, size) taken and not yet released
    taken: list[int] = []
    for item, (size, release) in enumerate(steps):
        if release and held:
            held.pop(0)
            for got in admission.admit(sum(s for _, s in held)):
                held.append(got)
                taken.append(got[0])
        if admission.offer(size, (item, size), sum(s for _, s in held)):
            held.append((item, size))
            taken.append(item)
        total = sum(s for _, s in held)
        assert total <= bound or len(held) == 1
    while held:
        held.pop(0)
        for got in admission.admit(sum(s for _, s in held)):
            held.append(got)
            taken.append(got[0])
    assert taken == list(range(len(steps)))
    assert admission.waiting == 0 and admission.waiting_bytes == 0


def _run_closed_loop(buffer: WalBuffer, producers: int, round_trip_ms: int, spread_ms: int, until_ms: int):
    """Producers that each send their next batch ``round_trip_ms`` after the flush holding their
    previous one (upload, commit, answer), ``spread_ms`` apart from each other, as producers at
    their in-flight limit do. Returns (each batch's wait in the buffer, flush times)."""
    arrivals = [(p * spread_ms, p) for p in range(producers)]
    waits: list[int] = []
    flushes: list[int] = []
    added: dict[int, int] = {}
    now = 0
    while now < until_ms:
        deadline = buffer.deadline_ms()
        next_arrival = min(arrivals) if arrivals else None
        if deadline is not None and (next_arrival is None or deadline <= next_arrival[0]):
            now = deadline
            assert buffer.due(now)
            flush = buffer.drain(now)
            assert flush is not None
            flushes.append(now)
            for b in flush.batches:
                waits.append(now - added.pop(b.partition))
                arrivals.append((now + round_trip_ms, b.partition))
            continue
        assert next_arrival is not None
        arrivals.remove(next_arrival)
        now, producer = next_arrival
        added[producer] = now
        if buffer.add(batch(producer, 10), now):
            for b in buffer.drain(now).batches:  # type: ignore[union-attr]
                waits.append(now - added.pop(b.partition))
                arrivals.append((now + round_trip_ms, b.partition))
            flushes.append(now)
    return waits, flushes


def test_closed_loop_producers_do_not_wait_a_whole_linger_per_round() -> None:
    """Producers at their in-flight limit send their next batches together once answered; the
    previous flush is then longer ago than the linger, so waiting a whole linger again only adds
    to every round (issue 10: at maximum rate every batch lingered ~92 ms of a ~270 ms round)."""
    buffer = WalBuffer(linger_ms=100, max_bytes=1 << 30)
    waits, flushes = _run_closed_loop(buffer, producers=3, round_trip_ms=170, spread_ms=2, until_ms=10_000)
    assert max(waits) <= buffer.gather_ms
    assert min(b - a for a, b in itertools.pairwise(flushes)) >= buffer.linger_ms


@given(
    st.lists(st.integers(0, 250), min_size=1, max_size=80),
    st.integers(1, 300),
    st.integers(0, 20),
)
def test_flushes_are_a_linger_apart_and_no_batch_waits_longer(gaps: list[int], linger: int, gather: int) -> None:
    """Whatever the arrivals: time-driven flushes start at least ``linger_ms`` apart (PUTs per
    second <= 1000 / linger), and no batch waits longer than ``linger_ms``."""
    buffer = WalBuffer(linger_ms=linger, max_bytes=1 << 30, gather_ms=gather)
    now = 0
    added: list[int] = []
    flushes: list[int] = []
    waits: list[int] = []
    for gap in gaps:
        arrival = now + gap
        while (deadline := buffer.deadline_ms()) is not None and deadline <= arrival:
            assert buffer.due(deadline) and not buffer.due(deadline - 1)
            flush = buffer.drain(deadline)
            assert flush is not None and len(flush.batches) == len(added)
            waits += [deadline - a for a in added]
            added = []
            flushes.append(deadline)
        now = arrival
        buffer.add(batch(0, 1), now)
        added.append(now)
    assert all(w <= linger for w in waits)
    assert all(b - a >= linger for a, b in itertools.pairwise(flushes))


@given(
    st.lists(st.integers(0, 250), min_size=1, max_size=80),
    st.integers(1, 300),
    st.integers(0, 20),
    st.integers(0, 10_000),
)
def test_aligned_flushes_are_one_per_slot_and_no_batch_waits_longer(
    gaps: list[int], linger: int, gather: int, start: int
) -> None:
    """With ``aligned``: time-driven flushes fall in distinct linger slots of the clock (PUTs per
    second <= 1000 / linger, as without it), and no batch waits longer than ``linger_ms``."""
    buffer = WalBuffer(linger_ms=linger, max_bytes=1 << 30, gather_ms=gather, aligned=True)
    now = start
    added: list[int] = []
    flushes: list[int] = []
    for gap in gaps:
        arrival = now + gap
        while (deadline := buffer.deadline_ms()) is not None and deadline <= arrival:
            assert buffer.drain(deadline) is not None
            assert all(deadline - a <= linger for a in added)
            added = []
            flushes.append(deadline)
        now = arrival
        buffer.add(batch(0, 1), now)
        added.append(now)
    slots = [f // linger for f in flushes]
    assert slots == sorted(set(slots))


def test_aligned_brokers_flush_together_whatever_their_phase() -> None:
    """Two representatives whose producers send at the same steady rate but out of phase flush at
    the same instants, the starts of the linger slots (unaligned, each keeps its own phase)."""

    def flush_times(aligned: bool, phase: int) -> list[int]:
        buffer = WalBuffer(linger_ms=100, max_bytes=1 << 30, gather_ms=10, aligned=aligned)
        flushes: list[int] = []
        for arrival in range(phase, 2_000, 7):  # a batch every 7 ms
            while (deadline := buffer.deadline_ms()) is not None and deadline <= arrival:
                buffer.drain(deadline)
                flushes.append(deadline)
            buffer.add(batch(0, 1), arrival)
        return flushes[2:]  # past the first, gather-driven flush

    assert flush_times(True, 3) == flush_times(True, 58)
    assert all(t % 100 == 0 for t in flush_times(True, 58))
    assert not set(flush_times(False, 3)) & set(flush_times(False, 58))


def test_aligned_flush_after_a_clock_stepped_back_waits_no_longer_than_a_linger() -> None:
    buffer = WalBuffer(linger_ms=100, max_bytes=1 << 30, gather_ms=10, aligned=True)
    buffer.add(batch(0, 1), now_ms=3_600_050)
    buffer.drain(3_600_060)
    buffer.add(batch(0, 1), now_ms=50)  # an hour back
    assert buffer.deadline_ms() == 150


def test_the_gather_is_a_broker_setting() -> None:
    from diskless.config import load_config
    from diskless.produce.host import RepresentativeHost
    from diskless.produce.representative import Representative

    config = load_config(environ={}, overrides={"diskless.wal.gather.ms": "3", "diskless.wal.linger.ms": "250"})
    host = RepresentativeHost(config, None, None, None, None)  # type: ignore[arg-type]
    representative = Representative(host, store=None, on_uploaded=lambda key, data: None)  # type: ignore[arg-type]
    assert (representative.buffer.gather_ms, representative.buffer.linger_ms) == (3, 250)
    assert not representative.buffer.aligned
    aligned = load_config(environ={}, overrides={"diskless.wal.linger.aligned": "true"})
    host = RepresentativeHost(aligned, None, None, None, None)  # type: ignore[arg-type]
    assert Representative(host, store=None, on_uploaded=lambda key, data: None).buffer.aligned  # type: ignore[arg-type]
    assert load_config(environ={}).diskless_wal_gather_ms == DEFAULT_GATHER_MS


def test_a_clock_stepped_back_holds_no_batch_longer_than_a_linger(monkeypatch: Any) -> None:
    """The buffer's deadlines are wall-clock milliseconds. After a flush at wall time T the next is
    due at T + linger; if the clock then steps back an hour, the timer must still fire within a
    linger, not an hour and a linger later."""
    import asyncio

    from diskless.config import load_config
    from diskless.produce import representative as module
    from diskless.produce.host import RepresentativeHost

    config = load_config(environ={}, overrides={"diskless.wal.linger.ms": "250"})
    host = RepresentativeHost(config, None, None, None, None)  # type: ignore[arg-type]
    rep = module.Representative(host, store=None, on_uploaded=lambda key, data: None)  # type: ignore[arg-type]
    now = 1_800_000_000_000
    rep.buffer.add(batch(0, 1), now)
    assert rep.buffer.drain(now) is not None  # a flush at T: the next is due at T + 250
    monkeypatch.setattr(module, "_now_ms", lambda: now - 3_600_000)

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        item = module._Item(batch(1, 1), loop.create_future(), acks=1)
        rep._buffer(item)
        assert rep._timer is not None
        delay = rep._timer.when() - loop.time()
        rep._timer.cancel()
        return delay

    assert asyncio.run(scenario()) <= 0.25 + 0.01

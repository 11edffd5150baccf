"""The representative's buffer and commit ordering, sans-IO."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.produce.wal_buffer import Admission, BufferedBatch, WalBuffer


def batch(partition: int, size: int) -> BufferedBatch:
    return BufferedBatch("t", "id", partition, b"x" * size, None)


def test_flush_by_linger_and_by_size() -> None:
    buffer = WalBuffer(linger_ms=100, max_bytes=1000)
    assert buffer.deadline_ms() is None and buffer.drain() is None
    assert not buffer.add(batch(0, 10), now_ms=5)
    assert buffer.deadline_ms() == 105 and not buffer.due(104) and buffer.due(105)
    assert buffer.add(batch(1, 990), now_ms=50)  # full
    flush = buffer.drain()
    assert flush is not None and flush.sequence == 0 and flush.size == 1000 and len(flush.batches) == 2
    assert buffer.deadline_ms() is None and buffer.size == 0
    buffer.add(batch(0, 1), now_ms=60)
    assert buffer.drain().sequence == 1  # type: ignore[union-attr]


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

"""The representative's buffer and commit ordering, sans-IO."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.produce.wal_buffer import BufferedBatch, CommitOrder, WalBuffer


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


@given(st.permutations(list(range(8))))
def test_commits_happen_in_flush_order_whatever_order_uploads_finish(finish_order: list[int]) -> None:
    order = CommitOrder()
    waiting = set()
    committed: list[int] = []
    for sequence in finish_order:  # uploads complete in this order
        waiting.add(sequence)
        progressed = True
        while progressed:
            progressed = False
            for candidate in sorted(waiting):
                if order.may_commit(candidate):
                    committed.append(candidate)
                    order.finished(candidate)
                    waiting.discard(candidate)
                    progressed = True
    assert committed == list(range(8))

"""The produce representative's buffer of diskless batches, sans-IO.

Batches for any diskless partition accumulate here until ``diskless.wal.linger.ms`` has passed
since the first one, or ``diskless.wal.max.bytes`` are buffered; then the whole buffer becomes one
WAL object (one PUT). Each drained flush gets a sequence number; ``CommitOrder`` lets flush n+1
commit only after flush n has finished committing, so commits for every partition are applied
in the order the representative received the batches even when uploads complete out of order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BufferedBatch:
    topic: str
    topic_id: str
    partition: int
    data: bytes
    token: Any  # the caller's handle to complete (a future), opaque here


@dataclass
class Flush:
    sequence: int
    batches: list[BufferedBatch]
    size: int


@dataclass
class WalBuffer:
    linger_ms: int
    max_bytes: int
    _batches: list[BufferedBatch] = field(default_factory=list)
    _size: int = 0
    _first_ms: int | None = None
    _next_sequence: int = 0

    def add(self, batch: BufferedBatch, now_ms: int) -> bool:
        """Buffer a batch; True when the buffer is full and should be flushed now."""
        if self._first_ms is None:
            self._first_ms = now_ms
        self._batches.append(batch)
        self._size += len(batch.data)
        return self._size >= self.max_bytes

    def deadline_ms(self) -> int | None:
        """When the current buffer must be flushed, or None when it is empty."""
        return None if self._first_ms is None else self._first_ms + self.linger_ms

    def due(self, now_ms: int) -> bool:
        deadline = self.deadline_ms()
        return deadline is not None and now_ms >= deadline

    @property
    def size(self) -> int:
        return self._size

    def drain(self) -> Flush | None:
        if not self._batches:
            return None
        flush = Flush(self._next_sequence, self._batches, self._size)
        self._next_sequence += 1
        self._batches = []
        self._size = 0
        self._first_ms = None
        return flush


@dataclass
class CommitOrder:
    """Which flush may commit next: strictly in sequence, each one exactly once."""

    _next: int = 0
    _done: set[int] = field(default_factory=set)

    def may_commit(self, sequence: int) -> bool:
        return sequence == self._next

    def finished(self, sequence: int) -> None:
        """A flush finished committing (or failed before committing): let the next ones go."""
        self._done.add(sequence)
        while self._next in self._done:
            self._done.discard(self._next)
            self._next += 1

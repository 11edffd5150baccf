"""The produce representative's buffer of diskless batches, sans-IO.

Batches for any diskless partition accumulate here until ``diskless.wal.linger.ms`` has passed
since the first one, or ``diskless.wal.max.bytes`` are buffered; then the whole buffer becomes one
WAL object (one PUT). Each drained flush gets a sequence number; the order of commits per
partition is ``commit_pipeline.CommitPipeline``'s job.

``Admission`` bounds what the representative holds (``diskless.produce.buffer.max.bytes``):
batches buffered here plus batches handed to the pipeline and still without an ordering
outcome. A batch that does not fit waits, first come first served, so batches are buffered in
the order they arrived (the order the pipeline keeps per partition); its producer's answer is
later by that much. The waiting line itself is bounded by the connections and their in-flight
request limits (the server stops reading a connection with too many requests outstanding), as
Kafka's own request queue is.
"""

from __future__ import annotations

from collections import deque
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
class Admission:
    """First come, first served admission of batches under a byte bound."""

    max_bytes: int
    _waiting: deque[tuple[int, Any]] = field(default_factory=deque)
    _waiting_bytes: int = 0

    def offer(self, size: int, item: Any, held_bytes: int) -> bool:
        """True when ``item`` may be buffered now; otherwise it waits its turn (see ``admit``)."""
        if not self._waiting and self._fits(size, held_bytes):
            return True
        self._waiting.append((size, item))
        self._waiting_bytes += size
        return False

    def admit(self, held_bytes: int) -> list[Any]:
        """Waiting items that fit now, in arrival order; ``held_bytes`` grows by each one taken."""
        taken = []
        while self._waiting and self._fits(self._waiting[0][0], held_bytes):
            size, item = self._waiting.popleft()
            self._waiting_bytes -= size
            held_bytes += size
            taken.append(item)
        return taken

    def drop_waiting(self) -> list[Any]:
        """Everything still waiting (at shutdown)."""
        items = [item for _, item in self._waiting]
        self._waiting.clear()
        self._waiting_bytes = 0
        return items

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def waiting_bytes(self) -> int:
        return self._waiting_bytes

    def _fits(self, size: int, held_bytes: int) -> bool:
        # A batch bigger than the bound alone is taken when nothing else is held, or it would wait forever.
        return held_bytes + size <= self.max_bytes or held_bytes == 0

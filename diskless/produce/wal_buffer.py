"""The produce representative's buffer of diskless batches, sans-IO.

Batches for any diskless partition accumulate here and the whole buffer becomes one WAL object
(one PUT) when ``diskless.wal.max.bytes`` are buffered, or else at the later of two times: the
first batch plus ``gather_ms`` (batches sent together, e.g. one producer's requests for several
partitions, share the object), and the previous flush plus ``diskless.wal.linger.ms``. So flushes
are at least a linger apart (PUTs per second <= 1000 / linger.ms, whatever the load or the
partition count) and no batch waits longer than a linger. Waiting a whole linger from the first
batch instead was a cap on throughput: producers at their in-flight limit send their next
requests together once answered, when the previous flush is already longer than a linger ago,
and every round paid the full linger again (issue 10: ~92 of the ~270 ms of a round at maximum
rate). Each drained flush gets a sequence number; the order of commits per partition is
``commit_pipeline.CommitPipeline``'s job.

``Admission`` bounds what the representative holds (``diskless.produce.buffer.max.bytes``):
batches buffered here plus batches handed to the pipeline and still without an ordering
outcome. A batch that does not fit waits, first come first served, so batches are buffered in
the order they arrived (the order the pipeline keeps per partition); its producer's answer is
later by that much. The waiting line itself is bounded by ``queued.max.request.bytes`` (the
server stops reading client requests while those being handled hold that much), as Kafka's own
request queue is: a produce request is handled until its batches are buffered (acks=0 too), and
a batch whose request ends first (timed out, connection closed) leaves the line (``remove``).
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


# Batches sent together reach the representative a few milliseconds apart (a producer writes its
# requests for several partitions back to back, each up to 1 MB); a flush waits this long after its
# first batch for them, unless the linger is shorter. Brokers take ``diskless.wal.gather.ms``.
DEFAULT_GATHER_MS = 10


@dataclass
class WalBuffer:
    linger_ms: int
    max_bytes: int
    gather_ms: int = DEFAULT_GATHER_MS
    aligned: bool = False
    _batches: list[BufferedBatch] = field(default_factory=list)
    _size: int = 0
    _first_ms: int | None = None
    _last_flush_ms: int | None = None
    _next_sequence: int = 0

    def __post_init__(self) -> None:
        self.gather_ms = max(0, min(self.gather_ms, self.linger_ms))

    def add(self, batch: BufferedBatch, now_ms: int) -> bool:
        """Buffer a batch; True when the buffer is full and should be flushed now."""
        if self._first_ms is None:
            self._first_ms = now_ms
        self._batches.append(batch)
        self._size += len(batch.data)
        return self._size >= self.max_bytes

    def deadline_ms(self) -> int | None:
        """When the current buffer must be flushed, or None when it is empty.

        Never later than the first batch plus the linger: the previous flush came before it."""
        if self._first_ms is None:
            return None
        deadline = self._first_ms + self.gather_ms
        if self._last_flush_ms is not None:
            if self.aligned:
                # The start of the linger slot after the previous flush's: one flush per slot.
                next_slot = (self._last_flush_ms // self.linger_ms + 1) * self.linger_ms
                # A clock stepped back must not hold a batch past its linger.
                deadline = min(max(deadline, next_slot), self._first_ms + self.linger_ms)
            else:
                deadline = max(deadline, self._last_flush_ms + self.linger_ms)
        return deadline

    def due(self, now_ms: int) -> bool:
        deadline = self.deadline_ms()
        return deadline is not None and now_ms >= deadline

    @property
    def size(self) -> int:
        return self._size

    def drain(self, now_ms: int) -> Flush | None:
        """The buffered batches as one flush (None when empty); the next flush is a linger later."""
        if not self._batches:
            return None
        self._last_flush_ms = now_ms
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

    def remove(self, item: Any) -> bool:
        """Take ``item`` out of the line (its request ended); False when it is not waiting."""
        for index, (size, waiting) in enumerate(self._waiting):
            if waiting is item:
                del self._waiting[index]
                self._waiting_bytes -= size
                return True
        return False

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

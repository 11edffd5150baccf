"""Order of a producer's batches while one of them is verified with its transaction coordinator
(KIP-890 part 1), sans-IO: the per-producer lines of classic produce
(``broker/classic_txn_verification.py``) and of the diskless representative
(``produce/representative.py``).

A batch that must be verified before it is appended (or buffered) joins its producer's line for
the partition, and so does every later batch of that producer to that partition, verified or not:
sequence numbers are per producer and partition, so those are the only batches whose order
matters, and other producers' batches are not held up. A batch's turn comes once it and every
batch ahead of it in its line are done verifying, so batches take their turns in arrival order
whatever order their verifications end in. A line exists only while a batch is in it: with none,
the caller's fast path is one emptiness check.

Items carry their own ``verifying`` flag: set it before ``join``, clear it when the verification
ends, then call ``next_turn`` until it answers None.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator
from typing import Generic, Protocol, TypeVar


class Verifying(Protocol):
    verifying: bool


K = TypeVar("K", bound=Hashable)
T = TypeVar("T", bound=Verifying)


class VerificationLines(Generic[K, T]):
    """Producer (and partition) key -> its batches waiting for a verification, in arrival order."""

    def __init__(self) -> None:
        self._lines: dict[K, deque[T]] = {}

    def __bool__(self) -> bool:
        return bool(self._lines)

    def has_line(self, key: K) -> bool:
        """Whether batches of ``key`` wait: a later batch of it must join the line."""
        return key in self._lines

    def join(self, key: K, item: T) -> None:
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = deque()
        line.append(item)

    def next_turn(self, key: K) -> T | None:
        """The batch at the front of ``key``'s line, taken out, if it is done verifying; None once
        the front is still verifying (or the line is empty, then gone)."""
        line = self._lines.get(key)
        if not line:
            return None
        if line[0].verifying:
            return None
        item = line.popleft()
        if not line:
            del self._lines[key]
        return item

    def drain(self) -> Iterator[T]:
        """Every waiting batch, taken out (shutdown)."""
        lines, self._lines = self._lines, {}
        for line in lines.values():
            yield from line

"""Producer id allocation in blocks: a block is reserved durably before any id in it is handed out.

Reserving blocks (rather than single ids) keeps the durable write off the InitProducerId path;
ids of a partially used block are simply skipped after a restart, never reused.
"""

from __future__ import annotations

from diskless.files import replace_durably

BLOCK_SIZE = 1000


class ProducerIdBlock:
    def __init__(self, start: int = 0, size: int = 0) -> None:
        self.next = start
        self.end = start + size

    def take(self) -> int | None:
        if self.next >= self.end:
            return None
        pid = self.next
        self.next += 1
        return pid


class LocalProducerIdStore:
    """Single-broker block reservation in a file next to the logs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def reserve_block(self) -> ProducerIdBlock:
        try:
            with open(self.path) as f:
                start = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            start = 0
        replace_durably(self.path, str(start + BLOCK_SIZE).encode())
        return ProducerIdBlock(start, BLOCK_SIZE)

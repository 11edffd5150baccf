"""A byte bound on client requests being handled: Kafka's ``queued.max.request.bytes``.

A connection reads a request, takes its frame's bytes from the budget, and gives them back when
the request's answer is ready. When the budget is spent the connection waits before starting the
request and reads nothing more meanwhile, so TCP pushes back on the client. This bounds what the
representative's produce buffer cannot: produce requests waiting to be buffered
(``diskless.produce.buffer.max.bytes``) still hold their frames, up to 512 per connection.

Grants come in arrival order, so a large request is not starved by small ones; a single request
larger than the whole budget is taken once nothing else is held (it passed
``socket.request.max.bytes`` already). Broker connections (replica fetches, commits) are not
budgeted: client produce requests with acks=all wait for them.
"""

from __future__ import annotations

import asyncio
from collections import deque


class RequestBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.max_bytes

    async def take(self, size: int) -> None:
        if not self._waiting and self._fits(size):
            self.held += size
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((size, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(size)  # granted as the waiter was cancelled: give it back
            else:
                self._waiting.remove((size, granted))
                self._grant()  # it may have been holding back smaller requests behind it
            raise

    def release(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            size, granted = self._waiting.popleft()
            self.held += size
            granted.set_result(None)

"""Small asyncio helpers shared by the services."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | asyncio.Future[Any] | None, timeout: float = 5.0) -> None:
    """Cancel tasks and wait for them to finish.

    Unlike ``with suppress(BaseException): await task``, this never swallows a cancellation of the
    caller itself (which would leave it running after its owner asked it to stop), and it never
    waits forever for a task that ignores cancellation.
    """
    pending = [t for t in tasks if t is not None and not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=timeout)
    for task in tasks:
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # mark retrieved: a failure on the way out is not news

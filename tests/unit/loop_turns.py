"""Counting event-loop turns: how many rounds of ready callbacks pass before something happens."""

from __future__ import annotations

import asyncio
from typing import Any


async def turns_until_done(task: asyncio.Future[Any], limit: int = 20) -> int:
    """Event-loop turns until ``task`` is done (each ``sleep(0)`` lets every ready callback run)."""
    for turns in range(limit):
        if task.done():
            return turns
        await asyncio.sleep(0)
    return limit

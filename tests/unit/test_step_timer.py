"""``aio.StepTimer``: a request's handler time for request_percentage quotas (KIP-124) is the time
its own steps run, not the time it waits (a produce's acks=all or a diskless flush, a Fetch's long
poll). Before, the edge counted wall time, so a diskless producer (each request waits ~linger.ms)
was over any request_percentage quota with almost no work."""

from __future__ import annotations

import asyncio
import time

import pytest

from diskless.aio import StepTimer


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_waits_are_not_counted_and_steps_are() -> None:
    async def handler() -> str:
        _spin(0.02)
        await asyncio.sleep(0.3)  # the flush / acks wait
        _spin(0.01)
        return "answer"

    timer = StepTimer()
    started = time.perf_counter()
    assert await timer.run(handler()) == "answer"
    assert time.perf_counter() - started >= 0.3
    assert 0.03 <= timer.busy < 0.2


async def test_work_of_other_tasks_during_the_wait_is_not_counted() -> None:
    async def handler() -> None:
        await asyncio.sleep(0.05)

    async def neighbour() -> None:
        await asyncio.sleep(0)
        _spin(0.1)  # another connection's request, on the same loop

    timer = StepTimer()
    await asyncio.gather(timer.run(handler()), neighbour())
    assert timer.busy < 0.05


async def test_errors_and_results_of_futures_pass_through() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("handler failed")

    with pytest.raises(ValueError, match="handler failed"):
        await StepTimer().run(failing())
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(future.set_result, 7)
    assert await StepTimer().run(future) == 7


async def test_a_cancellation_reaches_the_handler() -> None:
    reached = asyncio.Event()
    cleaned = []

    async def handler() -> None:
        try:
            reached.set()
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)

    task = asyncio.ensure_future(StepTimer().run(handler()))
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]

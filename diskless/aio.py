"""Small asyncio helpers shared by the services."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

T = TypeVar("T")


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


class StepTimer:
    """Runs an awaitable and adds up the time its own steps take, not the time it waits.

    A request's handler time as Kafka's request quota counts it (request_percentage, KIP-124) is
    the time a request handler thread works on it: a produce waiting for its acks or a diskless
    flush, or a fetch waiting for data, is in purgatory then and costs no thread. Under asyncio the
    same thing is the time between the task resuming the handler and the handler yielding again.
    """

    __slots__ = ("busy",)

    def __init__(self) -> None:
        self.busy = 0.0  # seconds

    def run(self, awaitable: Awaitable[T]) -> Awaitable[T]:
        return _timed_steps(awaitable, self)


@types.coroutine
def _timed_steps(awaitable: Awaitable[T], timer: StepTimer) -> Generator[Any, Any, T]:
    steps = awaitable.__await__()
    clock = time.perf_counter
    value: Any = None
    error: BaseException | None = None
    while True:
        started = clock()
        try:
            yielded = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            timer.busy += clock() - started
        value, error = None, None
        try:
            value = yield yielded
        except GeneratorExit:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
            raise
        except BaseException as exc:  # a cancellation (or any error) thrown in goes to the handler
            error = exc

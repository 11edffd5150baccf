"""``diskless.produce.buffer.max.bytes`` bounds what a running PUT holds too.

A failed PUT fails the later batches of its partitions (commit_pipeline rule R2), those of flushes
whose own PUT is still running included. Before the fix their bytes left the bounded quantity at
once, so new batches were admitted while the running PUT still held the old ones (and its WAL
object): with PUTs failing fast next to PUTs that stall, memory grew past the bound by a flush per
cycle. Now they count until their PUT ends."""

from __future__ import annotations

import asyncio

from test_representative_order import TOPIC, TOPIC_ID, FakeBroker, FakeCluster, Faults, batch_bytes

from diskless.produce.representative import Representative


class GatedStore:
    """PUT 1 fails when its gate opens; PUT 2 succeeds when its gate opens; later PUTs succeed."""

    def __init__(self) -> None:
        self.puts = 0
        self.gates = {1: asyncio.Event(), 2: asyncio.Event()}

    async def put(self, key: str, data: bytes, hedge: object = None) -> None:
        self.puts += 1
        number = self.puts
        if number in self.gates:
            await self.gates[number].wait()
        if number == 1:
            raise OSError("injected: PUT failed")


async def until(condition: object, what: str) -> None:
    async def poll() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.001)

    try:
        await asyncio.wait_for(poll(), 5)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def _scenario() -> None:
    size = len(batch_bytes(0, 0))
    broker = FakeBroker(FakeCluster(1, [], [0], Faults()), buffer_max_bytes=2 * size + 16, wal_max_bytes=1 << 20)
    store = GatedStore()
    rep = Representative(broker.host(), store, lambda key, data: None)  # type: ignore[arg-type]
    try:
        first = rep.submit(TOPIC, TOPIC_ID, 0, batch_bytes(0, 0), acks=1)
        await until(lambda: store.puts == 1, "the first flush's PUT")
        second = rep.submit(TOPIC, TOPIC_ID, 0, batch_bytes(0, 1), acks=1)
        await until(lambda: store.puts == 2, "the second flush's PUT")
        store.gates[1].set()  # PUT 1 fails: both batches are answered with an error
        answers = await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert all(a["error_code"] != 0 for a in answers), answers
        # PUT 2 still runs and holds the second batch: it counts against the bound.
        assert rep.held_bytes == size
        rep.submit(TOPIC, TOPIC_ID, 0, batch_bytes(0, 2), acks=1)
        rep.submit(TOPIC, TOPIC_ID, 0, batch_bytes(0, 3), acks=1)
        assert rep.admission.waiting == 1  # the bound is 2 batches: the running PUT holds one
        store.gates[2].set()  # PUT 2 ends: its bytes are free, and the waiting batch is taken
        await until(lambda: rep.admission.waiting == 0, "the waiting batch to be admitted")
    finally:
        await rep.close()


def test_a_put_still_running_after_its_batches_failed_keeps_their_bytes_counted() -> None:
    asyncio.run(_scenario())

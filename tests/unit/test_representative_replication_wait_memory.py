"""An acks=all batch waiting for replication no longer holds its bytes.

Once the leader has appended a batch, the representative only asks whether it is replicated:
the topic, the partition and the offsets are all it needs. Before the fix the wait kept the whole
batch for up to its timeout, outside ``diskless.produce.buffer.max.bytes``; with replication
stalled (a slow follower, a partition) memory grew by the ingest rate times that timeout."""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Any

from test_representative_memory_bound import until
from test_representative_order import TOPIC, TOPIC_ID, FakeBroker, FakeCluster, Faults, batch_bytes

from diskless.produce.representative import Representative
from diskless.produce.wal_buffer import BufferedBatch


class InstantStore:
    async def put(self, key: str, data: bytes, hedge: object = None) -> None:
        return None


async def _scenario() -> None:
    broker = FakeBroker(FakeCluster(1, [], [0], Faults()), buffer_max_bytes=1 << 20, wal_max_bytes=1 << 20)
    broker.cluster.replicated_after = itertools.cycle([False])  # the commit answer: not replicated yet
    asked = asyncio.Event()
    stalled = asyncio.Event()

    async def stalled_replication(body: dict[str, Any]) -> dict[str, Any]:
        asked.set()
        await stalled.wait()
        return {"results": [{"error_code": 0, "done": True} for _ in body["entries"]]}

    broker.leader.await_replicated = stalled_replication  # type: ignore[method-assign]
    rep = Representative(broker.host(), InstantStore(), lambda key, data: None)  # type: ignore[arg-type]
    data = batch_bytes(0, 0)
    try:
        answer = rep.submit(TOPIC, TOPIC_ID, 0, data, acks=-1)
        await until(asked.is_set, "the replication wait")
        gc.collect()
        # A BufferedBatch itself (inline attribute values) or its __dict__, whichever holds it.
        holders = [
            r
            for r in gc.get_referrers(data)
            if isinstance(r, BufferedBatch) or (isinstance(r, dict) and r.get("data") is data)
        ]
        assert holders == [], "the batch's bytes are held while it waits for replication"
        stalled.set()
        assert (await asyncio.wait_for(answer, 5))["error_code"] == 0
    finally:
        await rep.close()


def test_a_batch_waiting_for_replication_holds_no_bytes() -> None:
    asyncio.run(_scenario())

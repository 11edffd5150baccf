"""The representative's wait for an acks=all batch's replication.

It holds no bytes: once the leader has appended a batch, the representative only asks whether it is replicated:
the topic, the partition and the offsets are all it needs. Before the fix the wait kept the whole
batch for up to its timeout, outside ``diskless.produce.buffer.max.bytes``; with replication
stalled (a slow follower, a partition) memory grew by the ingest rate times that timeout.

It lasts the Produce request's timeout: it was a fixed 30 s, so a producer with a longer
``request.timeout.ms`` was answered REQUEST_TIMED_OUT where Kafka would still wait."""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Any

import pytest
from test_representative_memory_bound import until
from test_representative_order import TOPIC, TOPIC_ID, FakeBroker, FakeCluster, Faults, batch_bytes

import diskless.produce.representative as representative
from diskless.produce.representative import Representative
from diskless.produce.wal_buffer import BufferedBatch


class InstantStore:
    async def put(self, key: str, data: bytes, hedge: object = None) -> None:
        return None


def stalled_replication() -> tuple[Representative, asyncio.Event, asyncio.Event]:
    """A representative whose only leader answers AwaitReplicated once ``stalled`` is set."""
    broker = FakeBroker(FakeCluster(1, [], [0], Faults()), buffer_max_bytes=1 << 20, wal_max_bytes=1 << 20)
    broker.cluster.replicated_after = itertools.cycle([False])  # the commit answer: not replicated yet
    asked = asyncio.Event()
    stalled = asyncio.Event()

    async def await_replicated(body: dict[str, Any]) -> dict[str, Any]:
        asked.set()
        await stalled.wait()
        return {"results": [{"error_code": 0, "done": True} for _ in body["entries"]]}

    broker.leader.await_replicated = await_replicated  # type: ignore[method-assign]
    rep = Representative(broker.host(), InstantStore(), lambda key, data: None)  # type: ignore[arg-type]
    return rep, asked, stalled


async def _scenario() -> None:
    rep, asked, stalled = stalled_replication()
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


async def _long_timeout_scenario() -> None:
    rep, asked, stalled = stalled_replication()
    try:
        answer = rep.submit(TOPIC, TOPIC_ID, 0, batch_bytes(0, 0), acks=-1, timeout_s=60)
        await until(asked.is_set, "the replication wait")
        # Past the wait of a batch without a request timeout (0.05 s here, 30 s by default): one whose
        # request has 60 s is still waited for.
        done, _ = await asyncio.wait([answer], timeout=0.5)
        assert not done, f"answered before its request timed out: {answer.result()}"
        stalled.set()
        assert (await asyncio.wait_for(answer, 5))["error_code"] == 0
    finally:
        stalled.set()
        await rep.close()


def test_replication_is_awaited_for_the_requests_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(representative, "REPLICATION_TIMEOUT_S", 0.05)
    asyncio.run(_long_timeout_scenario())

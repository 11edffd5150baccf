"""A standalone broker (LocalBackend) applies a metadata change in the task of whoever made it: a
request handler, cancelled when its connection closes. librdkafka sends FindCoordinator on its
bootstrap connection and closes that connection at once; the handler creating __consumer_offsets
was cancelled in the middle of applying the new topic (it yields every APPLY_SLICE_S, which on a
loaded machine is within the 50 partitions), and the partitions after that point never got a
replica or a coordinator: groups hashed to them got COORDINATOR_LOAD_IN_PROGRESS forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from diskless.broker import broker as broker_module
from diskless.broker.broker import Broker
from diskless.cluster.metadata import BrokerInfo
from diskless.config import load_config

PARTITIONS = 6


async def test_a_cancelled_creator_does_not_stop_the_new_topics_application(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker_module, "APPLY_SLICE_S", 0.0)  # a loaded machine: a yield after every change
    broker = Broker(
        load_config(
            overrides={
                "node.id": "0",
                "log.dirs": str(tmp_path),
                "offsets.topic.num.partitions": str(PARTITIONS),
            }
        )
    )
    broker.metadata.brokers[0] = BrokerInfo(0, "127.0.0.1", 9092)
    try:
        handler = asyncio.create_task(broker.groups.ensure_topic())  # FindCoordinator's first step
        for _ in range(1000):
            await asyncio.sleep(0)
            if broker.groups.cores:
                break
        assert 0 < len(broker.groups.cores) < PARTITIONS, "the application was expected to be half-way"
        handler.cancel()  # the client closed the connection
        for _ in range(1000):
            await asyncio.sleep(0)
            if len(broker.groups.cores) == PARTITIONS:
                break
        assert sorted(broker.groups.cores) == list(range(PARTITIONS))
        assert len(broker.replicas.partitions) == PARTITIONS
        with pytest.raises(asyncio.CancelledError):
            await handler
    finally:
        await broker.replicas.close()

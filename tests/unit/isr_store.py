"""An etcd metadata store on tests/unit/fake_etcd.py with one topic "t" whose partition 0 broker 1
leads, for driving ``Broker._propose_isr`` (AlterPartition) against the real store code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

from fake_etcd import FakeEtcd

from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.metadata import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicMetadata,
    broker_record,
    partition_record,
    topic_record,
)
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.replication.partition import Partition

LEADER = 1


async def open_store(
    nodes: Iterable[int] = (1, 2, 3), metadata: ClusterMetadata | None = None
) -> tuple[FakeEtcd, EtcdMetadataStore, ClusterMetadata]:
    """A store on a fake etcd holding the given live brokers (nothing loaded yet), loading into
    ``metadata`` (a broker's own) or a fresh copy."""
    fake = FakeEtcd()
    metadata = ClusterMetadata("c") if metadata is None else metadata
    store = EtcdMetadataStore("127.0.0.1:2379", "c", metadata)
    store.client = fake  # type: ignore[assignment]
    for node in nodes:
        await fake.put(f"{store.prefix}brokers/{node}".encode(), broker_record(BrokerInfo(node, "h", 9000 + node)))
    return fake, store, metadata


async def put_topic(fake: FakeEtcd, store: EtcdMetadataStore, topic_id: str, state: PartitionState) -> None:
    """Store topic "t" (one partition) with ``state`` as its partition 0."""
    topic = TopicMetadata("t", topic_id, [PartitionState(list(state.replicas), state.leader)])
    await fake.put(f"{store.prefix}topics/t".encode(), topic_record(topic))
    await fake.put(f"{store.prefix}partitions/t/0".encode(), partition_record(state, topic_id))


def leader_replica(tmp_path: Path, metadata: ClusterMetadata, topic_id: str) -> Partition:
    """Broker 1's replica of t-0, with the loaded metadata's state applied."""
    replica = Partition("t", 0, PartitionLog(str(tmp_path / "t-0"), LogConfig(), 0), LEADER, topic_id)
    state = metadata.partition("t", 0)
    assert state is not None
    replica.apply_state(state, 0)
    return replica


def proposer(store: EtcdMetadataStore, metadata: ClusterMetadata) -> SimpleNamespace:
    """What ``Broker._propose_isr`` uses of broker 1."""
    return SimpleNamespace(
        _isr_updates=set(),
        backend=store,
        node_id=LEADER,
        metadata=metadata,
        _isr_slots=asyncio.Semaphore(8),
        _stopping=False,
    )


def stored_record(fake: FakeEtcd, store: EtcdMetadataStore) -> dict:
    """t-0's record as etcd holds it now (topic_id included)."""
    return json.loads(fake.kv[(store.prefix + "partitions/t/0").encode()].value)


def stored_state(fake: FakeEtcd, store: EtcdMetadataStore) -> PartitionState:
    raw = stored_record(fake, store)
    raw.pop("topic_id")
    return PartitionState(**raw)

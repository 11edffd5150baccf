"""The leader side of WalReferences and leader self-fencing, driven without sockets: a real
``ReplicaManager`` over a temporary directory and the ``DisklessRpcs`` handlers over an in-memory
broker stand-in whose lease fence is a real ``LeaseFence`` on a clock the test moves.

- Every answer carries the leader epoch of the answering replica (-1 when it cannot say), so the
  WAL manager can discard answers of a deposed leader.
- A topic id or partition the broker's metadata does not know is UNKNOWN, never "unreferenced":
  the view may lag the topic's creation.
- A broker whose etcd lease keepalive has not succeeded for the TTL answers as no leader at all:
  WalReferences UNKNOWN, commits and pointer fetches NOT_LEADER_OR_FOLLOWER, until it
  re-registered and its metadata shows that.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from batches import values_batch
from fenced_broker import NODE, TTL_MS, FencedBroker, now_ms

from diskless.broker.diskless_rpcs import DisklessRpcs
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.log.config import LogConfig
from diskless.replication.partition import Partition

REF_NO, REF_YES, REF_UNKNOWN = 0, 1, 2
NOT_LEADER_OR_FOLLOWER = 6
CONFIG = LogConfig(diskless_enabled=True)


class DisklessBroker(FencedBroker):
    """The fenced broker hosting diskless partitions."""

    def host(self, name: str, epoch: int = 0) -> tuple[TopicMetadata, Partition]:
        state = PartitionState(replicas=[NODE], leader=NODE, leader_epoch=epoch, isr=[NODE])
        meta = TopicMetadata(name, str(uuid.uuid4()), [state], {"diskless.enabled": "true"})
        self.metadata.topics[name] = meta
        replica = self.replicas.apply(meta, 0, CONFIG, now_ms())
        assert replica is not None
        return meta, replica


@pytest.fixture
def broker(tmp_path: Path) -> DisklessBroker:
    return DisklessBroker(tmp_path / "logs")


def commit_pointer(replica: Partition, key: str) -> None:
    replica.log.append_pointer_as_leader(values_batch(2)[:61], key, 0, replica.leader_epoch, now_ms())
    replica.on_local_append()


async def refs(rpcs: DisklessRpcs, queries: list[list[Any]]) -> tuple[list[int], list[int]]:
    answer = await rpcs.wal_references_rpc({"queries": queries})
    return answer["answers"], answer.get("epochs", [])


async def test_answers_carry_the_leader_epoch(broker: DisklessBroker) -> None:
    meta, replica = broker.host("t", epoch=7)
    commit_pointer(replica, "wal/a.wal")
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    answers, epochs = await refs(rpcs, [["wal/a.wal", meta.topic_id, 0], ["wal/b.wal", meta.topic_id, 0]])

    assert answers == [REF_YES, REF_NO]
    assert epochs == [7, 7]


async def test_unknown_topic_id_or_partition_is_unknown_not_unreferenced(broker: DisklessBroker) -> None:
    """The manager asks because its view has the topic; ours may lag the creation."""
    meta, _ = broker.host("t")
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    answers, epochs = await refs(rpcs, [["wal/a.wal", str(uuid.uuid4()), 0], ["wal/a.wal", meta.topic_id, 3]])

    assert answers == [REF_UNKNOWN, REF_UNKNOWN]
    assert epochs == [-1, -1]


async def test_a_broker_that_cannot_refresh_its_lease_stops_acting_as_leader(broker: DisklessBroker) -> None:
    meta, replica = broker.host("t", epoch=2)
    commit_pointer(replica, "wal/a.wal")
    replica.log.high_watermark = replica.log.log_end_offset
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]
    fetch = {"topic": "t", "topic_id": meta.topic_id, "partition": 0, "offset": 0, "max_bytes": 1 << 20}
    commit = {
        "key": "wal/b.wal",
        "created_ms": now_ms(),
        "entries": [
            {
                "topic": "t",
                "topic_id": meta.topic_id,
                "partition": 0,
                "header": values_batch(1)[:61],
                "position": 0,
                "acks": 1,
            }
        ],
    }

    broker.fence.on_refreshed(1_000)  # the last keepalive that succeeded was sent at 1,000
    broker.clock = 1_000 + TTL_MS - 1
    assert (await refs(rpcs, [["wal/a.wal", meta.topic_id, 0]]))[0] == [REF_YES]
    assert (await rpcs.fetch_pointers_rpc(fetch))["error_code"] == 0

    broker.clock = 1_000 + TTL_MS  # no keepalive for the TTL: etcd may expire the lease any moment
    assert await refs(rpcs, [["wal/a.wal", meta.topic_id, 0]]) == ([REF_UNKNOWN], [-1])
    assert (await rpcs.fetch_pointers_rpc(fetch))["error_code"] == NOT_LEADER_OR_FOLLOWER
    result = await rpcs.commit_batches_rpc(commit)
    assert [r["error_code"] for r in result["results"]] == [NOT_LEADER_OR_FOLLOWER]
    assert replica.log.log_end_offset == 2  # nothing appended

    broker.fence.on_expired()
    broker.fence.on_registered(broker.clock, revision=9)  # a new lease...
    assert (await refs(rpcs, [["wal/a.wal", meta.topic_id, 0]]))[0] == [REF_UNKNOWN]
    broker.fence.on_metadata_revision(9)  # ...and metadata that has seen it: leads again
    assert await refs(rpcs, [["wal/a.wal", meta.topic_id, 0]]) == ([REF_YES], [2])

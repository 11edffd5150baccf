"""A broker for leader-side handler tests: real metadata, replica manager and lease fence, no sockets.

Tests move ``clock`` (the fence's monotonic ms) to fence and unfence it, and add a ``host`` of the
partitions they need."""

from __future__ import annotations

import time
from pathlib import Path

from diskless.broker.replica_manager import ReplicaManager
from diskless.cluster.lease import LeaseFence
from diskless.cluster.metadata import ClusterMetadata
from diskless.config import BrokerConfig
from diskless.replication.partition import Partition

NODE = 0
TTL_MS = 3_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class FencedBroker:
    """What the leader-side handlers use of a broker, plus the lease fence of a clustered one."""

    def __init__(self, log_dir: Path, cluster_id: str = "fenced-broker-test") -> None:
        self.config = BrokerConfig()
        self.metadata = ClusterMetadata(cluster_id)
        self.replicas = ReplicaManager(str(log_dir), NODE, self.metadata.brokers.get)
        self.fence = LeaseFence(TTL_MS)
        self.clock = 0  # monotonic ms of the fence
        self.fence.on_registered(0, revision=1)
        self.fence.on_metadata_revision(1)

    @staticmethod
    def now_ms() -> int:
        return now_ms()

    def leader_fenced(self) -> bool:
        return self.fence.fenced(self.clock)

    def on_leader_append(self, partition: Partition) -> None:
        partition.on_local_append()

    def prefetch_objects(self, keys: set[str]) -> None:
        pass

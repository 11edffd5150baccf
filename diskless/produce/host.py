"""What the representative needs from the broker it runs in, and nothing more.

The representative (``representative.py``) decides nothing about leadership or replication: it
routes each commit to a partition's current leader, either this broker's own (a direct call) or
another broker (an internal request on a peer connection). ``RepresentativeHost`` is that whole
dependency, so the arrow points one way: ``broker/`` builds a host and hands it over, and nothing
in ``produce/`` imports ``broker/``. Tests give the representative a host of fakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from diskless.cluster.metadata import ClusterMetadata
    from diskless.config import BrokerConfig
    from diskless.protocol.client import KafkaClientConnection
    from diskless.security.internal_auth import ClusterSecret


class PeerConnections(Protocol):
    """Connections to the other brokers, one per broker, shared by everything in the process."""

    def connected(self, node_id: int) -> KafkaClientConnection | None:
        """The open connection to ``node_id``, or None (without waiting for one)."""

    async def get(self, node_id: int) -> KafkaClientConnection:
        """The connection to ``node_id``, opened if need be."""

    async def connect_all(self, node_ids: list[int]) -> None:
        """Open connections to these brokers ahead of need."""


class LocalLeader(Protocol):
    """This broker's own partition leaders, as the internal requests reach them from elsewhere."""

    def commit_batches_now(self, body: dict[str, Any]) -> dict[str, Any]:
        """CommitBatches: append the entries' pointers before returning (ordering relies on it)."""

    async def await_replicated(self, body: dict[str, Any]) -> dict[str, Any]:
        """AwaitReplicated: answer once any entry is replicated or refused, or at the wait's end."""

    async def verify_txn_partition(self, body: dict[str, Any]) -> dict[str, Any]:
        """VerifyTxnPartition: the guard a transactional batch's commit carries."""


@dataclass(frozen=True)
class RepresentativeHost:
    config: BrokerConfig
    metadata: ClusterMetadata  # partition leaders and epochs by topic id, brokers, the WAL manager
    peers: PeerConnections
    leader: LocalLeader
    credentials: ClusterSecret | None  # proves internal requests to the WAL manager

    @property
    def node_id(self) -> int:
        return self.config.node_id

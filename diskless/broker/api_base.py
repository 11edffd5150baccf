"""What every Kafka API family shares: constants, the broker handle, finding the local log of a
partition, and forwarding a request to a partition's leader."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import PartitionState
from diskless.log.partition_log import PartitionLog
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError
from diskless.replication.partition import FOLLOWER, Partition

if TYPE_CHECKING:
    from .broker import Broker

log = structlog.get_logger(__name__)


RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "long": 5, "list": 7}
EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4  # ListOffsets v8+ (KIP-405)
LATEST_TIERED = -5  # ListOffsets v9+ (KIP-1005)
READ_COMMITTED = 1
# What handlers put in authorized-operations fields (Kafka's "not asked" default); the security
# layer (SecurityApis._fill_authorized_operations) replaces it where the request asks for them.
NO_AUTHORIZED_OPERATIONS = -(2**31)
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
REF_NO, REF_YES, REF_UNKNOWN = 0, 1, 2
# KIP-320: the client's current_leader_epoch is older (newer) than the replica's. The client must
# hear it, to refresh its metadata: a read is never forwarded to the leader over one (the leader
# would answer it, and the client would go on with its stale view).
EPOCH_ERRORS = frozenset({ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch})


def _ms(value: Any) -> int:
    """kio decodes millisecond durations as timedelta; accept ints too."""
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


class CloseConnection(Exception):
    """Raised by a handler whose only possible answer is closing the client's connection."""


class ApiFamily:
    """Base of one family of API handlers: holds the broker and the lookups every handler needs."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {}

    @property
    def local_az(self) -> str:
        return self.broker.config.broker_rack or "none"

    @property
    def _meta(self) -> Any:
        return self.broker.metadata

    def _leader_log(
        self, topic: str, partition: int, current_leader_epoch: int = -1, any_replica: bool = False
    ) -> tuple[ErrorCode, PartitionLog | None, Partition | None]:
        """The local log of a partition this broker leads, or the Kafka error explaining why not.

        With ``any_replica`` (reads of diskless partitions) a follower replica serves too, up to
        the high watermark it learned from its leader.
        """
        state = self._meta.partition(topic, partition)
        if state is None:
            return ErrorCode.unknown_topic_or_partition, None, None
        return self._serving_replica(
            topic, partition, self._meta.topics[topic].topic_id, state, current_leader_epoch, any_replica, None
        )

    def _serving_replica(
        self,
        topic: str,
        partition: int,
        topic_id: str,
        state: PartitionState,
        current_leader_epoch: int,
        any_replica: bool,
        fenced: bool | None,
    ) -> tuple[ErrorCode, PartitionLog | None, Partition | None]:
        """``_leader_log`` for a partition whose metadata the caller has looked up already, and,
        unless ``fenced`` is None, whether this broker is fenced as leader (once per request)."""
        # Only a replica of the incarnation the metadata shows: until the change handler replaces
        # a re-created topic's old replica, that replica serves nothing under the name.
        replica = self.broker.replicas.hosted(topic, partition, topic_id)
        serving = replica is not None and (
            replica.leader_state is not None or (any_replica and replica.role == FOLLOWER)
        )
        if replica is None or not serving:
            code = ErrorCode.leader_not_available if state.leader < 0 else ErrorCode.not_leader_or_follower
            return code, None, None
        if replica.leader_state is not None and (self._leader_fenced() if fenced is None else fenced):
            # Our etcd lease may have expired: a successor may be elected any moment (lease.py).
            return ErrorCode.not_leader_or_follower, None, None
        if current_leader_epoch >= 0 and current_leader_epoch != replica.leader_epoch:
            code = (
                ErrorCode.fenced_leader_epoch
                if current_leader_epoch < replica.leader_epoch
                else ErrorCode.unknown_leader_epoch
            )
            return code, None, None
        return ErrorCode.none, replica.log, replica

    def _leader_fenced(self) -> bool:
        # Broker stand-ins in unit tests need not model the etcd lease: they are never fenced.
        fenced = getattr(self.broker, "leader_fenced", None)
        return fenced is not None and bool(fenced())

    def _is_diskless(self, topic: str) -> bool:
        meta = self._meta.topics.get(topic)
        return meta is not None and self.broker.is_diskless(meta)

    def _forward_target(self, topic: str, partition: int, diskless: bool, replica: Partition | None) -> int | None:
        """Where a request about a diskless partition goes when no replica here can answer it: zone-
        aligned metadata sends clients to a broker of their AZ, which may host no replica."""
        if not diskless or replica is not None:
            return None
        state = self._meta.partition(topic, partition)
        if state is None or state.leader < 0 or state.leader == self.broker.node_id:
            return None
        return int(state.leader)

    async def _forward(
        self, leader: int, api_key: int, version: int, body: dict[str, Any], timeout: float = 30.0
    ) -> Any | None:
        """The leader's answer to ``body``, or None if it could not be had within ``timeout`` seconds
        (a request that waits at the leader, such as DeleteRecords, needs its own wait and more)."""
        try:
            conn = await self.broker.peers.get(leader)
            return await conn.request(api_key, version, body, timeout=timeout)
        except (ClientError, OSError, TimeoutError) as exc:
            log.info("forwarding to the leader failed", leader=leader, api=api_key, error=str(exc))
            return None


def forwarded_by_broker(header: m.RequestHeader) -> bool:
    """Whether another broker forwarded this request to us, taking us for the leader. Such a
    request is answered here or refused (NOT_LEADER_OR_FOLLOWER), never forwarded on: brokers
    whose metadata views disagree about the leader would pass it along a chain, or in a loop."""
    return internal.broker_of_client(header.client_id) is not None


def _answered(
    entry: dict[str, Any],
    answer: Any,
    topic: str,
    index: int,
    topic_field: str = "name",
    index_field: str = "partition_index",
) -> Any | None:
    """The leader's entry for a partition a request was forwarded about; None, with ``entry`` set to
    NOT_LEADER_OR_FOLLOWER (retriable: the client refreshes its metadata), if it gave none."""
    found = _find_partition(answer, topic, index, topic_field, index_field)
    if found is None:
        entry["error_code"] = ErrorCode.not_leader_or_follower
    return found


def _find_partition(answer: Any, topic: str, index: int, topic_field: str, index_field: str) -> Any | None:
    """The partition entry of a forwarded response (kio entity), if the leader answered for it."""
    if answer is None:
        return None
    for t in answer.topics:
        if getattr(t, topic_field) == topic:
            for p in t.partitions:
                if getattr(p, index_field) == index:
                    return p
    return None

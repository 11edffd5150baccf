"""Metadata, DescribeCluster and FindCoordinator: what clients learn about the cluster, with
diskless partitions' leaders crafted per client AZ (zone alignment)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import MetadataError, TopicMetadata, validate_topic_name
from diskless.cluster.zones import zone_aligned_leader
from diskless.protocol import internal
from diskless.protocol import messages as m

from .api_base import NO_AUTHORIZED_OPERATIONS, ApiFamily
from .client_zone import current_client_az, current_listener

log = structlog.get_logger(__name__)


class MetadataApis(ApiFamily):
    """Cluster discovery APIs."""

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_METADATA: self.metadata,
            m.API_FIND_COORDINATOR: self.find_coordinator,
            m.API_DESCRIBE_CLUSTER: self.describe_cluster,
        }

    async def find_coordinator(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """Group coordinators are the leaders of ``__consumer_offsets`` partitions (created on first
        use). Transaction coordinators do not exist yet: COORDINATOR_NOT_AVAILABLE, as Kafka says
        before its internal topic exists."""
        key_type = getattr(request, "key_type", 0)
        keys = getattr(request, "coordinator_keys", None) or [getattr(request, "key", "")]
        entries = []
        for key in keys:
            entry: dict[str, Any] = {
                "key": key,
                "error_code": ErrorCode.coordinator_not_available,
                "error_message": None,
            }
            entry.update(node_id=-1, host="", port=-1)
            shell = self.broker.groups if key_type == 0 else self.broker.txns
            try:
                await shell.ensure_topic()
            except MetadataError as exc:
                entry["error_message"] = str(exc)
            node = shell.coordinator_node(key)
            info = self._meta.brokers.get(node)
            address = None if info is None else info.endpoint(current_listener())
            if address is not None:
                entry.update(error_code=ErrorCode.none, node_id=node, host=address[0], port=address[1])
            entries.append(entry)
        first = entries[0]
        single = {k: first[k] for k in ("error_code", "error_message", "node_id", "host", "port")}
        return {"throttle_time": 0, **single, "coordinators": entries}

    def _broker_entries(self, key: str) -> list[dict[str, Any]]:
        """Every broker at its address on the listener this request came in on (as Kafka does: a
        client that bootstrapped through its AZ's listener stays on it); a broker without that
        listener is left out, as Kafka leaves it out."""
        listener = current_listener()
        entries = []
        for b in sorted(self._meta.brokers.values(), key=lambda b: b.node_id):
            address = b.endpoint(listener)
            if address is not None:
                entries.append({key: b.node_id, "host": address[0], "port": address[1], "rack": b.rack})
        return entries

    def _topic_entry(self, topic: TopicMetadata, client_az: str | None = None) -> dict[str, Any]:
        aligned = client_az is not None and self.broker.is_diskless(topic)
        brokers = self._meta.brokers

        def shown_leader(index: int, state: Any) -> int:
            if not aligned or state.leader < 0:
                return int(state.leader)
            return zone_aligned_leader(state, topic.name, index, client_az or "", brokers)

        return {
            "error_code": ErrorCode.none,
            "name": topic.name,
            "topic_id": uuid.UUID(topic.topic_id),
            "is_internal": topic.internal,
            "partitions": [
                {
                    "error_code": ErrorCode.none if p.leader >= 0 else ErrorCode.leader_not_available,
                    "partition_index": i,
                    "leader_id": shown_leader(i, p),
                    "leader_epoch": p.leader_epoch,
                    "replica_nodes": p.replicas,
                    "isr_nodes": p.isr,
                    "offline_replicas": [r for r in p.replicas if r not in self._meta.brokers],
                }
                for i, p in enumerate(topic.partitions)
            ],
            "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

    def _controller_for_clients(self) -> int:
        """Where clients send controller requests (reassignments, elections): any broker applies
        them (a CAS in the metadata store), so, as a KRaft broker does, name a live broker, never
        one missing from the brokers list of the same answer (a controller that just left)."""
        controller = self._meta.controller_id
        return controller if controller in self._meta.brokers else self.broker.node_id

    async def metadata(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        requested = request.topics
        # The connection's decided AZ (cluster/client_az.py); outside a connection, the old rule.
        client_az = current_client_az() or internal.az_of_client(header.client_id) or self.local_az
        if requested is None or (header.api_version == 0 and not requested):
            entries = [self._topic_entry(t, client_az) for t in self._meta.topics.values()]
        else:
            allow_auto = getattr(request, "allow_auto_topic_creation", True)
            entries = []
            for item in requested:
                entries.append(await self._metadata_topic(item, allow_auto, client_az))
        return {
            "throttle_time": 0,
            "brokers": self._broker_entries("node_id"),
            "cluster_id": self._meta.cluster_id,
            "controller_id": self._controller_for_clients(),
            "topics": entries,
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

    async def _metadata_topic(self, item: Any, allow_auto: bool, client_az: str) -> dict[str, Any]:
        name = getattr(item, "name", None)
        topic_id = getattr(item, "topic_id", None)
        if name is None and topic_id is not None and topic_id.int != 0:
            topic = self._meta.topic_by_id(str(topic_id))
            if topic is None:
                return {"error_code": ErrorCode.unknown_topic_id, "name": None, "topic_id": topic_id}
            return self._topic_entry(topic, client_az)
        topic = self._meta.topics.get(name)
        if topic is not None:
            return self._topic_entry(topic, client_az)
        try:
            validate_topic_name(name)
        except MetadataError as exc:
            return {"error_code": exc.code, "name": name}
        if allow_auto and self.broker.config.auto_create_topics_enable:
            try:
                topic = await self.broker.create_topic(
                    name, self.broker.config.num_partitions, self.broker.config.default_replication_factor, {}
                )
                return self._topic_entry(topic, client_az)
            except MetadataError as exc:
                if exc.code == ErrorCode.topic_already_exists and name in self._meta.topics:
                    return self._topic_entry(self._meta.topics[name], client_az)
                return {"error_code": exc.code, "name": name}
        return {"error_code": ErrorCode.unknown_topic_or_partition, "name": name}

    def describe_cluster(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        endpoint_type = getattr(request, "endpoint_type", 1)
        if endpoint_type != 1:
            return {
                "error_code": ErrorCode.unsupported_endpoint_type,
                "error_message": "only broker endpoints are served",
                "endpoint_type": endpoint_type,
            }
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "endpoint_type": 1,
            "cluster_id": self._meta.cluster_id,
            "controller_id": self._controller_for_clients(),
            "brokers": self._broker_entries("broker_id"),
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

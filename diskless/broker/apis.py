"""Kafka API handlers: one method per API, version-agnostic, returning response dicts.

Requests arrive as kio entities of whatever version the client sent; fields that an older
version lacks are read with defaults. Responses are plain dicts that the codec fits to the
client's version. Errors are returned as Kafka error codes per topic/partition, as Kafka does.

Ordering note: the connection layer starts handlers in request order, and ``produce`` appends
before its first ``await``, so pipelined produce requests on one connection append in order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import MetadataError, TopicMetadata, validate_topic_name
from diskless.cluster.zones import zone_aligned_leader
from diskless.log.config import TOPIC_CONFIGS, canonical_name, effective_values
from diskless.log.partition_log import OffsetOutOfRange, PartitionLog, timestamp_allowed
from diskless.log.segment import POINTERS
from diskless.metrics import DISKLESS_COMMIT_SECONDS
from diskless.protocol import internal, records
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError
from diskless.replication.partition import FOLLOWER, Partition, wrap_pointers
from diskless.storage import pointer

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
READ_COMMITTED = 1
NO_AUTHORIZED_OPERATIONS = -(2**31)
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
REF_NO, REF_YES, REF_UNKNOWN = 0, 1, 2


def _ms(value: Any) -> int:
    """kio decodes millisecond durations as timedelta; accept ints too."""
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


class CloseConnection(Exception):
    """Raised by a handler whose only possible answer is closing the client's connection."""


class KafkaApis:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._handlers: dict[int, Callable[[m.RequestHeader, Any], Any]] = {
            m.API_PRODUCE: self.produce,
            m.API_FETCH: self.fetch,
            m.API_LIST_OFFSETS: self.list_offsets,
            m.API_METADATA: self.metadata,
            m.API_API_VERSIONS: self.api_versions,
            m.API_FIND_COORDINATOR: self.find_coordinator,
            m.API_CREATE_TOPICS: self.create_topics,
            m.API_DELETE_TOPICS: self.delete_topics,
            m.API_DELETE_RECORDS: self.delete_records,
            m.API_INIT_PRODUCER_ID: self.init_producer_id,
            m.API_OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            m.API_DESCRIBE_CONFIGS: self.describe_configs,
            m.API_ALTER_CONFIGS: self.alter_configs,
            m.API_CREATE_PARTITIONS: self.create_partitions,
            m.API_INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            m.API_DESCRIBE_CLUSTER: self.describe_cluster,
            m.API_WRITE_TXN_MARKERS: self.write_txn_markers,
            m.API_TXN_OFFSET_COMMIT: self.txn_offset_commit,
            **self._group_handlers(),
        }
        self._internal_handlers: dict[int, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            internal.INTERNAL_COMMIT_BATCHES: self.commit_batches_now,
            internal.INTERNAL_FETCH_POINTERS: self.fetch_pointers_rpc,
            internal.INTERNAL_WAL_REFERENCES: self.wal_references_rpc,
        }

    # --- zones ---------------------------------------------------------------------------------

    @property
    def local_az(self) -> str:
        return self.broker.config.broker_rack or "none"

    def peer_az(self, client_id: str | None) -> str:
        """The AZ on the other end of a connection: a broker's rack, a client's ``diskless_az``, else ours."""
        peer = internal.broker_of_client(client_id)
        if peer is not None:
            info = self._meta.brokers.get(peer)
            if info is not None and info.rack:
                return info.rack
        return internal.az_of_client(client_id) or self.local_az

    async def handle_internal(self, header: m.RequestHeader, body: dict[str, Any]) -> dict[str, Any]:
        handler = self._internal_handlers.get(header.api_key)
        if handler is None:
            return {"error_code": int(ErrorCode.invalid_request)}
        return await handler(body)

    async def handle(self, header: m.RequestHeader, request: Any) -> dict[str, Any] | None:
        result = self._handlers[header.api_key](header, request)
        if hasattr(result, "__await__"):
            result = await result
        return result

    # --- helpers ----------------------------------------------------------------------------

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
        replica = self.broker.replicas.partitions.get((topic, partition))
        serving = replica is not None and (
            replica.leader_state is not None or (any_replica and replica.role == FOLLOWER)
        )
        if replica is None or not serving:
            code = ErrorCode.leader_not_available if state.leader < 0 else ErrorCode.not_leader_or_follower
            return code, None, None
        if current_leader_epoch >= 0 and current_leader_epoch != replica.leader_epoch:
            code = (
                ErrorCode.fenced_leader_epoch
                if current_leader_epoch < replica.leader_epoch
                else ErrorCode.unknown_leader_epoch
            )
            return code, None, None
        return ErrorCode.none, replica.log, replica

    # --- ApiVersions / Metadata / DescribeCluster -----------------------------------------------

    def api_versions(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        return {"error_code": ErrorCode.none, "api_keys": api_version_entries(), "throttle_time": 0}

    def _group_handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        from diskless.groups import handlers as g
        from diskless.transactions import handlers as t

        txn_table = {
            m.API_ADD_PARTITIONS_TO_TXN: t.add_partitions_to_txn,
            m.API_ADD_OFFSETS_TO_TXN: t.add_offsets_to_txn,
            m.API_END_TXN: t.end_txn,
        }
        table = {
            m.API_JOIN_GROUP: g.join_group,
            m.API_SYNC_GROUP: g.sync_group,
            m.API_HEARTBEAT: g.heartbeat,
            m.API_LEAVE_GROUP: g.leave_group,
            m.API_OFFSET_COMMIT: g.offset_commit,
            m.API_OFFSET_FETCH: g.offset_fetch,
            m.API_OFFSET_DELETE: g.offset_delete,
            m.API_LIST_GROUPS: g.list_groups,
            m.API_DESCRIBE_GROUPS: g.describe_groups,
            m.API_DELETE_GROUPS: g.delete_groups,
            m.API_CONSUMER_GROUP_HEARTBEAT: g.consumer_group_heartbeat,
            m.API_CONSUMER_GROUP_DESCRIBE: g.consumer_group_describe,
        }

        def bind(handler: Any, shell: Callable[[], Any]) -> Callable[[m.RequestHeader, Any], Any]:
            return lambda header, request: handler(shell(), header, request)

        handlers = {key: bind(h, lambda: self.broker.groups) for key, h in table.items()}
        handlers.update({key: bind(h, lambda: self.broker.txns) for key, h in txn_table.items()})
        return handlers

    async def write_txn_markers(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """WriteTxnMarkers from a transaction coordinator: end a producer's transaction on each
        partition we lead with a control batch, answered once it is replicated (acks=all)."""
        from .group_shell import OFFSETS_TOPIC

        now = self.broker.now_ms()
        results = []
        waits: list[tuple[dict[str, Any], Partition, int]] = []
        for marker in request.markers:
            topics = []
            for topic in marker.topics:
                parts = []
                for index in topic.partition_indexes:
                    code, plog, replica = self._leader_log(topic.name, index)
                    entry: dict[str, Any] = {"partition_index": index, "error_code": code}
                    if plog is not None and replica is not None:
                        offset = plog.append_marker_as_leader(
                            marker.producer_id,
                            marker.producer_epoch,
                            bool(marker.transaction_result),
                            marker.coordinator_epoch,
                            replica.leader_epoch,
                            now,
                        )
                        self.broker.on_leader_append(replica)
                        waits.append((entry, replica, offset))
                        if topic.name == OFFSETS_TOPIC:
                            self.broker.groups.on_marker(index, marker.producer_id, bool(marker.transaction_result))
                    parts.append(entry)
                topics.append({"name": topic.name, "partitions": parts})
            results.append({"producer_id": marker.producer_id, "topics": topics})
        outcomes = await asyncio.gather(*(r.wait_for_commit(offset, 30.0) for _, r, offset in waits))
        for (entry, replica, _), committed in zip(waits, outcomes, strict=True):
            if not committed:
                lost = replica.leader_state is None
                entry["error_code"] = ErrorCode.not_leader_or_follower if lost else ErrorCode.request_timed_out
        return {"markers": results}

    async def txn_offset_commit(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """TxnOffsetCommit: offsets that count only if the producer's transaction commits."""
        from diskless.groups.coordinator import OffsetAndMetadata
        from diskless.groups.records import encode_offset

        group_id = request.group_id
        shell = self.broker.groups
        core = shell.coordinator(group_id)
        code = core if isinstance(core, ErrorCode) else ErrorCode.none
        now = self.broker.now_ms()
        generation = getattr(request, "generation_id", -1)
        if not isinstance(core, ErrorCode) and generation >= 0:
            code = core.validate_commit(
                group_id,
                generation,
                getattr(request, "member_id", ""),
                getattr(request, "group_instance_id", None),
                now,
            )
        offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
        for topic in request.topics:
            for p in topic.partitions:
                offsets[(topic.name, p.partition_index)] = OffsetAndMetadata(
                    p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata or "", now
                )
        if code == ErrorCode.none:
            entries = [encode_offset(group_id, t, i, value) for (t, i), value in offsets.items()]
            code = await shell.persist(group_id, entries, (request.producer_id, request.producer_epoch))
            if code == ErrorCode.none:
                shell.add_pending(group_id, request.producer_id, offsets)
        topics: dict[str, list[dict[str, Any]]] = {}
        for t, i in offsets:
            topics.setdefault(t, []).append({"partition_index": i, "error_code": code})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}

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
            if info is not None:
                entry.update(error_code=ErrorCode.none, node_id=node, host=info.host, port=info.port)
            entries.append(entry)
        first = entries[0]
        single = {k: first[k] for k in ("error_code", "error_message", "node_id", "host", "port")}
        return {"throttle_time": 0, **single, "coordinators": entries}

    def _broker_entries(self, key: str) -> list[dict[str, Any]]:
        return [
            {key: b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in sorted(self._meta.brokers.values(), key=lambda b: b.node_id)
        ]

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

    async def metadata(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        requested = request.topics
        client_az = internal.az_of_client(header.client_id) or self.local_az
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
            "controller_id": self._meta.controller_id,
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
            "controller_id": self._meta.controller_id,
            "brokers": self._broker_entries("broker_id"),
            "cluster_authorized_operations": NO_AUTHORIZED_OPERATIONS,
        }

    # --- Produce ---------------------------------------------------------------------------------

    def produce(self, header: m.RequestHeader, request: Any) -> Any:
        """Append synchronously (request order is append order), then wait for acks=all if asked."""
        now = self.broker.now_ms()
        acks = request.acks
        timeout_s = _ms(request.timeout) / 1000
        responses = []
        pending: list[tuple[dict[str, Any], Partition, int]] = []
        remote: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        for topic_data in request.topic_data:
            parts = []
            diskless = self._is_diskless(topic_data.name)
            for pdata in topic_data.partition_data:
                if diskless:
                    result, future = self._produce_diskless(topic_data.name, pdata.index, pdata.records, acks, now)
                    if future is not None:
                        remote.append((result, future))
                    parts.append(result)
                    continue
                result, replica, last_offset = self._produce_partition(
                    topic_data.name, pdata.index, pdata.records, acks, now
                )
                if replica is not None and acks == -1:
                    pending.append((result, replica, last_offset))
                parts.append(result)
            responses.append({"name": topic_data.name, "partition_responses": parts})
        if acks == 0:
            # As Kafka does: a failed acks=0 produce closes the connection, the client's only signal
            # that its records were refused (it then refreshes metadata and reconnects).
            errors = [p["error_code"] for t in responses for p in t["partition_responses"] if p["error_code"]]
            if errors:
                raise CloseConnection(f"acks=0 produce failed: {[e.name for e in errors]}")
            return None
        body = {"responses": responses, "throttle_time": 0}
        if not pending and not remote:
            return body
        return self._await_replication(body, pending, remote, timeout_s)

    async def _await_replication(
        self,
        body: dict[str, Any],
        pending: list[tuple[dict[str, Any], Partition, int]],
        remote: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]],
        timeout_s: float,
    ) -> dict[str, Any]:
        if remote:
            await asyncio.wait([f for _, f in remote], timeout=timeout_s)
            for entry, future in remote:
                outcome = future.result() if future.done() else {"error_code": int(ErrorCode.request_timed_out)}
                code = ErrorCode(outcome["error_code"])
                entry["error_code"] = code
                if code == ErrorCode.none:
                    entry["base_offset"] = outcome["base_offset"]
                    entry["log_start_offset"] = outcome.get("log_start_offset", -1)
                    append_time = outcome.get("log_append_time", -1)
                    entry["log_append_time"] = append_time if append_time >= 0 else None
        results = await asyncio.gather(*(replica.wait_for_commit(last, timeout_s) for _, replica, last in pending))
        for (entry, replica, _), committed in zip(pending, results, strict=True):
            if committed:
                if len(replica.isr) < replica.log.config.min_insync_replicas:
                    entry.update(error_code=ErrorCode.not_enough_replicas_after_append, base_offset=-1)
                continue
            code = ErrorCode.request_timed_out if replica.leader_state is not None else ErrorCode.not_leader_or_follower
            entry.update(error_code=code, base_offset=-1, log_append_time=None, log_start_offset=-1)
        return body

    def _is_diskless(self, topic: str) -> bool:
        meta = self._meta.topics.get(topic)
        return meta is not None and self.broker.is_diskless(meta)

    def _produce_diskless(
        self, topic: str, partition: int, data: bytes | None, acks: int, now: int
    ) -> tuple[dict[str, Any], asyncio.Future[dict[str, Any]] | None]:
        """Any broker accepts diskless produce: validate the header, hand the batch to the representative."""
        entry: dict[str, Any] = {
            "index": partition,
            "error_code": ErrorCode.none,
            "base_offset": -1,
            "log_append_time": None,
            "log_start_offset": -1,
            "record_errors": [],
            "error_message": None,
        }

        def failed(code: ErrorCode, message: str | None = None) -> tuple[dict[str, Any], None]:
            entry.update(error_code=code, error_message=message)
            return entry, None

        meta = self._meta.topics.get(topic)
        state = self._meta.partition(topic, partition)
        if meta is None or state is None:
            return failed(ErrorCode.unknown_topic_or_partition)
        if acks not in (0, 1, -1):
            return failed(ErrorCode.invalid_required_acks)
        representative = self.broker.representative
        if representative is None:
            return failed(ErrorCode.kafka_storage_error, "diskless topics need diskless.s3.endpoint")
        if not data:
            return failed(ErrorCode.invalid_record, "produce request carries no records")
        config = self.broker.log_config(meta)
        try:
            batches = records.split_batches(data)
            if len(batches) != 1:
                raise records.InvalidBatch("invalid_record", "produce v3+ must carry exactly one record batch")
            header = records.validate_batch(batches[0], config.max_message_bytes)
            if not timestamp_allowed(header, config, now):
                raise records.InvalidBatch("invalid_timestamp", "timestamp outside the allowed range")
        except records.InvalidBatch as exc:
            return failed(ErrorCode[exc.error], str(exc))
        if acks == -1 and len(state.isr) < config.min_insync_replicas:
            return failed(ErrorCode.not_enough_replicas)
        batch = bytearray(batches[0])
        if config.message_timestamp_type == "LogAppendTime":
            # Stamped before upload: the bytes in object storage are the bytes consumers get.
            records.set_log_append_time(batch, now)
        return entry, representative.submit(topic, meta.topic_id, partition, bytes(batch), acks)

    def commit_batches_now(self, body: dict[str, Any]) -> Awaitable[dict[str, Any]]:
        """CommitBatches on the leader: append every pointer now (in call order), then return what
        to await for acks=all replication. Called directly by a local representative and by the
        internal RPC handler, whose handlers start in request order."""
        now = self.broker.now_ms()
        key = body["key"]
        expired = now - int(body["created_ms"]) > self.broker.config.diskless_wal_commit_timeout_ms
        results: list[dict[str, Any]] = []
        waits: list[tuple[int, Partition, int]] = []
        appended = False
        for entry in body["entries"]:
            if expired:
                results.append({"error_code": int(ErrorCode.request_timed_out)})
                continue
            code, plog, replica = self._leader_log(entry["topic"], entry["partition"])
            if plog is None or replica is None:
                results.append({"error_code": int(code)})
                continue
            if entry["acks"] == -1 and len(replica.isr) < plog.config.min_insync_replicas:
                results.append({"error_code": int(ErrorCode.not_enough_replicas)})
                continue
            try:
                result = plog.append_pointer_as_leader(
                    entry["header"], key, entry["position"], replica.leader_epoch, now
                )
            except records.InvalidBatch as exc:
                results.append({"error_code": int(ErrorCode[exc.error])})
                continue
            if not result.duplicate:
                self.broker.on_leader_append(replica)
                appended = True
            results.append(
                {
                    "error_code": 0,
                    "base_offset": result.base_offset,
                    "log_append_time": result.log_append_time,
                    "log_start_offset": result.log_start_offset,
                }
            )
            if entry["acks"] == -1:
                waits.append((len(results) - 1, replica, result.last_offset))
        if appended:
            self.broker.prefetch_objects({key})

        async def replicated() -> dict[str, Any]:
            started = time.monotonic()
            outcomes = await asyncio.gather(*(r.wait_for_commit(last, 30.0) for _, r, last in waits))
            for (index, replica, _), committed in zip(waits, outcomes, strict=True):
                if not committed:
                    lost = replica.leader_state is None
                    results[index] = {
                        "error_code": int(ErrorCode.not_leader_or_follower if lost else ErrorCode.request_timed_out)
                    }
            DISKLESS_COMMIT_SECONDS.observe(time.monotonic() - started)
            return {"results": results}

        return replicated()

    def _produce_partition(
        self, topic: str, partition: int, data: bytes | None, acks: int, now: int
    ) -> tuple[dict[str, Any], Partition | None, int]:
        def failed(code: ErrorCode, message: str | None = None) -> tuple[dict[str, Any], None, int]:
            entry = {
                "index": partition,
                "error_code": code,
                "base_offset": -1,
                "log_append_time": None,
                "log_start_offset": -1,
                "record_errors": [],
                "error_message": message,
            }
            return entry, None, -1

        if acks not in (0, 1, -1):
            return failed(ErrorCode.invalid_required_acks)
        code, plog, replica = self._leader_log(topic, partition)
        if plog is None or replica is None:
            return failed(code)
        if not data:
            return failed(ErrorCode.invalid_record, "produce request carries no records")
        try:
            batches = records.split_batches(data)
            if len(batches) != 1:
                raise records.InvalidBatch("invalid_record", "produce v3+ must carry exactly one record batch")
            if acks == -1 and len(replica.isr) < plog.config.min_insync_replicas:
                return failed(ErrorCode.not_enough_replicas)
            result = plog.append_as_leader(batches, replica.leader_epoch, now)
        except records.InvalidBatch as exc:
            return failed(ErrorCode[exc.error], str(exc))
        if not result.duplicate:
            self.broker.on_leader_append(replica)
        entry = {
            "index": partition,
            "error_code": ErrorCode.none,
            "base_offset": result.base_offset,
            "log_append_time": result.log_append_time if result.log_append_time >= 0 else None,
            "log_start_offset": result.log_start_offset,
            "record_errors": [],
            "error_message": None,
        }
        return entry, replica, result.last_offset

    async def init_producer_id(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        if request.transactional_id is not None:
            from diskless.transactions.handlers import init_producer_id

            answer = await init_producer_id(self.broker.txns, header, request)
            if answer is not None:
                return answer
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "producer_id": await self.broker.allocate_producer_id(),
            "producer_epoch": 0,
        }

    # --- Fetch -----------------------------------------------------------------------------------

    async def fetch(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        session_id = getattr(request, "session_id", 0)
        session_epoch = getattr(request, "session_epoch", -1)
        if session_id != 0:
            return {
                "throttle_time": 0,
                "error_code": ErrorCode.fetch_session_id_not_found,
                "session_id": 0,
                "responses": [],
            }
        if session_epoch not in (0, -1):
            return {
                "throttle_time": 0,
                "error_code": ErrorCode.invalid_fetch_session_epoch,
                "session_id": 0,
                "responses": [],
            }
        max_wait_ms = _ms(request.max_wait)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            responses, total, has_error, remote, forwards = self._fetch_once(request)
            if forwards:
                total += await self._fetch_from_leaders(forwards, remote)
            remaining = deadline - time.monotonic()
            if total >= request.min_bytes or has_error or remaining <= 0 or (total > 0 and request.min_bytes <= 1):
                if remote:
                    await self._serve_pointers(remote)
                return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses}
            # Partitions read through their leader get no local wake-up: poll them at a short interval.
            await self.broker.replicas.wait_for_append(min(remaining, 0.1) if forwards else remaining)

    async def _fetch_from_leaders(
        self, forwards: list[tuple[dict[str, Any], str, int, int, int, int]], remote: list[tuple[dict[str, Any], bytes]]
    ) -> int:
        """Diskless partitions with no replica here: pointers (metadata only) come from the leader,
        the data from object storage in this AZ. Returns the bytes the batches will take."""

        async def one(item: tuple[dict[str, Any], str, int, int, int, int]) -> int:
            entry, topic, partition, offset, limit, leader = item
            body = {"topic": topic, "partition": partition, "offset": offset, "max_bytes": limit}
            try:
                conn = await self.broker.peers.get(leader)
                answer = await conn.wait(conn.send_internal(internal.INTERNAL_FETCH_POINTERS, body), timeout=10)
            except (ClientError, OSError, TimeoutError):
                entry["error_code"] = ErrorCode.not_leader_or_follower
                return 0
            entry["error_code"] = ErrorCode(answer["error_code"])
            for field in ("high_watermark", "log_start_offset"):
                entry[field] = answer.get(field, -1)
            entry["last_stable_offset"] = entry["high_watermark"]
            data = answer.get("data", b"")
            if answer.get("kind") == POINTERS and data:
                remote.append((entry, data))
                return pointer.served_size(data)
            entry["records"] = data
            return len(data)

        sizes = await asyncio.gather(*(one(item) for item in forwards))
        return sum(sizes)

    async def wal_references_rpc(self, body: dict[str, Any]) -> dict[str, Any]:
        """WalReferences from the WAL file manager: for each (object, topic id, partition), does that
        partition, answered by its leader (us), still reference the object? 0 no, 1 yes, 2 cannot
        say (not the leader). A topic id that no longer exists references nothing."""
        answers = []
        for key, topic_id, index in body["queries"]:
            topic = self._meta.topic_by_id(topic_id)
            if topic is None:
                answers.append(REF_NO)  # deleted topics reference nothing (ids are never reused)
                continue
            if index >= len(topic.partitions):
                answers.append(REF_UNKNOWN)  # our metadata lags: partitions never shrink
                continue
            replica = self.broker.replicas.partitions.get((topic.name, index))
            if replica is None or replica.leader_state is None:
                answers.append(REF_UNKNOWN)
            else:
                answers.append(REF_YES if replica.log.references(key) else REF_NO)
        return {"answers": answers}

    async def fetch_pointers_rpc(self, body: dict[str, Any]) -> dict[str, Any]:
        """FetchPointers on the leader: a slice of the log for a broker that has no replica."""
        code, plog, _ = self._leader_log(body["topic"], body["partition"])
        if plog is None:
            return {"error_code": int(code)}
        answer = {"high_watermark": plog.high_watermark, "log_start_offset": plog.log_start_offset}
        try:
            result = plog.read(body["offset"], body["max_bytes"], min_one=True)
        except OffsetOutOfRange:
            return {"error_code": int(ErrorCode.offset_out_of_range), **answer}
        return {"error_code": 0, "kind": result.kind, "data": result.records, **answer}

    def _preferred_read_replica(self, replica: Partition | None, rack: str) -> int:
        """KIP-392 for classic topics: a consumer that sent its rack is sent to an in-sync replica
        there (diskless topics need none of this: metadata already points clients into their AZ)."""
        if not rack or replica is None or replica.leader_state is None or rack == self.local_az:
            return -1
        for node_id in replica.isr:
            info = self._meta.brokers.get(node_id)
            if node_id != self.broker.node_id and info is not None and info.rack == rack:
                return node_id
        return -1

    async def _serve_pointers(self, remote: list[tuple[dict[str, Any], bytes]]) -> None:
        """Replace pointer entries by the batches they point to (cache, else ranged GETs)."""
        reader = self.broker.wal_reader

        async def one(entry: dict[str, Any], raw: bytes) -> None:
            entries = pointer.iter_entries(raw)
            pointers = [e for e in entries if isinstance(e, pointer.PointerEntry)]
            try:
                served = iter(await reader.batches(pointers) if reader is not None and pointers else [])
            except Exception as exc:
                log.warning("serving diskless batches failed", error=str(exc))
                entry["error_code"] = ErrorCode.kafka_storage_error
                return
            # Inline entries (transaction markers) are served from the log itself, in place.
            entry["records"] = b"".join(
                e.batch if isinstance(e, pointer.InlineEntry) else next(served) for e in entries
            )

        await asyncio.gather(*(one(entry, raw) for entry, raw in remote))

    def _fetch_once(
        self, request: Any
    ) -> tuple[
        list[dict[str, Any]],
        int,
        bool,
        list[tuple[dict[str, Any], bytes]],
        list[tuple[dict[str, Any], str, int, int, int, int]],
    ]:
        max_bytes = getattr(request, "max_bytes", 2**31 - 1)
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        follower = getattr(request, "replica_id", -1)
        total = 0
        has_error = False
        responses = []
        remote: list[tuple[dict[str, Any], bytes]] = []
        forwards: list[tuple[dict[str, Any], str, int, int, int, int]] = []
        for topic in request.topics:
            parts = []
            diskless = self._is_diskless(topic.topic)
            # Consumers may read from any replica (KIP-392); followers serve up to the HW they know.
            any_replica = follower < 0
            rack = getattr(request, "rack_id", "") if follower < 0 and not self._is_diskless(topic.topic) else ""
            for p in topic.partitions:
                code, plog, replica = self._leader_log(
                    topic.topic, p.partition, getattr(p, "current_leader_epoch", -1), any_replica
                )
                entry: dict[str, Any] = {
                    "partition_index": p.partition,
                    "error_code": code,
                    "high_watermark": -1,
                    "last_stable_offset": -1,
                    "log_start_offset": -1,
                    "aborted_transactions": [] if committed else None,
                    "preferred_read_replica": -1,
                    "records": b"",
                }
                preferred = self._preferred_read_replica(replica, rack)
                state = self._meta.partition(topic.topic, p.partition)
                if diskless and follower < 0 and replica is None and state is not None and state.leader >= 0:
                    limit = min(p.partition_max_bytes, max(max_bytes - total, 0))
                    forwards.append((entry, topic.topic, p.partition, p.fetch_offset, limit, state.leader))
                    entry["error_code"] = ErrorCode.none
                elif preferred >= 0 and plog is not None:
                    entry.update(
                        preferred_read_replica=preferred,
                        high_watermark=plog.high_watermark,
                        last_stable_offset=plog.last_stable_offset,
                        log_start_offset=plog.log_start_offset,
                    )
                    has_error = True  # answer now: the consumer moves to the replica in its rack
                elif plog is not None and replica is not None:
                    limit = min(p.partition_max_bytes, max(max_bytes - total, 0))
                    # read_committed stops at the last stable offset (open transactions).
                    max_offset = plog.last_stable_offset if committed else None
                    diverging = None
                    if follower >= 0:
                        # A follower reads up to our log end and, by the offset it asks for, tells us its own.
                        max_offset = plog.log_end_offset
                        diverging = replica.diverging_epoch(getattr(p, "last_fetched_epoch", -1), p.fetch_offset)
                        if diverging is None and p.fetch_offset <= plog.log_end_offset:
                            self.broker.on_follower_fetch(replica, follower, p.fetch_offset)
                            if replica.hw_news_for(follower):
                                has_error = True  # answer now: the follower serves reads up to this HW
                    try:
                        if diverging is not None:
                            entry["diverging_epoch"] = {"epoch": diverging.epoch, "end_offset": diverging.end_offset}
                            has_error = True  # answer now: the follower must truncate before fetching on
                        else:
                            result = plog.read(p.fetch_offset, limit, max_offset=max_offset, min_one=total == 0)
                            if result.kind == POINTERS and follower >= 0:
                                entry["records"] = wrap_pointers(result.records)
                                total += len(result.records)
                            elif result.kind == POINTERS:
                                remote.append((entry, result.records))
                                total += pointer.served_size(result.records)
                            else:
                                entry["records"] = result.records
                                total += len(result.records)
                            if committed and follower < 0 and result.records:
                                aborted = plog.txns.aborted_between(p.fetch_offset, plog.last_stable_offset)
                                entry["aborted_transactions"] = [
                                    {"producer_id": a.producer_id, "first_offset": a.first_offset} for a in aborted
                                ]
                    except OffsetOutOfRange:
                        entry["error_code"] = ErrorCode.offset_out_of_range
                    entry["high_watermark"] = plog.high_watermark
                    entry["last_stable_offset"] = plog.last_stable_offset
                    entry["log_start_offset"] = plog.log_start_offset
                has_error = has_error or entry["error_code"] != ErrorCode.none
                parts.append(entry)
            responses.append({"topic": topic.topic, "partitions": parts})
        return responses, total, has_error, remote, forwards

    # --- ListOffsets / OffsetForLeaderEpoch ---------------------------------------------------

    async def list_offsets(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        topics = []
        forwards: dict[int, list[tuple[dict[str, Any], str, int, int]]] = {}
        for topic in request.topics:
            parts = []
            diskless = self._is_diskless(topic.name)
            for p in topic.partitions:
                code, plog, replica = self._leader_log(
                    topic.name, p.partition_index, getattr(p, "current_leader_epoch", -1), diskless
                )
                entry = {
                    "partition_index": p.partition_index,
                    "error_code": code,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                }
                leader = self._forward_target(topic.name, p.partition_index, diskless, replica)
                if leader is not None:
                    forwards.setdefault(leader, []).append((entry, topic.name, p.partition_index, p.timestamp))
                elif plog is not None:
                    found = await self._offset_for(plog, p.timestamp, getattr(request, "isolation_level", 0) == 1)
                    if found is not None:
                        entry["offset"], entry["timestamp"] = found
                        entry["leader_epoch"] = plog.epochs.epoch_for_offset(found[0])
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        for leader, items in forwards.items():
            body = {
                "replica_id": -1,
                "isolation_level": getattr(request, "isolation_level", 0),
                "topics": [
                    {"name": t, "partitions": [{"partition_index": i, "timestamp": ts}]} for _, t, i, ts in items
                ],
            }
            answer = await self._forward(leader, m.API_LIST_OFFSETS, 7, body)
            for entry, topic_name, index, _ in items:
                found = _find_partition(answer, topic_name, index, "name", "partition_index")
                if found is None:
                    entry["error_code"] = ErrorCode.not_leader_or_follower
                    continue
                entry.update(
                    error_code=found.error_code,
                    timestamp=found.timestamp,
                    offset=found.offset,
                    leader_epoch=found.leader_epoch,
                )
        return {"throttle_time": 0, "topics": topics}

    def _forward_target(self, topic: str, partition: int, diskless: bool, replica: Partition | None) -> int | None:
        """Where a request about a diskless partition goes when no replica here can answer it: zone-
        aligned metadata sends clients to a broker of their AZ, which may host no replica."""
        if not diskless or replica is not None:
            return None
        state = self._meta.partition(topic, partition)
        if state is None or state.leader < 0 or state.leader == self.broker.node_id:
            return None
        return int(state.leader)

    async def _forward(self, leader: int, api_key: int, version: int, body: dict[str, Any]) -> Any | None:
        try:
            conn = await self.broker.peers.get(leader)
            return await conn.request(api_key, version, body, timeout=30)
        except (ClientError, OSError, TimeoutError) as exc:
            log.info("forwarding to the leader failed", leader=leader, api=api_key, error=str(exc))
            return None

    async def _offset_for(self, plog: PartitionLog, timestamp: int, committed: bool = False) -> tuple[int, int] | None:
        if timestamp == LATEST:
            return (plog.last_stable_offset if committed else plog.high_watermark), -1
        if timestamp == EARLIEST:
            return plog.log_start_offset, -1
        if timestamp == MAX_TIMESTAMP:
            found = plog.batch_of_max_timestamp()
            if found is None:
                return None
            return plog.record_with_max_timestamp(await self.broker.batch_bytes(*found))
        # The first batch reaching the timestamp normally holds the answer; record timestamps need
        # not be monotonic, so keep going if it does not.
        for segment, location in plog.batches_reaching(timestamp):
            hit = plog.first_record_reaching(await self.broker.batch_bytes(segment, location), timestamp)
            if hit is not None:
                return hit
        return None

    def offset_for_leader_epoch(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, plog, _ = self._leader_log(
                    topic.topic, p.partition, getattr(p, "current_leader_epoch", -1), self._is_diskless(topic.topic)
                )
                epoch, end = -1, -1
                if plog is not None:
                    epoch, end = plog.epochs.end_offset_for(p.leader_epoch, plog.log_end_offset)
                parts.append({"error_code": code, "partition": p.partition, "leader_epoch": epoch, "end_offset": end})
            topics.append({"topic": topic.topic, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    # --- topic administration -----------------------------------------------------------------

    async def create_topics(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        names = [t.name for t in request.topics]
        results = []
        for item in request.topics:
            entry: dict[str, Any] = {
                "name": item.name,
                "topic_id": None,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": None,
            }
            if names.count(item.name) > 1:
                entry.update(error_code=ErrorCode.invalid_request, error_message=f"Duplicate topic name {item.name}")
                results.append(entry)
                continue
            partitions = item.num_partitions
            rf = item.replication_factor
            assignments = [list(a.broker_ids) for a in sorted(item.assignments, key=lambda a: a.partition_index)]
            if not assignments:
                partitions = self.broker.config.num_partitions if partitions == -1 else partitions
                rf = self.broker.config.default_replication_factor if rf == -1 else rf
            configs = {c.name: c.value for c in item.configs}
            try:
                topic = await self.broker.create_topic(
                    item.name,
                    partitions,
                    rf,
                    configs,
                    assignments,
                    validate_only=getattr(request, "validate_only", False),
                )
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
                results.append(entry)
                continue
            entry.update(
                error_code=ErrorCode.none,
                error_message=None,
                topic_id=uuid.UUID(topic.topic_id),
                num_partitions=len(topic.partitions),
                replication_factor=len(topic.partitions[0].replicas),
                configs=[
                    {
                        "name": c["name"],
                        "value": c["value"],
                        "read_only": False,
                        "config_source": c["config_source"],
                        "is_sensitive": False,
                    }
                    for c in self._topic_config_entries(topic, None, False, False)
                ],
            )
            results.append(entry)
        return {"throttle_time": 0, "topics": results}

    async def delete_topics(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        items: list[tuple[str | None, uuid.UUID | None]] = [(n, None) for n in getattr(request, "topic_names", ())]
        items += [(t.name, t.topic_id) for t in getattr(request, "topics", ())]
        responses = []
        for name, topic_id in items:
            entry: dict[str, Any] = {
                "name": name,
                "topic_id": topic_id,
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            if name is None and topic_id is not None:
                found = self._meta.topic_by_id(str(topic_id))
                if found is None:
                    entry["error_code"] = ErrorCode.unknown_topic_id
                    responses.append(entry)
                    continue
                name = entry["name"] = found.name
            try:
                deleted = await self.broker.delete_topic(name or "")
                entry["topic_id"] = uuid.UUID(deleted.topic_id)
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            responses.append(entry)
        return {"throttle_time": 0, "responses": responses}

    async def create_partitions(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        results = []
        for item in request.topics:
            entry: dict[str, Any] = {"name": item.name, "error_code": ErrorCode.none, "error_message": None}
            if item.assignments:
                entry.update(
                    error_code=ErrorCode.invalid_replica_assignment,
                    error_message="manual assignments are not supported",
                )
            else:
                try:
                    await self.broker.add_partitions(item.name, item.count, request.validate_only)
                except MetadataError as exc:
                    entry.update(error_code=exc.code, error_message=str(exc))
            results.append(entry)
        return {"throttle_time": 0, "results": results}

    async def delete_records(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        topics = []
        forwards: dict[int, list[tuple[dict[str, Any], str, int, int]]] = {}
        for topic in request.topics:
            parts = []
            diskless = self._is_diskless(topic.name)
            for p in topic.partitions:
                code, plog, _ = self._leader_log(topic.name, p.partition_index)
                entry = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": code}
                local = self.broker.replicas.partitions.get((topic.name, p.partition_index))
                leader = self._forward_target(topic.name, p.partition_index, diskless, None if plog is None else local)
                if plog is None and leader is not None:
                    forwards.setdefault(leader, []).append((entry, topic.name, p.partition_index, p.offset))
                elif plog is not None:
                    target = plog.high_watermark if p.offset == -1 else p.offset
                    try:
                        if target < 0:
                            raise OffsetOutOfRange("negative offset")
                        entry["low_watermark"] = plog.delete_records_before(target)
                    except OffsetOutOfRange:
                        entry["error_code"] = ErrorCode.offset_out_of_range
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        for leader, items in forwards.items():
            body = {
                "topics": [{"name": t, "partitions": [{"partition_index": i, "offset": o}]} for _, t, i, o in items],
                "timeout": 30000,
            }
            answer = await self._forward(leader, m.API_DELETE_RECORDS, 2, body)
            for entry, topic_name, index, _ in items:
                found = _find_partition(answer, topic_name, index, "name", "partition_index")
                if found is None:
                    entry["error_code"] = ErrorCode.not_leader_or_follower
                else:
                    entry.update(error_code=found.error_code, low_watermark=found.low_watermark)
        return {"throttle_time": 0, "topics": topics}

    # --- configs --------------------------------------------------------------------------------

    def _topic_config_entries(
        self, topic: TopicMetadata, keys: Iterable[str] | None, synonyms: bool, documentation: bool
    ) -> list[dict[str, Any]]:
        wanted = None if keys is None else {canonical_name(k) for k in keys}
        out = []
        broker_value = self.broker.config.broker_value
        for name, (value, source) in effective_values(topic.configs, broker_value).items():
            if wanted is not None and name not in wanted:
                continue
            definition = TOPIC_CONFIGS[name]
            code = {"topic": SOURCE_TOPIC, "broker": SOURCE_STATIC_BROKER, "default": SOURCE_DEFAULT}[source]
            entry: dict[str, Any] = {
                "name": name,
                "value": definition.render(value),
                "read_only": False,
                "config_source": code,
                "is_default": source == "default",
                "is_sensitive": False,
                "config_type": CONFIG_TYPES[definition.kind],
                "documentation": definition.doc if documentation else None,
                "synonyms": [],
            }
            if synonyms:
                chain = []
                if name in topic.configs:
                    chain.append({"name": name, "value": topic.configs[name], "source": SOURCE_TOPIC})
                synonym = definition.broker_synonym
                if synonym and broker_value(synonym) is not None:
                    chain.append({"name": synonym, "value": broker_value(synonym), "source": SOURCE_STATIC_BROKER})
                chain.append(
                    {"name": synonym or name, "value": definition.render(definition.default), "source": SOURCE_DEFAULT}
                )
                entry["synonyms"] = chain
            out.append(entry)
        return out

    def _broker_config_entries(self, keys: Iterable[str] | None) -> list[dict[str, Any]]:
        wanted = None if keys is None else set(keys)
        out = []
        for name, value, explicit in self.broker.describe_broker_config():
            if wanted is not None and name not in wanted:
                continue
            out.append(
                {
                    "name": name,
                    "value": value,
                    "read_only": True,
                    "config_source": SOURCE_STATIC_BROKER if explicit else SOURCE_DEFAULT,
                    "is_default": not explicit,
                    "is_sensitive": False,
                    "config_type": 2,
                    "synonyms": [],
                }
            )
        return out

    def describe_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        results = []
        synonyms = getattr(request, "include_synonyms", False)
        documentation = getattr(request, "include_documentation", False)
        for res in request.resources:
            entry: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "error_message": None,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
                "configs": [],
            }
            if res.resource_type == RESOURCE_TOPIC:
                topic = self._meta.topics.get(res.resource_name)
                if topic is None:
                    entry.update(
                        error_code=ErrorCode.unknown_topic_or_partition,
                        error_message=f"Topic {res.resource_name} does not exist",
                    )
                else:
                    entry["configs"] = self._topic_config_entries(
                        topic, res.configuration_keys, synonyms, documentation
                    )
            elif res.resource_type == RESOURCE_BROKER and res.resource_name in ("", str(self.broker.node_id)):
                entry["configs"] = self._broker_config_entries(res.configuration_keys)
            else:
                entry.update(
                    error_code=ErrorCode.invalid_request, error_message=f"Unsupported resource {res.resource_name}"
                )
            results.append(entry)
        return {"throttle_time": 0, "results": results}

    async def alter_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """Legacy AlterConfigs: the given set replaces all of a topic's overrides."""

        def updates(res: Any) -> dict[str, str | None]:
            topic = self._meta.topics.get(res.resource_name)
            current = topic.configs if topic else {}
            new = {canonical_name(c.name): c.value for c in res.configs}
            return {**{k: None for k in current if k not in new}, **new}

        return await self._alter(request, updates)

    async def incremental_alter_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        def updates(res: Any) -> dict[str, str | None]:
            topic = self._meta.topics.get(res.resource_name)
            current = topic.configs if topic else {}
            out: dict[str, str | None] = {}
            for c in res.configs:
                name = canonical_name(c.name)
                if c.config_operation == OP_SET:
                    out[name] = c.value
                elif c.config_operation == OP_DELETE:
                    out[name] = None
                elif c.config_operation in (OP_APPEND, OP_SUBTRACT):
                    definition = TOPIC_CONFIGS.get(name)
                    if definition is None or definition.kind != "list":
                        raise MetadataError(ErrorCode.invalid_config, f"{name} is not a list config")
                    existing = [v for v in (current.get(name) or definition.default).split(",") if v]
                    values = [v.strip() for v in (c.value or "").split(",") if v.strip()]
                    if c.config_operation == OP_APPEND:
                        existing += [v for v in values if v not in existing]
                    else:
                        existing = [v for v in existing if v not in values]
                    out[name] = ",".join(existing)
                else:
                    raise MetadataError(ErrorCode.invalid_request, f"unknown config operation {c.config_operation}")
            return out

        return await self._alter(request, updates)

    async def _alter(self, request: Any, updates_for: Callable[[Any], dict[str, str | None]]) -> dict[str, Any]:
        responses = []
        for res in request.resources:
            entry: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "error_message": None,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
            }
            try:
                if res.resource_type != RESOURCE_TOPIC:
                    raise MetadataError(ErrorCode.invalid_request, "only topic configs can be altered at runtime")
                if res.resource_name not in self._meta.topics:
                    raise MetadataError(
                        ErrorCode.unknown_topic_or_partition, f"Topic {res.resource_name} does not exist"
                    )
                await self.broker.alter_topic_configs(res.resource_name, updates_for(res), request.validate_only)
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            responses.append(entry)
        return {"throttle_time": 0, "responses": responses}


# What ApiVersions advertises where it differs from what is served. As Apache Kafka 4 does
# (KAFKA-18659), Produce is advertised from v0 although only v3+ is decoded: librdkafka (kcat,
# confluent-kafka) enables gzip/snappy/lz4 only if the broker's Produce range overlaps v0, and
# otherwise silently sends those batches uncompressed. Clients use the highest common version,
# so v0-2 are never sent; one that is closes its connection like any unsupported version.
ADVERTISED_MIN_VERSIONS = {m.API_PRODUCE: 0}


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


def api_version_entries() -> list[dict[str, int]]:
    return [
        {"api_key": k, "min_version": ADVERTISED_MIN_VERSIONS.get(k, lo), "max_version": hi}
        for k, (lo, hi) in sorted(m.SUPPORTED_VERSIONS.items())
    ]

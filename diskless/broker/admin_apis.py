"""Topic administration: Create/Delete topics, CreatePartitions, DeleteRecords (configs: config_apis.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import MetadataError
from diskless.log.partition_log import OffsetOutOfRange
from diskless.protocol import messages as m

from .api_base import ApiFamily, _answered, _ms, forwarded_by_broker
from .config_apis import check_with_broker_defaults, topic_config_entries

if TYPE_CHECKING:
    from diskless.replication.partition import Partition

log = structlog.get_logger(__name__)

# What a forwarded DeleteRecords may take beyond the client's timeout: the leader's answer to a
# wait that timed out must still arrive (REQUEST_TIMED_OUT), not be cut off as if it had none.
FORWARD_MARGIN_S = 5.0

# Kafka's controller refuses requests that would create more partitions than this at once (one
# metadata batch; KAFKA-17870 for CreateTopics, KAFKA-19673 for CreatePartitions). Here it also
# keeps a request for 2^31 partitions from holding the event loop (and the etcd lease) hostage.
MAX_NEW_PARTITIONS_PER_REQUEST = 10000
EXCESSIVE_PARTITIONS = "Excessively large number of partitions per request."


NO_TOPIC_ID = uuid.UUID(int=0)  # an entry without a topic id


def _assignment_error(assignments: Any) -> str | None:
    """Why CreateTopics' manual assignments are invalid (Kafka's ReplicationControlManager), or None:
    each partition once, indexes 0..n-1, every replica list as long as the first."""
    indexes = [a.partition_index for a in assignments]
    if len(set(indexes)) != len(indexes):
        return "Found multiple manual partition assignments for one partition."
    if sorted(indexes) != list(range(len(indexes))):
        return "Manual partition assignment indexes must be a consecutive 0-based integer sequence."
    sizes = {len(a.broker_ids) for a in assignments}
    if len(sizes) > 1:
        return "The manual partition assignments have inconsistent replication factors."
    return None


class AdminApis(ApiFamily):
    """Topic administration."""

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_CREATE_TOPICS: self.create_topics,
            m.API_DELETE_TOPICS: self.delete_topics,
            m.API_CREATE_PARTITIONS: self.create_partitions,
            m.API_DELETE_RECORDS: self.delete_records,
        }

    async def create_topics(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        names = [t.name for t in request.topics]
        results = []
        default = self.broker.config.num_partitions
        asked = sum(
            len(t.assignments) or (default if t.num_partitions == -1 else t.num_partitions) for t in request.topics
        )
        for item in request.topics:
            entry: dict[str, Any] = {
                "name": item.name,
                "topic_id": None,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": None,
            }
            if asked > MAX_NEW_PARTITIONS_PER_REQUEST:
                entry.update(error_code=ErrorCode.policy_violation, error_message=EXCESSIVE_PARTITIONS)
                results.append(entry)
                continue
            if names.count(item.name) > 1:
                entry.update(error_code=ErrorCode.invalid_request, error_message=f"Duplicate topic name {item.name}")
                results.append(entry)
                continue
            partitions = item.num_partitions
            rf = item.replication_factor
            assignment_error = _assignment_error(item.assignments)
            if assignment_error is not None:
                entry.update(error_code=ErrorCode.invalid_replica_assignment, error_message=assignment_error)
                results.append(entry)
                continue
            assignments = [list(a.broker_ids) for a in sorted(item.assignments, key=lambda a: a.partition_index)]
            if not assignments:
                partitions = self.broker.config.num_partitions if partitions == -1 else partitions
                rf = self.broker.config.default_replication_factor if rf == -1 else rf
            configs = {c.name: c.value for c in item.configs}
            validate_only = getattr(request, "validate_only", False)
            try:
                # Validated first (Kafka's order of refusals), then its overrides (diskless.enabled
                # pinned) with this broker's topic defaults: a compacted diskless topic, or a
                # compaction lag conflicting with a log.cleaner.* default, is INVALID_CONFIG.
                topic = await self.broker.create_topic(
                    item.name, partitions, rf, configs, assignments, validate_only=True
                )
                check_with_broker_defaults(self.broker, topic.configs)
                if not validate_only:
                    topic = await self.broker.create_topic(item.name, partitions, rf, configs, assignments)
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
                    for c in topic_config_entries(self.broker, topic, None, False, False)
                ],
            )
            results.append(entry)
        return {"throttle_time": 0, "topics": results}

    async def delete_topics(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        items: list[tuple[str | None, uuid.UUID | None]] = [(n, None) for n in getattr(request, "topic_names", ())]
        items += [
            (t.name, None if t.topic_id in (None, NO_TOPIC_ID) else t.topic_id) for t in getattr(request, "topics", ())
        ]
        names = [n for n, _ in items if n is not None]
        ids = [i for _, i in items if i is not None]
        refused: set[tuple[str | None, uuid.UUID | None]] = set()
        responses = []
        for name, topic_id in items:
            entry: dict[str, Any] = {
                "name": name,
                "topic_id": topic_id or NO_TOPIC_ID,
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            # As Kafka's ControllerApis.deleteTopics: an entry naming both (a stale id would delete
            # the re-created topic by its name), neither, or a topic twice deletes nothing.
            refusal = (
                "You may not specify both topic name and topic id."
                if name is not None and topic_id is not None
                else "Neither topic name nor id were specified."
                if name is None and topic_id is None
                else "Duplicate topic name."
                if name is not None and names.count(name) > 1
                else "Duplicate topic id."
                if topic_id is not None and ids.count(topic_id) > 1
                else None
            )
            if refusal is not None:
                if (name, topic_id) in refused:
                    continue  # a duplicate is answered once, as Kafka does
                refused.add((name, topic_id))
                entry.update(error_code=ErrorCode.invalid_request, error_message=refusal)
                responses.append(entry)
                continue
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
        # A topic named twice is answered once, INVALID_REQUEST, and not grown (as Kafka's
        # ControllerApis.createPartitions, which collects the names in a set): only the others
        # count towards the partitions the request asks for.
        names = [item.name for item in request.topics]
        duplicated = {name for name in names if names.count(name) > 1}
        asked = 0
        for item in request.topics:
            topic = self._meta.topics.get(item.name)
            if item.name not in duplicated:
                asked += item.count - (len(topic.partitions) if topic is not None else 0)
        answered: set[str] = set()
        for item in request.topics:
            entry: dict[str, Any] = {"name": item.name, "error_code": ErrorCode.none, "error_message": None}
            if item.name in duplicated:
                if item.name not in answered:
                    answered.add(item.name)
                    entry.update(error_code=ErrorCode.invalid_request, error_message="Duplicate topic name.")
                    results.append(entry)
                continue
            if asked > MAX_NEW_PARTITIONS_PER_REQUEST:
                entry.update(error_code=ErrorCode.policy_violation, error_message=EXCESSIVE_PARTITIONS)
                results.append(entry)
                continue
            assignments = [list(a.broker_ids) for a in item.assignments] if item.assignments else None
            try:
                await self.broker.add_partitions(item.name, item.count, request.validate_only, assignments)
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            results.append(entry)
        return {"throttle_time": 0, "results": results}

    async def delete_records(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """DeleteRecords; of a diskless partition with no replica here, forwarded to its leader
        (zone-aligned metadata sends clients to a broker of their AZ). A forwarded request is
        answered by the leader only (``forwarded_by_broker``)."""
        forwarded = forwarded_by_broker(header)
        topics = []
        forwards: dict[int, list[tuple[dict[str, Any], str, int, int]]] = {}
        deleted: list[tuple[dict[str, Any], Partition, int]] = []
        for topic in request.topics:
            parts = []
            diskless = self._is_diskless(topic.name)
            for p in topic.partitions:
                code, plog, replica = self._leader_log(topic.name, p.partition_index)
                entry = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": code}
                local = self.broker.replicas.partitions.get((topic.name, p.partition_index))
                leader = (
                    None
                    if forwarded
                    else self._forward_target(topic.name, p.partition_index, diskless, None if plog is None else local)
                )
                if plog is None and leader is not None:
                    forwards.setdefault(leader, []).append((entry, topic.name, p.partition_index, p.offset))
                elif plog is not None and not plog.config.delete:
                    # A compacted topic keeps the latest record of every key: Kafka's deleteRecordsOnLeader
                    # refuses (the response has no room for its message).
                    entry["error_code"] = ErrorCode.policy_violation
                elif plog is not None:
                    target = plog.high_watermark if p.offset == -1 else p.offset
                    try:
                        if target < 0:
                            raise OffsetOutOfRange("negative offset")
                        entry["low_watermark"] = plog.delete_records_before(target)
                        if replica is not None:
                            deleted.append((entry, replica, target))
                    except OffsetOutOfRange:
                        entry["error_code"] = ErrorCode.offset_out_of_range
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        timeout_ms = _ms(request.timeout)
        # The leaders' waits and our own run side by side, each bounded by the client's timeout:
        # one after another, the answer could come several timeouts late, after the client gave up.
        await asyncio.gather(
            *(self._forward_delete(leader, items, timeout_ms) for leader, items in forwards.items()),
            self._await_low_watermarks(deleted, timeout_ms),
        )
        return {"throttle_time": 0, "topics": topics}

    async def _forward_delete(
        self, leader: int, items: list[tuple[dict[str, Any], str, int, int]], timeout_ms: int
    ) -> None:
        """Partitions led by ``leader`` deleted there: it waits for its followers up to the client's
        timeout, so the connection's own timeout leaves it that long and a margin to answer."""
        body = {
            "topics": [{"name": t, "partitions": [{"partition_index": i, "offset": o}]} for _, t, i, o in items],
            "timeout": timeout_ms,
        }
        answer = await self._forward(
            leader, m.API_DELETE_RECORDS, 2, body, timeout=max(0, timeout_ms) / 1000 + FORWARD_MARGIN_S
        )
        for entry, topic_name, index, _ in items:
            found = _answered(entry, answer, topic_name, index)
            if found is not None:
                entry.update(error_code=found.error_code, low_watermark=found.low_watermark)

    async def _await_low_watermarks(
        self, deleted: list[tuple[dict[str, Any], Partition, int]], timeout_ms: int
    ) -> None:
        """Kafka's DelayedDeleteRecords: a partition's answer waits until every live replica
        reported a log start at the requested offset (its low watermark), else REQUEST_TIMED_OUT.
        Until then a follower still answers ListOffsets(EARLIEST) and diskless reads from the old
        start, and zone-aligned clients of diskless topics read from followers."""
        if not deleted:
            return
        replicas = self.broker.replicas
        replicas.notify_append()  # parked replica fetches carry the new log start out now
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            live = self.broker.metadata.brokers.keys()
            waiting = []
            for entry, replica, target in deleted:
                state = replica.leader_state
                if state is None:
                    entry.update(error_code=ErrorCode.not_leader_or_follower, low_watermark=-1)
                    continue
                low = state.low_watermark(replica.log.log_start_offset, live)
                if low >= target:
                    entry["low_watermark"] = low
                else:
                    waiting.append((entry, replica, target))
            deleted = waiting
            left = deadline - time.monotonic()
            if not deleted or left <= 0:
                break
            await replicas.wait_for_follower_fetch(left)
        for entry, _, _ in deleted:
            entry["error_code"] = ErrorCode.request_timed_out

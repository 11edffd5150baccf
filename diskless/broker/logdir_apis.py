"""Where partitions live: DescribeLogDirs, AlterReplicaLogDirs and DescribeTopicPartitions (KIP-966).

A broker has one log directory (``log.dirs``). Diskless partitions keep only pointers there; the
bytes those pointers refer to live in object storage, which DescribeLogDirs reports as a second
directory, ``s3://<bucket>/wal``, holding each diskless partition's pointed-to bytes: operators see
both what a broker stores (and what moving the partition copies) and how much data it stands for.
DescribeTopicPartitions reports the true replicas, leader and ISR (Metadata answers crafted per
client AZ may name a zone-local broker as a diskless partition's leader).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from diskless.log.segment import POINTERS
from diskless.protocol import messages as m
from diskless.replication.partition import Partition

from .api_base import NO_AUTHORIZED_OPERATIONS, ApiFamily


def partition_sizes(partition: Partition) -> tuple[int, int]:
    """(bytes in the local log, bytes in object storage that its pointers refer to)."""
    local = pointed = 0
    for segment in partition.log.segments:
        local += segment.size
        if segment.kind == POINTERS:
            pointed += segment.data_bytes
    return local, pointed


class LogDirApis(ApiFamily):
    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            m.API_ALTER_REPLICA_LOG_DIRS: self.alter_replica_log_dirs,
            m.API_DESCRIBE_TOPIC_PARTITIONS: self.describe_topic_partitions,
        }

    @property
    def log_dir(self) -> str:
        return os.path.abspath(self.broker.config.log_dirs)

    @property
    def remote_dir(self) -> str | None:
        if not self.broker.config.diskless_s3_endpoint:
            return None
        return f"s3://{self.broker.config.diskless_s3_bucket}/wal"

    def describe_log_dirs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        wanted: dict[str, set[int]] | None = None
        if request.topics is not None:
            wanted = {}
            for t in request.topics:
                wanted.setdefault(t.topic, set()).update(t.partitions)
        local: dict[str, list[dict[str, Any]]] = {}
        remote: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), partition in sorted(self.broker.replicas.partitions.items()):
            if wanted is not None and index not in wanted.get(topic, ()):
                continue
            size, pointed = partition_sizes(partition)
            local.setdefault(topic, []).append(_partition_entry(index, size))
            if pointed or self._is_diskless(topic):
                remote.setdefault(topic, []).append(_partition_entry(index, pointed))
        try:
            usage = shutil.disk_usage(self.log_dir)
            total, usable, code = usage.total, usage.free, ErrorCode.none
        except OSError:
            total, usable, code = -1, -1, ErrorCode.kafka_storage_error
        results = [
            {
                "error_code": code,
                "log_dir": self.log_dir,
                "topics": [{"name": t, "partitions": parts} for t, parts in local.items()],
                "total_bytes": total,
                "usable_bytes": usable,
            }
        ]
        if self.remote_dir is not None:
            results.append(
                {
                    "error_code": ErrorCode.none,
                    "log_dir": self.remote_dir,
                    "topics": [{"name": t, "partitions": parts} for t, parts in remote.items()],
                    "total_bytes": -1,  # object storage has no fixed capacity
                    "usable_bytes": -1,
                }
            )
        return {"throttle_time": 0, "error_code": ErrorCode.none, "results": results}

    def alter_replica_log_dirs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """One log directory per broker: placing a replica there is already done; any other path
        is LOG_DIR_NOT_FOUND, as Kafka answers for a directory it does not have."""
        results: dict[str, list[dict[str, Any]]] = {}
        for d in request.dirs:
            ours = os.path.abspath(d.path) == self.log_dir
            for t in d.topics:
                for index in t.partitions:
                    if not ours:
                        code = ErrorCode.log_dir_not_found
                    elif self._meta.partition(t.name, index) is None:
                        code = ErrorCode.unknown_topic_or_partition
                    else:
                        code = ErrorCode.none
                    results.setdefault(t.name, []).append({"partition_index": index, "error_code": code})
        return {
            "throttle_time": 0,
            "results": [{"topic_name": t, "partitions": parts} for t, parts in results.items()],
        }

    def describe_topic_partitions(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        names = sorted({t.name for t in request.topics}) if request.topics else sorted(self._meta.topics)
        cursor = request.cursor
        if cursor is not None:
            names = [n for n in names if n >= cursor.topic_name]
        budget = max(1, int(request.response_partition_limit))
        live = set(self._meta.brokers)
        topics: list[dict[str, Any]] = []
        next_cursor = None
        for name in names:
            topic = self._meta.topics.get(name)
            if topic is None:
                topics.append(
                    {
                        "error_code": ErrorCode.unknown_topic_or_partition,
                        "name": name,
                        "topic_id": uuid.UUID(int=0),
                        "is_internal": False,
                        "partitions": [],
                        "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
                    }
                )
                continue
            first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
            if budget == 0 and first < len(topic.partitions):
                next_cursor = {"topic_name": name, "partition_index": first}
                break
            parts = []
            for index in range(first, len(topic.partitions)):
                if budget == 0:
                    next_cursor = {"topic_name": name, "partition_index": index}
                    break
                budget -= 1
                state = topic.partitions[index]
                parts.append(
                    {
                        "error_code": ErrorCode.none if state.leader >= 0 else ErrorCode.leader_not_available,
                        "partition_index": index,
                        "leader_id": state.leader,
                        "leader_epoch": state.leader_epoch,
                        "replica_nodes": list(state.replicas),
                        "isr_nodes": list(state.isr),
                        "eligible_leader_replicas": [],
                        "last_known_elr": [],
                        "offline_replicas": [r for r in state.replicas if r not in live],
                    }
                )
            topics.append(
                {
                    "error_code": ErrorCode.none,
                    "name": name,
                    "topic_id": uuid.UUID(topic.topic_id),
                    "is_internal": topic.internal,
                    "partitions": parts,
                    "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS,
                }
            )
            if next_cursor is not None:
                break
        return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}


def _partition_entry(index: int, size: int) -> dict[str, Any]:
    return {"partition_index": index, "partition_size": size, "offset_lag": 0, "is_future_key": False}

"""Partition reassignment and leader election APIs: AlterPartitionReassignments,
ListPartitionReassignments (KIP-455) and ElectLeaders (KIP-460).

Decisions are ``cluster/reassignment.py`` and ``cluster/elections.py``; ``operations.py`` stores
them. Any broker answers (Kafka forwards these to its controller; here every change is a CAS in
the metadata store, so whoever receives the request applies it). A reassignment of a diskless
partition moves its pointer log only: the new replica replicates kilobytes of pointers, never the
records, which stay where they are in object storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster import reassignment
from diskless.cluster.elections import PREFERRED, elect
from diskless.cluster.metadata import PartitionState
from diskless.protocol import messages as m

from .api_base import ApiFamily
from .operations import ConcurrentChange

log = structlog.get_logger(__name__)


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ReassignApis(ApiFamily):
    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            m.API_LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
            m.API_ELECT_LEADERS: self.elect_leaders,
        }

    async def _apply(
        self, topic: str, index: int, decide: Callable[[PartitionState], PartitionState | None]
    ) -> tuple[ErrorCode, str | None]:
        try:
            await self.broker.operations.change_partition(topic, index, decide)
        except (reassignment.ReassignmentError, _Refused) as exc:
            return exc.code, str(exc) or None
        except ConcurrentChange:
            return ErrorCode.request_timed_out, "The partition kept changing; retry"
        return ErrorCode.none, None

    async def alter_partition_reassignments(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        allow_rf_change = getattr(request, "allow_replication_factor_change", True)
        responses = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, message = await self._alter_one(topic.name, p.partition_index, p.replicas, allow_rf_change)
                parts.append({"partition_index": p.partition_index, "error_code": code, "error_message": message})
            responses.append({"name": topic.name, "partitions": parts})
        return {
            "throttle_time": 0,
            "allow_replication_factor_change": allow_rf_change,
            "error_code": ErrorCode.none,
            "error_message": None,
            "responses": responses,
        }

    async def _alter_one(
        self, topic: str, index: int, replicas: Any, allow_rf_change: bool
    ) -> tuple[ErrorCode, str | None]:
        if self._meta.partition(topic, index) is None:
            return ErrorCode.unknown_topic_or_partition, f"Unknown partition {topic}-{index}"
        live = set(self._meta.brokers)
        if replicas is None:

            def cancel(state: PartitionState) -> PartitionState | None:
                if not reassignment.in_progress(state):
                    raise _Refused(ErrorCode.no_reassignment_in_progress, f"No reassignment of {topic}-{index}")
                return reassignment.cancel(state, live)

            code, message = await self._apply(topic, index, cancel)
            if code == ErrorCode.none:
                log.info("reassignment cancelled", topic=topic, partition=index)
            return code, message
        target = [int(r) for r in replicas]

        def start(state: PartitionState) -> PartitionState | None:
            if not allow_rf_change and len(target) != len(reassignment.original_replicas(state)):
                raise _Refused(ErrorCode.invalid_replication_factor, "The replication factor would change")
            return reassignment.reassign(state, target, live)

        code, message = await self._apply(topic, index, start)
        if code == ErrorCode.none:
            log.info("reassignment started", topic=topic, partition=index, target=target)
        return code, message

    def list_partition_reassignments(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        wanted: dict[str, set[int]] | None = None
        if request.topics is not None:
            wanted = {}
            for t in request.topics:
                wanted.setdefault(t.name, set()).update(t.partition_indexes)
        topics = []
        for topic in self._meta.topics.values():
            if wanted is not None and topic.name not in wanted:
                continue
            parts = []
            for index, state in enumerate(topic.partitions):
                if wanted is not None and index not in wanted[topic.name]:
                    continue
                ongoing = reassignment.describe(state)
                if ongoing is not None:
                    parts.append(
                        {
                            "partition_index": index,
                            "replicas": ongoing.replicas,
                            "adding_replicas": ongoing.adding,
                            "removing_replicas": ongoing.removing,
                        }
                    )
            if parts:
                topics.append({"name": topic.name, "partitions": parts})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "topics": topics}

    async def elect_leaders(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        election_type = int(getattr(request, "election_type", PREFERRED))
        everything = request.topic_partitions is None
        if everything:
            targets = [
                (topic.name, index) for topic in self._meta.topics.values() for index in range(len(topic.partitions))
            ]
        else:
            targets = [(t.topic, int(i)) for t in request.topic_partitions for i in t.partitions]
        results: dict[str, list[dict[str, Any]]] = {}
        for topic, index in targets:
            code, message = await self._elect_one(topic, index, election_type)
            if everything and code == ErrorCode.election_not_needed:
                continue  # as Kafka: asked for everything, only report what was tried
            results.setdefault(topic, []).append({"partition_id": index, "error_code": code, "error_message": message})
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "replica_election_results": [
                {"topic": topic, "partition_result": parts} for topic, parts in results.items()
            ],
        }

    async def _elect_one(self, topic: str, index: int, election_type: int) -> tuple[ErrorCode, str | None]:
        if self._meta.partition(topic, index) is None:
            return ErrorCode.unknown_topic_or_partition, f"Unknown partition {topic}-{index}"
        live = set(self._meta.brokers)

        def decide(state: PartitionState) -> PartitionState | None:
            outcome = elect(state, election_type, live)
            if outcome.state is None:
                raise _Refused(outcome.error, outcome.message)
            return outcome.state

        code, message = await self._apply(topic, index, decide)
        if code == ErrorCode.none:
            state = self._meta.partition(topic, index)
            log.info(
                "leader elected",
                kind=self.broker.operations.election_type_name(election_type),
                topic=topic,
                partition=index,
                leader=None if state is None else state.leader,
            )
        return code, message

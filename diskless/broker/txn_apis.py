"""Broker-side transaction APIs that are not the coordinator's: WriteTxnMarkers (partition leaders
end a transaction with a control batch; also an operator's abort of a hanging transaction, KIP-664),
DescribeProducers (a partition's producer state, KIP-664) and TxnOffsetCommit (the group
coordinator's part)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import OFFSETS_TOPIC, TXN_TOPIC
from diskless.log.partition_log import PartitionLog
from diskless.protocol import messages as m
from diskless.protocol import records
from diskless.replication.partition import Partition, wait_for_commits

from .api_base import ApiFamily, _answered, forwarded_by_broker

log = structlog.get_logger(__name__)

MARKER_WAIT_S = 30.0  # how long a marker's leader waits for it to replicate (acks=all)


class TxnApis(ApiFamily):
    """WriteTxnMarkers, DescribeProducers and TxnOffsetCommit."""

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_WRITE_TXN_MARKERS: self.write_txn_markers,
            m.API_TXN_OFFSET_COMMIT: self.txn_offset_commit,
            m.API_DESCRIBE_PRODUCERS: self.describe_producers,
        }

    async def write_txn_markers(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """WriteTxnMarkers: end a producer's transaction on each partition we lead with a control
        batch, answered once it is replicated (acks=all). From a transaction coordinator, or from an
        operator aborting a hanging transaction (KIP-664's abort, with the producer's epochs as
        DescribeProducers showed them); an operator's marker for a diskless partition no replica
        here holds goes to its leader (zone-aligned metadata names a broker of the client's AZ)."""
        now = self.broker.now_ms()
        forwarded = forwarded_by_broker(header)
        results = []
        waits: list[tuple[dict[str, Any], Partition, int]] = []
        forwards: list[tuple[dict[str, Any], int, Any, str]] = []
        for marker in request.markers:
            topics = []
            for topic in marker.topics:
                parts = []
                for index in topic.partition_indexes:
                    if topic.name == TXN_TOPIC:
                        # No transaction ever writes there, and its loader reads every record as a
                        # transaction's: an (operator's) marker would leave the partition unloadable.
                        parts.append({"partition_index": index, "error_code": ErrorCode.invalid_topic_exception})
                        continue
                    code, plog, replica = self._leader_log(topic.name, index)
                    entry: dict[str, Any] = {"partition_index": index, "error_code": code}
                    leader = None if plog is not None else self._leader_elsewhere(forwarded, topic.name, index)
                    if leader is not None:
                        forwards.append((entry, leader, marker, topic.name))
                    elif plog is not None and replica is not None:
                        try:
                            offset = plog.append_marker_as_leader(
                                marker.producer_id,
                                marker.producer_epoch,
                                bool(marker.transaction_result),
                                marker.coordinator_epoch,
                                replica.leader_epoch,
                                now,
                            )
                        except records.InvalidBatch as exc:
                            # A stale marker: the transaction it ends is over here already.
                            log.info("refused transaction marker", topic=topic.name, partition=index, error=str(exc))
                            entry["error_code"] = ErrorCode[exc.error]
                            parts.append(entry)
                            continue
                        self.broker.on_leader_append(replica)
                        waits.append((entry, replica, offset, replica.leader_epoch))
                        if topic.name == OFFSETS_TOPIC:
                            self.broker.groups.on_marker(index, marker.producer_id, bool(marker.transaction_result))
                    parts.append(entry)
                topics.append({"name": topic.name, "partitions": parts})
            results.append({"producer_id": marker.producer_id, "topics": topics})
        # The leaders' commit waits and ours run side by side: one after another, each up to
        # MARKER_WAIT_S, the answer could come long after the operator's client gave up.
        codes, outcomes = await asyncio.gather(
            asyncio.gather(
                *(self._forward_marker(leader, marker, t, e["partition_index"]) for e, leader, marker, t in forwards)
            ),
            wait_for_commits([(r, offset, epoch) for _, r, offset, epoch in waits], MARKER_WAIT_S, first=False),
        )
        for (entry, *_), code in zip(forwards, codes, strict=True):
            entry["error_code"] = code
        for (entry, replica, _, epoch), committed in zip(waits, outcomes, strict=True):
            if not committed:
                lost = not replica.leads_at(epoch)
                entry["error_code"] = ErrorCode.not_leader_or_follower if lost else ErrorCode.request_timed_out
        return {"markers": results}

    def _leader_elsewhere(self, forwarded: bool, topic: str, index: int) -> int | None:
        """The leader to ask about a diskless partition no replica here can answer for, unless the
        request was forwarded to us already (None: answer here)."""
        return None if forwarded else self._forward_target(topic, index, self._is_diskless(topic), None)

    async def _forward_marker(self, leader: int, marker: Any, topic: str, index: int) -> ErrorCode:
        """One partition's marker written by its leader: the leader's answer for it."""
        body = {
            "markers": [
                {
                    "producer_id": marker.producer_id,
                    "producer_epoch": marker.producer_epoch,
                    "transaction_result": marker.transaction_result,
                    "topics": [{"name": topic, "partition_indexes": [index]}],
                    "coordinator_epoch": marker.coordinator_epoch,
                }
            ]
        }
        # The leader waits up to MARKER_WAIT_S for the marker to replicate: its REQUEST_TIMED_OUT
        # must arrive, not be cut off (and misread as NOT_LEADER_OR_FOLLOWER) at the same moment.
        answer = await self._forward(leader, m.API_WRITE_TXN_MARKERS, 1, body, timeout=MARKER_WAIT_S + 5.0)
        for result in answer.markers if answer is not None else ():
            for t in result.topics:
                for p in t.partitions:
                    if t.name == topic and p.partition_index == index:
                        return ErrorCode(p.error_code)
        return ErrorCode.not_leader_or_follower

    async def describe_producers(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """DescribeProducers (KIP-664): the producers a partition's replica knows, each with its
        epochs, last sequence and timestamp and the first offset of its open transaction, as Kafka's
        activeProducerState. Any replica answers from its own log, as in Kafka; a diskless
        partition no replica here holds is asked of its leader."""
        forwarded = forwarded_by_broker(header)
        topics = []
        forwards: dict[int, list[tuple[dict[str, Any], str, int]]] = {}
        for topic in request.topics:
            parts = []
            for index in topic.partition_indexes:
                code, plog, _ = self._leader_log(topic.name, index, any_replica=True)
                entry: dict[str, Any] = {"partition_index": index, "error_code": code, "active_producers": []}
                leader = None if plog is not None else self._leader_elsewhere(forwarded, topic.name, index)
                if leader is not None:
                    forwards.setdefault(leader, []).append((entry, topic.name, index))
                elif plog is not None:
                    entry["active_producers"] = active_producers(plog)
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        for leader, items in forwards.items():
            body = {"topics": [{"name": t, "partition_indexes": [i]} for _, t, i in items]}
            answer = await self._forward(leader, m.API_DESCRIBE_PRODUCERS, 0, body)
            for entry, topic_name, index in items:
                found = _answered(entry, answer, topic_name, index)
                if found is None:
                    continue
                entry.update(
                    error_code=found.error_code,
                    error_message=found.error_message,
                    active_producers=[dataclasses.asdict(p) for p in found.active_producers],
                )
        return {"throttle_time": 0, "topics": topics}

    async def txn_offset_commit(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """TxnOffsetCommit: offsets that count only if the producer's transaction commits."""
        from diskless.groups.coordinator import OffsetAndMetadata
        from diskless.groups.records import encode_offset

        group_id = request.group_id
        shell = self.broker.groups
        core = shell.coordinator(group_id)
        code = core if isinstance(core, ErrorCode) else ErrorCode.none
        now = self.broker.now_ms()
        if not isinstance(core, ErrorCode):
            # v0-2 carry no member: generation -1 and an empty member id, accepted from anyone.
            code = core.validate_commit(
                group_id,
                getattr(request, "generation_id", -1),
                getattr(request, "member_id", ""),
                getattr(request, "group_instance_id", None),
                now,
                transactional=True,
            )
        offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
        for topic in request.topics:
            for p in topic.partitions:
                offsets[(topic.name, p.partition_index)] = OffsetAndMetadata(
                    p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata or "", now
                )
        if code == ErrorCode.none:
            entries = [encode_offset(group_id, t, i, value) for (t, i), value in offsets.items()]
            # Pending from the append on (GroupShell.appended), as in Kafka, until the marker.
            code = await shell.persist(group_id, entries, (request.producer_id, request.producer_epoch))
        topics: dict[str, list[dict[str, Any]]] = {}
        for t, i in offsets:
            topics.setdefault(t, []).append({"partition_index": i, "error_code": code})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}


def active_producers(plog: PartitionLog) -> list[dict[str, Any]]:
    """DescribeProducers' entries for a log: every producer its state holds (expired ones are gone)."""
    ongoing = plog.txns.ongoing
    return [
        {
            "producer_id": producer_id,
            "producer_epoch": entry.epoch,
            "last_sequence": entry.last_seq,
            "last_timestamp": entry.last_timestamp,
            "coordinator_epoch": entry.coordinator_epoch,
            "current_txn_start_offset": ongoing.get(producer_id, -1),
        }
        for producer_id, entry in plog.producer_state.producers.items()
    ]

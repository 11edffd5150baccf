"""Broker-side transaction APIs that are not the coordinator's: WriteTxnMarkers (partition leaders
end a transaction with a control batch) and TxnOffsetCommit (the group coordinator's part)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import OFFSETS_TOPIC
from diskless.protocol import messages as m
from diskless.protocol import records
from diskless.replication.partition import Partition, wait_for_commits

from .api_base import ApiFamily

log = structlog.get_logger(__name__)


class TxnApis(ApiFamily):
    """WriteTxnMarkers and TxnOffsetCommit."""

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_WRITE_TXN_MARKERS: self.write_txn_markers,
            m.API_TXN_OFFSET_COMMIT: self.txn_offset_commit,
        }

    async def write_txn_markers(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """WriteTxnMarkers from a transaction coordinator: end a producer's transaction on each
        partition we lead with a control batch, answered once it is replicated (acks=all)."""
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
        outcomes = await wait_for_commits([(r, offset, epoch) for _, r, offset, epoch in waits], 30.0, first=False)
        for (entry, replica, _, epoch), committed in zip(waits, outcomes, strict=True):
            if not committed:
                lost = not replica.leads_at(epoch)
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

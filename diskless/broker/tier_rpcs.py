"""The internal RPCs a leader answers to the tiering job (``diskless/spark/tier_job.py``).

TierableRanges (32010): for every diskless partition this broker leads, the range a job may tier
next: from the end of what is tiered (or the batch at the log start) up to the last stable offset
(committed, and never splitting an open transaction), with the leader epoch a TierCommit must
carry and the figures the ``--every`` policy and metrics read (pointer bytes, oldest untiered
batch, tiered bytes and segment objects).

TierCommit (32011): "offsets [a, b] of this partition now live in segment object S". The leader
checks the topic incarnation and its epoch, that both objects exist with the sizes said, then
``PartitionLog.append_tier_as_leader`` checks contiguity, the last stable offset, batch boundaries
and the range digest; any refusal changes nothing and says why (``error_message``). Accepted, the
tier entry is appended like any entry and the answer waits (bounded) for it to replicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from diskless.metrics import TIER_COMMITS, TIERED_BYTES
from diskless.storage.segment_object import CorruptSegment, SegmentInfo
from diskless.tiering.entry import TierCommitError

from .api_base import ApiFamily

if TYPE_CHECKING:
    from .broker import Broker

log = structlog.get_logger(__name__)

COMMIT_REPLICATION_WAIT_S = 10.0


class _TierCollector:
    """Per-partition tiering gauges of every replica this process hosts, computed at scrape time."""

    def __init__(self) -> None:
        self.brokers: weakref.WeakSet[Broker] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition"]
        pointer = GaugeMetricFamily(
            "diskless_partition_pointer_bytes", "Bytes of pointer segments of a replica", labels=labels
        )
        tiered = GaugeMetricFamily(
            "diskless_partition_tiered_bytes", "Bytes of segment objects a replica's tiers point to", labels=labels
        )
        objects = GaugeMetricFamily(
            "diskless_partition_segment_objects", "Tiered segment objects of a replica", labels=labels
        )
        for broker in list(self.brokers):
            # Broker stand-ins in tests may have no replicas: a scrape never fails on them.
            partitions = getattr(getattr(broker, "replicas", None), "partitions", {})
            for (topic, index), replica in list(partitions.items()):
                plog = replica.log
                tiers = [t for t in plog.tiers if t.last_offset >= plog.log_start_offset]
                if not tiers and not plog.tiers_possible():
                    continue
                key = [topic, str(index)]
                pointer.add_metric(key, plog.pointer_bytes())
                tiered.add_metric(key, sum(t.info.size for t in tiers))
                objects.add_metric(key, len(tiers))
        yield from (pointer, tiered, objects)


_COLLECTOR = _TierCollector()
REGISTRY.register(_COLLECTOR)  # type: ignore[arg-type]


class TierRpcs(ApiFamily):
    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        with contextlib.suppress(TypeError):  # stand-ins that cannot be weakly referenced
            _COLLECTOR.brokers.add(broker)

    async def tierable_ranges_rpc(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._leader_fenced():
            return {"error_code": 0, "partitions": []}
        out = []
        for replica in self.broker.replicas.leading():
            meta = self._meta.topics.get(replica.topic)
            if meta is None or meta.topic_id != replica.topic_id or not self.broker.is_diskless(meta):
                continue
            plog = replica.log
            start = plog.tier_end
            oldest = -1
            for segment in plog.segments:
                location = segment.locate(start) if segment.next_offset > start else None
                if location is not None:
                    oldest = location.max_timestamp
                    break
            tiered = [t for t in plog.tiers if t.last_offset >= plog.log_start_offset]
            out.append(
                {
                    "topic": replica.topic,
                    "topic_id": replica.topic_id,
                    "partition": replica.index,
                    "leader_epoch": replica.leader_epoch,
                    "start": start,
                    "end": plog.last_stable_offset,  # exclusive
                    "log_start_offset": plog.log_start_offset,
                    "log_end_offset": plog.log_end_offset,
                    "tiered_end": plog.tiered_end,
                    "pointer_bytes": plog.pointer_bytes(),
                    "oldest_untiered_ms": oldest,
                    "segment_objects": len(tiered),
                    "tiered_bytes": sum(t.info.size for t in tiered),
                }
            )
        return {"error_code": 0, "partitions": out}

    async def tier_commit_rpc(self, body: dict[str, Any]) -> dict[str, Any]:
        topic, index, topic_id = body["topic"], int(body["partition"]), body.get("topic_id")
        epoch = int(body.get("leader_epoch", -1))
        meta = self._meta.topics.get(topic)
        if not isinstance(topic_id, str) or epoch < 0:
            return _refused(ErrorCode.invalid_request, "TierCommit must carry a topic id and a leader epoch")
        if meta is None or meta.topic_id != topic_id:
            return _refused(ErrorCode.unknown_topic_id, f"{topic} has no incarnation {topic_id} here")
        try:
            info = SegmentInfo.from_dict(body["segment"])
        except (CorruptSegment, KeyError) as exc:
            return _refused(ErrorCode.invalid_request, str(exc))
        if (info.topic_id, info.partition) != (topic_id, index):
            return _refused(ErrorCode.invalid_request, f"segment {info.log_key} is not of {topic_id}/{index}")
        code, plog, replica = self._leader_log(topic, index, epoch)
        if plog is None or replica is None or replica.topic_id != topic_id:
            return _refused(code, f"not the leader of {topic}-{index} at epoch {epoch} ({code.name})")
        # The WAL manager may delete an unreferenced segment object once it is older than this
        # timeout plus skew (wal_manager/core.py): never let a late commit reference it.
        age = self.broker.now_ms() - info.created_ms
        if info.created_ms < 0 or age > self.broker.config.diskless_tier_commit_timeout_ms:
            return _refused(
                ErrorCode.request_timed_out,
                f"segment {info.log_key} was written {age} ms ago, more than diskless.tier.commit.timeout.ms:"
                " rerun the job (it rewrites the same segment)",
            )
        store = self.broker.store
        if store is None:
            return _refused(ErrorCode.invalid_request, "this broker has no object storage")
        sizes = await asyncio.gather(store.head(info.log_key), store.head(info.index_key))
        if list(sizes) != [info.size, info.index_size]:
            return _refused(
                ErrorCode.corrupt_message,
                f"segment objects {info.log_key} / .index are {sizes}, expected {[info.size, info.index_size]}",
            )
        # Leadership may have moved while the objects were checked.
        code, plog, replica = self._leader_log(topic, index, epoch)
        if plog is None or replica is None or replica.topic_id != topic_id:
            return _refused(code, f"not the leader of {topic}-{index} at epoch {epoch} ({code.name})")
        try:
            appended_epoch = replica.leader_epoch
            offset = plog.append_tier_as_leader(info, appended_epoch, self.broker.now_ms())
        except TierCommitError as exc:
            log.info("tier commit refused", topic=topic, partition=index, error=exc.error, reason=exc.message)
            return _refused(ErrorCode[exc.error], exc.message)
        if offset is None:  # a rerun: exactly this segment is already tiered
            entry = next(t.entry_offset for t in plog.tiers if t.info == info)
            committed = await replica.wait_for_commit(entry, replica.leader_epoch, COMMIT_REPLICATION_WAIT_S)
            return {"error_code": 0, "entry_offset": entry, "committed": committed, "duplicate": True}
        self.broker.on_leader_append(replica)
        TIER_COMMITS.inc()
        TIERED_BYTES.inc(info.size)
        log.info("tiered", topic=topic, partition=index, base=info.base_offset, last=info.last_offset, bytes=info.size)
        committed = await replica.wait_for_commit(offset, appended_epoch, COMMIT_REPLICATION_WAIT_S)
        return {"error_code": 0, "entry_offset": offset, "committed": committed}


def _refused(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": int(code), "error_message": message}

"""The partition logs this broker hosts, their directories, and wake-ups for long-polling fetches.

A log directory is ``<log.dirs>/<topic>-<partition>`` with a ``partition.metadata`` file holding
the topic id, so a topic deleted and re-created under the same name never reuses old data.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid

import structlog

from diskless.cluster.metadata import TopicMetadata
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog

log = structlog.get_logger(__name__)

PARTITION_METADATA = "partition.metadata"


class ReplicaManager:
    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._appended = asyncio.Event()

    # --- lifecycle ---------------------------------------------------------------------------

    def load(self, topics: dict[str, TopicMetadata], config_for: dict[str, LogConfig], now_ms: int) -> None:
        """Open logs for every partition we host; delete directories of topics that are gone."""
        for name in sorted(os.listdir(self.log_dir)):
            path = os.path.join(self.log_dir, name)
            if name.endswith("-delete") and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)  # a topic deletion interrupted by a crash
                continue
            if not os.path.isfile(os.path.join(path, PARTITION_METADATA)):
                continue  # not a partition directory of ours: leave it alone
            topic, _, part = name.rpartition("-")
            topic_meta = topics.get(topic)
            stored_id = _read_topic_id(path)
            if (
                not part.isdigit()
                or topic_meta is None
                or stored_id != topic_meta.topic_id
                or int(part) >= len(topic_meta.partitions)
            ):
                log.info("deleting stale log directory", dir=name)
                shutil.rmtree(path, ignore_errors=True)
                continue
            plog = PartitionLog(path, config_for[topic], now_ms)
            if plog.recovered_bytes_truncated:
                log.warning("truncated torn log tail", dir=name, bytes=plog.recovered_bytes_truncated)
            self.logs[(topic, int(part))] = plog

    def ensure_log(self, topic: TopicMetadata, partition: int, config: LogConfig, now_ms: int) -> PartitionLog:
        key = (topic.name, partition)
        plog = self.logs.get(key)
        if plog is None:
            path = os.path.join(self.log_dir, f"{topic.name}-{partition}")
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, PARTITION_METADATA), "w") as f:
                f.write(f"version: 0\ntopic_id: {topic.topic_id}\n")
            plog = PartitionLog(path, config, now_ms)
            self.logs[key] = plog
        return plog

    def delete_topic(self, name: str) -> None:
        for key in [k for k in self.logs if k[0] == name]:
            plog = self.logs.pop(key)
            for segment in plog.segments:
                segment.close()
            # Rename first so a crash mid-delete never leaves a directory that looks live.
            doomed = f"{plog.directory}.{uuid.uuid4().hex}-delete"
            os.rename(plog.directory, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def update_config(self, topic: str, config: LogConfig) -> None:
        for (name, _), plog in self.logs.items():
            if name == topic:
                plog.update_config(config)

    def close(self) -> None:
        for plog in self.logs.values():
            plog.close(clean=True)
        self.logs.clear()

    # --- long-poll wake-ups -------------------------------------------------------------------

    def notify_append(self) -> None:
        self._appended.set()

    async def wait_for_append(self, timeout: float) -> None:
        """Wait until some partition receives data, or ``timeout`` seconds pass."""
        self._appended.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._appended.wait(), timeout)


def _read_topic_id(path: str) -> str | None:
    try:
        with open(os.path.join(path, PARTITION_METADATA)) as f:
            for line in f:
                if line.startswith("topic_id:"):
                    return line.split(":", 1)[1].strip()
    except FileNotFoundError:
        return None
    return None

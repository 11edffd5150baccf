"""A broker process: configuration, metadata, partition logs, the Kafka listener and timers.

This is the asyncio shell around the sans-IO pieces. It owns the wall clock (``now_ms``) and the
periodic retention check, persists metadata changes, and keeps each hosted partition's log
configuration in step with its topic's overrides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import structlog

from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, LocalMetadataStore, TopicMetadata
from diskless.cluster.producer_ids import LocalProducerIdStore, ProducerIdBlock
from diskless.config import BrokerConfig
from diskless.log.config import LogConfig, effective_values
from diskless.log.partition_log import PartitionLog
from diskless.metrics import RETENTION_DELETED_SEGMENTS, serve_metrics

from .apis import KafkaApis
from .replica_manager import ReplicaManager
from .server import KafkaServer

log = structlog.get_logger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.metadata = ClusterMetadata(config.cluster_id)
        self.store = LocalMetadataStore(os.path.join(config.log_dirs, "cluster-metadata.json"))
        self.replicas = ReplicaManager(config.log_dirs)
        self.apis = KafkaApis(self)
        self.server = KafkaServer(self.apis, config.socket_request_max_bytes)
        self.producer_ids = LocalProducerIdStore(os.path.join(config.log_dirs, "producer-id-block"))
        self._pid_block = ProducerIdBlock()
        self.port = -1
        self.metrics_port = -1
        self._retention_task: asyncio.Task[None] | None = None

    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        os.makedirs(self.config.log_dirs, exist_ok=True)
        self.store.load_into(self.metadata)
        self.metadata.cluster_id = self.config.cluster_id
        self.metadata.controller_id = self.node_id
        self.replicas.load(self.metadata.topics, self._configs_by_topic(), self.now_ms())
        for topic in self.metadata.topics.values():
            self._open_logs(topic)
        listener = self.config.listener
        self.port = await self.server.start(listener.host, listener.port)
        advertised = self.config.advertised(self.port)
        self.metadata.brokers = {
            self.node_id: BrokerInfo(self.node_id, advertised.host, advertised.port, self.config.broker_rack)
        }
        if self.config.metrics_port >= 0:
            self.metrics_port = serve_metrics(self.config.metrics_host, self.config.metrics_port)
        self._retention_task = asyncio.create_task(self._retention_loop())
        log.info(
            "broker started", node_id=self.node_id, host=advertised.host, port=self.port, metrics_port=self.metrics_port
        )

    async def stop(self) -> None:
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
        await self.server.stop()
        self.replicas.close()
        log.info("broker stopped", node_id=self.node_id)

    def allocate_producer_id(self) -> int:
        pid = self._pid_block.take()
        if pid is None:
            self._pid_block = self.producer_ids.reserve_block()
            pid = self._pid_block.take()
            assert pid is not None
        return pid

    # --- logs ----------------------------------------------------------------------------------

    def log_config(self, topic: TopicMetadata) -> LogConfig:
        values = effective_values(topic.configs, self.config.broker_value)
        return LogConfig.from_values({name: value for name, (value, _) in values.items()})

    def _configs_by_topic(self) -> dict[str, LogConfig]:
        return {name: self.log_config(t) for name, t in self.metadata.topics.items()}

    def _open_logs(self, topic: TopicMetadata) -> None:
        config = self.log_config(topic)
        for index, state in enumerate(topic.partitions):
            if self.node_id in state.replicas:
                self.replicas.ensure_log(topic, index, config, self.now_ms())

    def on_leader_append(self, topic: str, partition: int, plog: PartitionLog) -> None:
        """Single-replica partitions commit on append; replication replaces this rule."""
        plog.high_watermark = plog.log_end_offset

    async def _retention_loop(self) -> None:
        interval = self.config.log_retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.apply_retention()

    def apply_retention(self) -> int:
        deleted = 0
        now = self.now_ms()
        for key, plog in list(self.replicas.logs.items()):
            try:
                deleted += plog.apply_retention(now)
            except OSError:
                log.exception("retention failed", partition=key)
        if deleted:
            RETENTION_DELETED_SEGMENTS.inc(deleted)
        return deleted

    # --- metadata changes ----------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str | None],
        assignments: Sequence[Sequence[int]] = (),
        validate_only: bool = False,
    ) -> TopicMetadata:
        topic = self.metadata.create_topic(name, partitions, replication_factor, configs, assignments, validate_only)
        if not validate_only:
            self._open_logs(topic)
            self.store.save(self.metadata)
            log.info("topic created", topic=name, partitions=len(topic.partitions), configs=topic.configs)
        return topic

    async def delete_topic(self, name: str) -> TopicMetadata:
        topic = self.metadata.delete_topic(name)
        self.store.save(self.metadata)
        self.replicas.delete_topic(name)
        log.info("topic deleted", topic=name)
        return topic

    async def add_partitions(self, name: str, count: int, validate_only: bool) -> None:
        topic = self.metadata.add_partitions(name, count, validate_only)
        if not validate_only:
            self._open_logs(topic)
            self.store.save(self.metadata)

    async def alter_topic_configs(self, name: str, updates: Mapping[str, str | None], validate_only: bool) -> None:
        self.metadata.alter_topic_configs(name, updates, validate_only)
        if not validate_only:
            topic = self.metadata.topics[name]
            self.replicas.update_config(name, self.log_config(topic))
            self.store.save(self.metadata)
            log.info("topic configs altered", topic=name, configs=topic.configs)

    def describe_broker_config(self) -> list[tuple[str, str, bool]]:
        """(name, value, explicitly set) for every broker property."""
        out: list[tuple[str, str, bool]] = []
        defaults = BrokerConfig()
        for f in fields(self.config):
            prop = f.metadata.get("property")
            if prop is None:
                continue
            value: Any = getattr(self.config, f.name)
            rendered = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            out.append((prop, rendered, value != getattr(defaults, f.name)))
        out.extend(
            (name, value, True)
            for name, value in sorted(self.config.topic_defaults.items())
            if not any(o[0] == name for o in out)
        )
        return out

"""Transaction coordination on the broker: ``TransactionCoordinatorCore`` on the leaders of
``__transaction_state`` partitions, with WriteTxnMarkers sent to the leaders of the partitions
a transaction touched (a direct call when that leader is this broker)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import structlog
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import OFFSETS_TOPIC, TXN_TOPIC
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError
from diskless.replication.partition import Partition
from diskless.transactions.coordinator import TransactionCoordinatorCore, TxnConfig
from diskless.transactions.handlers import run_timers
from diskless.transactions.records import partition_for, replay

from .coordinator_shell import CoordinatorShell

log = structlog.get_logger(__name__)

MARKERS_VERSION = 1


class TxnShell(CoordinatorShell[TransactionCoordinatorCore]):
    topic = TXN_TOPIC

    def __init__(self, broker: Any) -> None:
        super().__init__(broker)
        self._timer_tasks: set[asyncio.Task[None]] = set()

    def configured_partitions(self) -> int:
        return self.broker.config.transaction_state_log_num_partitions

    def configured_replication(self) -> int:
        return self.broker.config.transaction_state_log_replication_factor

    def topic_configs(self) -> dict[str, str]:
        return {"segment.bytes": "104857600"}

    def hash_partition(self, key: str, partitions: int) -> int:
        return partition_for(key, partitions)

    def load(self, partition: Partition) -> TransactionCoordinatorCore:
        from diskless.protocol import records

        retention_ms = partition.log.config.retention_ms
        core = TransactionCoordinatorCore(
            TxnConfig(
                max_timeout_ms=self.broker.config.transaction_max_timeout_ms,
                refresh_after_ms=retention_ms // 2 if retention_ms >= 0 else -1,
                transactional_id_expiration_ms=self.broker.config.transactional_id_expiration_ms,
            ),
            partition=partition.index,
            coordinator_epoch=partition.leader_epoch,
        )
        log_start = partition.log.log_start_offset
        entries = [
            (key, value)
            for raw in self.log_batches(partition)
            for offset, key, value in records.iter_records(raw)
            if offset >= log_start and key is not None
        ]
        replay(core, entries)
        return core

    def tick(self, now_ms: int) -> None:
        for core in list(self.cores.values()):
            task = asyncio.get_running_loop().create_task(run_timers(self, core))
            self._timer_tasks.add(task)
            task.add_done_callback(self._timer_tasks.discard)

    def on_partition(self, index: int, partition: Partition | None) -> None:
        super().on_partition(index, partition)
        if index in self.cores:
            self.tick(self.now_ms())  # finish transactions a replay found half-way

    # --- the rest of the transaction facade ---------------------------------------------------

    async def allocate_producer_id(self) -> int:
        return int(await self.broker.allocate_producer_id())

    def partition_exists(self, topic: str, partition: int) -> bool:
        return self.broker.metadata.partition(topic, partition) is not None

    def offsets_partition_for(self, group_id: str) -> tuple[str, int]:
        return OFFSETS_TOPIC, self.broker.groups.partition_of(group_id)

    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        partitions: list[tuple[str, int]],
        coordinator_epoch: int,
    ) -> dict[tuple[str, int], ErrorCode]:
        """WriteTxnMarkers to every leader involved, concurrently; unreachable ones fail (retried)."""
        results: dict[tuple[str, int], ErrorCode] = {}
        by_leader: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for topic, index in partitions:
            state = self.broker.metadata.partition(topic, index)
            if state is None:
                results[(topic, index)] = ErrorCode.unknown_topic_or_partition
            elif state.leader < 0:
                results[(topic, index)] = ErrorCode.leader_not_available
            else:
                by_leader[int(state.leader)].append((topic, index))

        async def send(leader: int, members: list[tuple[str, int]]) -> None:
            topics: dict[str, list[int]] = defaultdict(list)
            for topic, index in members:
                topics[topic].append(index)
            body = {
                "markers": [
                    {
                        "producer_id": producer_id,
                        "producer_epoch": producer_epoch,
                        "transaction_result": committed,
                        "topics": [{"name": t, "partition_indexes": idx} for t, idx in topics.items()],
                        "coordinator_epoch": coordinator_epoch,
                    }
                ]
            }
            try:
                answer = await self._markers_to(leader, body)
            except (ClientError, OSError, TimeoutError) as exc:
                log.info("could not write transaction markers", leader=leader, error=str(exc))
                for tp in members:
                    results[tp] = ErrorCode.not_leader_or_follower
                return
            for marker in answer:
                for topic_result in marker["topics"]:
                    for p in topic_result["partitions"]:
                        results[(topic_result["name"], p["partition_index"])] = ErrorCode(p["error_code"])

        await asyncio.gather(*(send(leader, members) for leader, members in by_leader.items()))
        for tp in partitions:
            results.setdefault(tp, ErrorCode.unknown_server_error)
        return results

    async def _markers_to(self, leader: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        request = m.build(load_request_schema(m.API_WRITE_TXN_MARKERS, MARKERS_VERSION), body)
        if leader == self.broker.node_id:
            header = m.RequestHeader(m.API_WRITE_TXN_MARKERS, MARKERS_VERSION, 0, "txn-coordinator")
            response = await self.broker.apis.txn.write_txn_markers(header, request)
            return list(response["markers"])
        conn = await self.broker.peers.get(leader)
        answer = await conn.request(m.API_WRITE_TXN_MARKERS, MARKERS_VERSION, body, timeout=40)
        return [
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {"partition_index": p.partition_index, "error_code": p.error_code} for p in t.partitions
                        ],
                    }
                    for t in marker.topics
                ]
            }
            for marker in answer.markers
        ]

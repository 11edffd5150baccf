"""Follower fetchers: one task per leader broker pulls every partition we follow from it.

Fetch requests carry ``replica_id`` (so the leader reads up to its log end and learns our log end
offset) and ``last_fetched_epoch`` (so the leader can answer with a diverging epoch, telling us
where to truncate after a leader change). They name topics by id (Fetch v13, KIP-516): a leader
whose metadata shows another incarnation of the name (it has not seen a deletion and re-creation
yet, or we have not) answers UNKNOWN_TOPIC_ID instead of serving that incarnation's log, whose
pointers would otherwise land in ours when the leader epochs match (every incarnation starts at
0). Connection failures back off and retry; partitions move between fetchers when the metadata
store changes their leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13.request import FetchPartition as _FETCH_PARTITION
from kio.schema.fetch.v13.request import FetchRequest as _FETCH_REQUEST
from kio.schema.fetch.v13.request import FetchTopic as _FETCH_TOPIC
from kio.schema.fetch.v13.request import ForgottenTopic as _FORGOTTEN_TOPIC
from kio.static.primitive import i32

from diskless.aio import cancel_and_wait
from diskless.cluster.metadata import BrokerInfo
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.security.internal_auth import ClusterSecret

from .fetch_session import FetchSessionHandler
from .partition import FOLLOWER, DivergingEpoch, Partition

log = structlog.get_logger(__name__)

FETCH_VERSION = 13  # the first naming topics by id (the kio classes below are this version's)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplicaFetcher:
    """Copies the partitions this broker follows from one leader. ``on_progress`` is called after
    an answer moved the high watermark or last stable offset of one of them (readers waiting on
    this broker have news), ``on_pointers`` with pointer entries appended (to prefetch)."""

    def __init__(
        self,
        node_id: int,
        leader_id: int,
        lookup: Callable[[int], BrokerInfo | None],
        wait_max_ms: int,
        fetch_max_bytes: int,
        on_progress: Callable[[], None],
        on_pointers: Callable[[bytes], None] = lambda entries: None,
        local_host: str | None = None,
        credentials: ClusterSecret | None = None,
    ) -> None:
        self.local_host = local_host
        self.credentials = credentials
        self.node_id = node_id
        self.leader_id = leader_id
        self.lookup = lookup
        self.wait_max_ms = wait_max_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.on_progress = on_progress
        self.on_pointers = on_pointers
        self.partitions: dict[tuple[str, int], Partition] = {}
        # The replicas the request in flight was built for: an answer is applied only to the very
        # replica that asked, never to one that replaced it meanwhile (a topic re-created under the
        # same name gets a new replica whose log must not receive the old incarnation's batches).
        self._asked: dict[tuple[str, int], Partition] = {}
        self._asked_by_id: dict[tuple[str, int], Partition] = {}  # the same, by (topic id, index)
        self._active: list[Partition] = []  # the partitions _asked was built from
        # Each partition's request entry with the fetch position it was built for (_request).
        self._built: dict[tuple[str, int], tuple[tuple[int, ...], Any]] = {}
        # Our KIP-227 session with the leader: after a full fetch, requests name only the
        # partitions whose position moved (or that we stopped fetching).
        self.session = FetchSessionHandler()
        self._template: Any = None  # the request's constant fields (_request)
        self._wire_ids: dict[str, uuid.UUID] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: KafkaClientConnection | None = None
        self._stopping = False
        # When the request being answered was sent: the leader's answer describes it as of that
        # moment or later, however long the answer then took to be read (follower_reads).
        self._sent_ms = -1

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        # The flag as well as the cancel: Python 3.11's wait_for (in connect) swallows a cancellation
        # that arrives just as the connection completes, and the loop would then run forever.
        self._stopping = True
        await cancel_and_wait(self._task)
        if self._conn is not None:
            await self._conn.close()

    def add(self, partition: Partition) -> None:
        self.partitions[(partition.topic, partition.index)] = partition
        self._changed.set()

    def remove(self, key: tuple[str, int]) -> None:
        self.partitions.pop(key, None)

    async def _connect(self) -> KafkaClientConnection | None:
        info = self.lookup(self.leader_id)
        if info is None:
            return None
        conn = KafkaClientConnection(
            info.host,
            info.port,
            internal.broker_client_id(self.node_id, "replica-fetcher"),
            local_host=self.local_host,
            credentials=self.credentials,
        )
        try:
            await conn.connect()
        except (OSError, TimeoutError, ClientError) as exc:
            if isinstance(exc, ClientError):
                log.warning("replica fetcher cannot authenticate to its leader", leader=self.leader_id, error=str(exc))
            return None
        return conn

    async def _run(self) -> None:
        backoff = 0.05
        while not self._stopping:
            active = [p for p in self.partitions.values() if p.role == FOLLOWER and p.leader_id == self.leader_id]
            if not active:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 1.0)
                continue
            if self._conn is None or not self._conn.connected:
                self._conn = await self._connect()
                if self._conn is None:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
            try:
                self._sent_ms = _now_ms()
                response = await self._conn.request(
                    m.API_FETCH, FETCH_VERSION, self._request(active), timeout=self.wait_max_ms / 1000 + 10
                )
                backoff = 0.05
            except (ClientError, OSError, TimeoutError) as exc:
                log.info("replica fetch failed", leader=self.leader_id, error=str(exc))
                self.session.handle_error()
                await self._conn.close()
                self._conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            error = ErrorCode(response.error_code)
            if not self.session.handle_response(error, response.session_id):
                # A session error (the leader restarted, evicted it, or an answer was lost): the
                # next fetch is full. The answer names no partitions and means nothing about them.
                log.info("replica fetch session reset", leader=self.leader_id, error=error.name)
                continue
            if self._handle(response):
                await asyncio.sleep(0.1)  # leadership moving: give the metadata watch a moment

    def _request(self, active: list[Partition]) -> Any:
        """The Fetch request for the partitions in ``active``, as a kio entity: all of them in a
        full fetch, in an incremental one those whose position the leader's session does not have.

        Each partition's entry is built once and kept while its fetch position (epochs, offsets)
        stays the same: at 1,000 partitions building all of them anew for every fetch cost more
        than encoding them, and between two fetches only the partitions that got data move."""
        topics: dict[str, list[Any]] = {}
        same_partitions = active == self._active  # the same replica objects, in the same order
        if not same_partitions:
            self._active = list(active)  # a copy: a caller's list changed in place is another set
            self._asked = {(p.topic, p.index): p for p in active}
            self._asked_by_id = {(p.topic_id, p.index): p for p in active}
        # The same partitions: their entries are updated in place; else built into a new dict, so
        # partitions no longer fetched are forgotten.
        built = self._built if same_partitions else {}
        previous = self._built
        for key, p in self._asked_by_id.items():
            log = p.log
            position = (p.leader_epoch, log.log_end_offset, log.epochs.latest_epoch, log.log_start_offset)
            entry = previous.get(key)
            if entry is None or entry[0] != position:
                partition = {
                    "partition": p.index,
                    "current_leader_epoch": position[0],
                    "fetch_offset": position[1],
                    "last_fetched_epoch": position[2],
                    "log_start_offset": position[3],
                    "partition_max_bytes": self.fetch_max_bytes,
                }
                built[key] = (position, m.build(_FETCH_PARTITION, partition))
            elif not same_partitions:
                built[key] = entry
        self._built = built
        plan = self.session.build(built)
        for (topic_id, _index), partition_entry in plan.send:
            topics.setdefault(topic_id, []).append(partition_entry)
        forgotten: dict[str, list[int]] = {}
        for topic_id, index in plan.forgotten:
            forgotten.setdefault(topic_id, []).append(index)
        if self._template is None:
            # The fields no round changes, built (generically, so slowly) once.
            self._template = m.build(
                _FETCH_REQUEST,
                {
                    "replica_id": self.node_id,
                    "max_wait": self.wait_max_ms,
                    "min_bytes": 1,
                    "max_bytes": self.fetch_max_bytes * 10,
                    "isolation_level": 0,
                    "session_id": 0,
                    "session_epoch": -1,
                    "topics": [],
                    "forgotten_topics_data": [],
                    "rack_id": "",
                },
            )
        wire_id = self._wire_id
        return dataclasses.replace(
            self._template,
            session_id=i32(plan.session_id),
            session_epoch=i32(plan.epoch),
            topics=tuple(_FETCH_TOPIC(topic_id=wire_id(t), partitions=tuple(parts)) for t, parts in topics.items()),
            forgotten_topics_data=tuple(
                _FORGOTTEN_TOPIC(topic_id=wire_id(t), partitions=tuple(indexes)) for t, indexes in forgotten.items()
            ),
        )

    def _wire_id(self, topic_id: str) -> uuid.UUID:
        """``_wire_id`` kept per topic: parsing a UUID string on every round cost more than its use."""
        wire = self._wire_ids.get(topic_id)
        if wire is None:
            wire = self._wire_ids[topic_id] = _wire_id(topic_id)
        return wire

    def _handle(self, response: object) -> bool:
        """Apply a fetch response; True if some partition reported a leadership problem."""
        now = _now_ms()
        leadership_errors = False
        readable_moved = False  # a high watermark or last stable offset here moved
        answered: set[tuple[str, int]] = set()
        for topic in response.responses:  # type: ignore[attr-defined]
            for data in topic.partitions:
                # The answer is about the incarnation it names, and only the replica that asked for
                # it takes it (never one that replaced it while the request was in flight).
                asked = self._asked_by_id.get((_our_id(topic.topic_id), data.partition_index))
                if asked is None:
                    continue
                answered.add((asked.topic, asked.index))
                partition = self.partitions.get((asked.topic, asked.index))
                if partition is not asked or partition.role != FOLLOWER or partition.leader_id != self.leader_id:
                    continue
                code = data.error_code
                if code == ErrorCode.none:
                    diverging = data.diverging_epoch
                    if diverging is not None and (diverging.epoch >= 0 or diverging.end_offset >= 0):
                        partition.truncate_on_divergence(DivergingEpoch(diverging.epoch, diverging.end_offset), now)
                        readable_moved = True
                    else:
                        bounds = partition.log.read_bounds
                        entries = partition.on_fetched(
                            data.records or b"", data.high_watermark, data.log_start_offset, now, self._sent_ms
                        )
                        # Prefetching serves tail reads; a replica still catching up (a reassignment
                        # copying a long pointer log) would pull every WAL object it points to.
                        if entries and partition.log.log_end_offset >= data.high_watermark:
                            self.on_pointers(entries)
                        if partition.log.read_bounds != bounds:
                            readable_moved = True
                elif code == ErrorCode.offset_out_of_range and partition.log.log_end_offset < data.log_start_offset:
                    partition.log.truncate_fully_and_start_at(data.log_start_offset, now)
                    readable_moved = True
                elif code in (
                    ErrorCode.not_leader_or_follower,
                    ErrorCode.fenced_leader_epoch,
                    ErrorCode.unknown_leader_epoch,
                    ErrorCode.unknown_topic_or_partition,
                    ErrorCode.unknown_topic_id,  # one of us has not seen the re-creation yet
                ):
                    leadership_errors = True
                else:
                    log.warning("replica fetch error", topic=asked.topic, partition=asked.index, error=code.name)
        # The leader leaves out partitions with nothing new (broker/quiet_fetches.py): for those
        # the answer is news too, as of when the request was sent.
        for key, partition in self._asked.items():
            if key in answered or self.partitions.get(key) is not partition:
                continue
            if partition.role == FOLLOWER and partition.leader_id == self.leader_id:
                partition.on_quiet_answer(self._sent_ms)
        # Only readers of this broker's replicas wait on what a follower appends, and they read up
        # to the high watermark: records it does not cover yet are no news to them.
        if readable_moved:
            self.on_progress()
        return leadership_errors


def _wire_id(topic_id: str) -> uuid.UUID:
    """A replica's topic id as Fetch carries it; a replica without one asks for the zero id,
    which no leader knows (UNKNOWN_TOPIC_ID)."""
    return uuid.UUID(topic_id) if topic_id else uuid.UUID(int=0)


def _our_id(wire: uuid.UUID | None) -> str:
    """The form metadata and replicas keep topic ids in."""
    return str(wire) if wire is not None and wire.int != 0 else ""

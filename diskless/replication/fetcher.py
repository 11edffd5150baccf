"""Follower fetchers: one task per leader broker pulls every partition we follow from it.

Fetch requests carry ``replica_id`` (so the leader reads up to its log end and learns our log end
offset) and ``last_fetched_epoch`` (so the leader can answer with a diverging epoch, telling us
where to truncate after a leader change). They name topics by id (Fetch v13, KIP-516): a leader
whose metadata shows another incarnation of the name (it has not seen a deletion and re-creation
yet, or we have not) answers UNKNOWN_TOPIC_ID instead of serving that incarnation's log, whose
pointers would otherwise land in ours when the leader epochs match (every incarnation starts at
0). To a leader that serves it, a request goes in the compact form of
``protocol/replica_fetch_wire.py``: the same fields in fewer bytes, which cross AZs for every
produced batch. Connection failures back off and retry; partitions move between fetchers when the
metadata store changes their leader.
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
from diskless.metrics import REPLICA_FETCH_UNAPPLIED, UNWATCHED_CHANGES
from diskless.protocol import internal, replica_fetch_wire
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.security.internal_auth import ClusterSecret

from .fetch_session import FetchSessionHandler
from .partition import (
    FOLLOWER,
    SHARED_KEYS_FETCHER,
    VERIFY_MS,
    DivergingEpoch,
    LeaderContact,
    Partition,
    collect_pointer_keys,
)

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
        # Each asked partition's request entry with the fetch position it was built for, by
        # (topic id, index). Kept up to date from the partitions' watches: only those whose watch
        # fired (or that were added or removed) are looked at when the next request is built.
        self._built: dict[tuple[str, int], tuple[tuple[int, ...], Any]] = {}
        self._dirty: set[tuple[str, int]] = set()  # keys of self.partitions to look at again
        self._unsent: set[tuple[str, int]] = set()  # keys of _built changed since the last request
        self._verified_ms = -1  # when every partition was last looked at anyway (the safety net)
        # Our answers from the leader, through which asked partitions hear from it (follower reads).
        self._contact = LeaderContact()
        self._round = 0  # the request in flight (or last sent)
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
        self._unapplied_pause = 0.0  # the pause after an answer some partition could not apply
        # The compact replica fetch form's state on the connection it was built on (_wire_state).
        self._wire_conn: KafkaClientConnection | None = None
        self._wire = replica_fetch_wire.ConnectionState()

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
        key = (partition.topic, partition.index)
        self.partitions[key] = partition
        self._on_change(key)

    def remove(self, key: tuple[str, int]) -> None:
        if self.partitions.pop(key, None) is not None:
            self._on_change(key)

    def _on_change(self, key: tuple[str, int]) -> None:
        self._dirty.add(key)
        self._changed.set()

    async def _connect(self) -> KafkaClientConnection | None:
        info = self.lookup(self.leader_id)
        if info is None:
            return None
        conn = KafkaClientConnection(
            info.host,
            info.port,
            internal.broker_client_id(self.node_id, SHARED_KEYS_FETCHER),
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
        """Fetch rounds until stopped. A round that fails unexpectedly (a bug, a disk error outside
        one partition's answer) is logged and retried after a pause, with a fresh session and
        connection: nothing restarts this task, so an exception escaping it would end replication
        from this leader for good."""
        backoff = 0.05
        while not self._stopping:
            try:
                backoff = await self._round_trip(backoff)
            except Exception:
                log.exception("replica fetch round failed", leader=self.leader_id)
                REPLICA_FETCH_UNAPPLIED.labels("round").inc()
                self.session.handle_error()
                if self._conn is not None:
                    await self._conn.close()
                    self._conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _round_trip(self, backoff: float) -> float:
        """One round: bring the request up to date, fetch, apply the answer. Returns the pause
        before the next failed connection or fetch (doubling while they fail, reset by an answer)."""
        self._refresh(_now_ms())
        if not self._asked:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)
            return backoff
        if self._conn is None or not self._conn.connected:
            self._conn = await self._connect()
            if self._conn is None:
                await asyncio.sleep(backoff)
                return min(backoff * 2, 1.0)
        try:
            self._sent_ms = _now_ms()
            timeout = self.wait_max_ms / 1000 + 10
            if self._conn.served_apis.get(internal.INTERNAL_REPLICA_FETCH, -1) >= 0:
                state = self._wire_state(self._conn)
                body = replica_fetch_wire.encode_request(self._request(), state)
                response = await self._conn.request_unnamed(
                    internal.INTERNAL_REPLICA_FETCH,
                    body,
                    lambda view: replica_fetch_wire.decode_answer(view, state),
                    timeout,
                )
            else:  # a leader of a version before the compact form
                response = await self._conn.request(m.API_FETCH, FETCH_VERSION, self._request(), timeout=timeout)
        except (ClientError, OSError, TimeoutError) as exc:
            log.info("replica fetch failed", leader=self.leader_id, error=str(exc))
            self.session.handle_error()
            await self._conn.close()
            self._conn = None
            await asyncio.sleep(backoff)
            return min(backoff * 2, 1.0)
        error = ErrorCode(response.error_code)
        if not self.session.handle_response(error, response.session_id):
            # A session error (the leader restarted, evicted it, or an answer was lost): the next
            # fetch is full. The answer names no partitions and means nothing about them.
            log.info("replica fetch session reset", leader=self.leader_id, error=error.name)
            return 0.05
        pause = self._handle(response)
        if pause:
            await asyncio.sleep(pause)  # leadership moving (the metadata watch's moment), or a bad answer
        return 0.05

    def _wire_state(self, conn: KafkaClientConnection) -> replica_fetch_wire.ConnectionState:
        """The compact form's state for ``conn``: afresh for every new connection, as the leader's."""
        if self._wire_conn is not conn:
            self._wire_conn, self._wire = conn, replica_fetch_wire.ConnectionState()
        return self._wire

    def _refresh(self, now_ms: int) -> None:
        """Bring the asked partitions and their request entries up to date with the partitions
        whose watch fired (or that were added or removed); the (topic id, index) keys whose entry
        was added, changed or dropped go into ``_unsent`` for the next request. Every ``VERIFY_MS``
        all partitions are looked at: an entry found stale there is a change that fired no watch,
        counted and logged (a bug)."""
        full = not 0 <= now_ms - self._verified_ms < VERIFY_MS
        if full:
            self._verified_ms = now_ms
            keys = self._dirty | self.partitions.keys() | self._asked.keys()
        else:
            keys = self._dirty
        dirty, self._dirty = self._dirty, set()
        changed = self._unsent
        for key in keys:
            partition = self.partitions.get(key)
            asked = self._asked.get(key)
            active = partition is not None and partition.role == FOLLOWER and partition.leader_id == self.leader_id
            if (asked is not None and asked is not partition) or not active:
                if asked is not None:
                    del self._asked[key]
                    id_key = (asked.topic_id, asked.index)
                    del self._asked_by_id[id_key]
                    if self._built.pop(id_key, None) is not None:
                        changed.add(id_key)
                    asked.unwatch(self)
                    asked.stop_hearing(self._contact)
                if not active:
                    continue
            assert partition is not None
            id_key = (partition.topic_id, partition.index)
            if key not in self._asked:
                self._asked[key] = partition
                self._asked_by_id[id_key] = partition
            partition.listen(self._contact, self._round + 1)
            plog = partition.log
            position = (partition.leader_epoch, plog.log_end_offset, plog.epochs.latest_epoch, plog.log_start_offset)
            entry = self._built.get(id_key)
            if entry is None or entry[0] != position:
                if full and entry is not None and key not in dirty:
                    UNWATCHED_CHANGES.labels("replica-fetcher").inc()
                    log.warning("a followed partition changed unwatched", topic=key[0], partition=key[1])
                self._built[id_key] = (position, self._entry(partition.index, position))
                changed.add(id_key)
            partition.watch(self, lambda key=key: self._on_change(key))

    def _entry(self, index: int, position: tuple[int, ...]) -> Any:
        return m.build(
            _FETCH_PARTITION,
            {
                "partition": index,
                "current_leader_epoch": position[0],
                "fetch_offset": position[1],
                "last_fetched_epoch": position[2],
                "log_start_offset": position[3],
                "partition_max_bytes": self.fetch_max_bytes,
            },
        )

    def _request(self) -> Any:
        """The Fetch request for the partitions we follow from this leader, as a kio entity: all of
        them in a full fetch, in an incremental one those whose position the leader's session does
        not have (found from the partitions' watches, without a pass over all of them)."""
        self._refresh(_now_ms())
        changed, self._unsent = self._unsent, set()
        self._round += 1
        topics: dict[str, list[Any]] = {}
        built = self._built
        plan = self.session.build(built, changed)
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

    @staticmethod
    def _shared_keys(response: object) -> dict[int, bytes]:
        """The WAL object keys an answer's pointer runs share (``pointer_wire``'s "Shared keys"),
        from every run, those of partitions no longer asked for included: a run applied here may
        use a key written in one that is not."""
        shared: dict[int, bytes] = {}
        for topic in response.responses:  # type: ignore[attr-defined]
            for data in topic.partitions:
                if data.records:
                    try:
                        collect_pointer_keys(data.records, shared)
                    except Exception:
                        # A run that uses a key this one should have written fails alone, below.
                        log.exception("replica fetch answer's keys unreadable", partition=data.partition_index)
        return shared

    def _apply(self, partition: Partition, data: Any, now: int, shared_keys: dict[int, bytes]) -> tuple[bool, bool]:
        """Apply one partition's answer: (its readable range moved, a leadership error)."""
        code = data.error_code
        if code == ErrorCode.none:
            diverging = data.diverging_epoch
            if diverging is not None and (diverging.epoch >= 0 or diverging.end_offset >= 0):
                partition.truncate_on_divergence(DivergingEpoch(diverging.epoch, diverging.end_offset), now)
                return True, False
            bounds = partition.log.read_bounds
            entries = partition.on_fetched(
                data.records or b"", data.high_watermark, data.log_start_offset, now, self._sent_ms, shared_keys
            )
            # Prefetching serves tail reads; a replica still catching up (a reassignment copying a
            # long pointer log) would pull every WAL object it points to.
            if entries and partition.log.log_end_offset >= data.high_watermark:
                try:
                    self.on_pointers(entries)
                except Exception:
                    # Best effort: the entries are appended, and a read fetches what was not
                    # prefetched. Its readers must still hear that the range moved.
                    log.exception("prefetch failed", topic=partition.topic, partition=partition.index)
            return partition.log.read_bounds != bounds, False
        if code == ErrorCode.offset_out_of_range and partition.log.log_end_offset < data.log_start_offset:
            partition.log.truncate_fully_and_start_at(data.log_start_offset, now)
            return True, False
        if code in (
            ErrorCode.not_leader_or_follower,
            ErrorCode.fenced_leader_epoch,
            ErrorCode.unknown_leader_epoch,
            ErrorCode.unknown_topic_or_partition,
            ErrorCode.unknown_topic_id,  # one of us has not seen the re-creation yet
        ):
            return False, True
        log.warning("replica fetch error", topic=partition.topic, partition=partition.index, error=code.name)
        return False, False

    def _handle(self, response: object) -> float:
        """Apply a fetch response; how long to pause before the next fetch (0: none): a moment when
        some partition reported a leadership problem, a backoff growing to a second while some
        answer cannot be applied (the leader would answer its repeated ask at once)."""
        now = _now_ms()
        leadership_errors = unapplied = False
        shared_keys = self._shared_keys(response)
        readable_moved = False  # a high watermark or last stable offset here moved
        for topic in response.responses:  # type: ignore[attr-defined]
            for data in topic.partitions:
                # The answer is about the incarnation it names, and only the replica that asked for
                # it takes it (never one that replaced it while the request was in flight).
                id_key = (_our_id(topic.topic_id), data.partition_index)
                asked = self._asked_by_id.get(id_key)
                if asked is None:
                    continue
                partition = self.partitions.get((asked.topic, asked.index))
                if partition is not asked or partition.role != FOLLOWER or partition.leader_id != self.leader_id:
                    continue
                # Only at the position asked from, as Kafka's fetcher checks the fetch offset and
                # leader epoch: leadership that went elsewhere and came back (a truncation between)
                # makes the answer about a log that is gone. ``_built`` is as the request was sent.
                built = self._built.get(id_key)
                if built is None or built[0][:2] != (partition.leader_epoch, partition.log.log_end_offset):
                    continue
                # Answered with an error (or a truncation) it heard nothing this round; answered
                # with data, on_fetched notes the round.
                partition.hear_through(self._contact, self._round + 1)
                try:
                    moved, leadership_error = self._apply(partition, data, now, shared_keys)
                except Exception:
                    # As Kafka's fetcher does with a corrupt answer (or a failed truncation): this
                    # partition takes nothing from it and asks again from where it was; the others
                    # go on. Raised out of here, it would end this fetcher's task, and with it
                    # replication from this leader, for good.
                    log.exception("replica fetch answer not applied", topic=asked.topic, partition=asked.index)
                    REPLICA_FETCH_UNAPPLIED.labels("partition").inc()
                    unapplied = True
                    continue
                readable_moved = readable_moved or moved
                leadership_errors = leadership_errors or leadership_error
        # The leader leaves out partitions with nothing new (broker/quiet_fetches.py): for those
        # the answer is news too, as of when the request was sent, and they hear it through our
        # contact (every asked partition listens to it) without a visit to each.
        self._contact.round = self._round
        self._contact.sent_ms = self._sent_ms
        # Only readers of this broker's replicas wait on what a follower appends, and they read up
        # to the high watermark: records it does not cover yet are no news to them.
        if readable_moved:
            self.on_progress()
        self._unapplied_pause = min(max(self._unapplied_pause * 2, 0.05), 1.0) if unapplied else 0.0
        return max(self._unapplied_pause, 0.1 if leadership_errors else 0.0)


def _wire_id(topic_id: str) -> uuid.UUID:
    """A replica's topic id as Fetch carries it; a replica without one asks for the zero id,
    which no leader knows (UNKNOWN_TOPIC_ID)."""
    return uuid.UUID(topic_id) if topic_id else uuid.UUID(int=0)


def _our_id(wire: uuid.UUID | None) -> str:
    """The form metadata and replicas keep topic ids in."""
    return str(wire) if wire is not None and wire.int != 0 else ""

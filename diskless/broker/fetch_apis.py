"""Fetch, ListOffsets and OffsetForLeaderEpoch: reading partitions, classic and diskless, from a
leader, a follower (KIP-392 / zone-aligned reads) or, for a broker with no replica of a diskless
partition, pointers from the leader and data from object storage."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import structlog
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13.request import FetchTopic as _FETCH_TOPIC

from diskless.cluster.metadata import PartitionState
from diskless.cluster.zones import zone_aligned_leader
from diskless.fetch.lagging_reads import RemotePart, TieredRead, admit, at_tail, cold_reads
from diskless.fetch.tier_reader import TierReader
from diskless.log.partition_log import TIERED, OffsetMovedToTiered, OffsetOutOfRange, PartitionLog
from diskless.log.segment import POINTERS, RECORDS
from diskless.metrics import (
    DISKLESS_FOLLOWER_READS,
    DISKLESS_LAGGING_BYTES,
    DISKLESS_LAGGING_DEFERRED,
    FETCH_IDLE_PARTITIONS,
    FETCH_SESSIONS,
    REPLICA_FETCH_PARTITIONS,
    REPLICA_FETCHES,
    child,
)
from diskless.protocol import internal, records
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError
from diskless.replication.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchSession,
    FetchSessionCache,
)
from diskless.replication.follower_reads import (
    FORWARD,
    OUT_OF_RANGE,
    SERVE,
    FollowerView,
    ReadDecision,
    earliest_offset,
    follower_read,
    is_fresh,
    max_staleness_ms,
)
from diskless.replication.partition import SHARED_KEYS_FETCHER, Partition, wrap_pointers
from diskless.storage import pointer, segment_object

from .api_base import (
    EARLIEST,
    EARLIEST_LOCAL,
    EPOCH_ERRORS,
    LATEST,
    LATEST_TIERED,
    MAX_TIMESTAMP,
    READ_COMMITTED,
    ApiFamily,
    _answered,
    _ms,
    forwarded_by_broker,
)
from .client_zone import current_client_az
from .idle_fetches import CURRENT_IDLE_FETCHES, IdleFetchMemo
from .quiet_fetches import QuietReplicaFetches

log = structlog.get_logger(__name__)

_SERVE = ReadDecision(SERVE)


def _pointers_within(data: bytes, room: int, min_one: bool) -> bytes:
    """The leading pointer entries whose batches fit in ``room`` bytes (at least one if ``min_one``)."""
    pos = used = 0
    while pos < len(data):
        size = pointer.entry_header_at(data, pos).size
        if used + size > room and not (min_one and pos == 0):
            break
        used += size
        pos += pointer.pointer_entry_size(data, pos)
    return data[:pos]


def _batches_within(data: bytes, room: int, min_one: bool) -> bytes:
    """The leading record batches of ``data`` that fit in ``room`` bytes (at least one if ``min_one``)."""
    if len(data) <= room:
        return data
    pos = 0
    while pos < len(data):
        size = records.peek_offset_and_size(data, pos)[1]
        if pos + size > room and not (min_one and pos == 0):
            break
        pos += size
    return data[:pos]


def _in_request_order(
    reads: list[tuple[dict[str, Any], int]],
    remote: list[tuple[dict[str, Any], bytes]],
    answers: dict[int, tuple[Any, bytes]],
    max_bytes: int,
) -> tuple[list[tuple[dict[str, Any], bytes]], int]:
    """A consumer fetch's reads, local and through leaders, cut to the response's ``max_bytes`` in
    request order, as Kafka's ReplicaManager.readFromLog hands it out: the first partition with
    data keeps at least one batch, however big (KIP-74); every later one gets what is left, within
    the limit it was read with (at most its partition_max_bytes), down to no batch at all (its
    answer keeps the partition's offsets). Clients rotate the order of their partitions between
    fetches, so none starves, wherever it is read.

    ``reads`` are the partitions with data and those read through their leaders, in request order,
    with the limit each was read with; ``remote`` the local reads to serve from object storage;
    ``answers`` the leaders' (``_fetch_from_leaders``). Returns what to serve from object storage,
    in request order, and the bytes of the response.

    Each read was planned with the room left by the local reads before it in request order, not
    by the partitions read through leaders (their answers were not in yet), so cutting is all it
    takes, but for one case: a local read before it cut by more than a partition read through its
    leader ahead of both took (its batches do not split) leaves it less than Kafka would. The
    response is then smaller than Kafka's, never over its limits; the next fetches, in another
    order, catch up."""
    local = {id(entry): raw for entry, raw in remote}
    served: list[tuple[dict[str, Any], bytes]] = []
    total = 0
    for entry, limit in reads:
        first = total == 0
        room = min(limit, max(max_bytes - total, 0))
        key = id(entry)
        if key in answers:
            kind, data = answers[key]
        elif key in local:
            data = local[key]
            kind = TIERED if isinstance(data, TieredRead) else POINTERS
        else:
            kind, data = RECORDS, entry["records"]
        size = 0
        if kind == TIERED and data:
            d = msgpack.unpackb(data)
            d["max_bytes"], d["min_one"] = min(int(d["max_bytes"]), room), first
            if d["max_bytes"] > 0 or first:
                tiered = TieredRead(msgpack.packb(d))
                served.append((entry, tiered))
                size = tiered.size
        elif kind == POINTERS and data:
            data = _pointers_within(data, room, first)
            if data:
                served.append((entry, data))
                size = pointer.served_size(data)
        elif data:
            entry["records"] = _batches_within(data, room, first)
            size = len(entry["records"])
        if size == 0 and entry["aborted_transactions"]:
            entry["aborted_transactions"] = []  # no records: no transactions to drop from them
        total += size
    return served, total


@dataclass(frozen=True, slots=True)
class NamedFetchTopic:
    """A topic of a Fetch v13+ request (named by id) with the name its id has here now."""

    topic: str
    topic_id: uuid.UUID
    partitions: tuple[Any, ...]


class FetchApis(ApiFamily):
    """Read-side APIs."""

    @functools.cached_property
    def _quiet(self) -> QuietReplicaFetches:
        return QuietReplicaFetches(
            lambda topic, partition, epoch: self._leader_log(topic, partition, epoch),
            self.broker.on_follower_fetch,
            lambda: self.broker.replicas.partitions,
        )

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_FETCH: self.fetch,
            m.API_LIST_OFFSETS: self.list_offsets,
            m.API_OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
        }

    @functools.cached_property
    def _sessions(self) -> FetchSessionCache:
        return FetchSessionCache(self.broker.config.max_incremental_fetch_session_cache_slots)

    async def fetch(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        # A follower reads shared-key pointer runs when its client id says so (partition.py).
        shares_keys = getattr(request, "replica_id", -1) >= 0 and (header.client_id or "").endswith(SHARED_KEYS_FETCHER)
        # Topics named by id from v13 (KIP-516).
        return await self._fetch(request, by_id=header.api_version >= 13, shares_keys=shares_keys)

    async def replica_fetch(self, request: Any) -> dict[str, Any]:
        """A follower's fetch in the compact form (``protocol/replica_fetch_wire.py``): a Fetch v13
        request from a follower that reads shared-key pointer runs."""
        if request.replica_id < 0:  # only followers fetch this way
            return _refused(ErrorCode.invalid_request)
        return await self._fetch(request, by_id=True, shares_keys=True)

    async def _fetch(self, request: Any, by_id: bool, shares_keys: bool) -> dict[str, Any]:
        session_id = getattr(request, "session_id", 0)
        session_epoch = getattr(request, "session_epoch", -1)
        follower = getattr(request, "replica_id", -1)
        answer_session = 0
        session: FetchSession | None = None
        if follower >= 0 and session_epoch == INITIAL_EPOCH:
            # A follower starting over may have lost our last answers: its full fetch hears all.
            self._quiet.forget_follower(follower)
        if follower >= 0 and by_id:
            # Replica fetches get KIP-227 sessions: an incremental fetch names only the partitions
            # that moved, and is served as the session's whole set (replication/fetch_session.py).
            context = self._sessions.context(
                follower,
                session_id,
                session_epoch,
                ((t.topic_id, t.partitions) for t in request.topics),
                ((t.topic_id, t.partitions) for t in getattr(request, "forgotten_topics_data", ())),
                self.broker.now_ms(),
            )
            FETCH_SESSIONS.set(len(self._sessions))
            kind = "full" if session_epoch in (0, -1) else "incremental"
            child(REPLICA_FETCHES, kind).inc()
            child(REPLICA_FETCH_PARTITIONS, kind).inc(sum(len(t.partitions) for t in request.topics))
            if context.error != ErrorCode.none:
                return _refused(context.error)
            session = context.session
            if session is not None:
                answer_session = session.session_id
        elif session_id != INVALID_SESSION_ID or session_epoch not in (INITIAL_EPOCH, FINAL_EPOCH):
            # Served sessionless (consumers are kept no sessions), session fields read as Kafka's
            # FetchManager reads them: a full fetch naming a session is served all the same.
            code = self._sessions.sessionless(follower, session_id, session_epoch)
            if code != ErrorCode.none:
                return _refused(code)
        cap = self.broker.config.fetch_max_bytes
        if follower < 0 and getattr(request, "max_bytes", 2**31 - 1) > cap:
            # fetch.max.bytes: the batches of a response are held in memory while it is built.
            request = dataclasses.replace(request, max_bytes=cap)
        max_wait_ms = _ms(request.max_wait)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            if session is not None:
                # The session's partitions without a quiet mark, afresh each round: a change while
                # the fetch was parked dropped the mark of the partition it concerned.
                self._quiet.verify_if_due(session, self.broker.now_ms())
                request = dataclasses.replace(
                    request, topics=tuple(_FETCH_TOPIC(topic_id=t, partitions=parts) for t, parts in session.topics())
                )
            # Ids are resolved afresh each round: a topic re-created during a long poll is another topic.
            named, unknown = self._topics_by_name(request) if by_id else (request, [])
            # A follower is answered only for partitions with news (see quiet_fetches).
            if session is not None:
                asked = self._quiet.needing_answer_in_session(named, session, follower, self.broker.now_ms())
            elif follower >= 0:
                asked = self._quiet.needing_answer(named, follower, self.broker.now_ms())
            else:
                asked = named
            # Per pass: an answer's runs may refer to keys written in other runs of that answer only.
            responses, total, has_error, remote, forwards, reads = self._fetch_once(asked, {} if shares_keys else None)
            has_error = has_error or bool(unknown)
            if forwards:
                answers, forward_error = await self._fetch_from_leaders(forwards)
                # The response's max_bytes is handed out in request order, local and forwarded alike.
                remote, total = _in_request_order(reads, remote, answers, getattr(request, "max_bytes", 2**31 - 1))
                has_error = has_error or forward_error  # answered at once, as Kafka's DelayedFetch
            remaining = deadline - time.monotonic()
            if total >= request.min_bytes or has_error or remaining <= 0 or (total > 0 and request.min_bytes <= 1):
                if remote:
                    await self._serve_pointers(remote, total, deadline)
                if follower >= 0:
                    self._quiet.answered(asked, follower, self.broker.now_ms())
                if by_id:
                    ids = {topic.topic: topic.topic_id for topic in asked.topics}
                    if session is not None and reads:
                        read = {id(entry) for entry, _limit in reads}
                        session.to_the_end(
                            (ids[r["topic"]], p["partition_index"])
                            for r in responses
                            for p in r["partitions"]
                            if id(p) in read
                        )
                    responses = [{**r, "topic_id": ids[r["topic"]]} for r in responses] + unknown
                return {
                    "throttle_time": 0,
                    "error_code": ErrorCode.none,
                    "session_id": answer_session,
                    "responses": responses,
                }
            # Partitions read through their leader get no local wake-up: poll them at a short interval.
            await self.broker.replicas.wait_for_append(
                min(remaining, 0.1) if forwards else remaining, readable_only=follower < 0
            )

    def _topics_by_name(self, request: Any) -> tuple[Any, list[dict[str, Any]]]:
        """A Fetch v13+ request as the handler reads it (topics by the name their id has here now),
        and the answers to topics whose id is not a current topic here: UNKNOWN_TOPIC_ID. A leader
        that has not seen a topic's re-creation (or whose follower has not) thus never serves one
        incarnation's log to a replica of another."""
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        named: list[NamedFetchTopic] = []
        unknown: list[dict[str, Any]] = []
        for topic in request.topics:
            topic_id = topic.topic_id
            meta = self._meta.topic_by_id(str(topic_id)) if topic_id is not None and topic_id.int != 0 else None
            if meta is not None:
                named.append(NamedFetchTopic(meta.name, topic_id, tuple(topic.partitions)))
                continue
            parts = [_partition_answer(p.partition, ErrorCode.unknown_topic_id, committed) for p in topic.partitions]
            unknown.append({"topic_id": topic_id, "partitions": parts})
        return dataclasses.replace(request, topics=tuple(named)), unknown

    async def _fetch_from_leaders(
        self, forwards: list[tuple[dict[str, Any], str, int, int, int, int, int]]
    ) -> tuple[dict[int, tuple[Any, bytes]], bool]:
        """Diskless partitions with no replica here: pointers (metadata only) come from the leader,
        the data from object storage in this AZ. Returns each answered partition's read (its kind
        and data, by ``id`` of its answer), and whether some partition's answer is an error (the
        fetch is then answered at once).

        Every leader is asked at once, each for up to the limit its partition was planned with; the
        answers are then cut with the local reads, in request order, to the response's max_bytes
        (``_in_request_order``), before any data is read: what object storage sends back is held in
        memory until the answer is written."""
        answers: dict[int, tuple[Any, bytes]] = {}

        async def one(item: tuple[dict[str, Any], str, int, int, int, int, int]) -> None:
            entry, topic, partition, offset, limit, leader, leader_epoch = item
            meta = self._meta.topics.get(topic)
            if meta is None:  # deleted since the fetch was planned
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
                return
            # The id lets the leader refuse to answer from another incarnation of the name.
            body = {
                "topic": topic,
                "topic_id": meta.topic_id,
                "partition": partition,
                "offset": offset,
                "max_bytes": limit,
                "current_leader_epoch": leader_epoch,  # the consumer's, checked by the leader (KIP-320)
            }
            # The entry was built with a list of aborted transactions exactly when read_committed.
            committed = entry["aborted_transactions"] is not None
            body["read_committed"] = committed
            try:
                conn = await self.broker.peers.get(leader)
                answer = await conn.wait(conn.send_internal(internal.INTERNAL_FETCH_POINTERS, body), timeout=10)
            except (ClientError, OSError, TimeoutError):
                entry["error_code"] = ErrorCode.not_leader_or_follower
                return
            entry["error_code"] = ErrorCode(answer["error_code"])
            if entry["error_code"] == ErrorCode.unknown_topic_id:  # Fetch v4-12 names topics
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
            if committed and entry["error_code"] == ErrorCode.none and "last_stable_offset" not in answer:
                # A leader that does not bound reads by its LSO: never serve its data as committed.
                entry["error_code"] = ErrorCode.not_leader_or_follower
                return
            for field in ("high_watermark", "last_stable_offset", "log_start_offset"):
                entry[field] = answer.get(field, -1)
            if committed:
                entry["aborted_transactions"] = [
                    {"producer_id": pid, "first_offset": first} for pid, first in answer.get("aborted_transactions", [])
                ]
            answers[id(entry)] = (answer.get("kind"), answer.get("data", b""))

        await asyncio.gather(*(one(item) for item in forwards))
        errored = any(item[0]["error_code"] != ErrorCode.none for item in forwards)
        return answers, errored

    @staticmethod
    def _consumer_az(request: Any) -> str:
        """The AZ KIP-392 sends a consumer's fetches to: its connection's decided AZ (client.id,
        its rack, listener or address: cluster/client_az.py), only for Fetch v11+ (which carries
        ``preferred_read_replica``); its own rack outside a connection."""
        if not hasattr(request, "rack_id"):
            return ""
        return current_client_az() or request.rack_id or ""

    def _redirect_az(self, request: Any) -> str | None:
        """The AZ ``_zone_redirect`` may send this request's consumer to: its connection's decided
        AZ when that is not ours (Fetch v11+ only); None: every partition is served here."""
        az = current_client_az()
        return az if hasattr(request, "rack_id") and az and az != self.local_az else None

    def _zone_redirect(self, az: str, topic: str, index: int, state: PartitionState | None) -> int:
        """KIP-392 for diskless partitions: a consumer whose connection is decided to be in another
        AZ, ``az`` (it learnt its leaders from a broker that did not know its AZ yet: its rack comes
        only with its first Fetch) is sent to the broker its AZ's clients are shown, which serves it
        without crossing AZs. -1: serve it here."""
        if state is None or state.leader < 0:
            return -1
        target = zone_aligned_leader(state, topic, index, az, self._meta.brokers)
        info = self._meta.brokers.get(target)
        if target == self.broker.node_id or info is None or info.rack != az:
            return -1
        return target

    def _preferred_read_replica(self, replica: Partition | None, rack: str, fetch_offset: int) -> int:
        """KIP-392 for classic topics: a consumer that sent its rack is sent to an in-sync replica
        there that holds its fetch offset (diskless topics: ``_zone_redirect``). One that does not
        (its own retention ran ahead, or it has not fetched up to there) would answer
        OFFSET_OUT_OF_RANGE and the consumer would come back here, to be sent there again."""
        state = replica.leader_state if replica is not None else None
        if not rack or replica is None or state is None or rack == self.local_az:
            return -1
        for node_id in replica.isr:
            info = self._meta.brokers.get(node_id)
            if (
                node_id != self.broker.node_id
                and info is not None
                and info.rack == rack
                and state.holds_offset(node_id, fetch_offset)
            ):
                return node_id
        return -1

    async def _serve_pointers(self, remote: list[tuple[dict[str, Any], bytes]], total: int, deadline: float) -> None:
        """Replace pointer entries by the batches they point to (cache, else ranged GETs; the
        partitions of one response read each WAL object once, see ``batches_of_partitions``).
        ``total`` is the response's size, ``deadline`` its max wait (monotonic seconds)."""
        reader = self.broker.wal_reader
        # Each partition's pointers parsed once, for the quota's decision and for serving.
        parts: list[RemotePart] = [
            (entry, raw if isinstance(raw, TieredRead) else pointer.iter_entries(raw)) for entry, raw in remote
        ]
        parts = await self._within_lagging_quota(parts, total, deadline)

        async def tiered(entry: dict[str, Any], raw: TieredRead) -> None:
            try:
                entry["records"] = await self._tier_reader().read(bytes(raw))
            except Exception as exc:
                log.warning("serving tiered batches failed", error=str(exc))
                entry["error_code"] = ErrorCode.kafka_storage_error

        async def pointed() -> None:
            parsed = [(entry, entries) for entry, entries in parts if not isinstance(entries, TieredRead)]
            groups = [[e for e in entries if isinstance(e, pointer.PointerEntry)] for _, entries in parsed]
            if reader is None or not any(groups):
                results: list[list[bytes] | Exception] = [[] for _ in groups]
            else:
                now_ms = self.broker.now_ms()
                tail = [at_tail(entry, entries, now_ms) for entry, entries in parsed]
                results = await reader.batches_of_partitions(groups, tail)
            for (entry, entries), served in zip(parsed, results, strict=True):
                if isinstance(served, Exception):
                    log.warning("serving diskless batches failed", error=str(served))
                    entry["error_code"] = ErrorCode.kafka_storage_error
                    continue
                # Inline entries (transaction markers) are served from the log itself, in place.
                batches = iter(served)
                entry["records"] = b"".join(
                    e.batch if isinstance(e, pointer.InlineEntry) else next(batches) for e in entries
                )

        await asyncio.gather(pointed(), *(tiered(entry, raw) for entry, raw in parts if isinstance(raw, TieredRead)))

    async def _within_lagging_quota(self, parts: list[RemotePart], total: int, deadline: float) -> list[RemotePart]:
        """The partitions to serve now, and how much of each, under
        ``diskless.fetch.lagging.max.bytes.per.second`` (``fetch/lagging_reads.py`` decides which
        reads are cold and cuts them to the allowance).

        Over the quota, a response that has other data is answered now without the cold
        partitions' batches (their consumer asks again from the same offset); a response of cold
        partitions only waits for the quota, up to its max wait, as Kafka delays a fetch over its
        remote-read quota. Admitted bytes are charged at once, so fetches waking together do not
        all pass on the same refill."""
        reader = self.broker.wal_reader
        if reader is None or not self.broker.lagging_read_quota.limited:
            return parts
        quota = self.broker.lagging_read_quota
        cold = cold_reads(parts, reader.read_cost, self.broker.now_ms())
        if not cold.indices:
            return parts
        wait_ms = quota.wait_ms(self.broker.monotonic_ms())
        if wait_ms > 0 and total - cold.served_bytes <= 0:
            # Nothing else to answer with: wait for the quota as long as the fetch may wait.
            while wait_ms > 0 and (left := deadline - time.monotonic()) > 0:
                await asyncio.sleep(min(wait_ms / 1000.0, left))
                wait_ms = quota.wait_ms(self.broker.monotonic_ms())
        if wait_ms > 0:
            DISKLESS_LAGGING_DEFERRED.inc(len(cold.indices))
            deferred = set(cold.indices)
            for i in cold.indices:
                entry = parts[i][0]
                entry["records"] = b""
                if entry.get("aborted_transactions"):
                    entry["aborted_transactions"] = []
            return [part for i, part in enumerate(parts) if i not in deferred]
        charged = admit(parts, cold.indices, quota.allowance(self.broker.monotonic_ms()), reader.read_cost)
        quota.record(charged, self.broker.monotonic_ms())
        DISKLESS_LAGGING_BYTES.inc(charged)
        return parts

    def _tier_reader(self) -> TierReader:
        """Segment objects are read in the cache-miss lane (``WalReader.miss_store``) and share the
        WAL objects' cache."""
        reader = getattr(self, "_tiers", None)
        if reader is None:
            wal_reader = self.broker.wal_reader
            if wal_reader is None:
                raise RuntimeError("no object storage configured")
            reader = self._tiers = TierReader(wal_reader.miss_store, wal_reader.cache)
        return reader

    def _fetch_once(
        self, request: Any, shared_keys: dict[str, int] | None = None
    ) -> tuple[
        list[dict[str, Any]],
        int,
        bool,
        list[tuple[dict[str, Any], bytes]],
        list[tuple[dict[str, Any], str, int, int, int, int, int]],
        list[tuple[dict[str, Any], int]],
    ]:
        """One pass over a fetch's partitions: their answers, in request order (by topic, then
        partition), the bytes read, whether one needs answering at once, the reads to serve from
        object storage (``remote``), the partitions to read through their leaders (``forwards``),
        and every partition with data or read through its leader with the limit it was read with,
        in request order (``reads``: for ``_in_request_order``)."""
        max_bytes = getattr(request, "max_bytes", 2**31 - 1)
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        follower = getattr(request, "replica_id", -1)
        total = 0
        has_error = False
        responses = []
        remote: list[tuple[dict[str, Any], bytes]] = []
        forwards: list[tuple[dict[str, Any], str, int, int, int, int, int]] = []
        reads: list[tuple[dict[str, Any], int]] = []
        # A sessionless consumer names every partition it reads in every Fetch: what does not
        # depend on the partition is found once per round, not once per partition.
        now_ms = self.broker.now_ms()
        fenced = self._leader_fenced()
        routes: collections.Counter[str] = collections.Counter()
        staleness_ms = self._max_staleness_ms
        memo = self._idle_memo(request, committed, fenced, now_ms) if follower < 0 else None
        asked = reused = reused_follower_reads = 0
        for topic in request.topics:
            parts = []
            meta = self._meta.topics.get(topic.topic)
            states = () if meta is None else meta.partitions
            diskless = meta is not None and self.broker.is_diskless(meta)
            # Consumers may read from any replica (KIP-392); followers serve up to the HW they know.
            any_replica = follower < 0
            rack = self._consumer_az(request) if follower < 0 and not diskless else ""
            redirect_az = self._redirect_az(request) if diskless and follower < 0 else None
            asked += len(topic.partitions)
            reusable = (
                memo.reuse_topic(topic.topic, topic.partitions, now_ms, staleness_ms)
                if memo is not None and meta is not None
                else None
            )
            for position, p in enumerate(topic.partitions):
                index = p.partition
                state = states[index] if 0 <= index < len(states) else None
                idle = reusable[position] if reusable is not None and state is not None else None
                if idle is not None:
                    parts.append(idle.answer)
                    reused += 1
                    reused_follower_reads += idle.follower_read
                    continue
                asked_epoch = getattr(p, "current_leader_epoch", -1)
                if meta is None or state is None:
                    code, plog, replica = ErrorCode.unknown_topic_or_partition, None, None
                else:
                    code, plog, replica = self._serving_replica(
                        topic.topic,
                        index,
                        meta.topic_id,
                        state,
                        asked_epoch,
                        any_replica,
                        fenced,
                    )
                entry = _partition_answer(index, code, committed)
                preferred = self._preferred_read_replica(replica, rack, p.fetch_offset) if rack else -1
                # A follower shown to its AZ's clients as the leader answers only what the leader would.
                view = (
                    replica.follower_view()
                    if diskless and follower < 0 and replica is not None and replica.leader_state is None
                    else None
                )
                route = self._follower_route(view, p.fetch_offset, now_ms, staleness_ms, routes)
                # A stale or future leader epoch (KIP-320) is the consumer's to hear, never forwarded.
                through_leader = code not in EPOCH_ERRORS and (
                    replica is None
                    or (route.action == FORWARD and state is not None and state.leader != self.broker.node_id)
                )
                redirect = -1 if redirect_az is None else self._zone_redirect(redirect_az, topic.topic, index, state)
                if redirect >= 0:
                    entry.update(error_code=ErrorCode.none, preferred_read_replica=redirect)
                    has_error = True  # answer now: the consumer moves to its own AZ's broker
                elif diskless and follower < 0 and through_leader and state is not None and state.leader >= 0:
                    limit = min(p.partition_max_bytes, max(max_bytes - total, 0))
                    forwards.append((entry, topic.topic, p.partition, p.fetch_offset, limit, state.leader, asked_epoch))
                    reads.append((entry, limit))
                    entry["error_code"] = ErrorCode.none
                elif route.action == OUT_OF_RANGE and plog is not None:
                    entry.update(
                        error_code=ErrorCode.offset_out_of_range,
                        high_watermark=plog.high_watermark,
                        last_stable_offset=plog.last_stable_offset,
                        log_start_offset=route.log_start_offset,
                    )
                elif preferred >= 0 and plog is not None:
                    entry.update(
                        preferred_read_replica=preferred,
                        high_watermark=plog.high_watermark,
                        last_stable_offset=plog.last_stable_offset,
                        log_start_offset=plog.log_start_offset,
                    )
                    has_error = True  # answer now: the consumer moves to the replica in its rack
                elif follower < 0 and plog is not None and _at_the_end(plog, p.fetch_offset, committed):
                    # A tail consumer's usual partition: nothing to read, only the offsets to tell.
                    entry["high_watermark"] = plog.high_watermark
                    entry["last_stable_offset"] = plog.last_stable_offset
                    entry["log_start_offset"] = plog.log_start_offset if view is None else earliest_offset(view)
                    if memo is not None and replica is not None:
                        memo.keep((topic.topic, index), p.fetch_offset, asked_epoch, replica, entry, view is not None)
                elif plog is not None and replica is not None:
                    limit = min(p.partition_max_bytes, max(max_bytes - total, 0))
                    # read_committed stops at the last stable offset (open transactions).
                    max_offset = plog.last_stable_offset if committed else None
                    diverging = None
                    allowance: int | None = None
                    if follower >= 0:
                        # A follower reads up to our log end and, by the offset it asks for, tells us its own.
                        max_offset = plog.log_end_offset
                        # leader.replication.throttled.rate: a replica joining by reassignment (operations.py).
                        allowance = self.broker.operations.replication_allowance(state, follower)
                        limit = limit if allowance is None else min(limit, allowance)
                        diverging = replica.diverging_epoch(getattr(p, "last_fetched_epoch", -1), p.fetch_offset)
                        if diverging is None and p.fetch_offset <= plog.log_end_offset:
                            log_start = getattr(p, "log_start_offset", -1)
                            self.broker.on_follower_fetch(replica, follower, p.fetch_offset, log_start)
                            if replica.news_for(follower):
                                has_error = True  # answer now: the follower serves reads by this HW and start
                    try:
                        if diverging is not None:
                            entry["diverging_epoch"] = {"epoch": diverging.epoch, "end_offset": diverging.end_offset}
                            has_error = True  # answer now: the follower must truncate before fetching on
                        elif allowance == 0:
                            pass  # throttled: nothing for this replica until the bucket refills
                        else:
                            # Replicas copy pointer entries; consumers read tiered ranges from segments.
                            result = plog.read(
                                p.fetch_offset, limit, max_offset=max_offset, min_one=total == 0, tiered=follower < 0
                            )
                            if result.records:
                                reads.append((entry, limit))
                            if result.kind == TIERED:
                                tiered = TieredRead(result.records)
                                remote.append((entry, tiered))
                                total += tiered.size
                            elif result.kind == POINTERS and follower >= 0:
                                entry["records"] = wrap_pointers(result.records, shared_keys)
                                total += len(result.records)
                            elif result.kind == POINTERS:
                                remote.append((entry, result.records))
                                total += pointer.served_size(result.records)
                            else:
                                entry["records"] = result.records
                                total += len(result.records)
                            if allowance is not None:
                                self.broker.operations.replication_served(len(result.records))
                            if committed and follower < 0 and result.records:
                                aborted = plog.txns.aborted_between(p.fetch_offset, plog.last_stable_offset)
                                entry["aborted_transactions"] = [
                                    {"producer_id": a.producer_id, "first_offset": a.first_offset} for a in aborted
                                ]
                    except OffsetMovedToTiered:
                        # A replica behind our pointer entries takes our tier state and resumes after it.
                        entry["records"] = plog.tier_state_for_replica()
                        total += len(entry["records"])
                    except OffsetOutOfRange:
                        entry["error_code"] = ErrorCode.offset_out_of_range
                    entry["high_watermark"] = plog.high_watermark
                    entry["last_stable_offset"] = plog.last_stable_offset
                    entry["log_start_offset"] = plog.log_start_offset
                    if view is not None:
                        entry["log_start_offset"] = earliest_offset(view)
                has_error = has_error or entry["error_code"] != ErrorCode.none
                parts.append(entry)
            responses.append({"topic": topic.topic, "partitions": parts})
        if memo is not None:
            child(FETCH_IDLE_PARTITIONS, "reused").inc(reused)
            child(FETCH_IDLE_PARTITIONS, "decided").inc(asked - reused)
        if reused_follower_reads:
            # A reused answer is the same decision again (idle_fetches.py): a follower serving.
            routes[SERVE] += reused_follower_reads
        for action, count in routes.items():
            DISKLESS_FOLLOWER_READS.labels(action).inc(count)
        return responses, total, has_error, remote, forwards, reads

    def _idle_memo(self, request: Any, committed: bool, fenced: bool, now_ms: int) -> IdleFetchMemo | None:
        """The connection's memo of idle partitions (idle_fetches.py), begun for this pass with
        the request-wide inputs of the serving decision; None: decide every partition afresh."""
        memo = CURRENT_IDLE_FETCHES.get()
        if memo is None or fenced:
            return None
        metadata = self._meta
        memo.begin(
            (
                metadata.generation,
                metadata.topology_generation,
                committed,
                self._consumer_az(request),
                self._redirect_az(request),
            ),
            now_ms,
        )
        return memo

    @property
    def _max_staleness_ms(self) -> int:
        config = self.broker.config
        return max_staleness_ms(config.replica_fetch_wait_max_ms, config.replica_lag_time_max_ms)

    @staticmethod
    def _follower_route(
        view: FollowerView | None, offset: int, now_ms: int, staleness_ms: int, routes: collections.Counter[str]
    ) -> ReadDecision:
        """How a consumer's fetch of a diskless partition at ``offset`` is answered when the replica
        here is a follower (``view``: follower_reads); SERVE for everything else (no ``view``).
        Counted in ``routes``."""
        if view is None:
            return _SERVE
        decision = follower_read(view, offset, now_ms, staleness_ms)
        routes[decision.action] += 1
        return decision

    def _stale_follower(self, diskless: bool, replica: Partition | None) -> bool:
        """A follower replica of a diskless partition unfit to answer reads itself (out of the ISR,
        or no word from its leader lately): it answers as a broker without a replica would."""
        if not diskless or replica is None or replica.leader_state is not None:
            return False
        return not is_fresh(replica.follower_view(), self.broker.now_ms(), self._max_staleness_ms)

    # --- ListOffsets / OffsetForLeaderEpoch ---------------------------------------------------

    async def list_offsets(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """ListOffsets. Of a diskless partition, a follower fit to answer reads answers too; a broker
        with no replica, or an unfit follower, forwards it to the leader with the consumer's
        current_leader_epoch, which the leader checks (KIP-320), as Fetch's FetchPointers.

        A request another broker forwarded (taking us for the leader) is answered by the leader
        only, NOT_LEADER_OR_FOLLOWER elsewhere, and never forwarded on: brokers whose metadata
        views disagree about the leader would otherwise pass it along a chain, or in a loop."""
        forwarded = forwarded_by_broker(header)
        topics = []
        forwards: dict[int, list[tuple[dict[str, Any], str, int, int, int]]] = {}
        duplicates = _duplicate_partitions(request)
        refused: set[tuple[str, int]] = set()
        for topic in request.topics:
            parts = []
            diskless = self._is_diskless(topic.name)
            for p in topic.partitions:
                # As Kafka's ReplicaManager.fetchOffset, before looking at the partition.
                key = (topic.name, p.partition_index)
                if key in duplicates:
                    # Kafka's answer is a map by partition: one INVALID_REQUEST entry for all mentions.
                    if key not in refused:
                        refused.add(key)
                        parts.append(_offsets_answer(p.partition_index, ErrorCode.invalid_request))
                    continue
                if _timestamp_unsupported(p.timestamp, header.api_version):
                    parts.append(_offsets_answer(p.partition_index, ErrorCode.unsupported_version))
                    continue
                asked_epoch = getattr(p, "current_leader_epoch", -1)
                code, plog, replica = self._leader_log(
                    topic.name, p.partition_index, asked_epoch, diskless and not forwarded
                )
                entry = _offsets_answer(p.partition_index, code)
                # A stale or future leader epoch (KIP-320) is the consumer's to hear, never forwarded.
                local = None if self._stale_follower(diskless, replica) else replica
                leader = (
                    None
                    if forwarded or code in EPOCH_ERRORS
                    else self._forward_target(topic.name, p.partition_index, diskless, local)
                )
                if leader is not None:
                    item = (entry, topic.name, p.partition_index, p.timestamp, asked_epoch)
                    forwards.setdefault(leader, []).append(item)
                elif plog is not None:
                    found = await self._offset_for(plog, p.timestamp, getattr(request, "isolation_level", 0) == 1)
                    follower_here = diskless and replica is not None and replica.leader_state is None
                    if found is not None and p.timestamp == EARLIEST and follower_here and replica is not None:
                        found = earliest_offset(replica.follower_view()), -1
                    # As Kafka's Partition.fetchOffsetForTimestamp: a new leader whose high watermark
                    # has not reached its epoch's start (the old leader's, which clients were told,
                    # was higher) answers OFFSET_NOT_AVAILABLE, retriable, rather than an end that
                    # went backwards, for LATEST and for a timestamp not found below it.
                    lagging = (
                        getattr(request, "replica_id", -1) < 0  # a consumer's, also forwarded for one
                        and replica is not None
                        and replica.leader_state is not None
                        and replica.leader_state.epoch_start_offset > plog.high_watermark
                    )
                    if lagging and p.timestamp != EARLIEST and (p.timestamp == LATEST or found is None):
                        entry["error_code"] = ErrorCode.offset_not_available
                    elif found is not None:
                        entry["offset"], entry["timestamp"] = found
                        leads = replica is not None and replica.leader_state is not None
                        entry["leader_epoch"] = (
                            replica.leader_epoch  # type: ignore[union-attr]
                            if leads and p.timestamp == LATEST
                            else plog.epochs.epoch_for_offset(found[0])
                        )
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        for leader, items in forwards.items():
            body = {
                "replica_id": -1,
                "isolation_level": getattr(request, "isolation_level", 0),
                "topics": [
                    {
                        "name": t,
                        # The consumer's epoch, checked by the leader (KIP-320).
                        "partitions": [{"partition_index": i, "timestamp": ts, "current_leader_epoch": epoch}],
                    }
                    for _, t, i, ts, epoch in items
                ],
            }
            answer = await self._forward(leader, m.API_LIST_OFFSETS, 7, body)
            for entry, topic_name, index, _, _ in items:
                found = _answered(entry, answer, topic_name, index)
                if found is None:
                    continue
                entry.update(
                    error_code=found.error_code,
                    timestamp=found.timestamp,
                    offset=found.offset,
                    leader_epoch=found.leader_epoch,
                )
        if header.api_version < 5:
            # OFFSET_NOT_AVAILABLE came with v5; older clients hear LEADER_NOT_AVAILABLE (retriable
            # for them too), as from Kafka's ReplicaManager.fetchOffset. Also a leader's answer to a
            # request forwarded at v7 for such a client.
            for topic_answer in topics:
                for entry in topic_answer["partitions"]:
                    if entry["error_code"] == ErrorCode.offset_not_available:
                        entry["error_code"] = ErrorCode.leader_not_available
        return {"throttle_time": 0, "topics": topics}

    async def _offset_for(self, plog: PartitionLog, timestamp: int, committed: bool = False) -> tuple[int, int] | None:
        if timestamp == LATEST:
            return (plog.last_stable_offset if committed else plog.high_watermark), -1
        if timestamp == EARLIEST:
            return plog.log_start_offset, -1
        hit = None
        if timestamp == MAX_TIMESTAMP:
            found = plog.batch_of_max_timestamp()
            tiered = [t.info for t in plog.tiers if plog.log_start_offset <= t.last_offset < plog.tiered_end]
            best = max(tiered, key=lambda info: info.max_timestamp, default=None)
            if best is not None and (
                found is None or best.max_timestamp >= found[1].max_timestamp or found[1].base_offset < plog.tiered_end
            ):
                # The earliest record with the largest timestamp is in a segment object.
                hit = await self._tiered_offset_for(plog, best.max_timestamp, only=best)
            elif found is not None:
                hit = plog.record_with_max_timestamp(await self.broker.batch_bytes(*found))
        else:
            # Tiered ranges first (their pointer entries may be gone), then the log's own entries.
            hit = await self._tiered_offset_for(plog, timestamp)
            # The first batch reaching the timestamp normally holds the answer; record timestamps
            # need not be monotonic, so keep going if it does not.
            for segment, location in [] if hit is not None else plog.batches_reaching(timestamp):
                hit = plog.first_record_reaching(await self.broker.batch_bytes(segment, location), timestamp)
                if hit is not None:
                    break
        # As Kafka's Partition.fetchOffsetForTimestamp: only an offset this isolation level may read
        # (below the last stable offset for read_committed, the high watermark otherwise).
        fetchable = plog.last_stable_offset if committed else plog.high_watermark
        return hit if hit is not None and hit[0] < fetchable else None

    async def _tiered_offset_for(
        self, plog: PartitionLog, timestamp: int, only: segment_object.SegmentInfo | None = None
    ) -> tuple[int, int] | None:
        """The first record at or after ``timestamp`` in the tiered ranges in effect (or in the
        ``only`` one), read from their segment objects a few MB at a time (only tiers whose max
        timestamp reaches it)."""
        for tier in list(plog.tiers):
            info = tier.info
            if only is not None and info != only:
                continue
            if info.last_offset >= plog.tiered_end or info.last_offset < plog.log_start_offset:
                continue
            if info.max_timestamp < timestamp:
                continue
            offset = max(info.base_offset, plog.log_start_offset)
            while offset <= info.last_offset:
                descriptor = {
                    "segment": info.to_dict(),
                    "offset": offset,
                    "max_bytes": 4 * 1024 * 1024,
                    "max_offset": plog.high_watermark,
                }
                data = await self._tier_reader().read(msgpack.packb(descriptor))
                if not data:
                    break
                for batch in segment_object.iter_batches(data):
                    header = records.parse_header(batch)
                    if header.max_timestamp >= timestamp and not header.is_control:
                        hit = plog.first_record_reaching(bytes(batch), timestamp)
                        if hit is not None:
                            return hit
                    offset = header.last_offset + 1
        return None

    async def offset_for_leader_epoch(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """The end offset of the client's leader epoch (KIP-320). For a diskless partition that a
        follower or a broker without a replica serves, the leader answers: a follower's log may end
        before the leader's, and its end offset for the current epoch would make the client
        truncate or reset. A request another broker forwarded is answered by the leader only."""
        from_client = not forwarded_by_broker(header)
        topics = []
        forwards: dict[int, list[tuple[dict[str, Any], str, Any]]] = {}
        for topic in request.topics:
            parts = []
            diskless = self._is_diskless(topic.topic)
            for p in topic.partitions:
                code, plog, replica = self._leader_log(
                    topic.topic, p.partition, getattr(p, "current_leader_epoch", -1), diskless and from_client
                )
                entry: dict[str, Any] = {
                    "error_code": code,
                    "partition": p.partition,
                    "leader_epoch": -1,
                    "end_offset": -1,
                }
                state = self._meta.partition(topic.topic, p.partition)
                leads_here = replica is not None and replica.leader_state is not None
                if (
                    diskless
                    and from_client
                    and not leads_here
                    and state is not None
                    and 0 <= state.leader != self.broker.node_id
                ):
                    forwards.setdefault(int(state.leader), []).append((entry, topic.topic, p))
                elif plog is not None:
                    entry["leader_epoch"], entry["end_offset"] = plog.epochs.end_offset_for(
                        p.leader_epoch, plog.log_end_offset
                    )
                parts.append(entry)
            topics.append({"topic": topic.topic, "partitions": parts})
        for leader, items in forwards.items():
            body = {
                "replica_id": -1,
                "topics": [
                    {
                        "topic": name,
                        "partitions": [
                            {
                                "partition": p.partition,
                                "current_leader_epoch": getattr(p, "current_leader_epoch", -1),
                                "leader_epoch": p.leader_epoch,
                            }
                        ],
                    }
                    for _, name, p in items
                ],
            }
            answer = await self._forward(leader, m.API_OFFSET_FOR_LEADER_EPOCH, 4, body)
            for entry, name, p in items:
                found = _answered(entry, answer, name, p.partition, "topic", "partition")
                if found is not None:
                    entry.update(
                        error_code=found.error_code, leader_epoch=found.leader_epoch, end_offset=found.end_offset
                    )
        return {"throttle_time": 0, "topics": topics}


# The first ListOffsets version that may carry each special timestamp (Kafka's
# ReplicaManager.timestampMinSupportedVersion): MAX_TIMESTAMP from v7 (KIP-734), EARLIEST_LOCAL
# (-4) from v8 (KIP-405), LATEST_TIERED (-5) from v9 (KIP-1005). We serve up to v7, so -4 and -5
# are always refused rather than looked up as timestamps (which found the first record).
_TIMESTAMP_MIN_VERSION = {LATEST: 0, EARLIEST: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}


def _duplicate_partitions(request: Any) -> set[tuple[str, int]]:
    """(topic, partition) named more than once in a ListOffsets request."""
    seen: set[tuple[str, int]] = set()
    duplicates: set[tuple[str, int]] = set()
    for topic in request.topics:
        for p in topic.partitions:
            key = (topic.name, p.partition_index)
            if key in seen:
                duplicates.add(key)
            seen.add(key)
    return duplicates


def _timestamp_unsupported(timestamp: int, version: int) -> bool:
    """A special (negative) ListOffsets timestamp that ``version`` does not have, or that no
    version has: Kafka answers its partition UNSUPPORTED_VERSION."""
    return timestamp < 0 and version < _TIMESTAMP_MIN_VERSION.get(timestamp, 1 << 15)


def _offsets_answer(index: int, code: ErrorCode) -> dict[str, Any]:
    """A ListOffsets answer for one partition with nothing found yet (Kafka's buildErrorResponse)."""
    return {"partition_index": index, "error_code": code, "timestamp": -1, "offset": -1, "leader_epoch": -1}


def _at_the_end(plog: PartitionLog, offset: int, committed: bool) -> bool:
    """A consumer's read at ``offset`` finds nothing yet: it is where reads stop (the high
    watermark, or the last stable offset for read_committed), within the log."""
    end = plog.last_stable_offset if committed else plog.high_watermark
    return offset == end and plog.log_start_offset <= offset <= plog.log_end_offset


def _partition_answer(index: int, code: ErrorCode, committed: bool) -> dict[str, Any]:
    """A Fetch answer for one partition with nothing read yet (filled in as it is served)."""
    return {
        "partition_index": index,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": [] if committed else None,
        "preferred_read_replica": -1,
        "records": b"",
    }


def _refused(code: ErrorCode) -> dict[str, Any]:
    """A Fetch answer refusing the whole request (its top-level error code, no partitions)."""
    return {"throttle_time": 0, "error_code": code, "session_id": 0, "responses": []}

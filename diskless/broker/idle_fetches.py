"""A connection's memo of its consumer's idle partitions: cheap sessionless Fetches at the tail.

librdkafka's consumers open no KIP-227 fetch sessions, so every Fetch names every partition the
consumer reads, and a tail consumer's Fetch finds nothing new in almost all of them. Working out
"nothing to read here" afresh is the full serving decision per partition (leadership and epoch,
zone redirect, KIP-392 preferred replica, a follower's freshness and log bounds): at 1,000
partitions ~5 ms of broker CPU per pass, and a long poll makes two passes per wake-up (one when
the request arrives, one when something moves). This memo keeps, per partition, the answer of the
last pass that found the partition idle at the end of its log, together with every input that
answer depended on; the next pass reuses it when those inputs are unchanged and recomputes it
otherwise. It is an optimisation only: no answer differs from what the full decision would give.

Why a reused answer is the full decision's answer. The full decision (``FetchApis._fetch_once``)
reaches the "idle at the end" branch from these inputs only:

- the request: the partition's fetch offset and current leader epoch, the isolation level, and
  the client's AZ and rack (redirects, preferred replicas). Offset and epoch are kept per entry;
  the rest is the memo's *context*, and a different context empties the memo;
- the cluster metadata (partition states, ISR, brokers, topic configs such as diskless.enabled,
  topic ids): ``ClusterMetadata.generation`` moves on every applied change; it is in the context;
- whether this broker is fenced as leader: checked once per pass, and a fenced pass reuses nothing;
- the replica: which object serves (a re-created topic or a dropped replica is another object, or
  none), its role, leader epoch and whether it leads; its log's high watermark, log end and log
  start; as a follower, the leader's log start it last heard of, and its freshness
  (``heard_from_leader_ms`` within the staleness bound, recomputed at every reuse with the time
  passed in). The last stable offset is a function of the high watermark and the transaction
  index, which changes only by appends, truncation and retention: the log end and start.

The request's inputs are compared at each reuse. The replica's are watched instead of compared
(replication/partition.py): every change to its role, epoch, leadership, log end, high watermark
or log start fires the watch the entry put on it, which drops the entry, and the next pass
decides that partition afresh. A dropped or re-created replica fires its watches as it goes.
Only what moves with time is checked at reuse: a follower's freshness, and the leader's log start
it last heard of. Every ``VERIFY_MS`` the entries are compared in full anyway; one whose inputs
moved without its watch firing is counted (``diskless_unwatched_changes_total``, a bug; stays 0)
and dropped. Concurrent fetches of one connection share the memo safely: a pass reads entries
and replaces them, synchronously.

Memory: one small entry per partition a connection's consumer reads, and a watch on its replica,
dropped with the connection (``close``); ``MAX_ENTRIES`` bounds a connection whose client asks
for ever new partitions.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diskless.metrics import UNWATCHED_CHANGES
from diskless.protocol.fetch_response import KeptPartitionAnswer
from diskless.replication.partition import VERIFY_MS, Partition

MAX_ENTRIES = 100_000

# The memo of the connection a handler is answering (set by ``server.Connection``, inherited by its
# handler tasks as ``client_zone.CURRENT_ZONE`` is); None outside a connection: no reuse.
CURRENT_IDLE_FETCHES: contextvars.ContextVar[IdleFetchMemo | None] = contextvars.ContextVar(
    "idle_fetches", default=None
)


@dataclass(slots=True)
class _Idle:
    """One partition's idle answer and the inputs it was decided from."""

    fetch_offset: int
    asked_epoch: int
    replica: Partition
    role: str
    leader_epoch: int
    leads: bool
    high_watermark: int
    log_end_offset: int
    log_start_offset: int
    leader_log_start_offset: int
    follower_read: bool  # a diskless follower's read (counted in diskless_follower_reads_total)
    # The partition's Fetch answer: read-only, shared by every pass that reuses it (a copy per
    # partition per pass was the memo's largest cost at 1,000 partitions; a change would raise
    # instead of leaking into later answers), and written to the wire once per Fetch version.
    answer: KeptPartitionAnswer


class IdleFetchMemo:
    """One connection's idle answers, by topic then partition, valid under one context."""

    def __init__(self) -> None:
        self._context: tuple[Any, ...] | None = None
        # topic -> partition -> entry: a pass looks a topic up once, then each partition by its
        # index alone (a (topic, index) key per partition was a tenth of the pass at 1,000).
        self._entries: dict[str, dict[int, _Idle]] = {}
        self._size = 0
        self._verified_ms = -1
        self._closed = False

    def __len__(self) -> int:
        return self._size

    def begin(self, context: tuple[Any, ...], now_ms: int) -> None:
        """Start a pass whose request-wide inputs are ``context``: entries decided under another
        are dropped. At most every ``VERIFY_MS`` (``now_ms``), every entry is compared in full."""
        if context != self._context:
            self._clear()
            self._context = context
            self._verified_ms = now_ms
        elif not 0 <= now_ms - self._verified_ms < VERIFY_MS:
            self._verified_ms = now_ms
            for topic, entries in list(self._entries.items()):
                for index, idle in list(entries.items()):
                    if not _holds(idle):
                        UNWATCHED_CHANGES.labels("consumer-fetch-memo").inc()
                        self._drop(topic, index)

    def close(self) -> None:
        """The connection closed: drop every entry and its watch, and keep none from now on (a
        handler of the connection may still be running)."""
        self._closed = True
        self._clear()

    def _clear(self) -> None:
        for entries in self._entries.values():
            for idle in entries.values():
                idle.replica.unwatch(self)
        self._entries.clear()
        self._size = 0

    def _drop(self, topic: str, index: int) -> None:
        entries = self._entries.get(topic)
        idle = entries.pop(index, None) if entries is not None else None
        if idle is not None:
            self._size -= 1
            idle.replica.unwatch(self)

    def reuse_topic(self, topic: str, partitions: Sequence[Any], now_ms: int, staleness_ms: int) -> list[_Idle | None]:
        """For each partition of a Fetch request's topic, in order (entries carrying ``partition``,
        ``fetch_offset`` and, from Fetch v9, ``current_leader_epoch``): the entry kept for it if the
        request asks the same of it and it is still fresh, else None. Its replica's inputs are
        unchanged while it is kept (its watch drops it). The entry's ``answer`` is read-only;
        ``follower_read``: it was a diskless follower's read (which metrics count as that decision
        again)."""
        entries = self._entries.get(topic)
        if not entries:
            return [None] * len(partitions)
        with_epoch = bool(partitions) and hasattr(partitions[0], "current_leader_epoch")
        out: list[_Idle | None] = []
        for p in partitions:
            idle = entries.get(p.partition)
            if (
                idle is None
                or p.fetch_offset != idle.fetch_offset
                or (p.current_leader_epoch if with_epoch else -1) != idle.asked_epoch
                or not (idle.leads or _fresh(idle, now_ms, staleness_ms))
            ):
                out.append(None)
            else:
                out.append(idle)
        return out

    def keep(
        self,
        key: tuple[str, int],
        fetch_offset: int,
        asked_epoch: int,
        replica: Partition,
        answer: dict[str, Any],
        follower_read: bool = False,
    ) -> None:
        """Remember that the full decision found ``key`` idle at ``fetch_offset``, answering ``answer``
        (a partition's Fetch answer with no records; kept as a read-only copy). ``follower_read``: it was a
        diskless follower's decision to serve, which a reuse counts again."""
        if self._closed:
            return
        topic, index = key
        entries = self._entries.get(topic)
        previous = entries.get(index) if entries is not None else None
        if previous is None and self._size >= MAX_ENTRIES:
            self._clear()
            entries = None
        if entries is None:
            entries = self._entries[topic] = {}
        if previous is None:
            self._size += 1
        elif previous.replica is not replica:
            previous.replica.unwatch(self)
        log = replica.log
        entries[index] = _Idle(
            fetch_offset,
            asked_epoch,
            replica,
            replica.role,
            replica.leader_epoch,
            replica.leader_state is not None,
            log.high_watermark,
            log.log_end_offset,
            log.log_start_offset,
            replica.leader_log_start_offset,
            follower_read,
            KeptPartitionAnswer(answer),
        )
        replica.watch(self, lambda: self._drop(topic, index))


def _fresh(idle: _Idle, now_ms: int, staleness_ms: int) -> bool:
    """A follower's entry: it heard from its leader lately, and of the same log start."""
    replica = idle.replica
    heard = replica.heard_from_leader_ms
    if heard < 0 or now_ms - heard > staleness_ms:
        return False
    return replica.leader_log_start_offset == idle.leader_log_start_offset


def _holds(idle: _Idle) -> bool:
    """Whether the replica's inputs of an entry are as they were when it was kept."""
    replica = idle.replica
    log = replica.log
    return (
        replica.role == idle.role
        and replica.leader_epoch == idle.leader_epoch
        and (replica.leader_state is not None) == idle.leads
        and log.high_watermark == idle.high_watermark
        and log.log_start_offset == idle.log_start_offset
        and log.log_end_offset == idle.log_end_offset
    )

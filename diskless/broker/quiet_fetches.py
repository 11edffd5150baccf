"""Replica fetches of quiet partitions: the leader answers only the partitions with news.

A sessionless replica fetch names every partition the follower follows from this leader, so
with thousands of partitions nearly all of them are idle, and reading, encoding and decoding each
of them twice a second kept a broker with 10,000 replicas busy with nothing else (its lease
expired). The leader leaves out of its answer every partition for which the follower would learn
nothing: no records to send, no divergence, no error, a high watermark the
follower was already sent, the same log start as the follower's and one it was already sent
(its own retention may have moved its start there while it never heard ours, which its reads
answer EARLIEST with: follower_reads). Its fetch offset still counts
(ISR upkeep), exactly as if the partition had been read. The follower takes the answer as news
from the leader for every partition it asked about (``ReplicaFetcher``), which is what it is:
as of when the request was sent, nothing changed for those partitions.

Sessionless, every partition is answered in full at least every ``REFRESH_MS`` anyway, so a
follower whose previous answer was lost on a broken connection learns the high watermark it missed.

In a KIP-227 fetch session (replication/fetch_session.py) a partition found quiet gets a
``QuietMark`` in the session and a watch on the replica (replication/partition.py). The session's
next fetches leave it out unchecked until the watch fires (any change to its log end, high
watermark, log start, leader epoch, ISR or role) or the follower's position moves, which drop the
mark: each fetch checks only the partitions without one. A quiet fetch changes nothing for a
marked partition but the follower's caught-up time, which the session's clock stands for
(``FollowerProgress.quiet_clock``). No refresh is needed inside a session: a lost answer breaks
its epoch and the follower starts over with a full fetch, which forgets what this follower was
answered before (``forget_follower``): it is answered in full.

Every ``VERIFY_MS`` a session's marks are checked against their partitions anyway (``holds``):
a mark that no longer holds is a change that fired no watch. It is counted
(``diskless_unwatched_changes_total``, which stays 0), logged and dropped, so such a bug costs
the follower at most that long a delay, never a partition left unreplicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.log.partition_log import PartitionLog
from diskless.metrics import UNWATCHED_CHANGES
from diskless.replication.fetch_session import FetchSession, SessionClock
from diskless.replication.leader_state import FollowerProgress, LeaderState
from diskless.replication.partition import VERIFY_MS, Partition

log = structlog.get_logger(__name__)

REFRESH_MS = 5_000


@dataclass(slots=True)
class FetchedPartition:
    """What the leader knows when a follower's fetch of one partition arrives.

    Not frozen: one is built per partition of every replica fetch, and a frozen dataclass sets
    each field through ``object.__setattr__`` (a third of the quiet check's cost at 1,000 partitions)."""

    error: bool  # not the leader, stale epoch, unknown partition
    fetch_offset: int
    follower_log_start: int
    diverging: bool
    log_end_offset: int
    log_start_offset: int
    high_watermark: int
    last_sent_hw: int  # the high watermark this follower was last sent; -1 never
    last_answered_ms: int  # when this partition was last answered to this follower; -1 never
    last_sent_log_start: int  # the log start this follower was last sent; -1 never


def is_quiet(p: FetchedPartition, now_ms: int) -> bool:
    """True when answering this partition would tell the follower nothing it does not know."""
    return (
        not p.error
        and not p.diverging
        and p.fetch_offset == p.log_end_offset
        and p.follower_log_start == p.log_start_offset
        and p.last_sent_hw >= p.high_watermark
        and p.last_sent_log_start >= p.log_start_offset  # its own start says nothing of what it heard
        and p.last_answered_ms >= 0
        and 0 <= now_ms - p.last_answered_ms < REFRESH_MS  # a clock stepping back refreshes too
    )


LeaderLog = Callable[[str, int, int], tuple[ErrorCode, PartitionLog | None, Partition | None]]


@dataclass(slots=True, eq=False)
class QuietMark:
    """What a partition looked like to the leader when it was found quiet for a follower's session
    (``clock``), whose watch on ``replica`` it is."""

    replica: Partition
    state: LeaderState
    isr: list[int]
    progress: FollowerProgress
    leader_epoch: int
    log_end_offset: int
    high_watermark: int
    log_start_offset: int
    clock: SessionClock

    def holds(self, replica: Partition | None) -> bool:
        """Whether the partition is still exactly as it was (``replica``: the one hosted now)."""
        if replica is not self.replica:
            return False
        state = self.state
        plog = replica.log
        return (
            replica.leader_state is state
            and state.isr is self.isr
            and state.maximal_isr is None
            and replica.leader_epoch == self.leader_epoch
            and plog.log_end_offset == self.log_end_offset
            and plog.high_watermark == self.high_watermark
            and plog.log_start_offset == self.log_start_offset
        )

    def release(self) -> None:
        """The mark is dropped: stop watching, and write the caught-up time the clock stood for."""
        clock = self.clock
        self.replica.unwatch(clock)
        progress = self.progress
        if progress.quiet_clock is clock:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, clock.ms)
            progress.quiet_clock = None


class QuietReplicaFetches:
    """Per-follower memory of answers, and the filtering of a replica fetch request by it."""

    def __init__(
        self,
        leader_log: LeaderLog,
        on_follower_fetch: Callable[[Partition, int, int, int], None],
        hosted: Callable[[], Mapping[tuple[str, int], Partition]] = dict,
    ) -> None:
        self.leader_log = leader_log
        self.on_follower_fetch = on_follower_fetch
        self.hosted = hosted  # the replicas hosted now by (topic, index), whatever their role
        self._answered: dict[tuple[int, str, int], tuple[int, int]] = {}  # -> (leader epoch, ms)

    def needing_answer(self, request: Any, follower: int, now_ms: int) -> Any:
        """``request`` with only the partitions the answer must include."""
        topics = []
        for topic in request.topics:
            keep = [p for p in topic.partitions if not self._quiet(topic.topic, p, follower, now_ms)]
            if keep:
                topics.append(dataclasses.replace(topic, partitions=tuple(keep)))
        return dataclasses.replace(request, topics=tuple(topics))

    def needing_answer_in_session(self, request: Any, session: FetchSession, follower: int, now_ms: int) -> Any:
        """``needing_answer`` for a fetch served from ``session``: ``request`` names the session's
        partitions without a quiet mark (``FetchSession.topics``, read after ``verify_if_due``).
        Those found quiet get one."""
        topics = []
        for topic in request.topics:
            keep = []
            for p in topic.partitions:
                if not self._quiet(topic.topic, p, follower, now_ms):
                    keep.append(p)
                elif not session.closed:
                    self._mark(topic.topic, topic.topic_id, p.partition, follower, session)
            if keep:
                topics.append(dataclasses.replace(topic, partitions=tuple(keep)))
        return dataclasses.replace(request, topics=tuple(topics))

    def verify_if_due(self, session: FetchSession, now_ms: int) -> None:
        """The safety net, every ``VERIFY_MS``: drop (and count) each mark of ``session`` whose
        partition changed without its watch firing."""
        if 0 <= now_ms - session.verified_ms < VERIFY_MS:
            return
        session.verified_ms = now_ms
        hosted = self.hosted()
        for key, mark in list(session.quiet.items()):
            if not isinstance(mark, QuietMark) or mark.holds(hosted.get((mark.replica.topic, mark.replica.index))):
                continue
            UNWATCHED_CHANGES.labels("fetch-session").inc()
            log.warning("a quiet partition changed unwatched", topic=mark.replica.topic, partition=mark.replica.index)
            session.unmark(key)

    def _mark(self, topic: str, topic_id: Any, index: int, follower: int, session: FetchSession) -> None:
        """Mark a partition just found quiet, for a follower in its ISR only (one out of it may
        rejoin on this very fetch, which the full check proposes)."""
        replica = self.hosted().get((topic, index))
        state = replica.leader_state if replica is not None else None
        if replica is None or state is None or follower not in state.isr or state.maximal_isr is not None:
            return
        progress = state.followers.get(follower)
        plog = replica.log
        if progress is None or progress.log_end_offset != plog.log_end_offset:
            return
        clock = session.clock
        mark = QuietMark(
            replica,
            state,
            state.isr,
            progress,
            replica.leader_epoch,
            plog.log_end_offset,
            plog.high_watermark,
            plog.log_start_offset,
            clock,
        )
        key = (topic_id, index)
        replica.watch(clock, lambda: session.unmark(key))
        progress.quiet_clock = clock
        session.mark(key, mark)

    def answered(self, request: Any, follower: int, now_ms: int) -> None:
        """The answer to ``request`` (as filtered) is going out: remember when, per partition."""
        for topic in request.topics:
            for p in topic.partitions:
                _code, _plog, replica = self.leader_log(topic.topic, p.partition, -1)
                if replica is not None:
                    self._answered[(follower, topic.topic, p.partition)] = (replica.leader_epoch, now_ms)

    def _quiet(self, topic: str, p: Any, follower: int, now_ms: int) -> bool:
        code, plog, replica = self.leader_log(topic, p.partition, getattr(p, "current_leader_epoch", -1))
        state = replica.leader_state if replica is not None else None
        if code != ErrorCode.none or plog is None or replica is None or state is None:
            return False
        diverging = replica.diverging_epoch(getattr(p, "last_fetched_epoch", -1), p.fetch_offset) is not None
        if not diverging and p.fetch_offset <= plog.log_end_offset:
            # The follower's fetch offset counts whether or not the partition is answered (ISR
            # upkeep, and it may advance the high watermark, which is then news to send).
            self.on_follower_fetch(replica, follower, p.fetch_offset, getattr(p, "log_start_offset", -1))
        progress = state.followers.get(follower)
        epoch, answered_ms = self._answered.get((follower, topic, p.partition), (-1, -1))
        view = FetchedPartition(
            error=False,
            fetch_offset=p.fetch_offset,
            follower_log_start=getattr(p, "log_start_offset", -1),
            diverging=diverging,
            log_end_offset=plog.log_end_offset,
            log_start_offset=plog.log_start_offset,
            high_watermark=plog.high_watermark,
            last_sent_hw=progress.last_sent_hw if progress is not None else -1,
            last_answered_ms=answered_ms if epoch == replica.leader_epoch else -1,
            last_sent_log_start=progress.last_sent_log_start if progress is not None else -1,
        )
        return is_quiet(view, now_ms)

    def forget_follower(self, follower: int) -> None:
        """``follower`` starts a fetch session afresh (KIP-227 epoch 0): the last answers it may
        have lost with its connection, so none of them counts as heard and its first fetch is
        answered in full (the high watermark it missed included), as Kafka answers a full fetch."""
        for key in [k for k in self._answered if k[0] == follower]:
            del self._answered[key]

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._answered if k[1] == topic]:
            del self._answered[key]

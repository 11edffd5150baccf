"""KIP-227 incremental fetch sessions for replica fetches, sans-IO: the leader's session cache and
the follower's session handler.

Without sessions a follower's fetch names every partition it follows from the leader, and the
leader decodes, checks and (before ``broker/quiet_fetches.py``) answers all of them twice a second
even when nothing moved: at thousands of partitions that was most of a broker's CPU. With a
session the first (full) fetch names every partition and the leader remembers them under a session
id; later (incremental) fetches carry only the partitions whose fetch position changed and the
ones to drop (``forgotten_topics_data``), and the answer only partitions with news (the quiet
filter already leaves out the rest, which the follower takes as "nothing changed").

Kafka's rules (FetchSession.java, FetchManager): ``session_epoch`` -1 is a sessionless full fetch
(closing ``session_id`` if given); 0 is a full fetch that closes ``session_id`` if given and opens
a new session (the answer carries its id, or 0 if the cache keeps no sessions); any other epoch is
an incremental fetch of an existing session, which must be the epoch the leader expects next
(INVALID_FETCH_SESSION_EPOCH otherwise; FETCH_SESSION_ID_NOT_FOUND for an unknown id). Each
incremental fetch moves the expected epoch on, so an answer lost on a broken connection makes the
follower's next fetch fail its epoch check: it starts over with a full fetch, and never takes an
omitted partition as news it did not get. Sessions are offered to replica fetches only (consumers
get session id 0, sessionless Kafka fetching). The cache holds at most
``max.incremental.fetch.session.cache.slots`` sessions, evicting the least recently used (Kafka
also protects young sessions from eviction; a follower fetches twice a second, so its session is
never the least recently used one for long).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0  # a full fetch opening a session
FINAL_EPOCH = -1  # a sessionless full fetch
_MAX_EPOCH = 2**31 - 1


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (Kafka's FetchMetadata.nextEpoch: wraps to 1, never back to 0)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _MAX_EPOCH else epoch + 1


# --- leader side -------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)  # by identity: it is the session's key among a partition's watches
class SessionClock:
    """When a session's follower last fetched: what its quiet partitions' ISR upkeep reads."""

    ms: int


class QuietMarkLike(Protocol):
    def release(self) -> None:
        """The mark is dropped: stop watching its partition, and hand back its ISR upkeep."""


@dataclass(slots=True)
class FetchSession:
    """One follower's session: the request entry of every partition it fetches, by topic id, and
    which of them are quiet (``broker/quiet_fetches.py``).

    A quiet partition is one the follower would learn nothing from; it stays quiet, unchecked,
    until its mark is dropped: by a change to the partition (its watch calls ``unmark``) or to the
    follower's position (``update``). Each fetch then checks only the partitions with no mark
    (``topics``), which in a steady cluster are the few that moved since the last fetch."""

    session_id: int
    follower: int
    epoch: int  # the epoch the next incremental fetch must carry
    clock: SessionClock
    partitions: dict[Any, dict[int, Any]] = field(default_factory=dict)  # topic id -> index -> entry
    # (topic id, index) -> the mark of a partition found quiet; its watch drops it on any change.
    quiet: dict[Any, QuietMarkLike] = field(default_factory=dict)
    # The partitions without a mark, as ``partitions``: what the next fetch must check.
    _unmarked: dict[Any, dict[int, Any]] = field(default_factory=dict)
    _topics: list[tuple[Any, tuple[Any, ...]]] | None = None  # _unmarked as request topics
    closed: bool = False  # out of the cache: marks no more partitions
    verified_ms: int = -1  # when every mark was last checked against the partition (the safety net)

    def update(
        self, topics: Iterable[tuple[Any, Iterable[Any]]], forgotten: Iterable[tuple[Any, Iterable[int]]]
    ) -> None:
        """Apply an incremental fetch: entries added or changed (each has ``.partition``), and
        (topic id, indexes) to drop."""
        for topic_id, entries in topics:
            for entry in entries:
                index = entry.partition
                self.partitions.setdefault(topic_id, {})[index] = entry
                self._release((topic_id, index))  # the follower's position moved
                self._unmarked.setdefault(topic_id, {})[index] = entry
                self._topics = None
        for topic_id, indexes in forgotten:
            parts = self.partitions.get(topic_id)
            if parts is None:
                continue
            unmarked = self._unmarked.get(topic_id, {})
            for index in indexes:
                self._release((topic_id, index))
                parts.pop(index, None)
                unmarked.pop(index, None)
                self._topics = None
            if not parts:
                del self.partitions[topic_id]
            if not unmarked:
                self._unmarked.pop(topic_id, None)

    def mark(self, key: tuple[Any, int], mark: QuietMarkLike) -> None:
        """The partition ``key`` was found quiet: leave it out of ``topics`` until ``unmark``."""
        topic_id, index = key
        unmarked = self._unmarked.get(topic_id)
        if unmarked is None or index not in unmarked:
            mark.release()  # forgotten meanwhile
            return
        self._release(key)
        self.quiet[key] = mark
        del unmarked[index]
        if not unmarked:
            del self._unmarked[topic_id]
        self._topics = None

    def unmark(self, key: tuple[Any, int]) -> None:
        """The partition ``key`` changed (its watch fired): check it again at the next fetch."""
        if self._release(key):
            topic_id, index = key
            entry = self.partitions.get(topic_id, {}).get(index)
            if entry is not None:
                self._unmarked.setdefault(topic_id, {})[index] = entry
                self._topics = None

    def to_the_end(self, keys: Iterable[tuple[Any, int]]) -> None:
        """The partitions ``keys`` were answered with records: move them (and their topics) to the
        end of the session's order, as Kafka's incremental fetch context moves a partition answered
        with records to the end of its session's list. The next fetch reads the others first, so
        under the answer's max_bytes a partition that keeps getting appends starves none of them
        (the follower's request names only the partitions that moved: the order is the session's)."""
        unmarked = self._unmarked
        for topic_id, index in keys:
            parts = unmarked.get(topic_id)
            if parts is None or index not in parts:
                continue
            parts[index] = parts.pop(index)
            unmarked[topic_id] = unmarked.pop(topic_id)
            self._topics = None

    def _release(self, key: tuple[Any, int]) -> bool:
        mark = self.quiet.pop(key, None)
        if mark is None:
            return False
        mark.release()
        return True

    def close(self) -> None:
        """The session left the cache: release every mark (their watches, their ISR upkeep)."""
        self.closed = True
        for key in list(self.quiet):
            self.unmark(key)

    def topics(self) -> list[tuple[Any, tuple[Any, ...]]]:
        """The partitions to check at this fetch, as (topic id, entries): every partition of the
        session but the quiet ones. Kept between fetches that change nothing."""
        if self._topics is None:
            self._topics = [(topic_id, tuple(parts.values())) for topic_id, parts in self._unmarked.items()]
        return self._topics

    def size(self) -> int:
        return sum(len(parts) for parts in self.partitions.values())


@dataclass(frozen=True, slots=True)
class SessionContext:
    """How to serve one fetch: an error (answered alone, session id 0), or the session to read
    (None: sessionless, the request's own partitions)."""

    error: ErrorCode = ErrorCode.none
    session: FetchSession | None = None


class FetchSessionCache:
    """The leader's sessions, bounded, least recently used evicted first."""

    def __init__(self, slots: int, new_id: Callable[[], int] | None = None) -> None:
        self.slots = slots
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()  # least recently used first
        self._by_follower: dict[int, int] = {}  # follower -> its session's id
        self._new_id = new_id or (lambda: random.randint(1, _MAX_EPOCH))

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    def context(
        self,
        follower: int,
        session_id: int,
        epoch: int,
        topics: Iterable[tuple[Any, Iterable[Any]]],
        forgotten: Iterable[tuple[Any, Iterable[int]]],
        now_ms: int,
    ) -> SessionContext:
        """Decide how to serve a fetch from ``follower`` (a replica id >= 0; consumers never come
        here) carrying ``session_id``/``epoch``, its topics and forgotten topics."""
        if epoch == FINAL_EPOCH:
            self.remove(session_id)
            return SessionContext()
        if epoch == INITIAL_EPOCH:
            self.remove(session_id)
            # A broker fetches from a leader through one fetcher, so a new session of the same
            # follower replaces the old one (a restarted follower never closes the session it had).
            self.remove(self._by_follower.get(follower, INVALID_SESSION_ID))
            if self.slots <= 0:
                return SessionContext()
            while len(self._sessions) >= self.slots:
                self.remove(next(iter(self._sessions)))
            new_id = self._new_id()
            while new_id == INVALID_SESSION_ID or new_id in self._sessions:
                new_id = self._new_id()
            session = FetchSession(new_id, follower, next_epoch(INITIAL_EPOCH), SessionClock(now_ms))
            session.update(topics, ())
            self._sessions[new_id] = session
            self._by_follower[follower] = new_id
            return SessionContext(session=session)
        session = self._sessions.get(session_id)
        # Another broker's session is not this follower's to use, whatever id it sends.
        if session is None or session.follower != follower:
            return SessionContext(error=ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            return SessionContext(error=ErrorCode.invalid_fetch_session_epoch)
        session.update(topics, forgotten)
        session.epoch = next_epoch(epoch)
        session.clock.ms = now_ms
        self._sessions.move_to_end(session_id)
        return SessionContext(session=session)

    def sessionless(self, follower: int, session_id: int, epoch: int) -> ErrorCode:
        """What a fetch served outside these sessions (a consumer's, ``follower`` -1, or a replica
        fetch below v13, which names topics) makes of its session fields, as Kafka's FetchManager.
        A full fetch (epoch 0 or -1) closes the session it names, if it is the fetcher's own, and is
        served sessionless: never an error. An incremental fetch cannot be served: its session is
        unknown (FETCH_SESSION_ID_NOT_FOUND, as for session id 0), at another epoch
        (INVALID_FETCH_SESSION_EPOCH), or was opened naming topics by id, which this request
        cannot (FETCH_SESSION_TOPIC_ID_ERROR)."""
        session = self._sessions.get(session_id)
        if session is not None and session.follower != follower:
            session = None  # another broker's session is not this fetcher's to use or close
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session is not None:
                self.remove(session_id)
            return ErrorCode.none
        if session is None:
            return ErrorCode.fetch_session_id_not_found
        if session.epoch != epoch:
            return ErrorCode.invalid_fetch_session_epoch
        return ErrorCode.fetch_session_topic_id_error

    def remove(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        # A fetch of this session may still be parked on the leader: closed, it marks nothing, so
        # it cannot take over partitions the follower's next session watches.
        session.close()
        if self._by_follower.get(session.follower) == session_id:
            del self._by_follower[session.follower]


# --- follower side -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """The next fetch request of a follower: session fields, the entries to send (keyed like the
    handler's input) and the keys to forget."""

    session_id: int
    epoch: int
    send: list[tuple[Any, Any]]
    forgotten: list[Any]

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class FetchSessionHandler:
    """A follower's side of its session with one leader (Kafka's FetchSessionHandler).

    ``build`` takes every partition to fetch as key -> (position, entry), the position being what
    the leader must know (fetch offset, epochs, log start, max bytes): a partition goes into an
    incremental request only when its position differs from the one the leader's session holds."""

    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._sent: dict[Any, Any] = {}  # key -> position, as the leader's session holds it
        self._pending: dict[Any, Any] | None = None  # what _sent becomes if the request in flight succeeds

    def build(self, wanted: Mapping[Any, tuple[Any, Any]], changed: Collection[Any] | None = None) -> FetchPlan:
        """``changed``: the only keys whose position may differ from the last build's (added,
        moved or gone), when the caller knows them; None compares every key."""
        if self.session_id == INVALID_SESSION_ID or self.epoch == INITIAL_EPOCH:
            self._pending = {key: position for key, (position, _entry) in wanted.items()}
            return FetchPlan(self.session_id, INITIAL_EPOCH, [(key, entry) for key, (_p, entry) in wanted.items()], [])
        sent = self._sent
        if changed is None:
            send = [(key, entry) for key, (position, entry) in wanted.items() if sent.get(key) != position]
            forgotten = [key for key in sent if key not in wanted]
        else:
            # Every other key was in the last request's plan or unchanged before it, and the last
            # request succeeded (a failed one makes this build a full fetch): the leader has it.
            send = [(key, wanted[key][1]) for key in changed if key in wanted and sent.get(key) != wanted[key][0]]
            forgotten = [key for key in changed if key not in wanted and key in sent]
        if send or forgotten:
            pending = dict(sent)
            for key in forgotten:
                del pending[key]
            for key, _entry in send:
                pending[key] = wanted[key][0]
            self._pending = pending
        else:
            self._pending = sent
        return FetchPlan(self.session_id, self.epoch, send, forgotten)

    def handle_response(self, error: ErrorCode, session_id: int) -> bool:
        """The answer to the last built request arrived; False if it is an error to start over from
        (the next request is full: any session error, or a top-level error)."""
        pending, self._pending = self._pending, None
        if error != ErrorCode.none or pending is None:
            self._start_over(error == ErrorCode.fetch_session_id_not_found)
            return False
        if self.epoch == INITIAL_EPOCH or self.session_id == INVALID_SESSION_ID:
            # Our full fetch's answer: a session was opened (id != 0) or the leader keeps none.
            self.session_id = session_id
            self.epoch = next_epoch(INITIAL_EPOCH) if session_id != INVALID_SESSION_ID else INITIAL_EPOCH
            self._sent = pending if session_id != INVALID_SESSION_ID else {}
            return True
        if session_id != self.session_id:  # not the session we fetched in: start over
            self._start_over(False)
            return False
        self._sent = pending
        self.epoch = next_epoch(self.epoch)
        return True

    def handle_error(self) -> None:
        """The request failed without an answer (connection lost): the leader may or may not have
        moved the session on, so the next fetch is full (closing the old session if it still exists)."""
        self._pending = None
        self._start_over(False)

    def _start_over(self, unknown_session: bool) -> None:
        if unknown_session:
            self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._sent = {}

"""Sans-IO core of the WAL file manager: decides which WAL objects are safe to delete.

The core performs no I/O and reads no clock. The service around it lists the bucket, reads
trailers, asks partition leaders whether they still reference an object, deletes objects, and
reports every result here together with the current wall-clock time ``now_ms`` (the same clock
the brokers use to stamp WAL keys, within the configured skew).

Life of an object in the core
=============================
1. *Learned*: from a representative's best-effort notice (key, size, partitions) or from a
   bucket listing (key, size). A listed object's partitions are unknown until its trailer is read
   (``trailers_needed`` / ``on_trailer``), a bounded page of reads per pass so that a backlog
   (a new instance facing a full bucket) never holds up checks and deletes of what is known.
   Keys that do not parse as WAL keys are *foreign*: they are counted, never checked, never
   deleted.
2. *In grace*: nothing happens until the object is older than ``grace_ms`` by the creation time
   in its key.
3. *Checking*: in *rounds*. A round asks the current leader of every partition in the object's
   partition set (``checks_due``) and is complete when every answer is in (``on_answers``).
   A complete round whose answers are all UNREFERENCED is a *confirmation*. Any REFERENCED or
   UNKNOWN answer discards every confirmation so far and the object is asked again after
   ``check_interval_ms``.
4. *Garbage*: the first confirmation completed at time ``c1``; a second complete round issued at
   or after ``c1 + confirm_ms`` is also all UNREFERENCED. ``deletable`` hands such keys out,
   ``on_deleted`` / ``on_delete_failed`` report the outcome.

Safety argument (DESIGN.md, safety rules 3-5)
=============================================
*No later commit can make an old object referenced.* A commit carries the object's creation
time ``created_ms`` (from the representative's clock, the same value as in the key), and a
leader accepts it only while ``leader_now - created_ms <= commit_timeout``. The leader's clock
is at most ``skew`` ahead of or behind the manager's, so every accepted commit was appended
while ``manager_now <= created_ms + commit_timeout + skew``. The representative's own skew
cancels out because leader and manager both judge the same ``created_ms``. The core asks
nothing before ``manager_now - created_ms > grace_ms``; with ``grace_ms > commit_timeout +
skew`` every commit that will ever exist for the object has already been appended to some
leader's log when the first question is asked. From then on references only disappear
(retention, DeleteRecords, truncation of uncommitted tails, tiering, topic deletion; rule 4).
A leader answers REFERENCED for its whole log from the log start, uncommitted tail included,
so an UNREFERENCED answer from the true leader of a partition after grace is final.

*Answers carry the leader epoch.* Leader epochs of a partition only grow, and a broker answers
with the epoch it leads at. The core keeps the highest epoch it has seen per partition, from the
service's metadata (``on_leader_epoch``, reported when asking and again when the answers arrive)
and from answers, and counts an answer from a lower epoch as UNKNOWN: a leader that has been
deposed (and whose log may lack commits its successor accepted) is overruled as soon as the
manager knows of its successor, whatever the timing. Brokers also fence themselves: one that
has not refreshed its etcd lease for the lease TTL stops answering as a leader (UNKNOWN) before
the controller can elect a successor, which bounds how long a deposed leader that does not know
it can answer at all. The confirmation delay below remains for what neither catches (the
service's own view lagging behind a failover it has not heard of).

*Why two confirmations, ``confirm_ms`` apart.* An UNREFERENCED answer can still be wrong for a
while: a deposed leader that has not noticed yet (within its lease), or a leadership view in the
service that lags, gets the question and answers from a log that lacks commits its successor
accepted before the timeout. Such a window is bounded (lease TTL plus metadata propagation) and
``confirm_ms`` must be at least as long. The first confirmation's answers were all computed no
later than ``c1``, when the core held the last of them (and not before grace); the second
round's answers were computed no earlier than its issue time, ``>= c1 + confirm_ms``. If one of
those still came from a deposed leader inside its window, that leader was deposed after ``c1``,
hence after grace, when no commit could be accepted any more: its log held every commit and its
answer was right. More generally the second round overrules any wrong UNREFERENCED that was
possible during the first one and lasts less than ``confirm_ms`` (a broker answering before its
log is loaded, a follower still holding a tail its new leader lacks). The price is ``confirm_ms``
more life for garbage. The timing argument needs every answer to be delivered at most once and
only to the core instance that asked (see ``on_answers``); the core never has two questions for
the same (object, partition) outstanding, so it attributes every answer exactly.

What the leaders must guarantee (the service maps their replies): UNREFERENCED only if no
pointer from the log start on, uncommitted tail included, points into the object; UNKNOWN when
not (or no longer sure to be) the leader, including a topic id or partition its own metadata
does not know (its view may lag a creation), while the log is loading, and on any error. A
deleted topic references nothing: the service answers UNREFERENCED for it, but only when it knows
the topic was deleted (``route_question``: absent from a linearizable read of the topics made
after the question was issued), not merely because its metadata view (which may lag behind a
topic or a partition created recently) lacks it; then the answer is UNKNOWN.

*Lost state is safe.* Deletion needs positive evidence gathered by this very instance: the
partition set (from a notice or the trailer, both written by the object's writer), and two
confirmations. A new core starts with no evidence and therefore deletes nothing until it has
gathered all of it again; forgetting an object (a complete scan that no longer lists it, a
vanished object) likewise only removes evidence. Nothing the core could have forgotten is ever
needed to stay safe, only to make progress.

*Unreadable trailers are never garbage.* An object under ``wal/`` with a parseable key whose
trailer cannot be read (corrupt footer, a newer format version written by upgraded brokers while
this manager is older) is quarantined: never checked, never deleted, counted in ``stats`` for an
operator. Treating it as garbage after grace would be unsafe: readers locate batches through
pointers (object, offset, size), not through the trailer, so a damaged or unknown trailer does
not mean nobody references the data, and without the partition list there is nobody to ask. A
new core (restart, upgrade) tries the trailer again. A trailer that cannot be *read* (forbidden,
throttled, timing out) is retried with a growing backoff and counted as quarantined after a few
failures; like an unreadable one it only ever delays its own object, never any other.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from diskless.storage.wal_format import parse_wal_object_key

__all__ = [
    "NO_EPOCH",
    "Answer",
    "LeaderView",
    "ManagerConfig",
    "PartitionRef",
    "WalManagerCore",
    "route_question",
]

NO_EPOCH = -1  # an answer that no leader gave (the service's own, from cluster metadata)


@dataclass(frozen=True, order=True, slots=True)
class PartitionRef:
    """One partition, as named in WAL trailers: topic id (canonical ``str(uuid)``) and index."""

    topic_id: str
    partition: int
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        # The canonical spelling matters for safety: a differently spelled topic id would be
        # asked about as an unknown ("gone") topic, which the service maps to UNREFERENCED.
        canonical = str(self.topic_id if isinstance(self.topic_id, UUID) else UUID(self.topic_id))
        if canonical != self.topic_id:
            object.__setattr__(self, "topic_id", canonical)
        if isinstance(self.partition, bool) or not isinstance(self.partition, int) or self.partition < 0:
            raise ValueError(f"partition {self.partition!r} must be a non-negative int")
        # Hashed millions of times (sets of partitions, answers): compute once.
        object.__setattr__(self, "_hash", hash((self.topic_id, self.partition)))

    def __hash__(self) -> int:
        return self._hash


class Answer(enum.IntEnum):
    """A partition's current leader about one WAL object."""

    UNREFERENCED = 0  # nothing in the leader's log (from log start, uncommitted tail included) points into it
    REFERENCED = 1
    UNKNOWN = 2  # the leader cannot answer (not leader any more, loading, RPC failed): blocks deletion


@dataclass(frozen=True, slots=True)
class LeaderView:
    """What the service's cluster metadata says about one partition: whom to ask, at which epoch."""

    leader: int  # broker id; -1 while the partition is offline
    epoch: int


def route_question(
    ref: PartitionRef, partitions: Sequence[LeaderView] | None, fresh_topic_ids: Container[str] | None
) -> LeaderView | Answer:
    """Whom to ask about ``ref``, or the answer the service can give itself.

    ``partitions`` is the topic's partition list in the service's metadata view, None when the
    view has no topic with that id. The view may lag: a topic or partition created recently is
    missing from it, and a missing topic is *deleted* (and so references nothing) only if a fresh,
    linearizable read of the topic ids (``fresh_topic_ids``, read after the question was issued)
    lacks it too. Topic ids are never reused and a topic cannot come back, so an id absent from a
    read made after the question was issued belongs to a topic that was deleted before the read:
    every commit it ever accepted is gone with it. Without such a read the answer is UNKNOWN.
    """
    if partitions is None:
        if fresh_topic_ids is None or ref.topic_id in fresh_topic_ids:
            return Answer.UNKNOWN  # our view lags a topic creation, or nothing fresh to judge by
        return Answer.UNREFERENCED
    if ref.partition >= len(partitions):
        return Answer.UNKNOWN  # our view lags partitions being added: partitions never shrink
    view = partitions[ref.partition]
    if view.leader < 0:
        return Answer.UNKNOWN  # an offline partition blocks deletion
    return view


@dataclass(frozen=True)
class ManagerConfig:
    grace_ms: int  # never ask about (hence never delete) an object younger than this; > commit timeout + skew
    confirm_ms: int  # second confirming round issued at least this long after the first completed
    check_interval_ms: int  # re-ask about a referenced/unknown object (and retry a failed delete) this often
    max_delete_batch: int = 1000  # keys per deletable() call (S3 DeleteObjects takes at most 1000)
    max_check_batch: int = 10_000  # (object, partition) questions per checks_due() call; whole objects only
    max_trailer_batch: int = 100  # trailer reads handed out per trailers_needed() call
    quarantine_after: int = 3  # failed trailer reads of one object before it counts as quarantined

    def __post_init__(self) -> None:
        if self.grace_ms <= 0 or self.confirm_ms < 0 or self.check_interval_ms <= 0:
            raise ValueError("grace_ms and check_interval_ms must be positive, confirm_ms non-negative")
        if self.max_delete_batch <= 0 or self.max_check_batch <= 0 or self.max_trailer_batch <= 0:
            raise ValueError("batch limits must be positive")
        if self.quarantine_after <= 0:
            raise ValueError("quarantine_after must be positive")

    def check_against(self, commit_timeout_ms: int, max_clock_skew_ms: int) -> None:
        """Raise ``ValueError`` unless the grace period outlasts every possible commit."""
        if self.grace_ms <= commit_timeout_ms + max_clock_skew_ms:
            raise ValueError(
                f"grace_ms={self.grace_ms} must exceed wal.commit.timeout.ms={commit_timeout_ms}"
                f" + clock skew {max_clock_skew_ms}"
            )


@dataclass(slots=True)
class _Object:
    key: str
    created_ms: int
    size: int
    first_seen_ms: int
    partitions: frozenset[PartitionRef] | None = None  # None: unknown until notice or trailer
    unreadable: bool = False  # quarantined: trailer unreadable and partitions unknown
    trailer_failures: int = 0  # trailer reads that failed (forbidden, timed out...) since learned
    # The round in progress, if any.
    round_issued_ms: int | None = None
    round_asked: frozenset[PartitionRef] = frozenset()
    round_pending: set[PartitionRef] | None = None  # the very set in WalManagerCore._outstanding
    round_clean: bool = True  # every answer so far in this round was UNREFERENCED
    confirmed_ms: int | None = None  # completion time of the first confirmation since the last reset
    next_check_ms: int = 0  # earliest issue time of the next round (or retry time of a failed delete)
    due_ms: int | None = None  # time under which the object currently sits in the check heap
    garbage: bool = False  # two confirmations: deletable (or deleting)


def _sort_key(p: PartitionRef) -> tuple[str, int]:
    return p.topic_id, p.partition


class WalManagerCore:
    """Decision state of the WAL file manager (one active instance, see module docstring)."""

    def __init__(self, config: ManagerConfig) -> None:
        self.config = config
        self._objects: dict[str, _Object] = {}
        self._foreign: dict[str, int] = {}  # key -> size; keys that are not WAL keys, never deleted
        self._foreign_seen: dict[str, int] = {}  # key -> first seen, for scan-based forgetting
        # Objects whose trailer is wanted -> earliest time to hand the read out (again); the heap
        # holds (due, key) and is lazily invalidated like the check heap. Ready keys are due at 0,
        # so they come out oldest key (= oldest object) first.
        self._needs_trailer: dict[str, int] = {}
        self._trailer_heap: list[tuple[int, str]] = []
        self._trailer_failures = 0
        self._quarantined: dict[str, None] = {}  # ordered set: trailer reads failed quarantine_after times
        # Highest leader epoch seen per partition (metadata or answers): older ones are deposed.
        self._max_epoch: dict[PartitionRef, int] = {}
        self._answers_deposed = 0
        # Questions asked and not answered yet, per key. Survives forgetting the object, so that a
        # relearned object never gets a second question for a pair whose answer is still coming.
        # The set is shared with the asking incarnation's _Object.round_pending.
        self._outstanding: dict[str, set[PartitionRef]] = {}
        self._check_heap: list[tuple[int, str]] = []  # (due_ms, key), lazily invalidated
        self._confirmed_once: set[str] = set()
        self._deletable: dict[str, None] = {}  # ordered set: garbage not handed out
        # Handed out by deletable(), outcome not reported yet: key -> when (last) handed out.
        self._deleting: dict[str, int] = {}
        self._bytes_known = 0
        self._deleted_objects = 0
        self._deleted_bytes = 0
        self._delete_failures = 0

    # --- learning objects ----------------------------------------------------------------------

    def on_notice(self, key: str, size: int, partitions: Iterable[PartitionRef], now_ms: int) -> None:
        """A representative's notice after its commits; may be lost, duplicated, late or early.

        ``partitions`` must be every partition with batches in the object (what its trailer
        lists), not only those whose commit succeeded. Arriving for an object that was already
        deleted, it just makes the core check it again (then delete a missing key, or forget it
        at the next scan): harmless.
        """
        obj = self._learn(key, size, now_ms)
        if obj is not None:
            self._add_partitions(obj, partitions, now_ms)

    def on_listed(self, key: str, size: int, now_ms: int) -> None:
        """A bucket listing shows ``key``. Unknown objects then need their trailer."""
        obj = self._learn(key, size, now_ms)
        if obj is not None and obj.partitions is None and not obj.unreadable and key not in self._needs_trailer:
            self._want_trailer(key, 0)

    def on_segment_listed(
        self, key: str, size: int, created_ms: int, partition: PartitionRef, hold_ms: int, now_ms: int
    ) -> None:
        """A listing shows tiered segment object ``key`` (diskless/storage/segment_object.py) of
        ``partition``, last written at ``created_ms`` (the store's clock).

        Segments follow the WAL objects' rule with their own timeout: a leader refuses a
        TierCommit of a segment written more than ``diskless.tier.commit.timeout.ms`` ago, and the
        service passes ``hold_ms`` so that nothing is asked before that timeout plus twice the
        skew (the writer's clock and the store's) has passed: ``grace_ms + hold_ms`` in all. The
        partition is in the key, so no trailer is read. A segment rewritten later (a rerun of the
        job puts the same key again) starts over with its new time: evidence about the older
        write says nothing about commits of the newer one."""
        obj = self._objects.get(key)
        effective = created_ms + max(0, hold_ms)
        if obj is not None and obj.created_ms < effective:
            self._forget(key)
            obj = None
        if obj is None:
            obj = _Object(key=key, created_ms=effective, size=size, first_seen_ms=now_ms)
            self._objects[key] = obj
            self._bytes_known += size
            self._add_partitions(obj, [partition], now_ms)

    def created_ms(self, key: str) -> int | None:
        """The creation time the core judges ``key`` by (for segments: write time plus hold)."""
        obj = self._objects.get(key)
        return None if obj is None else obj.created_ms

    def on_scan_complete(
        self, listed: Iterable[str], scanned_prefixes: Iterable[str], started_ms: int, now_ms: int
    ) -> None:
        """A listing of every key under each of ``scanned_prefixes`` finished.

        ``listed`` holds the keys it returned (the same keys the service passed to ``on_listed``
        while paging), ``started_ms`` is when the first LIST request was sent. Objects under a
        scanned prefix that the scan did not list and that the core learned before the scan
        started are gone (deleted by someone else, or a late notice for an object deleted long
        ago) and are forgotten. Objects first learned during the scan are kept: a notice can
        arrive for an object PUT after the listing passed its position. Forgetting only drops
        evidence, so it can never make the core delete something.
        """
        prefixes = tuple(scanned_prefixes)
        if not prefixes:
            return
        listed_set = listed if isinstance(listed, set | frozenset) else set(listed)
        for key in [k for k, o in self._objects.items() if o.first_seen_ms < started_ms and k.startswith(prefixes)]:
            if key not in listed_set:
                self._forget(key)
        for key in [k for k, seen in self._foreign_seen.items() if seen < started_ms and k.startswith(prefixes)]:
            if key not in listed_set:
                del self._foreign[key], self._foreign_seen[key]

    def trailers_needed(self, now_ms: int, limit: int | None = None) -> list[str]:
        """Hand out up to ``limit`` (at most ``max_trailer_batch``) listed objects whose partitions
        are unknown, oldest first: the service reads only their trailer.

        A bounded page, so that a backlog (a new instance facing a full bucket) is worked through
        a page per pass, interleaved with checks and deletes, instead of reading every trailer
        before asking anything. Each key should be reported to ``on_trailer``,
        ``on_trailer_unreadable``, ``on_trailer_failed`` or ``on_gone``; one whose outcome is
        never reported is handed out again after ``check_interval_ms``, one that failed after a
        backoff.
        """
        cap = self.config.max_trailer_batch if limit is None else min(limit, self.config.max_trailer_batch)
        out: list[str] = []
        heap = self._trailer_heap
        while heap and heap[0][0] <= now_ms and len(out) < cap:
            due, key = heapq.heappop(heap)
            if self._needs_trailer.get(key) != due:
                continue  # stale entry
            out.append(key)
        for key in out:
            self._want_trailer(key, now_ms + self.config.check_interval_ms)  # re-offered if never reported
        return out

    def on_trailer(self, key: str, partitions: Iterable[PartitionRef], now_ms: int) -> None:
        """The trailer of ``key`` lists these partitions. Ignored for keys the core does not know."""
        obj = self._objects.get(key)
        if obj is None:
            return
        obj.unreadable = False
        self._drop_trailer(key)
        self._add_partitions(obj, partitions, now_ms)

    def on_trailer_unreadable(self, key: str, now_ms: int) -> None:
        """The object exists but its trailer cannot be parsed (``CorruptWalObject``).

        Transient read errors must be retried by the service and not reported here, and a
        missing object is ``on_gone``. Decision (see module docstring): an object whose
        partitions are still unknown is quarantined: never checked, never deleted, counted in
        ``stats``; a new core instance tries again. If a notice already gave the partitions the
        trailer was not needed and this report is ignored.
        """
        obj = self._objects.get(key)
        if obj is None or obj.partitions is not None:
            return
        obj.unreadable = True
        self._drop_trailer(key)

    def on_trailer_failed(self, key: str, now_ms: int) -> None:
        """Reading the trailer failed for another reason (forbidden, throttled, timed out, server
        errors after the store's own retries): the object is read again after a backoff that
        doubles up to 64 x ``check_interval_ms``, and counts as quarantined in ``stats`` after
        ``quarantine_after`` failures. It is never checked or deleted meanwhile (partitions
        unknown) and never holds up any other object: the service moves on to the next key.
        """
        obj = self._objects.get(key)
        if obj is None or key not in self._needs_trailer:
            return
        obj.trailer_failures += 1
        self._trailer_failures += 1
        backoff = self.config.check_interval_ms << min(obj.trailer_failures - 1, 6)
        self._want_trailer(key, now_ms + backoff)
        if obj.trailer_failures >= self.config.quarantine_after:
            self._quarantined[key] = None

    def on_gone(self, key: str, now_ms: int) -> None:
        """``key`` does not exist (404 on a trailer read or HEAD): forget it. Never unsafe."""
        self._foreign.pop(key, None)
        self._foreign_seen.pop(key, None)
        self._forget(key)

    # --- checking references -------------------------------------------------------------------

    def checks_due(self, now_ms: int) -> list[tuple[str, PartitionRef]]:
        """Start rounds for objects that are due; return the questions to ask.

        Each pair is to be asked of the *current* leader of the partition (the caller groups
        them by leader broker). Every pair returned must eventually get exactly one answer via
        ``on_answers``: the service maps RPC errors and timeouts to ``Answer.UNKNOWN``. All
        partitions of one object are returned together (a round is per object); the total is
        capped at ``max_check_batch`` except that one object is never split.
        """
        questions: list[tuple[str, PartitionRef]] = []
        heap = self._check_heap
        while heap and heap[0][0] <= now_ms and len(questions) < self.config.max_check_batch:
            due, key = heapq.heappop(heap)
            obj = self._objects.get(key)
            if obj is None or obj.due_ms != due:
                continue  # stale heap entry
            obj.due_ms = None
            if obj.partitions is None or obj.unreadable or obj.garbage or obj.round_issued_ms is not None:
                continue  # defensive: _schedule never queues these
            if key in self._outstanding:
                continue  # a previous incarnation's answers are still coming; rescheduled when they are in
            if not self._older_than_grace(obj, now_ms):
                self._schedule(obj)  # defensive: now_ms went backwards
                continue
            assert obj.partitions is not None
            obj.round_issued_ms = now_ms
            obj.round_asked = obj.partitions
            obj.round_pending = set(obj.partitions)
            obj.round_clean = True
            if not obj.partitions:
                # Nothing can point into an object without batches: the round is vacuously complete.
                self._complete_round(obj, now_ms)
                continue
            self._outstanding[key] = obj.round_pending
            questions.extend((key, p) for p in sorted(obj.partitions, key=_sort_key))
        return questions

    def on_leader_epoch(self, ref: PartitionRef, epoch: int) -> None:
        """The service's metadata shows ``epoch`` as the current leader epoch of ``ref``.

        Reported when asking and again when the answers come back: an answer from an older epoch
        comes from a deposed leader and is discarded (see ``on_answers``)."""
        if epoch > self._max_epoch.get(ref, NO_EPOCH):
            self._max_epoch[ref] = epoch

    def on_answers(self, answers: Iterable[tuple[str, PartitionRef, Answer, int]], now_ms: int) -> None:
        """Answers to questions from ``checks_due`` (any subset, any order, any grouping).

        Each answer is ``(key, partition, answer, epoch)``: ``epoch`` is the leader epoch of the
        broker that answered (as it believed it), or ``NO_EPOCH`` for answers the service gave
        itself (``route_question``, failed RPCs). An answer from an epoch lower than the highest
        this core has seen for the partition (from metadata or from other answers) comes from a
        deposed leader: it counts as UNKNOWN. Answers to questions this core did not ask, or
        already answered, are ignored. Each question may be answered only once, and answers to a
        previous core instance's questions must not be delivered to this one: both could
        otherwise be taken for a later question's answer and break the timing that makes two
        confirmations sufficient.
        """
        for key, partition, answer, epoch in answers:
            if epoch != NO_EPOCH:
                if epoch < self._max_epoch.get(partition, NO_EPOCH):
                    answer = Answer.UNKNOWN  # a deposed leader's view of a log that may lack commits
                    self._answers_deposed += 1
                else:
                    self._max_epoch[partition] = epoch
            pending = self._outstanding.get(key)
            if pending is None or partition not in pending:
                continue
            pending.discard(partition)
            if not pending:
                del self._outstanding[key]
            obj = self._objects.get(key)
            if obj is None:
                continue
            if obj.round_pending is not pending:
                # The object was forgotten and relearned while this answer was on its way: the
                # answer belongs to the old incarnation. Once all are in, the new one may start.
                if not pending:
                    self._schedule(obj)
                continue
            if answer != Answer.UNREFERENCED:  # UNKNOWN and anything unexpected block deletion
                obj.round_clean = False
            if not pending:
                self._complete_round(obj, now_ms)

    # --- deleting ------------------------------------------------------------------------------

    def deletable(self, now_ms: int) -> list[str]:
        """Hand out up to ``max_delete_batch`` keys that are safe to delete now.

        Each key handed out should be reported to ``on_deleted`` or ``on_delete_failed``; a
        failed key is offered again after ``check_interval_ms``, and so is a key whose outcome
        was never reported (a pass of the service that died, keys it dropped): deleting an
        object twice is harmless, and confirmation does not expire because references never
        come back.
        """
        limit = self.config.max_delete_batch
        out: list[str] = []
        for key in self._deletable:
            if len(out) >= limit:
                break
            obj = self._objects[key]
            if obj.next_check_ms <= now_ms and self._older_than_grace(obj, now_ms):
                out.append(key)
        for key in out:
            del self._deletable[key]
        overdue = now_ms - self.config.check_interval_ms
        for key in [k for k, handed_out in self._deleting.items() if handed_out <= overdue]:
            if len(out) >= limit:
                break
            obj = self._objects[key]
            if obj.garbage:
                out.append(key)
            else:  # its partition set grew after it was handed out: check it again first
                del self._deleting[key]
                self._schedule(obj)
        for key in out:
            self._deleting.pop(key, None)
            self._deleting[key] = now_ms  # re-inserted at the end: oldest hand-outs stay first
        return out

    def on_deleted(self, keys: Iterable[str], now_ms: int) -> None:
        """The objects are gone from the bucket (a DELETE of a missing key counts as success)."""
        for key in keys:
            obj = self._objects.get(key)
            if obj is not None:
                self._deleted_objects += 1
                self._deleted_bytes += obj.size
            self._forget(key)

    def on_delete_failed(self, keys: Iterable[str], now_ms: int) -> None:
        """Deleting failed; offered again by ``deletable`` after ``check_interval_ms``."""
        for key in keys:
            if key not in self._deleting:
                continue
            self._delete_failures += 1
            del self._deleting[key]
            obj = self._objects[key]
            obj.next_check_ms = now_ms + self.config.check_interval_ms
            if obj.garbage:
                self._deletable[key] = None  # at the end: failing keys do not starve the others
            else:
                self._schedule(obj)  # its partition set grew meanwhile: check again first

    # --- introspection -------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Gauges (current state) and counters (since this instance started) for metrics."""
        garbage = list(self._deletable) + list(self._deleting)
        unreadable = [o for o in self._objects.values() if o.unreadable]
        quarantined = [self._objects[k] for k in self._quarantined]
        known = len(self._objects)
        return {
            "objects_known": known,  # WAL objects tracked (parseable keys)
            "bytes_known": self._bytes_known,
            "objects_foreign": len(self._foreign),  # keys under the prefix that are not WAL keys
            "bytes_foreign": sum(self._foreign.values()),
            "objects_unreadable": len(unreadable),  # quarantined: trailer unreadable
            "bytes_unreadable": sum(o.size for o in unreadable),
            "objects_quarantined": len(quarantined),  # trailer reads keep failing: retried slowly
            "bytes_quarantined": sum(o.size for o in quarantined),
            "trailer_read_failures": self._trailer_failures,
            "trailers_needed": len(self._needs_trailer),
            "objects_pending": known - len(self._needs_trailer) - len(unreadable) - len(garbage),
            "objects_confirmed_once": len(self._confirmed_once),
            "checks_outstanding": sum(len(p) for p in self._outstanding.values()),
            "objects_garbage": len(garbage),  # confirmed unreferenced twice, not deleted yet
            "bytes_garbage": sum(self._objects[k].size for k in garbage),
            "objects_deleting": len(self._deleting),
            "objects_deleted": self._deleted_objects,
            "bytes_deleted": self._deleted_bytes,
            "delete_failures": self._delete_failures,
            "answers_deposed": self._answers_deposed,  # answers discarded: from an older leader epoch
        }

    # --- internals -----------------------------------------------------------------------------

    def _learn(self, key: str, size: int, now_ms: int) -> _Object | None:
        """The object for ``key``, created if new; None for foreign keys (recorded apart)."""
        obj = self._objects.get(key)
        if obj is not None:
            self._bytes_known += size - obj.size
            obj.size = size
            return obj
        try:
            created_ms = parse_wal_object_key(key).created_ms
        except ValueError:
            # Not written by a broker (or by a future key format): never ours to delete.
            self._foreign[key] = size
            self._foreign_seen.setdefault(key, now_ms)
            return None
        obj = _Object(key=key, created_ms=created_ms, size=size, first_seen_ms=now_ms)
        self._objects[key] = obj
        self._bytes_known += size
        return obj

    def _add_partitions(self, obj: _Object, partitions: Iterable[PartitionRef], now_ms: int) -> None:
        new = frozenset(partitions)
        if obj.partitions is not None and new <= obj.partitions:
            return  # duplicate notice, or a trailer confirming what a notice said
        first = obj.partitions is None
        # Union: notices and trailer should agree; if they do not, asking more is the safe side.
        obj.partitions = new if first else obj.partitions | new
        obj.unreadable = False
        self._drop_trailer(obj.key)
        if not first:
            # Partitions nobody asked about yet: earlier confirmations say nothing about them.
            # The round in progress (if any) completes as unconfirmed (round_asked is too small).
            self._reset(obj, next_check_ms=now_ms)
            if obj.garbage:
                # Only notices that disagree with the trailer (a writer bug) get here. A delete
                # the service already runs cannot be stopped; if it fails or is lost, the object is
                # checked again rather than deleted again.
                obj.garbage = False
                self._deletable.pop(obj.key, None)
        if obj.round_issued_ms is None:
            self._schedule(obj)

    def _want_trailer(self, key: str, due_ms: int) -> None:
        self._needs_trailer[key] = due_ms
        heapq.heappush(self._trailer_heap, (due_ms, key))

    def _drop_trailer(self, key: str) -> None:
        self._needs_trailer.pop(key, None)
        self._quarantined.pop(key, None)

    def _older_than_grace(self, obj: _Object, now_ms: int) -> bool:
        return now_ms - obj.created_ms > self.config.grace_ms

    def _schedule(self, obj: _Object) -> None:
        """Put a waiting object in the check heap under its due time."""
        if obj.partitions is None or obj.unreadable or obj.garbage or obj.round_issued_ms is not None:
            return
        if obj.key in self._deleting:
            return  # on_deleted / on_delete_failed decide what happens next
        due = max(obj.created_ms + self.config.grace_ms + 1, obj.next_check_ms)
        if obj.due_ms == due:
            return
        obj.due_ms = due
        heapq.heappush(self._check_heap, (due, obj.key))

    def _reset(self, obj: _Object, next_check_ms: int) -> None:
        obj.confirmed_ms = None
        self._confirmed_once.discard(obj.key)
        obj.next_check_ms = next_check_ms

    def _complete_round(self, obj: _Object, now_ms: int) -> None:
        issued = obj.round_issued_ms
        assert issued is not None and obj.partitions is not None
        obj.round_issued_ms = None
        obj.round_pending = None
        confirmation = obj.round_clean and obj.round_asked >= obj.partitions
        if not confirmation:
            self._reset(obj, now_ms + self.config.check_interval_ms)
        elif obj.confirmed_ms is None:
            # First confirmation. Its answers were computed no later than now (we hold them all).
            obj.confirmed_ms = now_ms
            self._confirmed_once.add(obj.key)
            obj.next_check_ms = now_ms + self.config.confirm_ms
        elif issued >= obj.confirmed_ms + self.config.confirm_ms:
            # Second confirmation: its answers were computed no earlier than it was issued.
            self._confirmed_once.discard(obj.key)
            obj.garbage = True
            obj.next_check_ms = now_ms
            self._deletable[obj.key] = None
            return
        else:
            # Not reachable through checks_due's scheduling; kept safe anyway: this round was
            # issued too early to be the second one, and proves nothing the first did not.
            obj.next_check_ms = obj.confirmed_ms + self.config.confirm_ms
        self._schedule(obj)

    def _forget(self, key: str) -> None:
        """Drop everything known about ``key`` (its outstanding questions stay accounted)."""
        obj = self._objects.pop(key, None)
        if obj is None:
            return
        self._bytes_known -= obj.size
        self._drop_trailer(key)
        self._confirmed_once.discard(key)
        self._deletable.pop(key, None)
        self._deleting.pop(key, None)

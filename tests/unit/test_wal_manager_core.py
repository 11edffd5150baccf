"""WalManagerCore: edge cases, and a model of the whole system proving it deletes safely and completely.

The state machine keeps, in memory, a bucket of WAL objects, partitions with replicated pointer
logs, representatives that upload objects and later commit pointers (leaders with skewed clocks
refuse commits older than the commit timeout, and accept one arriving exactly at it),
best-effort notices, bucket scans, leader failovers (with a deposed leader that may go on
answering for a while, with its old epoch), retention, topic deletion, topics re-created under
the same name (a new topic id: commits naming the old one are refused), partitions added, the
service's metadata view and the leaders' metadata lagging creations and deletions, restarts of
the manager and service passes that die. It drives a ``WalManagerCore`` as the service does
(routing questions with ``route_question`` and reporting the leader epochs its view shows), and
checks after every step that nothing referenced is ever deleted and that every pointer still
finds its object; at the end, that every unreferenced object was deleted.

Example counts (conftest.py's profiles set 100/1,000 examples for the rest of the unit suite):
this test runs 20x the loaded profile's ``max_examples`` but at least 2,000 (default "unit"
profile: 2,000 examples of up to 50 steps, about 30 s; ``HYPOTHESIS_PROFILE=thorough``: 20,000).
``WAL_MANAGER_PROFILE=deep`` runs 20,000 examples of up to 100 steps (about 10 minutes);
``HYPOTHESIS_PROFILE=deep`` selects the same once a "deep" profile is registered in conftest.py
(until then conftest.py's ``load_profile`` rejects the name). ``WAL_MANAGER_EXAMPLES=N``
overrides the count.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from diskless.storage.wal_format import parse_wal_object_key, wal_hour_prefix, wal_object_key
from wal_manager.core import NO_EPOCH, Answer, LeaderView, ManagerConfig, PartitionRef, WalManagerCore, route_question

T = TypeVar("T")

# --- simulated cluster constants (ms) --------------------------------------------------------------

T0 = 1_700_000_000_000
COMMIT_TIMEOUT = 60_000  # wal.commit.timeout.ms on every leader
SKEW = 5_000  # any leader's clock is within this of the manager's
GRACE = 70_000  # > COMMIT_TIMEOUT + SKEW, deliberately tight so that the model can probe the margin
CONFIRM = 30_000
STALE_LEADER_MS = CONFIRM  # a deposed leader may go on answering (stale log) this long after failover
CHECK_INTERVAL = 10_000
REP_SKEW = 150_000  # representatives' clocks may be far off: it cancels out (leader and manager use the key's time)
BROKERS = 4
# Time steps: hypothesis favours small integers, so name the interesting sizes explicitly. Most
# rules let some time pass first (LATER), so that time flows even when swarm testing disables tick.
DT = st.one_of(
    st.sampled_from([0, 1, 1_000, SKEW, CHECK_INTERVAL, 20_000, CONFIRM, COMMIT_TIMEOUT, GRACE, GRACE + CONFIRM]),
    st.integers(0, 2 * GRACE),
)
LATER = st.one_of(st.sampled_from([0, 1, 1_000, SKEW, CHECK_INTERVAL, 20_000]), st.integers(0, 20_000))
CONFIG = ManagerConfig(GRACE, CONFIRM, CHECK_INTERVAL, max_delete_batch=3, max_check_batch=8)
CONFIG.check_against(COMMIT_TIMEOUT, SKEW)

# --- example counts ------------------------------------------------------------------------------

_DEEP = "deep" in (os.environ.get("WAL_MANAGER_PROFILE"), os.environ.get("HYPOTHESIS_PROFILE"))
_EXAMPLES = int(os.environ.get("WAL_MANAGER_EXAMPLES", 0)) or (
    20_000 if _DEEP else max(2_000, 20 * settings.default.max_examples)
)
_STEPS = 100 if _DEEP else 50
COVERAGE: Counter[str] = Counter()  # examples in which something interesting happened
_CHUNK = 1_000


def ref(n: int, partition: int = 0) -> PartitionRef:
    return PartitionRef(str(uuid.UUID(int=n + 1)), partition)


def key_at(created_ms: int, n: int = 0) -> str:
    return wal_object_key(created_ms, "az-1", 1, f"{n:032x}")


# --- model ---------------------------------------------------------------------------------------


@dataclass
class Blob:
    """An object in the model bucket."""

    size: int
    partitions: frozenset[PartitionRef] | None  # what the trailer lists; None: trailer unreadable
    wal: bool  # the key parses as a WAL key


@dataclass
class Part:
    """One partition: the current leader's pointer log (followers hold prefixes of it)."""

    ref: PartitionRef
    replicas: tuple[int, ...]
    leader: int
    log: list[str] = field(default_factory=list)
    start: int = 0  # log start index: retention / DeleteRecords / tiering dropped everything before it
    replicated: dict[int, int] = field(default_factory=dict)  # follower -> length of its prefix
    available: bool = True
    epoch: int = 0  # the leader epoch: +1 at every failover
    knows: bool = True  # the leader's metadata has the partition (it may lag a creation)
    # A deposed leader that does not know it yet: (its log, its log start, answering until ms, its epoch).
    stale: tuple[tuple[str, ...], int, int, int] | None = None

    @property
    def hw(self) -> int:
        return min([len(self.log), *self.replicated.values()])

    def references(self, key: str) -> bool:
        return key in self.log[self.start :]


class WalManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.core = WalManagerCore(CONFIG)
        self.skew: list[int] = [0] * BROKERS
        self.parts: dict[PartitionRef, Part] = {}  # partitions of live topics
        self.all_refs: list[PartitionRef] = []  # every partition ever created (deleted topics too)
        self.topics: dict[str, list[PartitionRef]] = {}
        self.names: dict[str, str] = {}  # topic id -> name: a re-created topic has the old name, a new id
        # The service's metadata view: topic id -> partitions it shows. It may lag creations,
        # added partitions and deletions (until catch_up).
        self.view: dict[str, int] = {}
        self.bucket: dict[str, Blob] = {}
        self.deleted: set[str] = set()
        self.commits: list[tuple[str, int, PartitionRef]] = []  # (key, created_ms, partition) in flight
        self.notices: list[tuple[str, int, frozenset[PartitionRef]]] = []
        self.questions: list[tuple[str, PartitionRef]] = []  # asked by the current core, not answered
        self.responses: list[tuple[str, PartitionRef, Answer, int]] = []  # answered, not delivered yet
        self.deleting: list[str] = []  # handed out by deletable(), DELETE not done yet
        self.handed_out: dict[str, int] = {}  # handed out, outcome not reported (dropped ones too)
        self.pending_scan: tuple[int, dict[str, int], tuple[str, ...]] | None = None  # started, listing, prefixes
        self.counter = 0
        self.topic_counter = 0
        self.restarts = 0
        self.restarted_at = T0
        self.loop_ms: int | None = None  # the service runs its loop every loop_ms (None: only when told)
        self.scan_every: int | None = None  # ...and scans the bucket every scan_every loops
        self.loops = 0
        self.die_every: int | None = None  # ...and every die_every-th pass dies after deletable()
        self.stale_mask = 0  # which partitions' stale leaders (if any) the service asks
        self.seen: set[str] = set()  # what happened in this example, see test_wal_manager_model

    # --- helpers ---------------------------------------------------------------------------------

    def _new_topic(self, partitions: int, lag: bool = False, name: str | None = None) -> str:
        """Create a topic; with ``lag`` neither the service's view nor the leaders know it yet."""
        self.topic_counter += 1
        topic = str(uuid.UUID(int=self.topic_counter))
        self.names[topic] = name or f"topic-{self.topic_counter}"
        self.topics[topic] = []
        self._add_partitions(topic, partitions, lag)
        return topic

    def _add_partitions(self, topic: str, count: int, lag: bool) -> None:
        refs = self.topics[topic]
        new = [PartitionRef(topic, i) for i in range(len(refs), len(refs) + count)]
        refs.extend(new)
        for r in new:
            replicas = tuple((self.topic_counter + r.partition + j) % BROKERS for j in range(3))
            self.parts[r] = Part(r, replicas, replicas[0], replicated={b: 0 for b in replicas[1:]}, knows=not lag)
        self.all_refs.extend(new)
        if not lag:
            self.view[topic] = len(refs)

    def _view_epoch(self, part: Part, stale_mask: int) -> int:
        """The leader epoch the service's view shows: the deposed leader's while the view lags."""
        if part.stale is not None and self.now < part.stale[2] and stale_mask >> (part.ref.partition % 4) & 1:
            return part.stale[3]
        return part.epoch

    def _view_of(self, topic: str, stale_mask: int) -> list[LeaderView] | None:
        count = self.view.get(topic)
        if count is None:
            return None
        out = []
        for i in range(count):
            part = self.parts.get(PartitionRef(topic, i))
            # A deleted topic the view still shows: the broker it names no longer knows the id.
            out.append(
                LeaderView(0, 0) if part is None else LeaderView(part.leader, self._view_epoch(part, stale_mask))
            )
        return out

    def _observe_epochs(self, refs: Iterable[PartitionRef], stale_mask: int) -> None:
        """The service reports its view's leader epochs when asking and when answers come back."""
        for r in refs:
            view = self._view_of(r.topic_id, stale_mask)
            if view is not None and r.partition < len(view):
                self.core.on_leader_epoch(r, view[r.partition].epoch)

    def _advance(self, dt: int) -> None:
        """Let ``dt`` ms pass; the service's periodic loop runs whenever it is due meanwhile."""
        target = self.now + dt
        while self.loop_ms is not None:
            due = (self.now // self.loop_ms + 1) * self.loop_ms
            if due > target:
                break
            self.now = due
            self.loops += 1
            if self.scan_every is not None and self.loops % self.scan_every == 0:
                self._scan("full+trailers")
            if self.die_every is not None and self.loops % self.die_every == 0:
                self._service_step(self.stale_mask, dies=True)
            self._drain(self.stale_mask)
        self.now = target

    @staticmethod
    def _pick(items: list[T], i: int) -> T:
        return items[i % len(items)]

    def _answer(self, key: str, r: PartitionRef, stale_mask: int) -> tuple[Answer, int]:
        """The answer (and leader epoch) the service gets about ``key`` from ``r``'s leader now:
        routed by the service's (possibly lagging) metadata view, as ``route_question`` decides,
        with a fresh read of the topic ids (the etcd truth) when the view lacks the topic."""
        view = self._view_of(r.topic_id, stale_mask)
        routed = route_question(r, view, set(self.topics) if view is None else None)
        if isinstance(routed, Answer):
            if view is None and r.topic_id in self.topics:
                self.seen.add("service view lagged a topic creation")
            return routed, NO_EPOCH
        part = self.parts.get(r)
        if part is None:
            return Answer.UNKNOWN, NO_EPOCH  # deleted, the view lags: the broker does not know the id
        if part.stale is not None and self.now < part.stale[2] and stale_mask >> (r.partition % 4) & 1:
            # The service's leadership view still names the deposed leader, which still believes it
            # leads and answers from its own (stale) log, with its old epoch.
            log, start, _, epoch = part.stale
            self.seen.add("stale leader answered")
            return (Answer.REFERENCED if key in log[start:] else Answer.UNREFERENCED), epoch
        if not part.available:
            return Answer.UNKNOWN, NO_EPOCH
        if not part.knows:
            self.seen.add("leader's metadata lagged a creation")
            return Answer.UNKNOWN, NO_EPOCH  # the broker does not know the topic id or partition yet
        return (Answer.REFERENCED if part.references(key) else Answer.UNREFERENCED), part.epoch

    def _delete(self, key: str) -> None:
        """The service's DELETE reaches the bucket: the safety invariant (1) is checked right here."""
        blob = self.bucket.get(key)
        created = parse_wal_object_key(key).created_ms  # raises if the core handed out a foreign key
        assert blob is None or (blob.wal and blob.partitions is not None), f"deleted foreign/unreadable {key}"
        assert self.now - created > GRACE, f"deleted {key} at age {self.now - created} <= grace"
        for part in self.parts.values():
            assert not part.references(key), f"deleted {key} still referenced by {part.ref} at {part.log.index(key)}"
        self.bucket.pop(key, None)
        self.deleted.add(key)
        self.seen.add("deleted during the run")

    def _ask(self) -> int:
        asked = self.core.checks_due(self.now)
        assert len(set(asked)) == len(asked)
        assert not set(asked) & set(self.questions) and not set(asked) & {(k, r) for k, r, _, _ in self.responses}
        self._observe_epochs({r for _, r in asked}, self.stale_mask)
        self.questions.extend(asked)
        return len(asked)

    def _answer_questions(self, count: int, stale_mask: int) -> None:
        answered, self.questions = self.questions[:count], self.questions[count:]
        self.responses.extend((k, r, *self._answer(k, r, stale_mask)) for k, r in answered)

    def _deliver(self, count: int, view_caught_up: bool = False) -> None:
        """Answers reach the core; with ``view_caught_up`` the service's view learned of every
        failover while they were on their way (it reports the epochs it shows now)."""
        delivered, self.responses = self.responses[:count], self.responses[count:]
        self._observe_epochs({r for _, r, _, _ in delivered}, 0 if view_caught_up else self.stale_mask)
        before = self.core._answers_deposed  # stats() would cost O(objects) per delivery
        self.core.on_answers(delivered, self.now)
        if self.core._answers_deposed > before:
            self.seen.add("deposed leader's answer discarded")

    def _start_deletes(self) -> int:
        keys = self.core.deletable(self.now)
        assert len(keys) == len(set(keys)) <= CONFIG.max_delete_batch
        for key in keys:
            # Handed out again only if its outcome has not been reported for check_interval_ms.
            assert self.now - self.handed_out.get(key, -CHECK_INTERVAL) >= CHECK_INTERVAL
            self.handed_out[key] = self.now
        self.deleting.extend(k for k in keys if k not in self.deleting)
        return len(keys)

    def _lose_deletes(self, count: int) -> None:
        """A pass of the service hands keys out and dies: their outcome is never reported."""
        if self._start_deletes():
            self.seen.add("delete outcome lost")
        self.deleting = self.deleting[:-count]

    def _finish_deletes(self, count: int, fail: bool) -> None:
        done, self.deleting = self.deleting[:count], self.deleting[count:]
        for key in done:
            self.handed_out.pop(key, None)
        if fail:
            self.core.on_delete_failed(done, self.now)
            return
        for key in done:
            self._delete(key)
        self.core.on_deleted(done, self.now)

    def _service_step(self, stale_mask: int, dies: bool = False) -> bool:
        """One synchronous pass of the service loop; whether it had anything to do. A pass that
        ``dies`` does so right after deletable(): the keys' outcome is never reported."""
        asked = self._ask()
        self._answer_questions(len(self.questions), stale_mask)
        self._deliver(len(self.responses))
        if dies:
            self._lose_deletes(CONFIG.max_delete_batch)
            return bool(asked)
        handed_out = self._start_deletes()
        self._finish_deletes(len(self.deleting), fail=False)
        return bool(asked or handed_out)

    def _drain(self, stale_mask: int) -> None:
        """Passes of the service loop until the batch limits hold nothing back (at this time)."""
        for _ in range(10_000):
            if not self._service_step(stale_mask):
                return
        raise AssertionError("the service loop does not run dry")

    def _listing(self, prefixes: tuple[str, ...]) -> dict[str, int]:
        return {k: b.size for k, b in sorted(self.bucket.items()) if k.startswith(prefixes)}

    def _deliver_scan(self, started: int, listing: dict[str, int], prefixes: tuple[str, ...]) -> None:
        for k, size in listing.items():
            self.core.on_listed(k, size, self.now)
        self.core.on_scan_complete(set(listing), prefixes, started, self.now)

    def _read_trailers(self, limit: int | None) -> None:
        for k in self.core.trailers_needed(self.now, limit):
            blob = self.bucket.get(k)
            if blob is None:
                self.core.on_gone(k, self.now)
            elif blob.partitions is None:
                self.core.on_trailer_unreadable(k, self.now)
            else:
                self.core.on_trailer(k, blob.partitions, self.now)

    # --- setup -----------------------------------------------------------------------------------

    @initialize(
        skews=st.lists(st.one_of(st.sampled_from([-SKEW, 0, SKEW]), st.integers(-SKEW, SKEW)), min_size=4, max_size=4),
        sizes=st.lists(st.integers(1, 3), min_size=1, max_size=2),
        loop_ms=st.sampled_from([None, 2_000, SKEW, CHECK_INTERVAL, 25_000]),
        scan_every=st.sampled_from([None, 1, 3, 10]),
        die_every=st.sampled_from([None, None, 2, 7]),
        stale_mask=st.integers(0, 15),
    )
    def setup(
        self,
        skews: list[int],
        sizes: list[int],
        loop_ms: int | None,
        scan_every: int | None,
        die_every: int | None,
        stale_mask: int,
    ) -> None:
        self.skew = skews
        self.loop_ms = loop_ms
        self.scan_every = scan_every
        self.die_every = die_every
        self.stale_mask = stale_mask
        for n in sizes:
            self._new_topic(n)

    # --- producing -------------------------------------------------------------------------------

    @rule(
        broker=st.integers(0, BROKERS - 1),
        rep_skew=st.one_of(
            st.just(0),
            st.sampled_from([-COMMIT_TIMEOUT, -COMMIT_TIMEOUT - SKEW, -GRACE, GRACE]),
            st.integers(-REP_SKEW, REP_SKEW),
        ),
        picks=st.lists(st.integers(0, 63), min_size=1, max_size=4),
        commit_mask=st.one_of(st.just(15), st.integers(0, 15)),
        size=st.integers(1, 1000),
        dt=LATER,
        commit_after=st.one_of(
            st.none(),
            st.sampled_from([0, COMMIT_TIMEOUT - SKEW, COMMIT_TIMEOUT, COMMIT_TIMEOUT + SKEW]),
            st.integers(0, COMMIT_TIMEOUT + 2 * SKEW),
        ),
        failover_first=st.booleans(),
    )
    def put_object(
        self,
        broker: int,
        rep_skew: int,
        picks: list[int],
        commit_mask: int,
        size: int,
        dt: int,
        commit_after: int | None,
        failover_first: bool,
    ) -> None:
        """A representative PUTs a WAL object, then commits to some of its partitions: all
        ``commit_after`` ms later (the service's loop runs meanwhile), or one by one (``commit``).
        With ``failover_first`` leadership moved while the commits were on their way, so they
        land on the new leaders while the old ones may still answer the manager."""
        self._advance(dt)
        self.counter += 1
        created = self.now + rep_skew  # stamped by the representative's own clock
        key = wal_object_key(created, f"az-{broker % 3}", broker, f"{self.counter:032x}")
        partitions = frozenset(self._pick(self.all_refs, i) for i in picks)
        self.bucket[key] = Blob(size, partitions, wal=True)
        for j, r in enumerate(sorted(partitions)):
            if commit_mask >> j & 1:  # the others are never sent (representative crashed): orphans
                self.commits.append((key, created, r))
        self.notices.append((key, size, partitions))
        if commit_after is not None:
            self._advance(commit_after)
            for c in [c for c in self.commits if c[0] == key]:
                self.commits.remove(c)
                if failover_first and c[2] in self.parts:
                    self._failover(self.parts[c[2]], c[1])
                self._commit(c, replicate=True)

    @rule(kind=st.sampled_from(["empty", "readme", "bad-name", "corrupt"]), size=st.integers(0, 100))
    def put_odd_object(self, kind: str, size: int) -> None:
        """An object without batches (nothing can reference it), or something under wal/ the
        brokers did not write, or whose trailer is damaged: never to be deleted."""
        self.counter += 1
        if kind == "empty":
            key = wal_object_key(self.now, "az-0", 0, f"{self.counter:032x}")
            self.bucket[key] = Blob(size, frozenset(), wal=True)
            self.notices.append((key, size, frozenset()))
            return
        if kind == "readme":
            key = f"wal/README-{self.counter}"
        elif kind == "bad-name":
            key = f"{wal_hour_prefix(self.now)}{self.counter}.wal"
        else:
            key = wal_object_key(self.now - 10 * GRACE, "az-x", 9, f"{self.counter:032x}")
        self.bucket[key] = Blob(size, None, wal=kind == "corrupt")

    @rule(i=st.integers(0, 1000), deliver=st.booleans(), replicate=st.booleans(), dt=LATER)
    def commit(self, i: int, deliver: bool, replicate: bool, dt: int) -> None:
        """A CommitBatches request reaches the partition's current leader (or is lost)."""
        self._advance(dt)
        if not self.commits:
            return
        pending = self.commits.pop(i % len(self.commits))
        if deliver:
            self._commit(pending, replicate)

    def _commit(self, pending: tuple[str, int, PartitionRef], replicate: bool) -> None:
        key, created, r = pending
        # Commits name the topic id: one for a deleted topic (re-created under the same name or
        # not) finds no partition and is refused, never applied to the new incarnation.
        part = self.parts.get(r)
        if part is None or not part.available or not part.knows:
            return  # lost, topic deleted, leader down or not hosting it yet: the producer gets an error
        age = self.now + self.skew[part.leader] - created
        if age > COMMIT_TIMEOUT:
            self.seen.add("commit refused as too old")
            return  # refused: too old by the leader's clock
        if age == COMMIT_TIMEOUT:
            self.seen.add("commit accepted right at the timeout")
        if self.now - created > COMMIT_TIMEOUT:
            self.seen.add("commit accepted thanks to a slow leader clock")
        if self.now - created > COMMIT_TIMEOUT and self.core.stats()["objects_confirmed_once"]:
            self.seen.add("commit accepted late while some object was confirmed once")
        # Invariant (2): an accepted commit finds its object.
        assert key in self.bucket, f"commit accepted for {key}, deleted by the manager already"
        part.log.append(key)
        if replicate:  # acks=all: followers fetch it and the high watermark moves past it
            part.replicated = dict.fromkeys(part.replicated, len(part.log))

    @rule(i=st.integers(0, 1000), action=st.sampled_from(["deliver", "duplicate", "lose"]), dt=LATER)
    def notice(self, i: int, action: str, dt: int) -> None:
        """Best-effort notices: delivered in any order, duplicated, or lost."""
        self._advance(dt)
        if not self.notices:
            return
        j = i % len(self.notices)
        key, size, partitions = self.notices[j] if action == "duplicate" else self.notices.pop(j)
        if action != "lose":
            self.core.on_notice(key, size, partitions, self.now)

    # --- partitions ------------------------------------------------------------------------------

    @precondition(lambda self: self.parts)
    @rule(p=st.integers(0, 100), f=st.integers(0, 1), upto=st.integers(0, 100))
    def replicate(self, p: int, f: int, upto: int) -> None:
        part = self._pick(list(self.parts.values()), p)
        follower = self._pick(sorted(part.replicated), f)
        have = part.replicated[follower]
        part.replicated[follower] = have + upto % (len(part.log) - have + 1)

    @rule(p=st.integers(0, 100), n=st.integers(1, 5), dt=LATER)
    def move_log_start(self, p: int, n: int, dt: int) -> None:
        """Retention, DeleteRecords or tiering drop a prefix (only up to the high watermark)."""
        self._advance(dt)
        if not self.parts:
            return
        part = self._pick(list(self.parts.values()), p)
        part.start = max(part.start, min(part.start + n, part.hw))

    @rule(p=st.integers(0, 100), f=st.integers(0, 1), dt=LATER)
    def failover(self, p: int, f: int, dt: int) -> None:
        """A follower (all are in the ISR) becomes leader with the prefix it replicated; the
        uncommitted rest of the old leader's log is truncated everywhere. The deposed leader may
        go on answering from its old log for STALE_LEADER_MS."""
        self._advance(dt)
        if self.parts:
            self._failover(self._pick(list(self.parts.values()), p), f)

    def _failover(self, part: Part, f: int) -> None:
        new = self._pick(sorted(part.replicated), f)
        old_log, hw = tuple(part.log), part.hw
        length = part.replicated.pop(new)
        assert length >= hw  # an ISR member holds everything committed
        del part.log[length:]
        part.replicated = {b: min(n, length) for b, n in part.replicated.items()}
        if part.available:
            part.stale = (old_log, part.start, self.now + STALE_LEADER_MS, part.epoch)
        part.replicated[part.leader] = length
        part.leader = new
        part.epoch += 1
        part.available = True
        part.knows = True  # elected through the metadata it has

    @rule(p=st.integers(0, 100), dt=LATER)
    def toggle_available(self, p: int, dt: int) -> None:
        """The leader cannot answer (down, loading): it must answer UNKNOWN, never UNREFERENCED."""
        self._advance(dt)
        if not self.parts:
            return
        part = self._pick(list(self.parts.values()), p)
        part.available = not part.available

    @rule(t=st.integers(0, 100), lag=st.booleans(), dt=LATER)
    def delete_topic(self, t: int, lag: bool, dt: int) -> None:
        """With ``lag`` the service's view still shows the topic for a while."""
        self._advance(dt)
        if self.topics:
            self._delete_topic(self._pick(sorted(self.topics), t), lag)

    def _delete_topic(self, topic: str, lag: bool) -> None:
        for r in self.topics.pop(topic):
            del self.parts[r]
        if not lag:
            self.view.pop(topic, None)

    @precondition(lambda self: self.topic_counter < 5)
    @rule(n=st.integers(1, 3), lag=st.booleans())
    def create_topic(self, n: int, lag: bool) -> None:
        """With ``lag`` the service's view and the leaders' metadata learn of it later (catch_up)."""
        self._new_topic(n, lag)

    @precondition(lambda self: self.topic_counter < 5)
    @rule(t=st.integers(0, 100), n=st.integers(1, 3), lag=st.booleans(), dt=LATER)
    def recreate_topic(self, t: int, n: int, lag: bool, dt: int) -> None:
        """A topic is deleted and created again under the same name: a new topic id. Objects and
        commits in flight still name the old id; the views may lag both changes."""
        self._advance(dt)
        if not self.topics:
            return
        old = self._pick(sorted(self.topics), t)
        self._delete_topic(old, lag)
        self._new_topic(n, lag, name=self.names[old])
        self.seen.add("topic re-created")

    @rule(t=st.integers(0, 100), n=st.integers(1, 2), lag=st.booleans(), dt=LATER)
    def add_partitions(self, t: int, n: int, lag: bool, dt: int) -> None:
        self._advance(dt)
        if self.topics and len(self.all_refs) < 24:
            self._add_partitions(self._pick(sorted(self.topics), t), n, lag)
            self.seen.add("partitions added")

    @rule(who=st.sampled_from(["service", "leaders", "both"]), dt=LATER)
    def catch_up(self, who: str, dt: int) -> None:
        """Metadata propagation: the service's view and/or the leaders learn every change so far."""
        self._advance(dt)
        if who != "leaders":
            self.view = {topic: len(refs) for topic, refs in self.topics.items()}
        if who != "service":
            for part in self.parts.values():
                part.knows = True

    @rule(i=st.integers(0, 1000), late=st.sampled_from([0, 0, 1]))
    def commit_at_deadline(self, i: int, late: int) -> None:
        """A commit reaches its leader exactly when it becomes too old by the leader's clock (or
        1 ms later): accepted at the boundary, refused just after."""
        if not self.commits:
            return
        _, created, r = pending = self.commits[i % len(self.commits)]
        part = self.parts.get(r)
        if part is None:
            return
        at = created + COMMIT_TIMEOUT - self.skew[part.leader] + late
        if at < self.now:
            return
        self.commits.remove(pending)
        self._advance(at - self.now)
        if self.parts.get(r) is part:
            self._commit(pending, replicate=True)

    # --- time, scans, restarts -------------------------------------------------------------------

    @rule(dt=DT, loop=st.booleans(), stale_mask=st.integers(0, 15))
    def tick(self, dt: int, loop: bool, stale_mask: int) -> None:
        """Time passes; then the service may run one more pass of its loop."""
        self.stale_mask = stale_mask
        self._advance(dt)
        if loop:
            self._service_step(stale_mask)

    @rule(
        action=st.sampled_from(["full", "full+trailers", "begin-whole", "begin-hour", "end"]),
        which=st.integers(0, 100),
        dt=LATER,
    )
    def scan(self, action: str, which: int, dt: int) -> None:
        """Complete scans of the bucket; a begun scan lists now and reports later, after other
        steps, so its listing is stale by then."""
        self._advance(dt)
        self._scan(action, which)

    def _scan(self, action: str, which: int = 0) -> None:
        if action.startswith("full"):
            self._deliver_scan(self.now, self._listing(("wal/",)), ("wal/",))
            if action == "full+trailers":
                self._read_trailers(None)
        elif action == "end":
            if self.pending_scan is not None:
                started, listing, prefixes = self.pending_scan
                self.pending_scan = None
                self._deliver_scan(started, listing, prefixes)
        elif self.pending_scan is None:
            keys = sorted(k for k, b in self.bucket.items() if b.wal)
            prefixes: tuple[str, ...] = ("wal/",)
            if action == "begin-hour" and keys:
                prefixes = (wal_hour_prefix(parse_wal_object_key(self._pick(keys, which)).created_ms),)
            self.pending_scan = (self.now, self._listing(prefixes), prefixes)

    @rule(limit=st.one_of(st.none(), st.integers(1, 3)))
    def read_trailers(self, limit: int | None) -> None:
        self._read_trailers(limit)

    @precondition(lambda self: self.restarts < 2 and self.now - self.restarted_at >= GRACE)
    @rule(deletes_land=st.booleans())
    def restart(self, deletes_land: bool) -> None:
        """The manager process dies and a new one starts empty. Its DELETEs already sent may still
        land; its unanswered questions die with it. (Rationed, so that runs also make progress.)"""
        self.restarts += 1
        self.restarted_at = self.now
        self.seen.add("restarted")
        if deletes_land:
            for key in self.deleting:
                self._delete(key)
        self.deleting = []
        self.handed_out = {}
        self.questions = []
        self.responses = []
        self.pending_scan = None
        self.core = WalManagerCore(CONFIG)

    # --- the service loop, one piece at a time ---------------------------------------------------

    @rule(
        action=st.sampled_from(["ask", "answer", "deliver"]),
        count=st.integers(1, 10),
        stale_mask=st.integers(0, 15),
        view_caught_up=st.booleans(),
        dt=LATER,
    )
    def rpc(self, action: str, count: int, stale_mask: int, view_caught_up: bool, dt: int) -> None:
        """Questions go out, leaders answer some of them (now), answers reach the core (later)."""
        self._advance(dt)
        if action == "ask":
            self._ask()
        elif action == "answer":
            self._answer_questions(count, stale_mask)
        else:
            self._deliver(count, view_caught_up)

    @rule(i=st.integers(0, 1000), f=st.integers(0, 1), dt=LATER)
    def deposed_leader_answers(self, i: int, f: int, dt: int) -> None:
        """A question reaches a leader that is deposed right then (failover) and does not know it
        yet: it answers from its old log with its old epoch. By the time the answer arrives the
        service's view shows the successor's epoch."""
        self._advance(dt)
        self._ask()
        candidates = [q for q in self.questions if q[1] in self.parts and self.parts[q[1]].available]
        if not candidates:
            return
        key, r = candidates[i % len(candidates)]
        self._failover(self.parts[r], f)
        self.questions.remove((key, r))
        self.responses.append((key, r, *self._answer(key, r, 0b1111)))
        self._deliver(len(self.responses), view_caught_up=True)

    @rule(action=st.sampled_from(["start", "finish", "fail", "drop"]), count=st.integers(1, 5), dt=LATER)
    def deletes(self, action: str, count: int, dt: int) -> None:
        """deletable() hands keys out; DELETEs complete (or fail) later, or a pass of the service
        dies after deletable() and its keys are lost: the core must offer them again."""
        self._advance(dt)
        if action == "start":
            self._start_deletes()
        elif action == "drop":
            self._lose_deletes(count)
        else:
            self._finish_deletes(count, fail=action == "fail")

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def every_pointer_finds_its_object(self) -> None:
        # (3): every pointer from the log start on (acknowledged or not) still has its object.
        for part in self.parts.values():
            for key in part.log[part.start :]:
                assert key in self.bucket, f"{part.ref} points to deleted {key}"

    @invariant()
    def core_accounting(self) -> None:
        stats = self.core.stats()
        assert stats["checks_outstanding"] == len(self.questions) + len(self.responses)
        # <=: a scan may forget a key being deleted (a late notice relearned it after its deletion).
        assert stats["objects_deleting"] <= len(self.handed_out)
        assert stats["objects_pending"] >= 0 and stats["bytes_known"] >= 0

    def teardown(self) -> None:
        if sys.exc_info()[0] is None:  # a failing step is the error to report, not liveness
            COVERAGE.update(self.seen | {"examples"})
            self._check_liveness()

    def _check_liveness(self) -> None:
        """(4): with everything healthy and time passing, every unreferenced object goes."""
        self.view = {topic: len(refs) for topic, refs in self.topics.items()}
        for part in self.parts.values():
            part.knows = True
        for key, created, r in self.commits:  # in-flight commits arrive (accepted or refused)
            part = self.parts.get(r)
            if part is not None and part.available and self.now + self.skew[part.leader] - created <= COMMIT_TIMEOUT:
                assert key in self.bucket
                part.log.append(key)
        self.commits = []
        for key, size, partitions in self.notices:  # late notices, even for deleted objects
            self.core.on_notice(key, size, partitions, self.now)
        self.notices = []
        self._scan("end")
        for part in self.parts.values():
            part.available = True
        self.now += STALE_LEADER_MS  # deposed leaders have learned
        self._finish_deletes(len(self.deleting), fail=False)
        self._answer_questions(len(self.questions), 0)
        self._deliver(len(self.responses))
        self._scan("full+trailers")
        newest = max((parse_wal_object_key(k).created_ms for k, b in self.bucket.items() if b.wal), default=0)
        end = max(self.now, newest) + GRACE + CONFIRM + 4 * CHECK_INTERVAL
        while self.now < end:
            self.now += CHECK_INTERVAL // 2
            self._drain(0)
        self._scan("full")  # forgets objects relearned from late notices after their deletion
        referenced = {k for part in self.parts.values() for k in part.log[part.start :]}
        leaked = [k for k, b in self.bucket.items() if b.wal and b.partitions is not None and k not in referenced]
        assert not leaked, f"unreferenced objects never deleted: {leaked}"
        stats = self.core.stats()
        assert stats["objects_known"] == sum(b.wal for b in self.bucket.values())
        assert stats["objects_foreign"] == sum(not b.wal for b in self.bucket.values())
        assert stats["objects_unreadable"] == sum(b.wal and b.partitions is None for b in self.bucket.values())
        assert stats["objects_garbage"] == 0 and stats["checks_outstanding"] == 0 and stats["trailers_needed"] == 0


@pytest.mark.timeout(0 if _DEEP or _EXAMPLES > 2_000 else 600)
def test_wal_manager_model() -> None:
    COVERAGE.clear()
    # In runs of at most _CHUNK examples: hypothesis keeps every choice of a run in memory
    # (about 0.2 MB per example of 50 steps, 0.6 MB at 150), which 20,000 long examples would
    # turn into gigabytes.
    remaining = _EXAMPLES
    while remaining > 0:
        run_state_machine_as_test(
            WalManagerMachine,
            settings=settings(
                max_examples=min(remaining, _CHUNK),
                stateful_step_count=_STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
            ),
        )
        remaining -= _CHUNK
    # The model must keep reaching the situations that matter (typical shares in parentheses); a
    # change to the strategies that stops it doing so should fail here rather than go unnoticed.
    share = {what: n / COVERAGE["examples"] for what, n in COVERAGE.items()}
    print(" ".join(f"{what}: {100 * f:.1f}%" for what, f in sorted(share.items())))
    if _EXAMPLES >= 1_000:
        assert share.get("deleted during the run", 0) > 0.1  # (30%)
        assert share.get("restarted", 0) > 0.1  # (42%)
        assert share.get("commit refused as too old", 0) > 0.05  # (22%)
        assert share.get("stale leader answered", 0) > 0.02  # (8%)
        assert share.get("delete outcome lost", 0) > 0.02  # (9%)
        assert share.get("commit accepted thanks to a slow leader clock", 0) > 0  # (1%)
        assert share.get("topic re-created", 0) > 0.1  # (35%)
        assert share.get("partitions added", 0) > 0.1  # (38%)
        assert share.get("service view lagged a topic creation", 0) > 0.01  # (4%)
        assert share.get("leader's metadata lagged a creation", 0) > 0  # (1%)
        assert share.get("commit accepted right at the timeout", 0) > 0.01  # (4%)
        assert share.get("deposed leader's answer discarded", 0) > 0  # (x%)


# --- plain unit tests of edge cases ----------------------------------------------------------------

P1, P2 = ref(1), ref(2)


def confirm_once(core: WalManagerCore, now: int) -> int:
    """Run one complete all-UNREFERENCED round at ``now``; return the number of questions."""
    asked = core.checks_due(now)
    core.on_answers([(k, r, Answer.UNREFERENCED, NO_EPOCH) for k, r in asked], now)
    return len(asked)


def test_grace_boundary() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1], T0)
    assert core.checks_due(T0 + GRACE) == []  # exactly grace old is not older than grace
    assert core.checks_due(T0 + GRACE + 1) == [(key, P1)]


def test_confirm_boundary_and_deletion() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1, P2], T0)
    t = T0 + GRACE + 1
    asked = core.checks_due(t)
    assert sorted(asked) == [(key, P1), (key, P2)]
    core.on_answers([(key, P1, Answer.UNREFERENCED, NO_EPOCH)], t)
    core.on_answers([(key, P2, Answer.UNREFERENCED, NO_EPOCH)], t + 500)  # round complete at t + 500
    assert core.deletable(t + 10 * CONFIRM) == []  # one confirmation is not enough
    assert core.checks_due(t + 500 + CONFIRM - 1) == []
    assert confirm_once(core, t + 500 + CONFIRM) == 2
    assert core.stats()["objects_garbage"] == 1
    assert core.deletable(t + 500 + CONFIRM) == [key]
    assert core.deletable(t + 500 + CONFIRM) == []  # handed out once
    core.on_deleted([key], t + 600 + CONFIRM)
    stats = core.stats()
    assert stats["objects_deleted"] == 1 and stats["bytes_deleted"] == 10 and stats["objects_known"] == 0


@pytest.mark.parametrize("blocking", [Answer.UNKNOWN, Answer.REFERENCED])
def test_unknown_or_referenced_resets_confirmation(blocking: Answer) -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1, P2], T0)
    t = T0 + GRACE + 1
    confirm_once(core, t)
    t += CONFIRM
    asked = core.checks_due(t)
    core.on_answers([(key, P1, Answer.UNREFERENCED, NO_EPOCH), (key, P2, blocking, NO_EPOCH)], t)
    assert core.deletable(t) == [] and core.stats()["objects_confirmed_once"] == 0
    assert core.checks_due(t + CHECK_INTERVAL - 1) == []
    t += CHECK_INTERVAL
    confirm_once(core, t)  # a fresh first confirmation...
    assert core.deletable(t) == []
    assert core.checks_due(t + CONFIRM - 1) == []
    confirm_once(core, t + CONFIRM)  # ...and a second one, confirm_ms later
    assert core.deletable(t + CONFIRM) == [key]
    assert asked


def test_incomplete_round_confirms_nothing() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1, P2], T0)
    t = T0 + GRACE + 1
    core.checks_due(t)
    core.on_answers([(key, P1, Answer.UNREFERENCED, NO_EPOCH)], t)
    assert core.checks_due(t + 10 * CONFIRM) == []  # no new round while one is outstanding
    assert core.deletable(t + 10 * CONFIRM) == []
    assert core.stats()["checks_outstanding"] == 1


def test_unasked_and_duplicate_answers_are_ignored() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1], T0)
    t = T0 + GRACE + 1
    core.on_answers([(key, P1, Answer.UNREFERENCED, NO_EPOCH)], t)  # never asked
    assert core.stats()["objects_confirmed_once"] == 0
    core.checks_due(t)
    core.on_answers([(key, P1, Answer.REFERENCED, NO_EPOCH), (key, P1, Answer.UNREFERENCED, NO_EPOCH)], t)
    assert core.stats()["objects_confirmed_once"] == 0  # the duplicate did not overwrite REFERENCED


def test_restart_loses_state_but_stays_safe() -> None:
    key = key_at(T0)
    old = WalManagerCore(CONFIG)
    old.on_notice(key, 10, [P1], T0)
    t = T0 + GRACE + 1
    confirm_once(old, t)
    new = WalManagerCore(CONFIG)  # the old one's confirmation is lost with it
    new.on_listed(key, 10, t + CONFIRM)
    assert new.trailers_needed(T0) == [key]
    assert new.checks_due(t + CONFIRM) == []  # partitions unknown: nobody to ask
    new.on_trailer(key, [P1], t + CONFIRM)
    confirm_once(new, t + CONFIRM)
    assert new.deletable(t + CONFIRM) == []  # needs its own second confirmation
    confirm_once(new, t + 2 * CONFIRM)
    assert new.deletable(t + 2 * CONFIRM) == [key]


def test_unparseable_keys_are_never_deleted() -> None:
    core = WalManagerCore(CONFIG)
    foreign = ["wal/README", "wal/2023/11/14/22/1700000000000-az-1-1-xyz.wal", "wal/x.wal", key_at(T0) + ".tmp"]
    for k in foreign:
        core.on_listed(k, 5, T0)
        core.on_notice(k, 5, [P1], T0)
        core.on_trailer(k, [P1], T0)
    far = T0 + 100 * GRACE
    assert core.trailers_needed(T0) == [] and core.checks_due(far) == [] and core.deletable(far) == []
    stats = core.stats()
    assert stats["objects_foreign"] == len(foreign) and stats["bytes_foreign"] == 5 * len(foreign)
    assert stats["objects_known"] == 0
    core.on_scan_complete(set(), ["wal/"], T0 + 1, T0 + 2)  # gone from the bucket: forgotten
    assert core.stats()["objects_foreign"] == 0


def test_unreadable_trailer_is_quarantined() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_listed(key, 7, T0)
    core.on_trailer_unreadable(key, T0)
    far = T0 + 100 * GRACE
    assert core.trailers_needed(T0) == [] and core.checks_due(far) == [] and core.deletable(far) == []
    assert core.stats()["objects_unreadable"] == 1 and core.stats()["bytes_unreadable"] == 7
    # A new instance (restart, upgrade) tries the trailer again.
    new = WalManagerCore(CONFIG)
    new.on_listed(key, 7, far)
    assert new.trailers_needed(T0) == [key]


def test_scan_forgets_only_objects_known_before_it_under_its_prefixes() -> None:
    core = WalManagerCore(CONFIG)
    old, other_hour, during = key_at(T0, 1), key_at(T0 + 3_600_000, 2), key_at(T0, 3)
    core.on_notice(old, 1, [P1], T0)
    core.on_notice(other_hour, 1, [P1], T0)
    core.on_notice(during, 1, [P1], T0 + 20)  # noticed after the scan started: maybe PUT after the listing
    core.on_scan_complete(set(), [wal_hour_prefix(T0)], T0 + 10, T0 + 30)
    assert core.stats()["objects_known"] == 2
    confirm_once(core, T0 + GRACE + 1)
    assert [k for k, _ in core.checks_due(T0 + GRACE + 1 + CONFIRM)] == [during]  # 'old' is forgotten
    assert core.checks_due(T0 + 3_600_000 + GRACE + 1)[0][0] == other_hour


def test_answer_for_forgotten_object_does_not_count_for_relearned_one() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1], T0)
    t = T0 + GRACE + 1
    assert core.checks_due(t) == [(key, P1)]
    core.on_gone(key, t)
    core.on_notice(key, 10, [P1], t + 1)  # relearned while the old question is unanswered
    assert core.checks_due(t + 2) == []  # no second question for the same pair
    core.on_answers([(key, P1, Answer.UNREFERENCED, NO_EPOCH)], t + 3)  # the old answer: consumed, not counted
    assert core.stats()["objects_confirmed_once"] == 0 and core.stats()["checks_outstanding"] == 0
    assert core.checks_due(t + 3) == [(key, P1)]


def test_new_partitions_reset_confirmation() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1], T0)
    t = T0 + GRACE + 1
    confirm_once(core, t)
    core.on_trailer(key, [P1, P2], t + 1)  # more partitions than the notice said: ask them too
    assert core.stats()["objects_confirmed_once"] == 0
    assert sorted(core.checks_due(t + 1)) == [(key, P1), (key, P2)]


def test_partitions_growing_mid_round_invalidate_the_round() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 10, [P1], T0)
    t = T0 + GRACE + 1
    core.checks_due(t)
    core.on_notice(key, 10, [P2], t)
    core.on_answers([(key, P1, Answer.UNREFERENCED, NO_EPOCH)], t)
    assert core.stats()["objects_confirmed_once"] == 0


def test_object_without_partitions_goes_after_grace_and_confirm() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 1, [], T0)
    assert core.checks_due(T0 + GRACE + 1) == []  # vacuous round, nothing to ask
    assert core.deletable(T0 + GRACE + CONFIRM) == []
    assert core.checks_due(T0 + GRACE + 1 + CONFIRM) == []
    assert core.deletable(T0 + GRACE + 1 + CONFIRM) == [key]


def test_failed_delete_is_retried_after_interval() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 1, [P1], T0)
    t = T0 + GRACE + 1
    confirm_once(core, t)
    confirm_once(core, t + CONFIRM)
    t += CONFIRM
    assert core.deletable(t) == [key]
    core.on_delete_failed([key], t)
    assert core.deletable(t + CHECK_INTERVAL - 1) == []
    assert core.deletable(t + CHECK_INTERVAL) == [key]
    assert core.stats()["delete_failures"] == 1


def test_batch_limits() -> None:
    core = WalManagerCore(CONFIG)  # max_check_batch=8, max_delete_batch=3
    keys = [key_at(T0, n) for n in range(5)]
    for k in keys:
        core.on_notice(k, 1, [ref(i) for i in range(3)], T0)
    t = T0 + GRACE + 1
    first = core.checks_due(t)
    assert len(first) == 9  # three whole objects: the limit never splits one
    assert len(core.checks_due(t)) == 6
    core.on_answers([(k, r, Answer.UNREFERENCED, NO_EPOCH) for k, r in first], t)
    assert len(core.checks_due(t + CONFIRM)) == 9
    assert core.deletable(t + CONFIRM) == []


def test_config_validation_and_partition_ref() -> None:
    with pytest.raises(ValueError):
        CONFIG.check_against(COMMIT_TIMEOUT, GRACE - COMMIT_TIMEOUT)
    with pytest.raises(ValueError):
        ManagerConfig(0, 1, 1)
    u = uuid.UUID(int=7)
    assert PartitionRef(u.hex.upper(), 1) == PartitionRef(str(u), 1) == PartitionRef(u, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PartitionRef("not-a-uuid", 0)
    with pytest.raises(ValueError):
        PartitionRef(str(u), -1)


def test_trailers_needed_oldest_first_and_gone_objects_forgotten() -> None:
    core = WalManagerCore(CONFIG)
    keys = [key_at(T0 + 3_600_000, 1), key_at(T0, 2), key_at(T0 + 5, 3)]
    for k in keys:
        core.on_listed(k, 1, T0)
    assert core.trailers_needed(T0, limit=1) == [keys[1]]  # handed out: not again until reported...
    assert core.trailers_needed(T0) == [keys[2], keys[0]]
    assert core.trailers_needed(T0 + CHECK_INTERVAL - 1) == []
    assert core.trailers_needed(T0 + CHECK_INTERVAL) == sorted(keys)  # ...or check_interval_ms passed
    core.on_gone(keys[1], T0)  # 404 on the trailer read
    core.on_trailer(keys[1], [P1], T0)  # late: unknown keys are ignored
    assert core.trailers_needed(T0 + 2 * CHECK_INTERVAL) == [keys[2], keys[0]]
    assert core.stats()["objects_known"] == 2 and core.stats()["trailers_needed"] == 2


def test_unreadable_trailer_ignored_when_a_notice_gave_the_partitions() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 1, [P1], T0)
    core.on_trailer_unreadable(key, T0)
    assert core.stats()["objects_unreadable"] == 0
    assert core.checks_due(T0 + GRACE + 1) == [(key, P1)]


def test_delete_outcome_never_reported_is_offered_again() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 1, [P1], T0)
    t = T0 + GRACE + 1
    confirm_once(core, t)
    confirm_once(core, t + CONFIRM)
    t += CONFIRM
    assert core.deletable(t) == [key]  # ... and the service loses it
    assert core.deletable(t + CHECK_INTERVAL - 1) == []
    assert core.deletable(t + CHECK_INTERVAL) == [key]
    core.on_deleted([key], t + CHECK_INTERVAL)
    core.on_deleted([key], t + CHECK_INTERVAL)  # both DELETEs landed: counted once
    assert core.stats()["objects_deleted"] == 1 and core.stats()["objects_deleting"] == 0


def test_answer_from_a_deposed_leader_epoch_is_discarded() -> None:
    core = WalManagerCore(CONFIG)
    key, other = key_at(T0, 1), key_at(T0, 2)
    core.on_notice(key, 1, [P1], T0)
    core.on_notice(other, 1, [P1], T0)
    t = T0 + GRACE + 1
    asked = core.checks_due(t)
    assert sorted(asked) == sorted([(key, P1), (other, P1)])
    core.on_leader_epoch(P1, 5)  # the service's metadata moved on while the questions were out
    core.on_answers([(key, P1, Answer.UNREFERENCED, 4)], t)  # answered by the epoch-4 leader
    assert core.stats()["objects_confirmed_once"] == 0 and core.stats()["answers_deposed"] == 1
    core.on_answers([(other, P1, Answer.UNREFERENCED, 5)], t)  # the current leader counts
    assert core.stats()["objects_confirmed_once"] == 1
    # An answer from epoch 6 teaches the core of a newer leader even if metadata has not caught up.
    t += CHECK_INTERVAL
    core.on_leader_epoch(P1, 5)
    first = core.checks_due(t)
    assert first == [(key, P1)]
    core.on_answers([(key, P1, Answer.REFERENCED, 6)], t)
    t += CHECK_INTERVAL
    assert core.checks_due(t) == [(key, P1)]
    core.on_answers([(key, P1, Answer.UNREFERENCED, 5)], t)  # the epoch-5 leader is deposed now
    assert core.stats()["objects_confirmed_once"] == 1 and core.stats()["answers_deposed"] == 2


def test_answers_without_epoch_are_not_checked_against_epochs() -> None:
    core = WalManagerCore(CONFIG)
    key = key_at(T0)
    core.on_notice(key, 1, [P1], T0)
    core.on_leader_epoch(P1, 9)
    confirm_once(core, T0 + GRACE + 1)  # NO_EPOCH: the service's own answer (a deleted topic)
    assert core.stats()["objects_confirmed_once"] == 1 and core.stats()["answers_deposed"] == 0


def test_route_question_never_takes_a_lagging_view_for_a_deletion() -> None:
    view = [LeaderView(3, 7), LeaderView(-1, 2)]
    assert route_question(P1, view, None) == LeaderView(3, 7)
    assert route_question(ref(1, 1), view, None) == Answer.UNKNOWN  # offline
    assert route_question(ref(1, 2), view, None) == Answer.UNKNOWN  # partition added after our view
    # The view lacks the topic: only a fresh read that lacks it too proves it was deleted.
    assert route_question(P1, None, None) == Answer.UNKNOWN
    assert route_question(P1, None, {P1.topic_id}) == Answer.UNKNOWN  # created recently: the view lags
    assert route_question(P1, None, {P2.topic_id}) == Answer.UNREFERENCED


def test_trailer_reads_come_in_bounded_pages() -> None:
    config = ManagerConfig(GRACE, CONFIRM, CHECK_INTERVAL, max_trailer_batch=10)
    core = WalManagerCore(config)
    keys = [key_at(T0, n) for n in range(35)]
    for k in reversed(keys):
        core.on_listed(k, 1, T0)
    pages = [core.trailers_needed(T0) for _ in range(5)]
    assert [len(p) for p in pages] == [10, 10, 10, 5, 0]
    assert [k for p in pages for k in p] == sorted(keys)  # oldest first, each once
    assert core.trailers_needed(T0, limit=3) == []


def test_failing_trailer_reads_back_off_and_are_quarantined_without_holding_up_others() -> None:
    config = ManagerConfig(GRACE, CONFIRM, CHECK_INTERVAL, max_trailer_batch=1, quarantine_after=2)
    core = WalManagerCore(config)
    bad, good = key_at(T0, 1), key_at(T0, 2)  # bad is older: handed out first
    core.on_listed(bad, 5, T0)
    core.on_listed(good, 7, T0)
    assert core.trailers_needed(T0) == [bad]
    core.on_trailer_failed(bad, T0)  # e.g. 403 Forbidden on its ranged GET
    assert core.trailers_needed(T0) == [good]  # the next page goes on
    core.on_trailer(good, [P1], T0)
    assert core.trailers_needed(T0 + CHECK_INTERVAL - 1) == []
    assert core.trailers_needed(T0 + CHECK_INTERVAL) == [bad]
    core.on_trailer_failed(bad, T0 + CHECK_INTERVAL)
    stats = core.stats()
    assert stats["objects_quarantined"] == 1 and stats["bytes_quarantined"] == 5
    assert stats["trailer_read_failures"] == 2
    assert core.trailers_needed(T0 + 3 * CHECK_INTERVAL - 1) == []  # the backoff doubled
    assert core.trailers_needed(T0 + 3 * CHECK_INTERVAL) == [bad]
    core.on_trailer(bad, [P2], T0 + 3 * CHECK_INTERVAL)  # readable again (permissions fixed)
    assert core.stats()["objects_quarantined"] == 0
    assert sorted(core.checks_due(T0 + 3 * CHECK_INTERVAL + GRACE)) == sorted([(good, P1), (bad, P2)])

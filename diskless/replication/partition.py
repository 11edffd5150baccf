"""One hosted partition replica: its log, its role (leader or follower) and acks=all waiters.

A leader tracks followers through ``LeaderState`` and completes produce waiters once the high
watermark passes their last offset. A follower's log is written only by the replica fetcher and
its high watermark is the leader's, capped at its own log end. The leader answers replica
fetches, including the diverging-epoch check that tells a follower where to truncate (KIP-320).

Watches: what a replica fetch needs to know of a partition (its log end, high watermark, log
start, leader epoch, role, ISR) changes only through its log's ``on_change`` hook and the state
changes here. Each change fires the partition's watches, one-shot callbacks under a key (one per
party watching: a follower's fetch session on the leader, the replica fetcher on a follower).
Those parties then check only the partitions whose watch fired, not every partition on every
fetch; at 1,000 partitions those per-fetch passes were a fifth of a broker's CPU.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import structlog

from diskless.cluster.metadata import PartitionState
from diskless.log.leader_epoch import UNDEFINED_EPOCH
from diskless.log.partition_log import PartitionLog
from diskless.storage import pointer_wire
from diskless.tiering.entry import unwrap_tier_state

from .follower_reads import FollowerView
from .leader_state import LeaderState

log = structlog.get_logger(__name__)

# How often the parties watching partitions look at all of them anyway: a change that fired no
# watch (a bug) then costs at most that long, and is counted (diskless_unwatched_changes_total).
VERIFY_MS = 1_000

LEADER = "leader"
FOLLOWER = "follower"
OFFLINE = "offline"


# Pointer entries travel in a replica fetch answer's ``records`` behind an envelope
# (``pointer_wire.ENVELOPE``): -4 with the answer's shared key table, for followers that say they
# read it (``SHARED_KEYS_FETCHER``), -3 compact alone, -1 the segment bytes as they are.
# The replica fetcher's role in its client id: a leader sends shared-key runs (-4) only to a
# fetcher naming it, so a follower of an older version, mid-upgrade, is never sent a form it
# would take for record batches.
SHARED_KEYS_FETCHER = "replica-fetcher-k4"


def wrap_pointers(entries: bytes, shared: dict[str, int] | None = None) -> bytes:
    """Pointer entries for a replica fetch answer; ``shared``: the answer's key table (-4)."""
    compact = pointer_wire.encode(entries, shared)
    if compact is None:
        return pointer_wire.ENVELOPE.pack(-1, len(entries)) + entries
    return pointer_wire.ENVELOPE.pack(-3 if shared is None else -4, len(compact)) + compact


def unwrap_pointers(data: bytes, shared: dict[int, bytes] | None = None) -> bytes | None:
    """The pointer entries inside a replica fetch's records, or None for record batches.
    ``shared``: the answer's key table (``collect_pointer_keys``), for -4 runs."""
    found = pointer_wire.enveloped(data)
    if found is None:
        return None
    mark, body = found
    if mark == pointer_wire.RAW_MARK:
        return bytes(body)
    return pointer_wire.decode(body, None if mark == pointer_wire.COMPACT_MARK else ({} if shared is None else shared))


def collect_pointer_keys(data: bytes, shared: dict[int, bytes]) -> None:
    """Add the keys a -4 run writes to its answer's table (before any run of it is unwrapped)."""
    found = pointer_wire.enveloped(data)
    if found is not None and found[0] == pointer_wire.SHARED_MARK:
        pointer_wire.collect_keys(found[1], shared)


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    epoch: int
    end_offset: int


def _nothing() -> None:
    pass


@dataclass(slots=True, eq=False)
class LeaderContact:
    """A replica fetcher's last answer from its leader: the round (request) it answered and when
    that request was sent. The partitions the fetcher asks for hear from the leader through it
    (``Partition.hear_through``), so an answer leaving them out as quiet needs no visit to each."""

    round: int = -1
    sent_ms: int = -1


async def wait_for_commits(waits: list[tuple[Partition, int, int]], timeout: float, first: bool) -> list[bool | None]:
    """Wait for acks=all replication of several (replica, last offset, leader epoch of the append;
    see ``Partition.on_commit``): until all are decided, or (``first``) until any is, or
    ``timeout`` seconds. Per wait: True replicated, False refused (leadership lost, the append
    gone), None undecided. One future and one timer for all of them: the caller resumes in the
    loop turn after the deciding follower fetch, not after a task per wait and a gather."""
    if not waits:
        return []
    loop = asyncio.get_running_loop()
    outcome: list[bool | None] = [None] * len(waits)
    done: asyncio.Future[None] = loop.create_future()
    pending = len(waits)

    def decided(index: int, ok: bool) -> None:
        nonlocal pending
        outcome[index] = ok
        pending -= 1
        if (first or pending == 0) and not done.done():
            done.set_result(None)

    cancels = [
        replica.on_commit(offset, epoch, lambda ok, i=i: decided(i, ok))
        for i, (replica, offset, epoch) in enumerate(waits)
    ]
    timer = None if done.done() else loop.call_later(timeout, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        if timer is not None:
            timer.cancel()
        for cancel in cancels:
            cancel()
    return outcome


class Partition:
    def __init__(self, topic: str, index: int, log: PartitionLog, node_id: int, topic_id: str = "") -> None:
        self.topic = topic
        # The incarnation of the topic this replica belongs to: replica fetches name it, so a leader
        # never serves another incarnation's log to this replica (fetcher.py). "" only in tests
        # that never fetch; a leader answers such a fetch UNKNOWN_TOPIC_ID.
        self.topic_id = topic_id
        self.index = index
        self.log = log
        self.node_id = node_id
        self.role = OFFLINE
        self.leader_id = -1
        self.leader_epoch = -1
        self.isr: list[int] = []
        self.replicas: list[int] = []
        self._applied_state: PartitionState | None = None  # the metadata state applied last
        self.leader_state: LeaderState | None = None
        # acks=all waiters, sorted: (last offset, seq, callback). Callbacks run synchronously when the
        # high watermark passes their offset (True) or leadership is lost (False), so the waiting
        # coroutine resumes in the very next loop turn (tests/unit/test_commit_wakeups.py).
        self._waiters: list[tuple[int, int, Callable[[bool], None]]] = []
        self._seq = 0
        # As a follower: when the current leader last answered a replica fetch, and the largest log
        # start offset it reported. Reads served here depend on both (follower_reads).
        self._heard_ms = -1
        self._contact: LeaderContact | None = None
        self._contact_from = 0  # the first round of _contact that counts for this replica
        self.leader_log_start_offset = -1
        self._watches: dict[Hashable, Callable[[], None]] = {}
        log.on_change = self.changed

    # --- hearing from the leader (follower reads depend on it) ------------------------------------

    @property
    def heard_from_leader_ms(self) -> int:
        """When the current leader last answered a replica fetch of this partition, as of when the
        fetch was sent; -1 if not yet (this epoch). An answer that leaves the partition out as quiet
        counts; one with an error for it does not."""
        contact = self._contact
        if contact is not None and contact.round >= self._contact_from and contact.sent_ms > self._heard_ms:
            return contact.sent_ms
        return self._heard_ms

    @heard_from_leader_ms.setter
    def heard_from_leader_ms(self, value: int) -> None:
        self._heard_ms = value
        self._contact = None  # until the fetcher asks again (hear_through)

    def hear_through(self, contact: LeaderContact, first_round: int) -> None:
        """Answers of ``contact`` from round ``first_round`` on are news from the leader for us
        (what we heard through it until now stays heard)."""
        self._heard_ms = self.heard_from_leader_ms
        self._contact = contact
        self._contact_from = first_round

    def listen(self, contact: LeaderContact, first_round: int) -> None:
        """``hear_through`` unless already listening to ``contact``."""
        if self._contact is not contact:
            self.hear_through(contact, first_round)

    def stop_hearing(self, contact: LeaderContact) -> None:
        """No longer asked for through ``contact``: keep what was heard through it, nothing more."""
        if self._contact is contact:
            self._heard_ms = self.heard_from_leader_ms
            self._contact = None

    # --- watches ---------------------------------------------------------------------------------

    def watch(self, key: Hashable, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, at the next change of this partition's replication state; a
        later watch under the same ``key`` replaces this one."""
        self._watches[key] = callback

    def unwatch(self, key: Hashable) -> None:
        self._watches.pop(key, None)

    def changed(self) -> None:
        """The partition's replication state changed: fire (and drop) every watch."""
        if self._watches:
            watches, self._watches = self._watches, {}
            for key, callback in watches.items():
                try:
                    callback()
                except Exception:
                    # Fired from inside log changes (an append, a truncation): a watcher's bug must
                    # not cut one short. Its periodic comparison still finds what it missed.
                    log.exception("a partition watch failed", topic=self.topic, partition=self.index, watcher=repr(key))

    # --- role changes ---------------------------------------------------------------------------

    def apply_state(self, state: PartitionState, now_ms: int) -> str | None:
        """Follow the metadata store; returns "leader"/"follower"/"offline" when the role changed."""
        try:
            return self._apply_state(state, now_ms)
        finally:
            self.changed()  # rare, so any state applied counts as a change (ISR, replicas, epoch)

    def _apply_state(self, state: PartitionState, now_ms: int) -> str | None:
        epoch_changed = state.leader_epoch != self.leader_epoch
        state_changed, self._applied_state = state != self._applied_state, state
        self.replicas = list(state.replicas)
        self.isr = list(state.isr)
        if state.leader == self.node_id:
            if self.role != LEADER or epoch_changed:
                self._become_leader(state, now_ms)
                return LEADER
            assert self.leader_state is not None
            self.leader_state.replicas = list(state.replicas)
            if self.leader_state.apply_isr(state.isr, self.log.log_end_offset, state_changed):
                self._on_hw_advanced()
            return None
        previous = self.role
        if epoch_changed or previous != FOLLOWER:
            self.heard_from_leader_ms = -1  # nothing heard from this leader yet
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.leader_state = None
        self.role = FOLLOWER if state.leader >= 0 else OFFLINE
        self._fail_waiters()
        return self.role if (previous != self.role or epoch_changed) else None

    def _become_leader(self, state: PartitionState, now_ms: int) -> None:
        self.role = LEADER
        self.leader_id = self.node_id
        self.leader_epoch = state.leader_epoch
        leo = self.log.log_end_offset
        self.log.epochs.assign(state.leader_epoch, leo)
        self.leader_state = LeaderState(
            leader_id=self.node_id,
            leader_epoch=state.leader_epoch,
            replicas=list(state.replicas),
            isr=list(state.isr),
            epoch_start_offset=leo,
            high_watermark=self.log.high_watermark,
            became_leader_ms=now_ms,
        )
        if self.leader_state.maybe_advance_hw(leo):
            self._on_hw_advanced()

    # --- leader side -----------------------------------------------------------------------------

    def propose_isr(self, isr: list[int]) -> None:
        """An ISR change is on its way to the store (the HW waits for a joining replica now)."""
        if self.leader_state is not None:
            self.leader_state.propose_isr(isr)
            self.changed()

    def isr_proposal_failed(self, state: LeaderState) -> None:
        """The proposal made under ``state`` failed; nothing to undo if leadership moved since."""
        if self.leader_state is state:
            state.proposal_failed()
            self.changed()

    def on_local_append(self) -> None:
        """After a leader append: a partition whose ISR is only us commits immediately."""
        if self.leader_state is not None and self.leader_state.maybe_advance_hw(self.log.log_end_offset):
            self._on_hw_advanced()

    def on_follower_fetch(self, follower: int, fetch_offset: int, now_ms: int, log_start_offset: int = -1) -> bool:
        assert self.leader_state is not None
        leo = self.log.log_end_offset
        advanced = self.leader_state.on_follower_fetch(follower, fetch_offset, leo, now_ms, log_start_offset)
        if advanced:
            self._on_hw_advanced()
        return advanced

    def news_for(self, follower: int) -> bool:
        """True (once) when ``follower`` has not yet been told the current high watermark or log
        start; both are then counted as told.

        A follower serves diskless reads up to the HW it knows, and answers ListOffsets(EARLIEST)
        and OFFSET_OUT_OF_RANGE with the leader's start as last heard (follower_reads), so a move
        of either must reach it now, not with the next batch of data, even when its own retention
        already moved its own start there."""
        if self.leader_state is None:
            return False
        progress = self.leader_state.followers.get(follower)
        high_watermark, log_start = self.log.high_watermark, self.log.log_start_offset
        if progress is None or (progress.last_sent_hw >= high_watermark and progress.last_sent_log_start >= log_start):
            return False
        progress.last_sent_hw = high_watermark
        progress.last_sent_log_start = log_start
        return True

    def diverging_epoch(self, last_fetched_epoch: int, fetch_offset: int) -> DivergingEpoch | None:
        """Where a follower's log diverges from ours, if it does (Kafka's Partition.fetchRecords check)."""
        if last_fetched_epoch == UNDEFINED_EPOCH:
            return None
        epoch, end = self.log.epochs.end_offset_for(last_fetched_epoch, self.log.log_end_offset)
        if epoch < last_fetched_epoch or end < fetch_offset:
            return DivergingEpoch(epoch, end)
        return None

    def _on_hw_advanced(self) -> None:
        assert self.leader_state is not None
        self.log.high_watermark = self.leader_state.high_watermark
        hw = self.log.high_watermark
        waiters = self._waiters
        if waiters and waiters[0][0] < hw:
            done = bisect.bisect_left(waiters, (hw,))  # every waiter whose offset is below the HW
            decided, self._waiters = waiters[:done], waiters[done:]
            for _, _, callback in decided:
                callback(True)

    def leads_at(self, leader_epoch: int) -> bool:
        return self.leader_state is not None and self.leader_epoch == leader_epoch

    def holds_append(self, last_offset: int, leader_epoch: int) -> bool:
        """Is the record at ``last_offset`` still the one this replica appended when it led at
        ``leader_epoch``? Epochs are unique to one leadership, so a record written in that epoch
        is that append; a leader truncated as a follower and refilled by another leader holds a
        later epoch's record there instead, which the high watermark must not acknowledge."""
        if self.leads_at(leader_epoch):
            return last_offset < self.log.log_end_offset  # a leader never truncates its own epoch
        return last_offset < self.log.log_end_offset and self.log.epochs.epoch_for_offset(last_offset) == leader_epoch

    def on_commit(self, last_offset: int, leader_epoch: int, callback: Callable[[bool], None]) -> Callable[[], None]:
        """acks=all for what this replica appended as leader at ``leader_epoch``, ending at
        ``last_offset``: call ``callback(True)`` once the high watermark passes it, or
        ``callback(False)`` when it can no longer: this replica stops leading, or the record there
        is no longer that append. At once if already decided. Returns a cancel function
        (idempotent) that drops the waiter without calling it.

        The callback runs inside whatever moved the high watermark (a follower's fetch), so it
        must only set a result: a future's waiter then resumes in the next loop turn.

        A produce appends, then waits a loop turn or more before its wait begins (its handler
        gathers every partition's wait). Leadership that moved in between failed the waiters
        present then, not this one, so the wait checks for itself:
        - not leading now: refused at once. Before, such a wait sat out the request's whole timeout
          (30 s) and only then told the producer NOT_LEADER_OR_FOLLOWER; kafka-python stalled that
          long in a reassignment test;
        - leading again at a later epoch after a truncation as follower: the offset holds another
          leader's record, and the new high watermark passing it would acknowledge a write that
          is gone. Refused; while the append is still there (no truncation), it is waited for."""
        if not self.holds_append(last_offset, leader_epoch):
            callback(False)
            return _nothing
        if self.log.high_watermark > last_offset:
            callback(True)
            return _nothing
        if self.leader_state is None:
            callback(False)
            return _nothing
        self._seq += 1
        waiter = (last_offset, self._seq, callback)
        bisect.insort(self._waiters, waiter)

        def cancel() -> None:
            index = bisect.bisect_left(self._waiters, waiter[:2])
            if index < len(self._waiters) and self._waiters[index][1] == waiter[1]:
                del self._waiters[index]

        return cancel

    def pending_commit_waiters(self) -> int:
        return len(self._waiters)

    async def wait_for_commit(self, last_offset: int, leader_epoch: int, timeout: float) -> bool:
        """acks=all for an append made as leader at ``leader_epoch``: True once the high watermark
        passes ``last_offset``; False on timeout or when it can no longer (see on_commit)."""
        if self.log.high_watermark > last_offset and self.holds_append(last_offset, leader_epoch):
            return True  # the common case on a quiet partition: no future, no timer
        return await wait_for_commits([(self, last_offset, leader_epoch)], timeout, first=False) == [True]

    def _fail_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, callback in waiters:
            callback(False)

    # --- follower side --------------------------------------------------------------------------

    def on_fetched(
        self,
        records: bytes,
        leader_hw: int,
        leader_log_start: int,
        now_ms: int,
        sent_ms: int = -1,
        shared_keys: dict[int, bytes] | None = None,
    ) -> bytes | None:
        """Append what the leader sent; returns pointer entries appended (for prefetching).

        ``sent_ms`` is when the replica fetch was sent: the leader's state in the answer is at least
        that recent, but an answer read late (this process paused, a slow connection) is no fresher.
        ``shared_keys``: the answer's WAL object keys (``collect_pointer_keys``).
        """
        tier_state = unwrap_tier_state(records) if records else None
        if tier_state is not None:
            # We are behind the leader's pointer entries: its tiers hold that range (tiering).
            self.log.adopt_tier_state(tier_state, now_ms)
            resume = tier_state["resume"]
            log.info("took the leader's tier state", topic=self.topic, partition=self.index, resume=resume)
            records = b""
        entries = unwrap_pointers(records, shared_keys) if records else None
        if entries is not None:
            self.log.append_pointers_as_follower(entries, now_ms)
        elif records:
            self.log.append_as_follower(records, now_ms)
        self.log.high_watermark = max(self.log.high_watermark, min(leader_hw, self.log.log_end_offset))
        self._heard_ms = sent_ms if sent_ms >= 0 else now_ms
        self.leader_log_start_offset = max(self.leader_log_start_offset, leader_log_start)
        if leader_log_start > self.log.log_start_offset:
            # Retention and DeleteRecords on the leader move our start too (references drop).
            self.log.delete_records_before(min(leader_log_start, self.log.high_watermark))
        return entries

    def follower_view(self) -> FollowerView:
        """What this follower knows when a consumer's read arrives (see follower_reads)."""
        return FollowerView(
            in_isr=self.node_id in self.isr,
            heard_from_leader_ms=self.heard_from_leader_ms,
            log_start_offset=self.log.log_start_offset,
            high_watermark=self.log.high_watermark,
            leader_log_start_offset=self.leader_log_start_offset,
        )

    def truncate_on_divergence(self, diverging: DivergingEpoch, now_ms: int) -> None:
        if diverging.end_offset < 0:
            # The leader knows nothing of our epochs: fall back to what is known committed.
            target = self.log.high_watermark
        else:
            # Our own end of that epoch, or of the last epoch before it when we never had it (the
            # leader's epoch, started after ours ended): records past it were written in epochs the
            # leader's log does not have (Kafka's AbstractFetcherThread.getOffsetTruncationState).
            local_epoch, local_end = self.log.epochs.end_offset_for(diverging.epoch, self.log.log_end_offset)
            target = diverging.end_offset if local_epoch < 0 else min(diverging.end_offset, local_end)
        target = max(target, self.log.log_start_offset)
        self.log.truncate_to(min(target, self.log.log_end_offset), now_ms)

"""Leader-side replication state of one partition, sans-IO (Kafka's Partition + ISR rules).

The leader learns each follower's log end offset from the offset it fetches at. From those it
derives the high watermark (the smallest log end offset in the ISR, never moving backwards) and
proposes ISR changes: a follower that has not caught up to the leader's log end within
``replica.lag.time.max.ms`` is dropped; one that has reached the high watermark (and the start of
the current leader epoch) is added back. Proposals go to the metadata store; the ISR here changes
only when the store's new state is applied. While an expansion is proposed, the high watermark
already waits for the joining follower (Kafka's maximal ISR, KIP-497): the controller may act on
the stored ISR (complete a reassignment, elect that follower) before the leader applies it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

UNKNOWN = -1


class Clock(Protocol):
    ms: int


@dataclass
class FollowerProgress:
    log_end_offset: int = UNKNOWN
    # The follower's own log start, as its last fetch said (its retention is its own, and may run
    # ahead of ours): KIP-392 sends a consumer to it only for an offset it still holds.
    log_start_offset: int = UNKNOWN
    last_caught_up_ms: int = 0
    last_sent_hw: int = UNKNOWN  # the high watermark this follower was last told
    # The log start this follower was last told: its own start equal to ours says nothing of
    # what it heard from us (its retention runs on its own), which its follower reads depend on.
    last_sent_log_start: int = UNKNOWN
    # The leader's log end and the time at this follower's previous fetch: a fetch reaching that
    # end shows the follower was caught up then (Kafka's lastFetchLeaderLogEndOffset).
    last_fetch_leader_leo: int = UNKNOWN
    last_fetch_ms: int = 0
    # While the follower's fetch session holds this partition quiet (broker/quiet_fetches.py), it
    # is caught up at each fetch of that session without being looked at: the session's clock (when
    # it last fetched) stands in for last_caught_up_ms, which takes its value when the mark goes.
    quiet_clock: Clock | None = None

    def caught_up_ms(self) -> int:
        clock = self.quiet_clock
        return self.last_caught_up_ms if clock is None else max(self.last_caught_up_ms, clock.ms)


@dataclass
class LeaderState:
    leader_id: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    epoch_start_offset: int
    high_watermark: int
    became_leader_ms: int
    followers: dict[int, FollowerProgress] = field(default_factory=dict)
    # The ISR proposed to the store and not applied yet, when it adds replicas (None otherwise).
    maximal_isr: list[int] | None = None

    def __post_init__(self) -> None:
        for replica in self.replicas:
            if replica != self.leader_id:
                # A follower gets lag time from the moment we became leader before it can be dropped.
                self.followers.setdefault(replica, FollowerProgress(last_caught_up_ms=self.became_leader_ms))

    def on_follower_fetch(
        self, follower: int, fetch_offset: int, leader_leo: int, now_ms: int, log_start_offset: int = UNKNOWN
    ) -> bool:
        """Record a follower fetch (at ``fetch_offset``, its log starting at ``log_start_offset``);
        True if the high watermark advanced."""
        progress = self.followers.get(follower)
        if progress is None:  # not setdefault: that built a FollowerProgress on every replica fetch
            progress = self.followers[follower] = FollowerProgress(last_caught_up_ms=now_ms)
        progress.log_end_offset = fetch_offset
        progress.log_start_offset = log_start_offset
        if fetch_offset >= leader_leo:
            progress.last_caught_up_ms = now_ms
        elif fetch_offset >= progress.last_fetch_leader_leo >= 0:
            # Behind now only by what the leader appended since the previous fetch, whose answer
            # this follower has all of: it was caught up at that fetch. Without this, a follower
            # keeping pace with a leader that appends between every two fetches was never caught
            # up, and was dropped from the ISR after replica.lag.time.max.ms.
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.last_fetch_ms)
        progress.last_fetch_leader_leo = leader_leo
        progress.last_fetch_ms = now_ms
        return self.maybe_advance_hw(leader_leo)

    def maybe_advance_hw(self, leader_leo: int) -> bool:
        candidate = leader_leo
        for replica in self.isr if self.maximal_isr is None else self.maximal_isr:
            if replica == self.leader_id:
                continue
            progress = self.followers.get(replica)
            if progress is None or progress.log_end_offset == UNKNOWN:
                return False
            candidate = min(candidate, progress.log_end_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def holds_offset(self, follower: int, offset: int) -> bool:
        """Whether ``follower`` holds ``offset`` as far as its last fetch told us (its log start to
        its log end): the replicas KIP-392 may send a consumer at ``offset`` to (Kafka's
        ReplicaManager.findPreferredReadReplica). Never for a follower not heard from yet."""
        progress = self.followers.get(follower)
        return progress is not None and progress.log_start_offset <= offset <= progress.log_end_offset

    def low_watermark(self, leader_log_start: int, live: Collection[int]) -> int:
        """Kafka's Partition.lowWatermarkIfLeader: the lowest log start of this leader and of its
        followers on ``live`` brokers (UNKNOWN for one not heard from yet). A DeleteRecords is done
        when it reaches the requested offset: every live replica then answers from the new start."""
        low = leader_log_start
        for follower, progress in self.followers.items():
            if follower in live and follower in self.replicas:
                low = min(low, progress.log_start_offset)
        return low

    def isr_to_shrink(self, now_ms: int, lag_ms: int) -> list[int]:
        out = []
        for replica in self.isr:
            if replica == self.leader_id:
                continue
            progress = self.followers.get(replica)
            if progress is None or now_ms - progress.caught_up_ms() > lag_ms:
                out.append(replica)
        return out

    def isr_to_expand(self) -> list[int]:
        return [replica for replica in self.followers if self.may_rejoin(replica)]

    def may_rejoin(self, follower: int) -> bool:
        """Whether ``follower``, out of the ISR, has caught up enough to be added back (asked on
        every replica fetch of every partition, so for the one fetching follower only)."""
        if follower in self.isr or follower not in self.replicas:
            return False
        progress = self.followers.get(follower)
        return progress is not None and progress.log_end_offset >= max(self.high_watermark, self.epoch_start_offset)

    def propose_isr(self, isr: list[int]) -> None:
        """An ISR change is being proposed to the store: until it is applied (or fails), replicas it
        adds count for the high watermark as if they were in the ISR."""
        if set(isr) - set(self.isr):
            self.maximal_isr = sorted(set(self.isr) | set(isr))

    def proposal_failed(self) -> None:
        self.maximal_isr = None

    def apply_isr(self, isr: list[int], leader_leo: int, state_changed: bool = True) -> bool:
        """The store's ISR (applied from metadata); returns True if that advanced the high watermark.

        The same state applied again (a watch resync re-applies every partition) says nothing about
        a proposal in flight: its maximal ISR stays, as Kafka leaves the pending state alone for a
        metadata update with an unchanged partition epoch. Any other change to the partition's
        state (``state_changed``: its ISR, or its replicas by a reassignment) moved the revision
        the proposal was made against, so the proposal can no longer land: the pending state ends,
        as on Kafka's new partition epoch."""
        if state_changed or list(isr) != self.isr:
            self.maximal_isr = None
        self.isr = list(isr)
        return self.maybe_advance_hw(leader_leo)

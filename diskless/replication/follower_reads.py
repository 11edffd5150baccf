"""Whether a follower replica answers a consumer's read of a diskless partition itself, sans-IO.

Zone-aligned metadata presents a follower to the clients of its AZ as the partition's leader
(DESIGN.md, "Metadata crafting"). Those clients cannot fall back to the real leader the way a
KIP-392 consumer does, so the follower must never answer what the leader would not:

- OFFSET_OUT_OF_RANGE only for an offset below the leader's log start (as last heard from the
  leader, which only grows), reported with that start. An offset above what the follower holds
  committed (a consumer that got it from another broker or a committed group offset) is read
  through the leader, as a broker with no replica does; so is one below the follower's own
  start (its retention may have run ahead of the leader's).
- Data only from a follower that is in the ISR and heard from its leader within
  ``max_staleness_ms``. A follower serves up to the high watermark and above the log start it
  learned from its last replication answer; after retention or DeleteRecords on the leader
  those offsets' WAL objects become deletable, and the WAL manager deletes them no sooner than
  ``wal.manager.confirm.ms`` after the leader stopped referencing them. A follower that heard
  from the leader within a few seconds therefore knows every start that could matter, and one
  that did not (partitioned, paused, leader just changed, out of the ISR) reads through the
  leader instead.

An offset exactly at the follower's high watermark is served locally (an empty long poll): that
is where every caught-up consumer waits, and replication wakes it.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVE = "serve"
FORWARD = "forward"
OUT_OF_RANGE = "out_of_range"


@dataclass(slots=True)
class FollowerView:
    """What a follower knows when a read arrives.

    Not frozen: one is built per partition of a consumer's fetch from a follower, and a frozen
    dataclass sets each field through ``object.__setattr__``."""

    in_isr: bool  # per the metadata store
    heard_from_leader_ms: int  # when its replica fetcher last had an answer; -1 never (this epoch)
    log_start_offset: int
    high_watermark: int
    leader_log_start_offset: int  # the leader's, as of that answer; -1 unknown


@dataclass(frozen=True, slots=True)
class ReadDecision:
    action: str  # SERVE, FORWARD or OUT_OF_RANGE
    log_start_offset: int = -1  # with OUT_OF_RANGE: the log start to report


def is_fresh(view: FollowerView, now_ms: int, max_staleness_ms: int) -> bool:
    """In the ISR and in recent contact with the leader: fit to answer reads itself."""
    return view.in_isr and view.heard_from_leader_ms >= 0 and now_ms - view.heard_from_leader_ms <= max_staleness_ms


def follower_read(view: FollowerView, offset: int, now_ms: int, max_staleness_ms: int) -> ReadDecision:
    """How a follower answers a consumer's fetch at ``offset`` (see the module docstring)."""
    if offset < view.leader_log_start_offset:
        # Log starts only move forward: the leader would refuse this offset too.
        return ReadDecision(OUT_OF_RANGE, view.leader_log_start_offset)
    if not is_fresh(view, now_ms, max_staleness_ms):
        return ReadDecision(FORWARD)
    if offset < view.log_start_offset or offset > view.high_watermark:
        return ReadDecision(FORWARD)
    return ReadDecision(SERVE)


def earliest_offset(view: FollowerView) -> int:
    """ListOffsets(EARLIEST) (and a Fetch answer's log start) from a fresh follower: what the
    leader would answer, its log start as last heard. Not our own start when that is higher: our
    retention may have run ahead of the leader's, and the offsets in between are read through the
    leader (``follower_read``), so a consumer resetting to earliest must start at the leader's.
    Our own start only while the leader's is unknown."""
    return view.leader_log_start_offset if view.leader_log_start_offset >= 0 else view.log_start_offset


def max_staleness_ms(replica_fetch_wait_max_ms: int, replica_lag_time_max_ms: int) -> int:
    """How long after the last replication answer a follower still serves reads itself.

    An idle leader answers a replica fetch every ``replica.fetch.wait.max.ms``; a few of those
    missed means something is wrong. Bounded by the ISR lag time, and far below the WAL
    manager's confirmation delay (30 s by default), which the log-start argument needs."""
    return min(replica_lag_time_max_ms, max(4 * replica_fetch_wait_max_ms, 2_000))

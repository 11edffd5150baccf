"""A follower's truncation when its leader answers a fetch with a diverging epoch (KIP-320).

Replicas are sans-IO ``Partition``s; ``fetch_round`` is one replica fetch as the leader's Fetch
handler and the follower's fetcher do it. Each test fails on the code before the fix named in it.
"""

from __future__ import annotations

from pathlib import Path

from batches import values_batch

from diskless.cluster.metadata import PartitionState
from diskless.log.config import LogConfig
from diskless.log.partition_log import OffsetOutOfRange, PartitionLog
from diskless.replication.partition import DivergingEpoch, Partition

T0 = 1_700_000_000_000


def replica(tmp, node, **config):
    log = PartitionLog(str(tmp / f"r{node}"), LogConfig(**config), T0)
    return Partition("t", 0, log, node, "id")


def state(leader, epoch, isr, replicas=(0, 1)):
    return PartitionState(replicas=list(replicas), leader=leader, leader_epoch=epoch, isr=list(isr))


def produce(leader, count, now=T0):
    batch = values_batch(count, start_ts=now)
    r = leader.log.append_as_leader([memoryview(batch)], leader.leader_epoch, now)
    leader.on_local_append()
    return r


def fetch_round(leader, follower, now=T0):
    """One replica fetch by ``follower`` from ``leader``; returns what happened."""
    plog = leader.log
    offset = follower.log.log_end_offset
    last_epoch = follower.log.epochs.latest_epoch
    diverging = leader.diverging_epoch(last_epoch, offset)
    if diverging is not None:
        follower.truncate_on_divergence(DivergingEpoch(diverging.epoch, diverging.end_offset), now)
        return "diverging", diverging
    if offset <= plog.log_end_offset:
        leader.on_follower_fetch(follower.node_id, offset, now)
    try:
        result = plog.read(offset, 1 << 20, max_offset=plog.log_end_offset, tiered=False)
    except OffsetOutOfRange:
        if follower.log.log_end_offset < plog.log_start_offset:
            follower.log.truncate_fully_and_start_at(plog.log_start_offset, now)
        return "out_of_range", None
    follower.on_fetched(result.records, plog.high_watermark, plog.log_start_offset, now)
    return "data", len(result.records)


def test_follower_resumes_after_leading_an_empty_epoch(tmp_path: Path) -> None:
    """A led epoch 1 and appended nothing; B then leads epoch 2. B answers A's fetches with the
    end of epoch 0, which is A's log end: before the fix A's truncation stopped there without
    forgetting its own epoch 1, and every later fetch diverged again (A never copied a record)."""
    a, b = replica(tmp_path, 0), replica(tmp_path, 1)
    b.apply_state(state(1, 0, [0, 1]), 0)
    a.apply_state(state(1, 0, [0, 1]), 0)
    produce(b, 5)
    for _ in range(3):
        fetch_round(b, a)
    assert a.log.log_end_offset == 5 and b.log.high_watermark == 5

    # A leads epoch 1 and appends nothing; then B leads epoch 2.
    a.apply_state(state(0, 1, [0, 1]), 0)
    b.apply_state(state(0, 1, [0, 1]), 0)
    fetch_round(a, b)
    a.apply_state(state(1, 2, [0, 1]), 0)
    b.apply_state(state(1, 2, [0, 1]), 0)

    produce(b, 3)
    outcomes = [fetch_round(b, a)[0] for _ in range(10)]
    assert a.log.log_end_offset == 8, (outcomes, a.log.epochs._entries, b.log.epochs._entries)


R = (0, 1, 2)


def test_follower_truncates_to_its_own_end_of_an_unknown_epoch(tmp_path: Path) -> None:
    """A wrote 10..11 in epoch 3, which C (leader at epoch 4) never saw; C answers with the end of
    epoch 2 (15), which A never had. Before the fix A truncated to 15, that is not at all, kept
    records C's log does not have and diverged on every fetch; it must cut at its own end of
    epoch 2's predecessor (10)."""
    a, b, c = replica(tmp_path, 0), replica(tmp_path, 1), replica(tmp_path, 2)
    for p in (a, b, c):
        p.apply_state(state(0, 1, [0, 1, 2], R), 0)
    produce(a, 10)
    for _ in range(2):
        fetch_round(a, b), fetch_round(a, c)

    for p in (a, b, c):
        p.apply_state(state(1, 2, [0, 1, 2], R), 0)
    fetch_round(b, a)  # caught up at 10
    produce(b, 5)
    fetch_round(b, c)
    assert c.log.log_end_offset == 15 and a.log.log_end_offset == 10

    for p in (a, c):
        p.apply_state(state(0, 3, [0, 2], R), 0)  # B died
    produce(a, 2)
    assert a.log.log_end_offset == 12

    for p in (a, c):
        p.apply_state(state(2, 4, [2], R), 0)  # A died before C fetched from it; C leads
    produce(c, 1)
    outcomes = [fetch_round(c, a) for _ in range(6)]
    assert a.log.log_end_offset == c.log.log_end_offset, (outcomes, a.log.epochs._entries, c.log.epochs._entries)
    assert a.log.epochs.epoch_for_offset(10) == 2, a.log.epochs._entries

"""A leader serving replica fetches from KIP-227 sessions (broker/fetch_apis.py, quiet marks in
broker/quiet_fetches.py), driven without sockets through the real codec: quiet partitions of an
incremental fetch are left out without being checked one by one, and any change to one of them
(an append, a leadership change, an ISR change) makes it answered again."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import io
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from test_topic_identity import CONFIG, FetchingBroker, now_ms, produce_pointer

from diskless.broker.fetch_apis import NamedFetchTopic
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.metrics import UNWATCHED_CHANGES
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.replication.fetch_session import FetchSession
from diskless.replication.fetcher import FETCH_VERSION, ReplicaFetcher
from diskless.replication.partition import VERIFY_MS, Partition

PARTITIONS = 10


@dataclasses.dataclass
class Pair:
    leader: FetchingBroker
    follower: FetchingBroker
    meta: TopicMetadata
    fetcher: ReplicaFetcher
    replicas: list[Partition]  # the follower's
    checks: int = 0  # full quiet checks the leader ran (leader_log calls)
    sent_ms: int = 1_000_000  # when the last replica fetch was sent, as the fetcher stamps it

    async def round(self) -> dict[int, Any]:
        """One replica fetch; the partitions answered, by index."""
        header = m.RequestHeader(m.API_FETCH, FETCH_VERSION, 7, internal.broker_client_id(1, "replica-fetcher"))
        request_cls = m._request_type(m.API_FETCH, FETCH_VERSION)
        self.fetcher._sent_ms = self.sent_ms = self.sent_ms + 1000  # as _run stamps each request
        body = dataclasses.replace(self.fetcher._request(), max_wait=datetime.timedelta(0))
        out = io.BytesIO()
        m._writer(request_cls)(out, body)
        request, _ = m._reader(request_cls)(memoryview(out.getvalue()), 0)
        frame = m.encode_response(header, await self.leader.fetch_apis.fetch(header, request))
        response, _ = m._reader(m._response_type(m.API_FETCH, FETCH_VERSION))(memoryview(frame)[9:], 0)
        assert response.error_code == ErrorCode.none
        assert self.fetcher.session.handle_response(response.error_code, response.session_id)
        self.fetcher._handle(response)
        return {p.partition_index: p for t in response.responses for p in t.partitions}

    def set_state(self, index: int, **changes: Any) -> None:
        """A new stored state of one partition, applied by both brokers."""
        state = dataclasses.replace(self.meta.partitions[index], **changes)
        self.meta = dataclasses.replace(
            self.meta, partitions=[*self.meta.partitions[:index], state, *self.meta.partitions[index + 1 :]]
        )
        for broker in (self.leader, self.follower):
            broker.metadata.topics["t"] = self.meta
            broker.replicas.apply(self.meta, index, CONFIG, now_ms())

    def sessions(self) -> list[FetchSession]:
        return list(self.leader.fetch_apis._sessions._sessions.values())

    async def until_quiet(self) -> None:
        for _ in range(5):
            if not await self.round():
                return
        raise AssertionError("fetches never became quiet")


def make_pair(tmp_path: Path) -> Pair:
    leader, follower = FetchingBroker(tmp_path / "leader", 0), FetchingBroker(tmp_path / "follower", 1)
    states = [PartitionState(replicas=[0, 1], leader=0, leader_epoch=0, isr=[0, 1]) for _ in range(PARTITIONS)]
    meta = TopicMetadata("t", str(uuid.uuid4()), states, {"diskless.enabled": "true"})
    leader.metadata.topics["t"] = follower.metadata.topics["t"] = meta
    fetcher = ReplicaFetcher(1, 0, lambda node: None, 0, 1 << 20, lambda: None)
    replicas = []
    for index in range(PARTITIONS):
        assert leader.replicas.apply(meta, index, CONFIG, now_ms()) is not None
        replica = follower.replicas.apply(meta, index, CONFIG, now_ms())
        assert replica is not None
        fetcher.add(replica)
        replicas.append(replica)
    result = Pair(leader, follower, meta, fetcher, replicas)
    quiet = leader.fetch_apis._quiet
    leader_log = quiet.leader_log

    def counting(*args: Any) -> Any:
        result.checks += 1
        return leader_log(*args)

    quiet.leader_log = counting
    return result


@pytest.fixture
async def pair(tmp_path: Path) -> Iterator[Pair]:
    result = make_pair(tmp_path)
    yield result
    await result.leader.replicas.close()
    await result.follower.replicas.close()


def leader_replica(pair: Pair, index: int) -> Partition:
    replica = pair.leader.replicas.partitions[("t", index)]
    assert replica.leader_state is not None
    return replica


async def test_quiet_incremental_fetch_checks_no_partition_and_keeps_the_follower_in_sync(pair: Pair) -> None:
    await pair.until_quiet()
    states = [leader_replica(pair, i).leader_state for i in range(PARTITIONS)]
    for state in states:
        assert state is not None
        state.followers[1].last_caught_up_ms = 0
    pair.checks = 0
    assert await pair.round() == {}
    assert pair.checks == 0  # sessionless (or without quiet marks): one full check per partition
    # replica.lag.time.max.ms sees the follower caught up at this fetch
    assert all(state.isr_to_shrink(now_ms(), 10_000) == [] for state in states)  # type: ignore[union-attr]


async def test_an_append_on_a_quiet_partition_is_answered_and_replicated(pair: Pair) -> None:
    await pair.until_quiet()
    produce_pointer(leader_replica(pair, 3), "wal/a.wal")
    answers = await pair.round()
    assert list(answers) == [3] and answers[3].records
    assert pair.replicas[3].log.log_end_offset == 3
    await pair.until_quiet()  # the follower's new position, then the new high watermark, went through
    assert leader_replica(pair, 3).log.high_watermark == 3
    assert pair.replicas[3].log.high_watermark == 3


async def test_a_leadership_change_on_a_quiet_partition_is_answered(pair: Pair) -> None:
    await pair.until_quiet()
    moved = dataclasses.replace(pair.meta.partitions[5], leader=1, leader_epoch=1)
    meta = dataclasses.replace(pair.meta, partitions=[*pair.meta.partitions[:5], moved, *pair.meta.partitions[6:]])
    pair.leader.metadata.topics["t"] = meta
    pair.leader.replicas.apply(meta, 5, CONFIG, now_ms())
    answers = await pair.round()
    assert list(answers) == [5] and answers[5].error_code != ErrorCode.none


async def test_an_isr_change_on_a_quiet_partition_is_checked_again(pair: Pair) -> None:
    await pair.until_quiet()
    replica = leader_replica(pair, 7)
    shrunk = dataclasses.replace(pair.meta.partitions[7], isr=[0])  # the follower dropped out
    replica.apply_state(shrunk, now_ms())
    pair.checks = 0
    await pair.round()
    assert pair.checks >= 1  # the full check ran (and may propose the follower back)


async def test_a_fetch_parked_in_its_session_answers_a_partition_that_changes_meanwhile(pair: Pair) -> None:
    await pair.until_quiet()
    header = m.RequestHeader(m.API_FETCH, FETCH_VERSION, 8, internal.broker_client_id(1, "replica-fetcher"))
    body = dataclasses.replace(pair.fetcher._request(), max_wait=datetime.timedelta(seconds=5))
    parked = asyncio.create_task(pair.leader.fetch_apis.fetch(header, body))
    await asyncio.sleep(0)  # the fetch found nothing to answer and parked
    assert not parked.done()
    produce_pointer(leader_replica(pair, 3), "wal/a.wal")  # its quiet mark goes
    pair.leader.replicas.notify_append()
    answer = await asyncio.wait_for(parked, 5)
    assert [p["partition_index"] for t in answer["responses"] for p in t["partitions"]] == [3]


@dataclasses.dataclass
class _Request:
    topics: tuple[Any, ...]


async def test_a_late_pass_of_a_replaced_session_marks_nothing(pair: Pair) -> None:
    """A follower's fetch can still be parked in its old session when its next, full fetch opens a
    new one (a connection lost mid-poll). The old session's pass must not take the partitions over:
    their ISR upkeep would then follow a session that no longer fetches, and the follower, fetching
    on, would be dropped from the ISR at replica.lag.time.max.ms."""
    await pair.until_quiet()
    [old] = pair.sessions()
    pair.fetcher.session.handle_error()  # the follower starts over: full fetch, new session
    await pair.until_quiet()
    [new] = pair.sessions()
    assert new is not old and old.closed
    request = _Request(tuple(NamedFetchTopic("t", t, parts) for t, parts in old.topics()))
    assert request.topics  # closed, the old session holds no marks: all its partitions are checked
    pair.leader.fetch_apis._quiet.needing_answer_in_session(request, old, 1, now_ms())
    assert not old.quiet
    for i in range(PARTITIONS):
        progress = leader_replica(pair, i).leader_state.followers[1]  # type: ignore[union-attr]
        assert progress.quiet_clock is new.clock


async def test_a_change_that_fires_no_watch_is_caught_by_the_next_verification(pair: Pair) -> None:
    await pair.until_quiet()
    replica = leader_replica(pair, 4)
    hook, replica.log.on_change = replica.log.on_change, lambda: None  # a change made behind the watches
    produce_pointer(replica, "wal/b.wal")
    replica.log.on_change = hook
    assert await pair.round() == {}  # its mark stands until verified
    misses = UNWATCHED_CHANGES.labels("fetch-session")._value.get()
    [session] = pair.sessions()
    session.verified_ms = now_ms() - VERIFY_MS
    assert list(await pair.round()) == [4]
    assert UNWATCHED_CHANGES.labels("fetch-session")._value.get() == misses + 1


def assert_fetcher_current(pair: Pair) -> None:
    """The follower's fetcher, refreshed from its watches alone, asks for every partition it
    follows at the position a fresh look gives."""
    fetcher = pair.fetcher
    fetcher._refresh(fetcher._verified_ms)  # not the periodic full look
    assert set(fetcher._asked) == {("t", i) for i in range(PARTITIONS)}
    for replica in pair.replicas:
        log = replica.log
        position = (replica.leader_epoch, log.log_end_offset, log.epochs.latest_epoch, log.log_start_offset)
        assert fetcher._built[(replica.topic_id, replica.index)][0] == position


# Operations on the partitions between replica fetch rounds: every one must drop the leader's quiet
# mark of the partition it changes (or leave it true), and reach the follower's fetcher if it moves
# the follower's position: the safety net's checks tell.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "round",
                "append",
                "shrink",
                "expand",
                "propose",
                "bump_epoch",
                "delete_records",
                "follower_delete_records",
            ]
        ),
        st.integers(0, 3),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_every_change_drops_the_quiet_mark_it_concerns(tmp_path: Path, ops: list[tuple[str, int]]) -> None:
    async def scenario(directory: Path) -> None:
        pair = make_pair(directory)
        try:
            for index in range(PARTITIONS):  # data in every partition, so each change has a mark to drop
                produce_pointer(leader_replica(pair, index), "wal/first.wal")
            for _ in range(3):
                await pair.round()
            await pair.until_quiet()
            assert len(pair.sessions()[0].quiet) == PARTITIONS
            for op, index in ops:
                replica = leader_replica(pair, index)
                state = pair.meta.partitions[index]
                if op == "round":
                    await pair.round()
                elif op == "append":
                    produce_pointer(replica, f"wal/{index}.wal")
                elif op == "shrink":
                    pair.set_state(index, isr=[0])
                elif op == "expand":
                    pair.set_state(index, isr=[0, 1])
                elif op == "propose" and state.isr == [0]:
                    replica.propose_isr([0, 1])
                elif op == "bump_epoch":
                    pair.set_state(index, leader_epoch=state.leader_epoch + 1)
                elif op == "delete_records" and replica.log.high_watermark > replica.log.log_start_offset:
                    replica.log.delete_records_before(replica.log.log_start_offset + 1)  # mid-batch
                elif op == "follower_delete_records":
                    follower = pair.replicas[index].log
                    if follower.high_watermark > follower.log_start_offset:
                        follower.delete_records_before(follower.log_start_offset + 1)
                # Every change fired its watches: nothing is stale where the parties look.
                assert_fetcher_current(pair)
                hosted = pair.leader.replicas.partitions
                for session in pair.sessions():
                    for mark in session.quiet.values():
                        assert mark.holds(hosted.get((mark.replica.topic, mark.replica.index))), (op, index)
            for index in range(PARTITIONS):
                pair.set_state(index, isr=[0, 1])
            for _ in range(6):
                await pair.round()
            for index in range(PARTITIONS):  # and the follower got everything
                leader, follower = leader_replica(pair, index).log, pair.replicas[index].log
                assert follower.log_end_offset == leader.log_end_offset
                assert follower.log_start_offset >= leader.log_start_offset  # its own DeleteRecords
                assert follower.high_watermark == leader.high_watermark == leader.log_end_offset
        finally:
            await pair.leader.replicas.close()
            await pair.follower.replicas.close()

    with tempfile.TemporaryDirectory(dir=tmp_path) as directory:
        asyncio.run(scenario(Path(directory)))


async def test_a_quiet_answer_is_news_from_the_leader_for_every_partition_it_leaves_out(pair: Pair) -> None:
    await pair.until_quiet()
    assert await pair.round() == {}
    assert [r.heard_from_leader_ms for r in pair.replicas] == [pair.sent_ms] * PARTITIONS


async def test_a_partition_answered_with_an_error_has_not_heard_from_the_leader(pair: Pair) -> None:
    await pair.until_quiet()
    heard = pair.replicas[5].heard_from_leader_ms
    moved = dataclasses.replace(pair.meta.partitions[5], leader=1, leader_epoch=1)
    pair.leader.metadata.topics["t"] = dataclasses.replace(
        pair.meta, partitions=[*pair.meta.partitions[:5], moved, *pair.meta.partitions[6:]]
    )
    pair.leader.replicas.apply(pair.leader.metadata.topics["t"], 5, CONFIG, now_ms())  # the follower lags behind
    for _ in range(2):
        answers = await pair.round()
        assert answers[5].error_code != ErrorCode.none
        assert pair.replicas[5].heard_from_leader_ms == heard
        assert pair.replicas[4].heard_from_leader_ms == pair.sent_ms


async def test_after_a_new_leader_epoch_quiet_answers_count_again(pair: Pair) -> None:
    """A new epoch resets what the replica heard (nothing from this leader epoch yet). Its next
    answers must count again, although the fetcher still asks for the very same replica."""
    await pair.until_quiet()
    pair.set_state(6, leader_epoch=1)
    assert pair.replicas[6].heard_from_leader_ms == -1
    await pair.round()  # the new epoch goes to the leader
    await pair.until_quiet()
    assert pair.replicas[6].heard_from_leader_ms == pair.sent_ms


async def test_a_failing_watch_neither_cuts_a_change_short_nor_stops_the_other_watches(pair: Pair) -> None:
    replica = leader_replica(pair, 2)
    fired: list[str] = []

    def broken() -> None:
        raise RuntimeError("a watcher's bug")

    replica.watch("broken", broken)
    replica.watch("other", lambda: fired.append("other"))
    produce_pointer(replica, "wal/c.wal")  # the append completes
    assert replica.log.log_end_offset == 3 and fired == ["other"]


async def test_a_high_watermark_sent_in_a_lost_answer_reaches_the_follower_that_starts_over(pair: Pair) -> None:
    """The leader's answer carrying a new high watermark is lost with the connection; the follower
    starts over with a full fetch in a new session. Before the fix the leader still took that
    watermark as heard and left the partition out of every later answer (quiet), so the follower,
    and the consumers it serves, kept the old one until the partition next changed."""
    await pair.until_quiet()
    leader = leader_replica(pair, 3)
    produce_pointer(leader, "wal/a.wal")
    await pair.round()  # the follower copies the entry; the leader still has its fetch offset at 0
    assert pair.replicas[3].log.log_end_offset == 3

    # The next fetch (offset 3) moves the high watermark to 3; its answer carries it, and is lost.
    header = m.RequestHeader(m.API_FETCH, FETCH_VERSION, 9, internal.broker_client_id(1, "replica-fetcher"))
    body = dataclasses.replace(pair.fetcher._request(), max_wait=datetime.timedelta(0))
    lost = await pair.leader.fetch_apis.fetch(header, body)
    assert leader.log.high_watermark == 3
    assert any(p["partition_index"] == 3 for t in lost["responses"] for p in t["partitions"])
    pair.fetcher.session.handle_error()  # the connection dropped: the next fetch is full

    for _ in range(5):
        await pair.round()
    assert pair.replicas[3].log.high_watermark == 3


async def test_a_session_serves_its_partitions_in_turn_when_max_bytes_holds_one(pair: Pair) -> None:
    # Kafka's incremental fetch context moves each partition answered with records to the end of
    # the session's list: under max_bytes, partitions further down are read first next time, and
    # one that keeps getting appends does not starve the others.
    await pair.until_quiet()
    pair.fetcher.fetch_max_bytes, pair.fetcher._template = 1, None  # KIP-74: one partition's first batch per answer
    served = []
    for _ in range(PARTITIONS):
        for index in range(PARTITIONS):
            produce_pointer(leader_replica(pair, index), "wal/a.wal")
        ends = [replica.log.log_end_offset for replica in pair.replicas]
        await pair.round()
        served += [i for i, replica in enumerate(pair.replicas) if replica.log.log_end_offset > ends[i]]
    assert served == list(range(PARTITIONS))

"""A leader serving replica fetches from KIP-227 sessions (broker/fetch_apis.py, quiet marks in
broker/quiet_fetches.py), driven without sockets through the real codec: quiet partitions of an
incremental fetch are left out without being checked one by one, and any change to one of them
(an append, a leadership change, an ISR change) makes it answered again."""

from __future__ import annotations

import dataclasses
import datetime
import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from test_topic_identity import CONFIG, FetchingBroker, now_ms, produce_pointer

from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.replication.fetcher import FETCH_VERSION, ReplicaFetcher
from diskless.replication.partition import Partition

PARTITIONS = 10


@dataclasses.dataclass
class Pair:
    leader: FetchingBroker
    follower: FetchingBroker
    meta: TopicMetadata
    fetcher: ReplicaFetcher
    replicas: list[Partition]  # the follower's
    checks: int = 0  # full quiet checks the leader ran (leader_log calls)

    async def round(self) -> dict[int, Any]:
        """One replica fetch; the partitions answered, by index."""
        header = m.RequestHeader(m.API_FETCH, FETCH_VERSION, 7, internal.broker_client_id(1, "replica-fetcher"))
        request_cls = m._request_type(m.API_FETCH, FETCH_VERSION)
        body = dataclasses.replace(self.fetcher._request(self.replicas), max_wait=datetime.timedelta(0))
        out = io.BytesIO()
        m._writer(request_cls)(out, body)
        request, _ = m._reader(request_cls)(memoryview(out.getvalue()), 0)
        frame = m.encode_response(header, await self.leader.fetch_apis.fetch(header, request))
        response, _ = m._reader(m._response_type(m.API_FETCH, FETCH_VERSION))(memoryview(frame)[9:], 0)
        assert response.error_code == ErrorCode.none
        assert self.fetcher.session.handle_response(response.error_code, response.session_id)
        self.fetcher._handle(response)
        return {p.partition_index: p for t in response.responses for p in t.partitions}

    async def until_quiet(self) -> None:
        for _ in range(5):
            if not await self.round():
                return
        raise AssertionError("fetches never became quiet")


@pytest.fixture
async def pair(tmp_path: Path) -> Iterator[Pair]:
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
    yield result
    await leader.replicas.close()
    await follower.replicas.close()


def leader_replica(pair: Pair, index: int) -> Partition:
    replica = pair.leader.replicas.partitions[("t", index)]
    assert replica.leader_state is not None
    return replica


async def test_quiet_incremental_fetch_checks_no_partition_and_keeps_the_follower_in_sync(pair: Pair) -> None:
    await pair.until_quiet()
    progress = [leader_replica(pair, i).leader_state.followers[1] for i in range(PARTITIONS)]  # type: ignore[union-attr]
    for p in progress:
        p.last_caught_up_ms = 0
    pair.checks = 0
    assert await pair.round() == {}
    assert pair.checks == 0  # sessionless (or without quiet marks): one full check per partition
    assert all(p.last_caught_up_ms > 0 for p in progress)  # replica.lag.time.max.ms sees it caught up


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
    assert replica.leader_state is not None
    replica.leader_state.apply_isr([0], replica.log.log_end_offset)  # the follower dropped out
    pair.checks = 0
    await pair.round()
    assert pair.checks >= 1  # the full check ran (and may propose the follower back)

"""KIP-392 for classic topics: the leader sends a consumer only to a replica that holds its fetch
offset. Kafka's ReplicaManager.findPreferredReadReplica keeps in-sync replicas whose log start
offset <= fetch offset <= log end offset, as the leader last learnt them from the replica's own
fetches; a follower whose retention ran ahead would answer OFFSET_OUT_OF_RANGE, the consumer would
clear its preferred replica, come back to the leader, be sent there again, forever."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_follower_reads as tfr
from fetch_requests import consumer_fetch
from kio.schema.errors import ErrorCode
from test_follower_reads import EPOCH, FOLLOWER, TOPIC, FakeBroker, Pair, client_header, fetch_request, offsets_of

from diskless.protocol import messages as m
from diskless.replication.partition import Partition


class ClassicBroker(FakeBroker):
    """FakeBroker of a classic topic, able to answer a replica fetch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.operations = SimpleNamespace(replication_allowance=lambda state, follower: None)

    def is_diskless(self, meta: Any) -> bool:
        return False

    def on_follower_fetch(self, partition: Partition, follower: int, fetch_offset: int, log_start_offset: int) -> None:
        partition.on_follower_fetch(follower, fetch_offset, self.now_ms(), log_start_offset)


class ClassicPair(Pair):
    """Pair's leader (az-a) and in-sync follower (az-b), of a classic topic."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        saved = tfr.FakeBroker
        tfr.FakeBroker = ClassicBroker  # type: ignore[misc]
        try:
            super().__init__(root, **kwargs)
        finally:
            tfr.FakeBroker = saved  # type: ignore[misc]
        self.metadata.topics[TOPIC].configs.pop("diskless.enabled", None)
        state = self.leader_part.leader_state
        assert state is not None
        state.high_watermark = self.leader_part.log.high_watermark  # Pair set the log's by hand

    async def replica_fetch(self, offset: int, log_start: int) -> None:
        """The follower's Fetch v12 to the leader: at ``offset``, its own log starting at ``log_start``."""
        base = consumer_fetch(12, TOPIC, uuid.UUID(int=0), [offset])
        topic = base.topics[0]
        part = dataclasses.replace(topic.partitions[0], current_leader_epoch=EPOCH, log_start_offset=log_start)
        request = dataclasses.replace(
            base, replica_id=FOLLOWER, topics=(dataclasses.replace(topic, partitions=(part,)),), rack_id=""
        )
        await self.leader.fetch_apis.fetch(m.RequestHeader(m.API_FETCH, 12, 2, "broker-1"), request)


async def _consumer_fetch(broker: FakeBroker, offset: int) -> dict[str, Any]:
    """A consumer in az-b (client.rack) fetching at ``offset`` (Fetch v12, with KIP-392's fields)."""
    request = fetch_request(offset)
    request.rack_id = "az-b"
    response = await broker.fetch_apis.fetch(client_header(m.API_FETCH, 12), request)
    return response["responses"][0]["partitions"][0]


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[ClassicPair]:
    made = ClassicPair(tmp_path / "classic", leader_end=20, follower_end=20)
    yield made
    await made.close()


async def test_the_leader_does_not_send_a_consumer_to_a_replica_without_its_offset(pair: ClassicPair) -> None:
    # The in-sync follower's own retention ran ahead of the leader's; its next fetch tells the leader.
    pair.follower_part.log.delete_records_before(10)
    assert pair.follower_part.log.log_start_offset == 10 and pair.leader_part.log.log_start_offset == 0
    await pair.replica_fetch(20, 10)

    assert (await _consumer_fetch(pair.follower, 5))["error_code"] == ErrorCode.offset_out_of_range
    answer = await _consumer_fetch(pair.leader, 5)
    assert answer["preferred_read_replica"] == -1
    assert answer["error_code"] == ErrorCode.none and offsets_of(answer)[0] == 5


async def test_the_leader_does_not_send_a_consumer_past_a_replicas_log_end(pair: ClassicPair) -> None:
    await pair.replica_fetch(12, 0)  # the follower has told the leader it holds offsets below 12 only
    answer = await _consumer_fetch(pair.leader, 15)
    assert answer["preferred_read_replica"] == -1 and offsets_of(answer)[0] == 15


async def test_the_leader_does_not_send_a_consumer_to_a_replica_it_has_not_heard_from(pair: ClassicPair) -> None:
    answer = await _consumer_fetch(pair.leader, 15)
    assert answer["preferred_read_replica"] == -1 and offsets_of(answer)[0] == 15


async def test_the_leader_prefers_a_replica_in_the_consumers_rack_that_has_the_offset(pair: ClassicPair) -> None:
    await pair.replica_fetch(20, 0)
    assert (await _consumer_fetch(pair.leader, 15))["preferred_read_replica"] == FOLLOWER
    answer = await _consumer_fetch(pair.follower, 15)
    assert answer["error_code"] == ErrorCode.none and offsets_of(answer)[0] == 15

"""The replica fetcher sends the compact form (protocol/replica_fetch_wire.py) only to a leader
that listed it at the connection's handshake, and Fetch v13 to any other (an older version,
mid-upgrade), choosing per round, so a reconnection to another version is followed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from test_replica_fetch_bad_answer import LEADER, follower_replica

from diskless.protocol import internal, replica_fetch_wire
from diskless.protocol import messages as m
from diskless.replication.fetcher import FETCH_VERSION, ReplicaFetcher

FOLLOWER_ID = 1


class StubConnection:
    """A leader connection that records how it was asked and answers with nothing new."""

    connected = True

    def __init__(self, served: dict[int, int]) -> None:
        self.served_apis = served
        self.asked: list[tuple[str, int, int, Any]] = []
        self.state = replica_fetch_wire.ConnectionState()  # the leader's end

    async def request(self, api_key: int, version: int, body: Any, timeout: float) -> Any:
        self.asked.append(("kafka", api_key, version, body))
        return replica_fetch_wire.FetchAnswer(0, ErrorCode.none, 0, [])

    async def request_unnamed(self, api_key: int, body: bytes, decode: Any, timeout: float, version: int = 0) -> Any:
        self.asked.append(("compact", api_key, version, replica_fetch_wire.decode_request(body, self.state)))
        return decode(memoryview(replica_fetch_wire.encode_answer(0, {"error_code": 0}, self.state))[8:])


async def test_the_compact_form_goes_only_to_a_leader_that_listed_it(tmp_path: Path) -> None:
    topic_id = str(uuid.uuid4())
    fetcher = ReplicaFetcher(FOLLOWER_ID, LEADER, lambda node: None, 500, 1 << 20, lambda: None)
    fetcher.add(follower_replica(tmp_path, 0, topic_id))

    older, newer, newer_again = (StubConnection(served) for served in ({}, {32006: 0}, {32006: 0}))
    for conn in (older, newer, newer, older, newer_again):
        fetcher._conn = conn  # type: ignore[assignment]  # as after a reconnection to that leader
        await fetcher._round_trip(0.05)

    assert [(how, key, version) for how, key, version, _ in older.asked] == [("kafka", m.API_FETCH, FETCH_VERSION)] * 2
    assert [(how, key, version) for how, key, version, _ in newer.asked] == [
        ("compact", internal.INTERNAL_REPLICA_FETCH, 0)
    ] * 2
    # A new connection starts the compact form's state afresh on both ends: the stub's leader end
    # is new, and decoding the fetcher's first request there (constants, topic written whole) worked.
    assert len(newer_again.asked) == 1 and newer_again.state.ids == newer.state.ids
    # The same request either way: the leader reads back the entity the fetcher built.
    compact = newer.asked[0][3]
    assert compact.replica_id == FOLLOWER_ID and [str(t.topic_id) for t in compact.topics] == [topic_id]
    assert [p.partition for t in compact.topics for p in t.partitions] == [0]

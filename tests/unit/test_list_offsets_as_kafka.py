"""ListOffsets answered as Kafka's ReplicaManager.fetchOffset answers it (found by review; each test
failed on the old code).

- A special timestamp is served only from the version that defines it (MAX_TIMESTAMP -3 from v7,
  KIP-734; EARLIEST_LOCAL -4 from v8, KIP-405; LATEST_TIERED -5 from v9, KIP-1005); any other
  negative timestamp, or one older than its version, is UNSUPPORTED_VERSION for its partition.
  -4, -5 and the like used to be looked up as timestamps (answering the first record), and -3 was
  served at every version.
- A partition named twice in one request is INVALID_REQUEST, once; it used to be answered twice.
- OFFSET_NOT_AVAILABLE exists from v5: older clients hear LEADER_NOT_AVAILABLE.

The requests go to the real handler of a leader (and a follower) over real partition logs
(``test_follower_reads.Pair``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from test_follower_reads import (  # noqa: F401 (pairs is a fixture)
    EARLIEST,
    EPOCH,
    FOLLOWER,
    LATEST,
    LEADER,
    TOPIC,
    FakeBroker,
    Pair,
    client_header,
    ns,
    pairs,
)

from diskless.cluster.metadata import PartitionState
from diskless.log.config import LogConfig
from diskless.log.segment import BatchLocation, LogSegment
from diskless.protocol import messages as m

MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -3, -4, -5


def _request(*partitions: tuple[int, int], isolation_level: int = 0) -> Any:
    """A consumer's ListOffsets of (partition, timestamp) pairs of TOPIC, in order."""
    parts = [{"partition_index": i, "timestamp": ts, "current_leader_epoch": -1} for i, ts in partitions]
    return ns({"replica_id": -1, "isolation_level": isolation_level, "topics": [{"name": TOPIC, "partitions": parts}]})


async def _list_offsets(broker: FakeBroker, version: int, *partitions: tuple[int, int]) -> list[dict[str, Any]]:
    # The broker loads a batch to find a record's timestamp; these logs hold record batches.
    async def batch_bytes(segment: LogSegment, location: BatchLocation) -> bytes:
        return segment.read_batch(location)

    broker.batch_bytes = batch_bytes  # type: ignore[attr-defined]
    answer = await broker.fetch_apis.list_offsets(client_header(m.API_LIST_OFFSETS, version), _request(*partitions))
    return [p for t in answer["topics"] for p in t["partitions"]]


@pytest.mark.parametrize(
    ("timestamp", "version"),
    [(MAX_TIMESTAMP, 1), (MAX_TIMESTAMP, 6), (EARLIEST_LOCAL, 7), (LATEST_TIERED, 7), (-6, 7), (-1000, 7)],
)
async def test_a_special_timestamp_its_version_lacks_is_unsupported_version(
    pairs: Callable[..., Pair],  # noqa: F811
    timestamp: int,
    version: int,
) -> None:
    pair = pairs(leader_end=20, follower_end=20)
    (entry,) = await _list_offsets(pair.leader, version, (0, timestamp))
    assert entry == {
        "partition_index": 0,
        "error_code": ErrorCode.unsupported_version,
        "timestamp": -1,
        "offset": -1,
        "leader_epoch": -1,
    }


@pytest.mark.parametrize(
    ("timestamp", "version", "offset"),
    [(LATEST, 1, 20), (EARLIEST, 1, 0), (MAX_TIMESTAMP, 7, 4), (0, 1, 0)],
)
async def test_timestamps_a_version_has_are_answered(
    pairs: Callable[..., Pair],  # noqa: F811
    timestamp: int,
    version: int,
    offset: int,
) -> None:
    pair = pairs(leader_end=20, follower_end=20)
    (entry,) = await _list_offsets(pair.leader, version, (0, timestamp))
    assert (entry["error_code"], entry["offset"]) == (ErrorCode.none, offset)


async def test_a_partition_named_twice_is_one_invalid_request(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    pair = pairs(leader_end=20, follower_end=20)
    entries = await _list_offsets(pair.leader, 7, (0, LATEST), (0, EARLIEST))
    assert [(e["partition_index"], e["error_code"], e["offset"]) for e in entries] == [
        (0, ErrorCode.invalid_request, -1)
    ]


async def test_a_partition_named_twice_is_not_forwarded_to_the_leader(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    pair = pairs(leader_end=20, follower_end=20, isr=[LEADER])  # out of the ISR: the leader answers
    entries = await _list_offsets(pair.follower, 7, (0, LATEST), (0, LATEST))
    assert [e["error_code"] for e in entries] == [ErrorCode.invalid_request]
    assert pair.follower.peers.calls == []
    (entry,) = await _list_offsets(pair.follower, 7, (0, LATEST))
    assert entry["offset"] == 20 and pair.follower.peers.calls == [(LEADER, m.API_LIST_OFFSETS)]


@pytest.mark.parametrize(
    ("version", "code"), [(4, ErrorCode.leader_not_available), (5, ErrorCode.offset_not_available)]
)
async def test_offset_not_available_is_leader_not_available_below_v5(
    pairs: Callable[..., Pair],  # noqa: F811
    version: int,
    code: ErrorCode,
) -> None:
    """A new leader whose high watermark has not reached its epoch's start (see
    test_fetch_kafka_semantics) answers LATEST with the error each version has."""
    pair = pairs(leader_end=20, follower_end=20)
    pair.follower_part.log.high_watermark = 15
    # The follower becomes the leader; its HW of 15 has not reached its epoch's start, 20.
    new = PartitionState([LEADER, FOLLOWER], FOLLOWER, EPOCH + 1, [FOLLOWER, LEADER])
    pair.metadata.topics[TOPIC].partitions[0] = new
    now = pair.follower.clock_ms
    pair.follower.replicas.apply(pair.metadata.topics[TOPIC], 0, LogConfig(diskless_enabled=True), now)
    assert pair.follower_part.leader_state is not None
    (entry,) = await _list_offsets(pair.follower, version, (0, LATEST))
    assert entry["error_code"] == code

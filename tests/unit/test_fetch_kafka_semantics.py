"""Consumer reads of diskless partitions as Kafka answers them (found by review; each test failed
on the old code).

- KIP-320: a Fetch naming an older leader epoch gets FENCED_LEADER_EPOCH, on the leader and on a
  follower alike. The epoch error used to make the partition "read through the leader", which
  served it with NONE, so the client never refreshed its metadata.
- A partition read through the leader whose answer is an error ends the long poll at once (Kafka's
  DelayedFetch completes on any partition error); it waited out max_wait, asking the leader every
  100 ms.
- ListOffsets LATEST on a new leader whose high watermark has not reached its epoch's start answers
  OFFSET_NOT_AVAILABLE (Kafka's Partition.fetchOffsetForTimestamp) rather than an end offset
  below the one the old leader published.
"""

from __future__ import annotations

import time
from pathlib import Path

from kio.schema.errors import ErrorCode
from test_follower_reads import (
    EPOCH,
    FOLLOWER,
    LATEST,
    LEADER,
    TOPIC,
    Pair,
    client_header,
    fetch,
    fetch_request,
    ns,
)

from diskless.cluster.metadata import PartitionState
from diskless.log.config import LogConfig
from diskless.protocol import messages as m


def request(offset: int, epoch: int):
    req = fetch_request(offset)
    req.topics[0].partitions[0].current_leader_epoch = epoch
    return req


async def _fetch(broker, offset, epoch):
    response = await broker.fetch_apis.fetch(client_header(m.API_FETCH, 12), request(offset, epoch))
    return response["responses"][0]["partitions"][0]


async def test_stale_epoch_on_the_leader_is_fenced(tmp_path: Path) -> None:
    pair = Pair(tmp_path, leader_end=20, follower_end=20)
    try:
        entry = await _fetch(pair.leader, 5, EPOCH - 1)
        assert entry["error_code"] == ErrorCode.fenced_leader_epoch, (entry["error_code"], len(entry["records"]))
    finally:
        await pair.close()


async def test_stale_epoch_on_a_follower_is_fenced(tmp_path: Path) -> None:
    pair = Pair(tmp_path, leader_end=20, follower_end=20)
    try:
        entry = await _fetch(pair.follower, 5, EPOCH - 1)
        assert entry["error_code"] == ErrorCode.fenced_leader_epoch, (entry["error_code"], len(entry["records"]))
    finally:
        await pair.close()


async def test_forwarded_offset_out_of_range_is_answered_at_once(tmp_path: Path) -> None:
    pair = Pair(tmp_path, leader_end=20, follower_end=20)
    try:
        started = time.monotonic()
        entry = await fetch(pair.follower, 1000, max_wait_ms=2000)  # past the leader's log end
        elapsed = time.monotonic() - started
        assert entry["error_code"] == ErrorCode.offset_out_of_range
        calls = len(pair.follower.peers.calls)
        # One leader RPC, not one per 100 ms; and well before max_wait_ms, even on a loaded machine.
        assert calls == 1 and elapsed < 1.5, f"answered after {elapsed:.2f}s and {calls} leader RPCs"
    finally:
        await pair.close()


async def test_latest_on_a_new_leader_with_a_lagging_hw_is_offset_not_available(tmp_path: Path) -> None:
    pair = Pair(tmp_path, leader_end=20, follower_end=20)
    try:
        follower_log = pair.follower_part.log
        follower_log.high_watermark = 15  # the HW of 20 had not reached it yet
        new = PartitionState([LEADER, FOLLOWER], FOLLOWER, EPOCH + 1, [FOLLOWER, LEADER])
        pair.metadata.topics[TOPIC].partitions[0] = new
        now = pair.follower.clock_ms
        pair.follower.replicas.apply(pair.metadata.topics[TOPIC], 0, LogConfig(diskless_enabled=True), now)
        assert pair.follower_part.leader_state is not None
        assert follower_log.high_watermark == 15 and follower_log.log_end_offset == 20
        request = ns(
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {
                        "name": TOPIC,
                        "partitions": [{"partition_index": 0, "timestamp": LATEST, "current_leader_epoch": EPOCH + 1}],
                    }
                ],
            }
        )
        result = await pair.follower.fetch_apis.list_offsets(client_header(m.API_LIST_OFFSETS, 7), request)
        part = result["topics"][0]["partitions"][0]
        assert part["error_code"] == ErrorCode.offset_not_available, part
    finally:
        await pair.close()

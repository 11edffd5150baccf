"""ListOffsets of a diskless partition forwarded to its leader (a broker of the consumer's AZ with
no replica, or with a follower unfit to answer, asks the leader).

KIP-320: the consumer's current_leader_epoch goes with the request, so the leader answers
FENCED_LEADER_EPOCH (older) or UNKNOWN_LEADER_EPOCH (newer) as Kafka would; an epoch error found
here is the consumer's to hear, never forwarded (the leader would answer an offset, and the
consumer would not refresh its metadata), as for Fetch. A request that was itself forwarded is
answered here, NOT_LEADER_OR_FOLLOWER when this broker is not the leader: forwarding it on would
chain (or loop) between brokers whose metadata views disagree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from test_follower_reads import (  # noqa: F401
    EPOCH,
    LATEST,
    TOPIC,
    FakeBroker,
    Pair,
    client_header,
    ns,
    pairs,
)

from diskless.protocol import internal
from diskless.protocol import messages as m

BYSTANDER = 2  # a broker of the consumer's AZ hosting no replica of the partition


def _request(timestamp: int, epoch: int) -> Any:
    return ns(
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [{"partition_index": 0, "timestamp": timestamp, "current_leader_epoch": epoch}],
                }
            ],
        }
    )


async def _list_offsets(broker: FakeBroker, epoch: int, header: m.RequestHeader | None = None) -> dict[str, Any]:
    header = header or client_header(m.API_LIST_OFFSETS, 7)
    result = await broker.fetch_apis.list_offsets(header, _request(LATEST, epoch))
    return result["topics"][0]["partitions"][0]


def _forwarded_by(node_id: int) -> m.RequestHeader:
    """The header of a ListOffsets another broker forwarded (as ``_forward`` sends it)."""
    return m.RequestHeader(m.API_LIST_OFFSETS, 7, 0, internal.broker_client_id(node_id, "forward"))


def _with_bystander(pair: Pair) -> FakeBroker:
    broker = pair.leader.cluster[BYSTANDER] = FakeBroker(
        BYSTANDER, "az-b", pair.metadata, pair.leader.cluster, pair.leader.replicas.log_dir + "-bystander"
    )
    return broker


@pytest.mark.parametrize(
    ("asked", "expected"),
    [(EPOCH - 1, ErrorCode.fenced_leader_epoch), (EPOCH + 1, ErrorCode.unknown_leader_epoch)],
)
async def test_the_leader_checks_the_epoch_of_a_forwarded_list_offsets(
    pairs: Callable[..., Pair],  # noqa: F811
    asked: int,
    expected: ErrorCode,
) -> None:
    bystander = _with_bystander(pairs(leader_end=20, follower_end=20))
    entry = await _list_offsets(bystander, asked)
    assert (entry["error_code"], entry["offset"]) == (expected, -1)
    assert [api for _, api in bystander.peers.calls] == [m.API_LIST_OFFSETS]


async def test_a_forwarded_list_offsets_at_the_current_epoch_is_answered(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    bystander = _with_bystander(pairs(leader_end=20, follower_end=20))
    entry = await _list_offsets(bystander, EPOCH)
    assert (entry["error_code"], entry["offset"], entry["leader_epoch"]) == (ErrorCode.none, 20, EPOCH)


async def test_a_stale_follower_answers_an_epoch_error_itself(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    pair = pairs(leader_end=20, follower_end=20)
    pair.follower.clock_ms += 60_000  # no word from the leader lately: it would forward
    entry = await _list_offsets(pair.follower, EPOCH - 1)
    assert entry["error_code"] == ErrorCode.fenced_leader_epoch
    assert pair.follower.peers.calls == []


async def test_a_forwarded_list_offsets_is_not_forwarded_again(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    pair = pairs(leader_end=20, follower_end=20)
    bystander = _with_bystander(pair)
    entry = await _list_offsets(bystander, EPOCH, _forwarded_by(1))
    assert entry["error_code"] == ErrorCode.not_leader_or_follower
    assert bystander.peers.calls == []


async def test_a_follower_does_not_answer_a_forwarded_list_offsets(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    """The forwarding broker took this one for the leader: only the leader answers it."""
    pair = pairs(leader_end=20, follower_end=20)
    entry = await _list_offsets(pair.follower, EPOCH, _forwarded_by(BYSTANDER))
    assert entry["error_code"] == ErrorCode.not_leader_or_follower
    assert pair.follower.peers.calls == []
    leader_entry = await _list_offsets(pair.leader, EPOCH, _forwarded_by(BYSTANDER))
    assert (leader_entry["error_code"], leader_entry["offset"]) == (ErrorCode.none, 20)


def _delete_records_request(offset: int) -> Any:
    return ns({"topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": offset}]}], "timeout": 30000})


async def test_a_forwarded_delete_records_is_not_forwarded_again(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    """DeleteRecords follows the same rule: a broker without a replica forwards a client's request
    to the leader, but one that was itself forwarded to it is refused, not passed along."""
    from diskless.broker.admin_apis import AdminApis

    pair = pairs(leader_end=20, follower_end=20)
    bystander = _with_bystander(pair)
    admin = AdminApis(bystander)  # type: ignore[arg-type]
    header = m.RequestHeader(m.API_DELETE_RECORDS, 2, 0, internal.broker_client_id(1, "forward"))
    answer = await admin.delete_records(header, _delete_records_request(5))
    entry = answer["topics"][0]["partitions"][0]
    assert entry["error_code"] == ErrorCode.not_leader_or_follower
    assert bystander.peers.calls == []
    assert pair.leader_part.log.log_start_offset == 0

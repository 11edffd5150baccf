"""A DeleteRecords that names diskless partitions of several leaders, none here, is forwarded to
each; every leader then waits up to the client's timeout for its followers' log starts
(DelayedDeleteRecords). Those waits must overlap, and each forward must be given the client's
timeout and a margin: one after another, or cut at a fixed 30 s, the answer came late (after the
client gave up) or said NOT_LEADER_OR_FOLLOWER for a leader that was still answering."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode
from test_follower_reads import FOLLOWER, LEADER, TOPIC, FakeBroker, Pair, client_header, ns, pairs  # noqa: F401

from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.protocol import messages as m

BYSTANDER = 2
OTHER = "zoned-other"


def _request(timeout_ms: int) -> Any:
    return ns(
        {
            "topics": [
                {"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 5}]},
                {"name": OTHER, "partitions": [{"partition_index": 0, "offset": 5}]},
            ],
            "timeout": timeout_ms,
        }
    )


async def test_forwards_to_several_leaders_wait_side_by_side(pairs: Callable[..., Pair]) -> None:  # noqa: F811
    from diskless.broker.admin_apis import AdminApis

    pair = pairs(leader_end=20, follower_end=20)
    # A second diskless topic led by the other broker; the bystander hosts no replica of either.
    state = PartitionState([FOLLOWER, LEADER], FOLLOWER, 1, [FOLLOWER, LEADER])
    pair.metadata.topics[OTHER] = TopicMetadata(OTHER, str(uuid.uuid4()), [state], {"diskless.enabled": "true"})
    bystander = pair.leader.cluster[BYSTANDER] = FakeBroker(
        BYSTANDER, "az-b", pair.metadata, pair.leader.cluster, pair.leader.replicas.log_dir + "-bystander"
    )
    admin = AdminApis(bystander)  # type: ignore[arg-type]
    asked: list[tuple[int, float]] = []
    both_asked = asyncio.Event()

    async def leader_waiting(
        leader: int, api_key: int, version: int, body: dict[str, Any], timeout: float = 30.0
    ) -> Any:
        # Each leader answers only once both were asked: forwards made one after another never do.
        asked.append((leader, timeout))
        if len(asked) == 2:
            both_asked.set()
        await both_asked.wait()
        topic = body["topics"][0]["name"]
        return ns(
            {"topics": [{"name": topic, "partitions": [{"partition_index": 0, "error_code": 0, "low_watermark": 5}]}]}
        )

    admin._forward = leader_waiting  # type: ignore[method-assign]
    answer = await asyncio.wait_for(admin.delete_records(client_header(m.API_DELETE_RECORDS, 2), _request(60_000)), 10)
    entries = {t["name"]: t["partitions"][0] for t in answer["topics"]}
    assert {name: (e["error_code"], e["low_watermark"]) for name, e in entries.items()} == {
        TOPIC: (ErrorCode.none, 5),
        OTHER: (ErrorCode.none, 5),
    }
    assert sorted(leader for leader, _ in asked) == [LEADER, FOLLOWER]
    # The leaders wait up to the client's 60 s: the forward waits longer for their answer.
    assert all(timeout > 60 for _, timeout in asked)

"""ListOffsets(EARLIEST) answered by a diskless follower whose own retention ran ahead of the
leader's: the records between the leader's log start and the follower's are read through the
leader (follower_reads), so EARLIEST must be the leader's log start, as the leader answers, or a
consumer resetting to earliest in this AZ never sees them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from test_follower_reads import EARLIEST, TOPIC, Pair, client_header, fetch, ns, offsets_of, pairs  # noqa: F401

from diskless.protocol import messages as m
from diskless.replication.follower_reads import FollowerView, earliest_offset


def _earliest_request() -> Any:
    return ns(
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [{"partition_index": 0, "timestamp": EARLIEST, "current_leader_epoch": -1}],
                }
            ],
        }
    )


async def _earliest(broker: Any) -> int:
    result = await broker.fetch_apis.list_offsets(client_header(m.API_LIST_OFFSETS, 7), _earliest_request())
    part = result["topics"][0]["partitions"][0]
    assert part["error_code"] == ErrorCode.none
    return int(part["offset"])


async def test_earliest_on_a_follower_ahead_on_retention_is_the_leaders_log_start(
    pairs: Callable[..., Pair],  # noqa: F811
) -> None:
    pair = pairs(leader_end=20, follower_end=20)
    pair.follower_part.log.delete_records_before(10)  # the follower's own retention ran ahead
    pair.replicate(20)  # fresh: just heard from the leader, whose log starts at 0
    # Records 0..9 are readable through this follower (it reads them through the leader)...
    entry = await fetch(pair.follower, 0)
    assert entry["error_code"] == ErrorCode.none and offsets_of(entry)[0] == 0
    assert entry["log_start_offset"] == 0
    # ...so EARLIEST is 0 there, as on the leader.
    assert await _earliest(pair.leader) == 0
    assert await _earliest(pair.follower) == 0
    assert len(pair.follower.peers.calls) == 1, "only the fetch of offset 0 went to the leader"


@given(
    own_start=st.integers(0, 100), leader_start=st.integers(0, 100), heard=st.booleans(), hw_extra=st.integers(0, 50)
)
def test_earliest_is_the_leaders_log_start_whenever_known(
    own_start: int, leader_start: int, heard: bool, hw_extra: int
) -> None:
    view = FollowerView(True, 0, own_start, own_start + hw_extra, leader_start if heard else -1)
    assert earliest_offset(view) == (leader_start if heard else own_start)

"""WriteTxnMarkers naming ``__transaction_state`` is refused (INVALID_TOPIC_EXCEPTION) before any
append: no transaction writes there, and the coordinator's loader reads every record of it as a
transaction's, so the control batch an operator's ABORT would put there (KIP-664's abort, allowed
to clients) left the partition unloadable at the next coordinator move."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from diskless.broker.txn_apis import TxnApis
from diskless.cluster.coordinator_records import TXN_TOPIC, RecordFormatError
from diskless.protocol import messages as m
from diskless.transactions.records import decode


def _markers(topic: str) -> Any:
    marker = SimpleNamespace(
        producer_id=7,
        producer_epoch=0,
        transaction_result=False,
        coordinator_epoch=0,
        topics=[SimpleNamespace(name=topic, partition_indexes=[0])],
    )
    return SimpleNamespace(markers=[marker])


def test_a_marker_is_not_something_the_transaction_log_can_load() -> None:
    # What a control batch's record would be to the loader: why the marker must not get there.
    with pytest.raises(RecordFormatError):
        decode(struct.pack(">hh", 0, 0), struct.pack(">hi", 0, 0))


def test_markers_on_the_transaction_log_are_refused_before_any_append() -> None:
    def no_lookup(*_: Any) -> Any:
        raise AssertionError("the partition must not be looked up, let alone appended to")

    broker = SimpleNamespace(
        now_ms=lambda: 0, metadata=SimpleNamespace(partition=no_lookup, topics={}), replicas=SimpleNamespace()
    )
    apis = TxnApis(broker)  # type: ignore[arg-type]
    header = m.RequestHeader(m.API_WRITE_TXN_MARKERS, 1, 1, "operator")
    answer = asyncio.run(apis.write_txn_markers(header, _markers(TXN_TOPIC)))
    (partition,) = answer["markers"][0]["topics"][0]["partitions"]
    assert partition == {"partition_index": 0, "error_code": ErrorCode.invalid_topic_exception}


def test_markers_forwarded_to_several_leaders_wait_side_by_side() -> None:
    """An operator's ABORT naming diskless partitions of two leaders, neither here: both leaders
    wait for their marker to replicate at once, and each forward outlasts the leader's own wait."""
    apis = TxnApis(SimpleNamespace(now_ms=lambda: 0))  # type: ignore[arg-type]
    leaders = {"a": 1, "b": 2}
    apis._leader_log = lambda topic, index: (ErrorCode.not_leader_or_follower, None, None)  # type: ignore[method-assign]
    apis._leader_elsewhere = lambda forwarded, topic, index: leaders[topic]  # type: ignore[method-assign]
    asked: list[tuple[int, float]] = []

    async def run() -> dict[str, Any]:
        both_asked = asyncio.Event()

        async def leader_writing(leader: int, api_key: int, version: int, body: Any, timeout: float = 30.0) -> Any:
            asked.append((leader, timeout))
            if len(asked) == 2:
                both_asked.set()
            await both_asked.wait()  # answered only once both leaders were asked
            topic = body["markers"][0]["topics"][0]["name"]
            partition = SimpleNamespace(partition_index=0, error_code=0)
            return SimpleNamespace(
                markers=[SimpleNamespace(topics=[SimpleNamespace(name=topic, partitions=[partition])])]
            )

        apis._forward = leader_writing  # type: ignore[method-assign]
        request = _markers("a")
        request.markers[0].topics.append(SimpleNamespace(name="b", partition_indexes=[0]))
        header = m.RequestHeader(m.API_WRITE_TXN_MARKERS, 1, 1, "operator")
        return await asyncio.wait_for(apis.write_txn_markers(header, request), 10)

    answer = asyncio.run(run())
    codes = {t["name"]: t["partitions"][0]["error_code"] for t in answer["markers"][0]["topics"]}
    assert codes == {"a": ErrorCode.none, "b": ErrorCode.none}
    assert sorted(leader for leader, _ in asked) == [1, 2]
    assert all(timeout > 30 for _, timeout in asked)

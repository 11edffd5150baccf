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

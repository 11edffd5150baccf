"""The struct-built Produce response (protocol/produce_response.py) is byte for byte kio's, for
every version the broker answers, including the error answers ``error_responses`` builds."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from diskless.protocol import error_responses, produce_response
from diskless.protocol import messages as m

VERSIONS = range(produce_response.FIRST_VERSION, produce_response.LAST_VERSION + 1)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
codes = st.sampled_from([ErrorCode.none, ErrorCode.not_leader_or_follower, ErrorCode.invalid_record, 0, 19])
texts = st.none() | st.text(max_size=12)
record_errors = st.lists(
    st.fixed_dictionaries({"batch_index": i32}, optional={"batch_index_error_message": texts}), max_size=3
)
# What the produce handlers answer with: no append time (None), or one in milliseconds.
append_times = st.none() | st.integers(0, 2**41)


@st.composite
def partitions(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": draw(i32), "error_code": draw(codes)}
    for key, values in (
        ("base_offset", i64),
        ("log_append_time", append_times),
        ("log_start_offset", i64),
        ("record_errors", record_errors),
        ("error_message", texts),
    ):
        if draw(st.booleans()):
            entry[key] = draw(values)
    return entry


bodies = st.fixed_dictionaries(
    {
        "throttle_time": st.integers(0, 2**31 - 1)
        | st.integers(0, 10_000).map(lambda ms: datetime.timedelta(milliseconds=ms)),
        "responses": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=12), "partition_responses": st.lists(partitions(), max_size=4)}
            ),
            max_size=3,
        ),
    }
)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), correlation_id=i32, body=bodies)
def test_same_bytes_as_kio(version: int, correlation_id: int, body: dict[str, Any]) -> None:
    header = m.RequestHeader(m.API_PRODUCE, version, correlation_id, "c")
    expected = m.encode_response_with_kio(header, body, version)
    assert produce_response.encode_produce_response(version, correlation_id, body) == expected
    assert m.encode_response(header, body) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_error_answers_are_kios(version: int) -> None:
    """A handler that failed is answered per partition with the API's error (error_responses)."""
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(TopicProduceData(name="t", partition_data=(PartitionProduceData(index=3, records=b"x"),)),),
    )
    body = error_responses.error_response(m.API_PRODUCE, version, request, ErrorCode.unknown_server_error)
    header = m.RequestHeader(m.API_PRODUCE, version, 7, "c")
    assert m.encode_response(header, body) == m.encode_response_with_kio(header, body, version)


def test_versions_outside_the_range_are_refused() -> None:
    with pytest.raises(ValueError):
        produce_response.encode_produce_response(10, 1, {"responses": []})

"""The struct-built Fetch response (protocol/fetch_response.py) is byte for byte kio's, for every
version the broker answers, and kio's reader reads it back to the same fields."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.protocol import fetch_response
from diskless.protocol import messages as m

VERSIONS = range(fetch_response.FIRST_VERSION, fetch_response.LAST_VERSION + 1)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
codes = st.sampled_from([ErrorCode.none, ErrorCode.offset_out_of_range, ErrorCode.not_leader_or_follower, 0, 75])
aborted = st.none() | st.lists(st.fixed_dictionaries({"producer_id": i64, "first_offset": i64}), max_size=3)
diverging = (
    st.none() | st.fixed_dictionaries({"epoch": i32, "end_offset": i64}) | st.just({"epoch": -1, "end_offset": -1})
)


@st.composite
def partitions(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {"partition_index": draw(i32), "error_code": draw(codes)}
    for key in ("high_watermark", "last_stable_offset", "log_start_offset"):
        if draw(st.booleans()):
            entry[key] = draw(i64)
    entry["aborted_transactions"] = draw(aborted)
    if draw(st.booleans()):
        entry["preferred_read_replica"] = draw(i32)
    entry["records"] = draw(st.none() | st.binary(max_size=64))
    if (found := draw(diverging)) is not None:
        entry["diverging_epoch"] = found
    return entry


topics = st.lists(
    st.fixed_dictionaries(
        {
            "topic": st.text(max_size=12),
            "topic_id": st.uuids(),
            "partitions": st.lists(partitions(), max_size=4),
        }
    ),
    max_size=3,
)
bodies = st.fixed_dictionaries(
    {
        "throttle_time": st.integers(0, 2**31 - 1)
        | st.integers(0, 10_000).map(lambda ms: datetime.timedelta(milliseconds=ms)),
        "error_code": codes,
        "session_id": i32,
        "responses": topics,
    }
)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), correlation_id=i32, body=bodies)
def test_same_bytes_as_kio(version: int, correlation_id: int, body: dict[str, Any]) -> None:
    header = m.RequestHeader(m.API_FETCH, version, correlation_id, "c")
    expected = m.encode_response_with_kio(header, body, version)
    assert fetch_response.encode_fetch_response(version, correlation_id, body) == expected
    assert m.encode_response(header, body) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_records_memoryviews_and_bytes_are_written_once_each(version: int) -> None:
    """The handler's records come as bytes or memoryviews of pointer-served data."""
    batch = bytes(range(200)) * 10
    body = {
        "throttle_time": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": "t",
                "topic_id": uuid.uuid4(),
                "partitions": [
                    {"partition_index": 0, "error_code": 0, "high_watermark": 5, "records": memoryview(batch)},
                    {"partition_index": 1, "error_code": 0, "high_watermark": 5, "records": batch},
                ],
            }
        ],
    }
    header = m.RequestHeader(m.API_FETCH, version, 1, "c")
    frame = fetch_response.encode_fetch_response(version, 1, body)
    assert frame == m.encode_response_with_kio(
        header,
        {
            **body,
            "responses": [
                {
                    **body["responses"][0],
                    "partitions": [{**p, "records": bytes(p["records"])} for p in body["responses"][0]["partitions"]],
                }
            ],
        },
        version,
    )
    assert frame.count(batch) == 2


def test_versions_outside_the_range_are_refused() -> None:
    with pytest.raises(ValueError):
        fetch_response.encode_fetch_response(3, 1, {"responses": []})


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("aborted_transactions", [None, []])
def test_quiet_partitions_written_in_one_pack_are_kios_bytes(version: int, aborted_transactions: Any) -> None:
    """A partition with nothing but its offsets takes a one-``struct`` path; every variant of it
    (versions, null or empty aborted list, preferred replica given as -1 or left out, a diverging
    epoch of -1/-1) is still kio's bytes, beside partitions that take the general path."""
    quiet = {
        "partition_index": 7,
        "error_code": 0,
        "high_watermark": 1234,
        "last_stable_offset": 1200,
        "log_start_offset": 5,
        "aborted_transactions": aborted_transactions,
        "preferred_read_replica": -1,
        "records": b"",
    }
    left_out = {k: v for k, v in quiet.items() if k != "preferred_read_replica"}
    diverging_default = {**quiet, "partition_index": 8, "diverging_epoch": {"epoch": -1, "end_offset": -1}}
    general = {**quiet, "partition_index": 9, "records": b"x" * 5, "preferred_read_replica": 2}
    body = {
        "throttle_time": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {"topic": "t", "topic_id": uuid.uuid4(), "partitions": [quiet, left_out, diverging_default, general]}
        ],
    }
    header = m.RequestHeader(m.API_FETCH, version, 3, "c")
    assert fetch_response.encode_fetch_response(version, 3, body) == m.encode_response_with_kio(header, body, version)


@settings(max_examples=200, deadline=None)
@given(entry=partitions(), versions=st.lists(st.sampled_from(VERSIONS), min_size=1, max_size=4))
def test_a_kept_answer_writes_kios_bytes_for_each_version_and_writes_them_once(
    entry: dict[str, Any], versions: list[int]
) -> None:
    """A partition's answer kept for reuse (broker/idle_fetches.py) keeps its bytes per version: the
    frame is still kio's, whatever versions the answer is written in and in what order, and a
    second writing in one version reuses the first one's bytes."""
    kept = fetch_response.KeptPartitionAnswer(entry)
    assert kept == entry
    for version in versions:
        body = {"throttle_time": 0, "error_code": 0, "session_id": 0}
        body["responses"] = [{"topic": "t", "topic_id": uuid.UUID(int=1), "partitions": [kept]}]
        header = m.RequestHeader(m.API_FETCH, version, 3, "c")
        expected = m.encode_response_with_kio(
            header, {**body, "responses": [{**body["responses"][0], "partitions": [entry]}]}, version
        )
        assert fetch_response.encode_fetch_response(version, 3, body) == expected
        assert kept.wire(version) is kept.wire(version)
    with pytest.raises(TypeError):
        kept["high_watermark"] = 1  # type: ignore[index]

"""The compact replica fetch form (protocol/replica_fetch_wire.py): the leader reads back the very
Fetch v13 request entity the follower built, the follower reads every field a Fetch v13 answer of
the same dict has, in a fraction of the bytes; bytes that are not this form are refused with
``ReplicaFetchWireError`` and nothing else."""

from __future__ import annotations

import contextlib
import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13.request import FetchPartition, FetchRequest, FetchTopic, ForgottenTopic
from test_fetch_response import bodies

from diskless.protocol import fetch_response
from diskless.protocol import messages as m
from diskless.protocol.replica_fetch_wire import (
    ReplicaFetchWireError,
    decode_answer,
    decode_request,
    encode_answer,
    encode_request,
)

i32 = st.integers(-(2**31), 2**31 - 1)
u31 = st.integers(0, 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def fetch_partitions(draw: st.DrawFn, max_bytes: st.SearchStrategy[int]) -> FetchPartition:
    return FetchPartition(
        partition=draw(u31),
        current_leader_epoch=draw(i32),
        fetch_offset=draw(i64),
        last_fetched_epoch=draw(i32),
        log_start_offset=draw(i64),
        partition_max_bytes=draw(max_bytes),
    )


@st.composite
def fetch_requests(draw: st.DrawFn) -> FetchRequest:
    # Mostly one partition_max_bytes (a replica fetcher's), sometimes a mix.
    max_bytes = st.just(1 << 20) if draw(st.booleans()) else st.integers(0, 2**31 - 1) | st.just(0) | st.just(2**31 - 1)
    topics = draw(
        st.lists(
            st.builds(FetchTopic, topic_id=st.uuids(), partitions=st.lists(fetch_partitions(max_bytes)).map(tuple)),
            max_size=3,
        )
    )
    forgotten = draw(
        st.lists(st.builds(ForgottenTopic, topic_id=st.uuids(), partitions=st.lists(u31).map(tuple)), max_size=2)
    )
    return FetchRequest(
        replica_id=draw(u31),
        max_wait=datetime.timedelta(milliseconds=draw(u31)),
        min_bytes=draw(u31),
        max_bytes=draw(u31),
        isolation_level=draw(st.sampled_from([0, 1])),
        session_id=draw(i32),
        session_epoch=draw(i32),
        topics=tuple(topics),
        forgotten_topics_data=tuple(forgotten),
        rack_id=draw(st.text(max_size=8)),
    )  # type: ignore[arg-type]


def follower_request(partitions: int, fetch_offset: int = 123_456) -> FetchRequest:
    """A replica fetcher's incremental request (replication/fetcher.py builds the same)."""
    parts = tuple(
        FetchPartition(
            partition=i,
            current_leader_epoch=3,
            fetch_offset=fetch_offset,
            last_fetched_epoch=3,
            log_start_offset=0,
            partition_max_bytes=1 << 20,
        )
        for i in range(partitions)
    )  # type: ignore[arg-type]
    return FetchRequest(
        replica_id=2,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=10 << 20,
        session_id=12345,
        session_epoch=17,
        topics=(FetchTopic(topic_id=uuid.uuid4(), partitions=parts),),
        forgotten_topics_data=(),
    )  # type: ignore[arg-type]


def kio_request_bytes(request: FetchRequest) -> int:
    out = io.BytesIO()
    m._writer(FetchRequest)(out, request)
    return len(out.getvalue())


@settings(max_examples=300, deadline=None)
@given(fetch_requests())
def test_the_leader_reads_the_request_the_follower_built(request: FetchRequest) -> None:
    assert decode_request(encode_request(request)) == request


def _aborted(entry: Any) -> tuple[int, int]:
    if isinstance(entry, tuple):  # ours: (producer id, first offset)
        return int(entry[0]), int(entry[1])
    return int(entry.producer_id), int(entry.first_offset)


def _fields(partition: Any) -> tuple[Any, ...]:
    """What the follower reads of a partition's answer, in either form."""
    diverging = partition.diverging_epoch
    if diverging is not None and (diverging.epoch, diverging.end_offset) == (-1, -1):
        diverging = None  # kio reads the absent tag as its default
    aborted = partition.aborted_transactions
    return (
        int(partition.partition_index),
        int(partition.error_code),
        int(partition.high_watermark),
        int(partition.last_stable_offset),
        int(partition.log_start_offset),
        None if aborted is None else [_aborted(a) for a in aborted],
        int(partition.preferred_read_replica),
        None if partition.records is None else bytes(partition.records),
        None if diverging is None else (int(diverging.epoch), int(diverging.end_offset)),
    )


@settings(max_examples=300, deadline=None)
@given(bodies, st.integers(0, 2**31 - 1))
def test_the_follower_reads_what_a_fetch_v13_answer_says(body: dict[str, Any], correlation_id: int) -> None:
    v13 = fetch_response.encode_fetch_response(13, correlation_id, body)
    expected, _ = m._reader(m._response_type(m.API_FETCH, 13))(memoryview(v13)[9:], 0)
    frame = encode_answer(correlation_id, body)
    assert struct.unpack_from(">ii", frame) == (len(frame) - 4, correlation_id)

    got = decode_answer(memoryview(frame)[8:])

    assert (got.throttle_time_ms, got.error_code, got.session_id) == (
        expected.throttle_time // datetime.timedelta(milliseconds=1),
        expected.error_code,
        expected.session_id,
    )
    assert [t.topic_id for t in got.responses] == [t.topic_id for t in expected.responses]
    got_partitions = [[_fields(p) for p in t.partitions] for t in got.responses]
    assert got_partitions == [[_fields(p) for p in t.partitions] for t in expected.responses]


def test_a_pointer_run_travels_without_its_envelope_and_comes_back_with_it() -> None:
    run = b"\x05" * 30  # a shared-key pointer run's body (opaque here)
    wrapped = struct.pack(">qi", -4, len(run)) + run
    inconsistent = struct.pack(">qi", -4, len(run) + 1) + run  # a length that does not match: as it is
    body = {
        "responses": [
            {
                "topic_id": uuid.uuid4(),
                "partitions": [
                    {"partition_index": 0, "high_watermark": 9, "records": wrapped},
                    {"partition_index": 1, "high_watermark": 9, "records": inconsistent},
                ],
            }
        ]
    }
    frame = encode_answer(1, body)
    first, second = decode_answer(memoryview(frame)[8:]).responses[0].partitions
    assert first.records == wrapped and second.records == inconsistent
    plain = encode_answer(1, {"responses": [{**body["responses"][0], "partitions": [{"partition_index": 0}]}]})
    assert len(frame) - len(plain) <= len(wrapped) - 12 + 3 + len(inconsistent) + 12


def test_a_follower_request_and_a_quiet_answer_take_a_fraction_of_fetch_v13s_bytes() -> None:
    """Per partition: a request entry 33 bytes in Fetch v13, here at most 9 at a six-digit offset;
    an answer entry with nothing to read ~37 bytes there, here at most 9."""
    one, hundred = follower_request(1), follower_request(101)
    per_partition = (len(encode_request(hundred)) - len(encode_request(one))) / 100
    assert (kio_request_bytes(hundred) - kio_request_bytes(one)) / 100 == 33
    assert per_partition <= 9, per_partition

    def answer(partitions: int) -> dict[str, Any]:
        quiet = [
            {"partition_index": i, "high_watermark": 123_456, "last_stable_offset": 123_456, "log_start_offset": 0}
            for i in range(partitions)
        ]
        return {"session_id": 12345, "responses": [{"topic_id": uuid.uuid4(), "partitions": quiet}]}

    ours = (len(encode_answer(1, answer(101))) - len(encode_answer(1, answer(1)))) / 100
    v13 = (
        len(fetch_response.encode_fetch_response(13, 1, answer(101)))
        - len(fetch_response.encode_fetch_response(13, 1, answer(1)))
    ) / 100
    assert v13 >= 37 and ours <= 9, (v13, ours)


def valid_request() -> bytes:
    return encode_request(follower_request(3))


def valid_answer() -> bytes:
    body = {
        "session_id": 7,
        "responses": [
            {
                "topic_id": uuid.uuid4(),
                "partitions": [
                    {"partition_index": 0, "high_watermark": 5, "records": b"x" * 20},
                    {"partition_index": 1, "diverging_epoch": {"epoch": 2, "end_offset": 4}},
                    {"partition_index": 2, "aborted_transactions": [{"producer_id": 1, "first_offset": 2}]},
                ],
            }
        ],
    }
    return encode_answer(1, body)[8:]


@pytest.mark.parametrize(
    "decode, data", [(decode_request, valid_request()), (decode_answer, valid_answer())], ids=["request", "answer"]
)
def test_every_truncation_and_any_trailing_byte_is_refused(decode: Any, data: bytes) -> None:
    decode(data)
    for end in range(len(data)):
        with pytest.raises(ReplicaFetchWireError):
            decode(data[:end])
    with pytest.raises(ReplicaFetchWireError):
        decode(data + b"\x00")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_refused_with_the_one_error(data: bytes) -> None:
    for decode in (decode_request, decode_answer):
        with contextlib.suppress(ReplicaFetchWireError):
            decode(data)


def test_a_hostile_count_is_refused_before_anything_is_allocated() -> None:
    head = bytes([2, 0, 1, 0, 0, 0, 0, 1])  # replica, max wait, min/max bytes, isolation, session, epoch, max
    huge = b"\xff\xff\xff\xff\x0f"  # 2**32 - 1 topics
    with pytest.raises(ReplicaFetchWireError, match="count"):
        decode_request(head + huge)
    with pytest.raises(ReplicaFetchWireError, match="count"):
        decode_answer(b"\x00\x00\x00" + huge)


def test_an_unknown_error_code_or_flag_is_refused() -> None:
    topic = uuid.uuid4().bytes
    partition = bytes([0, 0, 0, 0, 0])  # index, error, high watermark, stable gap, log start
    assert (
        decode_answer(b"\x00\x00\x00\x01" + topic + b"\x01" + partition + b"\x00").responses[0].partitions[0].error_code
        is ErrorCode.none
    )
    with pytest.raises(ReplicaFetchWireError, match="flags"):
        decode_answer(b"\x00\x00\x00\x01" + topic + b"\x01" + partition + b"\x80")
    with pytest.raises(ReplicaFetchWireError, match="error code"):
        decode_answer(b"\x00\xfe\x7f\x00\x00")  # top-level error 8191: no such code


def test_offsets_beyond_int64_and_unknown_isolation_levels_are_refused() -> None:
    """A 10-byte varint holds 70 bits: an offset past int64 would go on into logs and checkpoints."""
    from diskless.protocol.varint import write_zigzag

    def partition_answer(high_watermark: int, stable_gap: int) -> bytes:
        out = bytearray(b"\x00\x00\x00\x01" + bytes(16) + b"\x01\x00\x00")  # one topic, partition 0, no error
        write_zigzag(high_watermark, out)
        write_zigzag(stable_gap, out)
        out += b"\x00\x00"  # log start 0, no flags
        return bytes(out)

    assert decode_answer(partition_answer(2**63 - 1, 0)).responses[0].partitions[0].high_watermark == 2**63 - 1
    for high_watermark, gap in ((2**63, 0), (-(2**63) - 1, 0), (2**63 - 1, -1), (0, 2**63 + 1)):
        with pytest.raises(ReplicaFetchWireError, match="int64"):
            decode_answer(partition_answer(high_watermark, gap))

    request = bytearray(encode_request(follower_request(0)))
    at = 1 + 2 + 1 + 4  # after replica id 2, max wait 500 ms, min bytes 1 and max bytes 10 MiB
    assert request[at] == 0  # read_uncommitted
    request[at] = 2
    with pytest.raises(ReplicaFetchWireError, match="isolation"):
        decode_request(bytes(request))

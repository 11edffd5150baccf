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

from diskless.protocol import fetch_response, replica_fetch_wire
from diskless.protocol import messages as m
from diskless.protocol.replica_fetch_wire import ConnectionState, ReplicaFetchWireError


# Most tests look at one request or answer, each the first on its connection.
def encode_request(request: FetchRequest) -> bytes:
    return replica_fetch_wire.encode_request(request, ConnectionState())


def decode_request(data: bytes) -> FetchRequest:
    return replica_fetch_wire.decode_request(data, ConnectionState())


def encode_answer(correlation_id: int, body: dict[str, Any]) -> bytes:
    return replica_fetch_wire.encode_answer(correlation_id, body, ConnectionState())


def decode_answer(data: bytes | memoryview) -> replica_fetch_wire.FetchAnswer:
    return replica_fetch_wire.decode_answer(data, ConnectionState())


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
    # constants follow: replica, max wait, min/max bytes, isolation, default max, empty rack; session, epoch
    head = bytes([1, 2, 0, 1, 0, 0, 1, 0, 0, 0])
    huge = b"\xff\xff\xff\xff\x0f"  # 2**32 - 1 topics
    with pytest.raises(ReplicaFetchWireError, match="count"):
        decode_request(head + huge)
    with pytest.raises(ReplicaFetchWireError, match="count"):
        decode_answer(b"\x00\x00\x00" + huge)


def test_an_unknown_error_code_or_flag_is_refused() -> None:
    topic = b"\x00" + uuid.uuid4().bytes  # written whole
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
        out = bytearray(b"\x00\x00\x00\x01\x00" + bytes(16) + b"\x01\x00\x00")  # one topic, partition 0, no error
        write_zigzag(high_watermark, out)
        write_zigzag(stable_gap, out)
        out += b"\x00\x00"  # log start 0, no flags
        return bytes(out)

    assert decode_answer(partition_answer(2**63 - 1, 0)).responses[0].partitions[0].high_watermark == 2**63 - 1
    for high_watermark, gap in ((2**63, 0), (-(2**63) - 1, 0), (2**63 - 1, -1), (0, 2**63 + 1)):
        with pytest.raises(ReplicaFetchWireError, match="int64"):
            decode_answer(partition_answer(high_watermark, gap))

    request = bytearray(encode_request(follower_request(0)))
    at = 1 + 1 + 2 + 1 + 4  # after the flags, replica id 2, max wait 500 ms, min bytes 1 and max bytes 10 MiB
    assert request[at] == 0  # read_uncommitted
    request[at] = 2
    with pytest.raises(ReplicaFetchWireError, match="isolation"):
        decode_request(bytes(request))


@settings(max_examples=100, deadline=None)
@given(st.lists(fetch_requests(), min_size=1, max_size=5), st.data())
def test_a_connections_requests_and_answers_read_back_through_its_aliases(
    requests: list[FetchRequest], data: st.DataObject
) -> None:
    """Requests in order on one connection, each followed by an answer naming topics some request
    named (by alias) and some none did (whole): both ends read exactly what the other wrote."""
    follower, leader = ConnectionState(), ConnectionState()
    named: list[uuid.UUID] = []
    for request in requests:
        assert (
            replica_fetch_wire.decode_request(replica_fetch_wire.encode_request(request, follower), leader) == request
        )
        named += [t.topic_id for t in request.topics] + [t.topic_id for t in request.forgotten_topics_data]
        ids = data.draw(st.lists(st.sampled_from(named) | st.uuids(), max_size=3) if named else st.lists(st.uuids()))
        body = {"responses": [{"topic_id": topic_id, "partitions": [{"partition_index": 0}]} for topic_id in ids]}
        frame = replica_fetch_wire.encode_answer(1, body, leader)
        assert [t.topic_id for t in replica_fetch_wire.decode_answer(memoryview(frame)[8:], follower).responses] == ids
    assert follower.ids == leader.ids and len(set(follower.ids)) == len(follower.ids)


def test_a_connection_writes_a_topic_id_and_the_constant_fields_once() -> None:
    follower, leader = ConnectionState(), ConnectionState()
    request = follower_request(1)
    first = replica_fetch_wire.encode_request(request, follower)
    second = replica_fetch_wire.encode_request(request, follower)
    assert len(first) - len(second) >= 16 + 8, (len(first), len(second))  # the id (16 bytes) and constants
    assert replica_fetch_wire.decode_request(first, leader) == request
    assert replica_fetch_wire.decode_request(second, leader) == request
    quiet = {"responses": [{"topic_id": request.topics[0].topic_id, "partitions": [{"partition_index": 0}]}]}
    assert len(replica_fetch_wire.encode_answer(1, quiet, leader)) + 16 == len(encode_answer(1, quiet))

    # What only a broken or hostile peer sends: refused, never guessed.
    with pytest.raises(ReplicaFetchWireError, match="constant fields"):
        decode_request(second)  # the first request on a connection without them
    forgetful = ConnectionState()  # has the constants, not the alias
    forgetful.constants = leader.constants
    with pytest.raises(ReplicaFetchWireError, match="never defined"):
        replica_fetch_wire.decode_request(second, forgetful)
    with pytest.raises(ReplicaFetchWireError, match="defined twice"):
        replica_fetch_wire.decode_request(first, leader)  # the same id written whole again
    answer = replica_fetch_wire.encode_answer(1, quiet, leader)
    with pytest.raises(ReplicaFetchWireError, match="never defined"):
        decode_answer(memoryview(answer)[8:])  # an alias this follower never gave


def test_a_full_alias_table_writes_further_topics_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_fetch_wire, "MAX_ALIASES", 1)
    follower, leader = ConnectionState(), ConnectionState()
    for _ in range(2):
        request = follower_request(1)  # a new topic id each time
        assert (
            replica_fetch_wire.decode_request(replica_fetch_wire.encode_request(request, follower), leader) == request
        )
        assert (
            replica_fetch_wire.decode_request(replica_fetch_wire.encode_request(request, follower), leader) == request
        )
    assert len(follower.ids) == len(leader.ids) == 1

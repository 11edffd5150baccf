"""Malformed and hostile input over raw sockets: the broker answers with Kafka's error codes or
closes the offending connection, and nothing else is disturbed.

Each test keeps a second, already-open, healthy connection and checks after the bad input that it
still produces and fetches, and that data acknowledged before is still readable.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import struct
import time
from collections.abc import Iterator

import crc32c
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.create_topics.v5.request import CreatableTopic, CreatableTopicConfig, CreateTopicsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v9.response import MetadataResponse
from kio.schema.produce.v7.response import ProduceResponse
from rawclient import (
    Record,
    Session,
    build_batch,
    encode_header,
    encode_request,
    metadata_request,
    produce_request,
)
from support import wait_until

pytestmark = pytest.mark.integration

TOPIC = "victim"
PRODUCE = 0
METADATA = 3
API_VERSIONS = 18


# --- fixtures and helpers --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_handler_crashes(tmp_path):
    """Whatever the input, the broker answers or closes cleanly: no handler may blow up."""
    yield
    for log_file in tmp_path.glob("*.log"):
        text = log_file.read_text(errors="replace")
        assert "Traceback" not in text, f"{log_file.name}:\n{text[-3000:]}"


class Healthy:
    """An open connection with acknowledged data behind it; ``check`` proves both are intact."""

    def __init__(self, broker, session: Session) -> None:
        self.broker = broker
        self.session = session
        self.expected: list[tuple[bytes | None, bytes | None]] = []
        self.produce([(b"k0", b"acknowledged-0"), (b"k1", b"acknowledged-1")])

    def produce(self, rows: list[tuple[bytes | None, bytes | None]]) -> None:
        part = self.session.produce(TOPIC, 0, build_batch(rows))
        assert part.error_code == ErrorCode.none
        assert part.base_offset == len(self.expected)
        self.expected += rows

    def records(self) -> list[Record]:
        return self.session.fetch_all(TOPIC, 0)

    def check(self) -> None:
        assert self.broker.alive(), "the broker process died"
        n = len(self.expected)
        self.produce([(f"k{n}".encode(), f"after-bad-input-{n}".encode())])
        records = self.records()
        assert [r.offset for r in records] == list(range(len(self.expected)))
        assert [(r.key, r.value) for r in records] == self.expected


@pytest.fixture
def healthy(broker) -> Iterator[Healthy]:
    with Session(broker.bootstrap) as session:
        md = session.metadata([TOPIC], allow_auto_create=True)
        assert md.topics[0].error_code == ErrorCode.none
        yield Healthy(broker, session)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def assert_closed(client: Session) -> None:
    assert client.wait_closed(timeout=10), "the broker kept the connection open"


def produce_error(session: Session, topic: str, partition: int, batch: bytes, acks: int = -1) -> ErrorCode:
    return session.produce(topic, partition, batch, acks).error_code


# --- record batch validation -------------------------------------------------------------------


def test_wrong_crc_is_corrupt_message(broker, healthy):
    batch = bytearray(build_batch([(b"k", b"value")]))
    batch[-1] ^= 0xFF  # flip bits in the last record: the stored CRC no longer matches
    with Session(broker.bootstrap) as bad:
        assert produce_error(bad, TOPIC, 0, bytes(batch)) == ErrorCode.corrupt_message
        # A wrong CRC field over intact data is refused the same way.
        batch = bytearray(build_batch([(b"k", b"value")]))
        struct.pack_into(">I", batch, 17, (struct.unpack_from(">I", batch, 17)[0] + 1) % 2**32)
        assert produce_error(bad, TOPIC, 0, bytes(batch)) == ErrorCode.corrupt_message
        # The connection stays usable after an error response.
        assert produce_error(bad, TOPIC, 0, build_batch([(b"ok", b"fine")])) == ErrorCode.none
    healthy.expected.append((b"ok", b"fine"))
    healthy.check()


def test_truncated_and_inconsistent_batches_are_refused(broker, healthy):
    good = build_batch([(b"a", b"1"), (b"b", b"2")])
    with Session(broker.bootstrap) as bad:
        # batchLength claims more bytes than were sent.
        assert produce_error(bad, TOPIC, 0, good[:-3]) == ErrorCode.corrupt_message
        # Shorter than a batch header.
        assert produce_error(bad, TOPIC, 0, good[:40]) == ErrorCode.corrupt_message
        # Record count disagrees with lastOffsetDelta (CRC recomputed so only the count is wrong).
        wrong_count = bytearray(good)
        struct.pack_into(">i", wrong_count, 57, 5)
        _recrc(wrong_count)
        assert produce_error(bad, TOPIC, 0, bytes(wrong_count)) == ErrorCode.invalid_record
        # Two batches in one produce request (v3+ allows exactly one).
        assert produce_error(bad, TOPIC, 0, good + good) == ErrorCode.invalid_record
        # Clients may not write control batches.
        control = bytearray(good)
        struct.pack_into(">h", control, 21, 0x20)
        _recrc(control)
        assert produce_error(bad, TOPIC, 0, bytes(control)) == ErrorCode.invalid_record
        # An old message format (magic 1) is refused and nothing is appended.
        old_magic = bytearray(good)
        old_magic[16] = 1
        assert produce_error(bad, TOPIC, 0, bytes(old_magic)) != ErrorCode.none
    healthy.check()


def _recrc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))


def create_topic(session: Session, topic: str, configs: dict[str, str]) -> None:
    request = CreateTopicsRequest(
        topics=(
            CreatableTopic(
                name=topic,
                num_partitions=1,
                replication_factor=1,
                assignments=(),
                configs=tuple(CreatableTopicConfig(name=k, value=v) for k, v in configs.items()),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    assert session.request(request).topics[0].error_code == ErrorCode.none


def test_batch_larger_than_max_message_bytes(broker, healthy):
    topic = "small-messages"
    with Session(broker.bootstrap) as bad:
        create_topic(bad, topic, {"max.message.bytes": "1000"})
        big = build_batch([(b"k", b"x" * 1200)])
        assert len(big) > 1000
        assert produce_error(bad, topic, 0, big) == ErrorCode.message_too_large
        fits = build_batch([(b"k", b"x" * 500)])
        assert produce_error(bad, topic, 0, fits) == ErrorCode.none
        assert [r.value for r in bad.fetch_all(topic, 0)] == [b"x" * 500]
    healthy.check()


def test_timestamps_outside_allowed_range(broker, healthy):
    topic = "strict-timestamps"
    hour = 3_600_000
    with Session(broker.bootstrap) as bad:
        create_topic(
            bad,
            topic,
            {"message.timestamp.after.max.ms": str(hour), "message.timestamp.before.max.ms": str(24 * hour)},
        )
        now = int(time.time() * 1000)
        future = build_batch([(b"k", b"from the future")], base_timestamp=now + 2 * hour)
        assert produce_error(bad, topic, 0, future) == ErrorCode.invalid_timestamp
        past = build_batch([(b"k", b"from the past")], base_timestamp=now - 48 * hour)
        assert produce_error(bad, topic, 0, past) == ErrorCode.invalid_timestamp
        assert produce_error(bad, topic, 0, build_batch([(b"k", b"now")], base_timestamp=now)) == ErrorCode.none
        assert [r.value for r in bad.fetch_all(topic, 0)] == [b"now"]
    healthy.check()


def test_unknown_topic_partition_and_offsets(broker, healthy):
    with Session(broker.bootstrap) as bad:
        batch = build_batch([(b"k", b"v")])
        assert produce_error(bad, "never-created", 0, batch) == ErrorCode.unknown_topic_or_partition
        # Produce does not auto-create topics (only Metadata does).
        md = bad.metadata(["never-created"], allow_auto_create=False)
        assert md.topics[0].error_code == ErrorCode.unknown_topic_or_partition
        assert produce_error(bad, TOPIC, 1, batch) == ErrorCode.unknown_topic_or_partition
        assert produce_error(bad, TOPIC, -1, batch) == ErrorCode.unknown_topic_or_partition
        assert bad.fetch("never-created", 0, 0).error_code == ErrorCode.unknown_topic_or_partition
        # Fetch offsets outside [log start, log end] are out of range; the log end itself is fine.
        assert bad.fetch(TOPIC, 0, 3).error_code == ErrorCode.offset_out_of_range
        assert bad.fetch(TOPIC, 0, -1).error_code == ErrorCode.offset_out_of_range
        at_end = bad.fetch(TOPIC, 0, 2)
        assert (at_end.error_code, at_end.records or b"", at_end.high_watermark) == (ErrorCode.none, b"", 2)
    healthy.check()


def test_invalid_required_acks(broker, healthy):
    with Session(broker.bootstrap) as bad:
        for acks in (5, 2, -2):
            assert produce_error(bad, TOPIC, 0, build_batch([(b"k", b"v")]), acks=acks) == (
                ErrorCode.invalid_required_acks
            )
    assert len(healthy.records()) == 2  # nothing was appended
    healthy.check()


def test_acks_zero_gets_no_response_but_data_lands(broker, healthy):
    with Session(broker.bootstrap) as client:
        request = produce_request(TOPIC, 0, build_batch([(b"fire", b"and-forget")]), acks=0)
        client.send(request)
        # The next response on this connection answers the next request: none came for acks=0.
        cid = client.send(metadata_request([TOPIC]))
        md = client.receive(MetadataResponse, METADATA, expect_correlation=cid)
        assert md.topics[0].name == TOPIC
    healthy.expected.append((b"fire", b"and-forget"))
    wait_until(lambda: len(healthy.records()) == 3, timeout=5)
    healthy.check()

    # kafka-python with acks=0: records land although the client never hears back.
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=0)
    try:
        for i in range(20):
            producer.send(TOPIC, key=b"a0", value=f"acks0-{i}".encode(), partition=0)
        producer.flush(timeout=10)
    finally:
        producer.close(timeout=5)
    healthy.expected += [(b"a0", f"acks0-{i}".encode()) for i in range(20)]
    wait_until(lambda: len(healthy.records()) == len(healthy.expected), timeout=10)
    healthy.check()


def test_acks_zero_with_an_error_closes_the_connection(broker, healthy):
    """Kafka closes the connection when an acks=0 produce fails, so the client learns of it."""
    with Session(broker.bootstrap) as bad:
        bad.send(produce_request("never-created", 0, build_batch([(b"k", b"v")]), acks=0))
        assert_closed(bad)
    with Session(broker.bootstrap) as bad:
        corrupt = bytearray(build_batch([(b"k", b"v")]))
        corrupt[-1] ^= 0xFF
        bad.send(produce_request(TOPIC, 0, bytes(corrupt), acks=0))
        assert_closed(bad)
    healthy.check()


# --- protocol-level errors ------------------------------------------------------------------------


def test_api_versions_with_unsupported_version_answers_v0(broker, healthy):
    with Session(broker.bootstrap) as client:
        # A future ApiVersions version with a body we cannot know: answered at v0 (KIP-511).
        client.send_raw(frame(encode_header(API_VERSIONS, 99, 42, "future-client", False) + b"\x00\x01\x02"))
        response = client.receive(ApiVersionsResponseV0, API_VERSIONS, expect_correlation=42)
        assert response.error_code == ErrorCode.unsupported_version
        ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert ranges[API_VERSIONS] == (0, 4)
        assert ranges[PRODUCE][0] <= 7 <= ranges[PRODUCE][1]
        assert METADATA in ranges
        # The connection stays open; the client downgrades and carries on.
        current = client.request(ApiVersionsRequest(client_software_name="raw", client_software_version="1"))
        assert current.error_code == ErrorCode.none
        assert {k.api_key for k in current.api_keys} == set(ranges)
    healthy.check()


@pytest.mark.parametrize(
    "api_key, version",
    [(METADATA, 99), (PRODUCE, 0), (PRODUCE, 42), (1000, 0), (-1, 0)],
    ids=["metadata-v99", "produce-v0", "produce-v42", "unknown-api", "negative-api"],
)
def test_unsupported_version_closes_connection(broker, healthy, api_key, version):
    with Session(broker.bootstrap) as bad:
        bad.send_raw(frame(encode_header(api_key, version, 7, "bad", False) + b"\x00" * 8))
        assert_closed(bad)
    healthy.check()


def test_oversized_frame_closes_connection(broker, healthy):
    with Session(broker.bootstrap) as bad:
        bad.send_raw(struct.pack(">i", 2**31 - 1) + b"\x00" * 64)
        assert_closed(bad)
    with Session(broker.bootstrap) as bad:
        bad.send_raw(struct.pack(">i", -5))
        assert_closed(bad)
    healthy.check()


def test_socket_request_max_bytes_is_enforced(broker_factory):
    broker = broker_factory(overrides={"socket.request.max.bytes": "4096"})
    with Session(broker.bootstrap) as session:
        assert session.metadata([TOPIC], allow_auto_create=True).topics[0].error_code == ErrorCode.none
        healthy = Healthy(broker, session)
        with Session(broker.bootstrap) as bad:
            # Just over the limit: refused from the size prefix alone, before the body arrives.
            bad.send_raw(struct.pack(">i", 4097))
            assert_closed(bad)
        with Session(broker.bootstrap) as bad:
            big = encode_request(produce_request(TOPIC, 0, build_batch([(b"k", b"x" * 5000)])), 1)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the broker may close mid-send
                bad.send_raw(big)
            assert_closed(bad)
        healthy.check()


@pytest.mark.parametrize(
    "payload",
    [
        encode_header(PRODUCE, 7, 1, "garbage", False) + bytes(range(256)) * 4,  # produce header, junk body
        encode_header(PRODUCE, 7, 1, "garbage", False) + b"\xff\xff",  # body cut short
        encode_header(METADATA, 9, 1, "garbage", True) + b"\xff" * 3,  # flexible: bad compact array
        encode_header(METADATA, 9, 1, "garbage", False) + b"\x05" + b"\xff" * 5,  # tagged fields overrun
        struct.pack(">hhih", PRODUCE, 7, 1, 500) + b"short",  # client id overruns the frame
        b"\x00\x03",  # shorter than any request header
        b"",  # empty frame
    ],
    ids=["junk-body", "short-body", "bad-compact-array", "tagged-fields-overrun", "client-id-overrun", "tiny", "empty"],
)
def test_garbage_frames_close_connection(broker, healthy, payload):
    with Session(broker.bootstrap) as bad:
        bad.send_raw(frame(payload))
        assert_closed(bad)
    healthy.check()


def test_half_frame_then_disconnect(broker, healthy):
    request = encode_request(produce_request(TOPIC, 0, build_batch([(b"half", b"sent")])), 1)
    with Session(broker.bootstrap) as bad:
        bad.send_raw(request[: len(request) // 2])
        bad.sock.shutdown(socket.SHUT_WR)
        assert_closed(bad)
    assert len(healthy.records()) == 2  # the half request was never applied
    healthy.check()


def test_bad_frame_after_valid_requests_on_same_connection(broker, healthy):
    """Requests answered before the bad frame stay answered; the bad frame closes only that socket."""
    with Session(broker.bootstrap) as client:
        part = client.produce(TOPIC, 0, build_batch([(b"first", b"ok")]))
        assert (part.error_code, part.base_offset) == (ErrorCode.none, 2)
        client.send_raw(frame(encode_header(METADATA, 99, 9, "bad", False)))
        assert_closed(client)
    healthy.expected.append((b"first", b"ok"))
    healthy.check()


def test_pipelined_requests_are_answered_in_order(broker, healthy):
    with Session(broker.bootstrap) as client:
        requests = [produce_request(TOPIC, 0, build_batch([(b"p", f"pipelined-{i}".encode())])) for i in range(30)]
        cids = []
        data = b""
        for request in requests:
            cid = client.correlation()
            cids.append(cid)
            data += encode_request(request, cid)
        client.send_raw(data)
        offsets = []
        for cid in cids:
            response = client.receive(ProduceResponse, PRODUCE, expect_correlation=cid)
            part = response.responses[0].partition_responses[0]
            assert part.error_code == ErrorCode.none
            offsets.append(part.base_offset)
        assert offsets == list(range(2, 32))
    healthy.expected += [(b"p", f"pipelined-{i}".encode()) for i in range(30)]
    healthy.check()


def test_real_clients_unaffected_by_bad_connections(broker, healthy):
    """A kafka-python consumer and producer keep working while bad connections come and go."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        for i in range(5):
            with Session(broker.bootstrap) as bad:
                bad.send_raw(struct.pack(">i", 2**31 - 1))
                assert_closed(bad)
            with Session(broker.bootstrap) as bad:
                bad.send_raw(frame(encode_header(PRODUCE, 7, 1, "x", False) + b"\xde\xad\xbe\xef" * 10))
                assert_closed(bad)
            meta = producer.send(TOPIC, key=b"kp", value=f"real-{i}".encode(), partition=0).get(timeout=10)
            assert meta.offset == 2 + i
        healthy.expected += [(b"kp", f"real-{i}".encode()) for i in range(5)]
        got: list = []
        wait_until(lambda: got.extend(consumer.poll(timeout_ms=200).get(tp, [])) or len(got) >= 7, timeout=10)
        assert [(r.key, r.value) for r in got] == healthy.expected
    finally:
        producer.close(timeout=5)
        consumer.close()
    healthy.check()

"""Fuzzed frames against a live broker process: no crash, no hang, a healthy client unaffected.

Each fuzzed frame goes on a fresh connection; the broker must answer it (a frame with the same
correlation id) or close the connection within a deadline. Afterwards the broker process is
alive, an already-open healthy connection still produces and fetches its acknowledged data, and
no handler failed with a traceback.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from rawclient import Session, build_batch

sys.path.insert(0, str(Path(__file__).parent.parent / "unit"))
from test_fuzz_requests import HUGE, SUPPORTED, header_bytes, valid_body

pytestmark = pytest.mark.integration

TOPIC = "fuzz-victim"
ANSWER_DEADLINE_S = 30.0
# Found by fuzzing: a 28-byte Metadata v10 body whose topics count decodes to ~7.4e9 made kio
# reserve 58 GB; the failed allocation aborted the broker process (SIGABRT).
METADATA_V10_ABSURD_COUNT = bytes.fromhex("f9f5e0b71bbaa491a6d1c89e190b265508cbec7a7ab314977ac32384")


@pytest.fixture
def victim(broker_factory) -> Iterator[tuple[object, Session]]:
    broker = broker_factory(overrides={"socket.request.max.bytes": str(1 << 20)})
    with Session(broker.bootstrap) as session:
        assert session.metadata([TOPIC], allow_auto_create=True).topics[0].error_code == ErrorCode.none
        assert session.produce(TOPIC, 0, build_batch([(b"k", b"acknowledged")])).error_code == ErrorCode.none
        yield broker, session
    log = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]


def send_and_wait(bootstrap: str, payload: bytes, correlation_id: int) -> str:
    """'answered', 'closed'; raises on a hang."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(struct.pack(">i", len(payload)) + payload)
        except (BrokenPipeError, ConnectionResetError):
            return "closed"
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        buf = b""
        while time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return "closed"
            except TimeoutError:
                break
            if not chunk:
                return "closed"
            buf += chunk
            if len(buf) >= 8:
                (size, got) = struct.unpack_from(">ii", buf)
                assert got == correlation_id, f"answer for correlation id {got}, expected {correlation_id}"
                if len(buf) >= 4 + size:
                    return "answered"
        raise AssertionError(f"no answer and no close within {ANSWER_DEADLINE_S}s")


def still_healthy(broker, session: Session) -> None:
    assert broker.alive(), f"the broker process died:\n{broker._tail()}"
    assert session.produce(TOPIC, 0, build_batch([(b"k", b"after")])).error_code == ErrorCode.none
    values = [r.value for r in session.fetch_all(TOPIC, 0)]
    assert values[0] == b"acknowledged" and values[-1] == b"after"


def test_absurd_array_count_closes_the_connection_and_the_broker_lives(victim) -> None:
    broker, session = victim
    assert send_and_wait(broker.bootstrap, header_bytes(3, 10, 7) + METADATA_V10_ABSURD_COUNT, 7) == "closed"
    still_healthy(broker, session)


def test_null_where_the_schema_forbids_it_closes_the_connection(victim) -> None:
    """CreatePartitions and LeaveGroup with a null array reached their handlers as None (TypeError)."""
    broker, session = victim
    create_partitions = header_bytes(37, 0, 8) + struct.pack(">i", -1) + struct.pack(">i", 1000) + b"\x00"
    assert send_and_wait(broker.bootstrap, create_partitions, 8) == "closed"
    leave_group = header_bytes(13, 3, 9) + struct.pack(">h", 1) + b"g" + struct.pack(">i", -1)
    assert send_and_wait(broker.bootstrap, leave_group, 9) == "closed"
    still_healthy(broker, session)


def test_fuzzed_frames_of_every_api_against_a_live_broker(victim) -> None:
    broker, session = victim
    outcomes: dict[str, int] = {}

    # No shrinking: each example may wait out a deadline, and the failing frame is printed anyway.
    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.explicit, Phase.generate],
    )
    @given(api=st.sampled_from(SUPPORTED), data=st.data())
    def fuzz(api: tuple[int, int], data: st.DataObject) -> None:
        correlation_id = data.draw(st.integers(0, 2**31 - 1))
        header = header_bytes(api[0], api[1], correlation_id)
        if data.draw(st.booleans()):
            body = bytearray(data.draw(st.binary(max_size=200)))
        else:
            body = bytearray(valid_body(*api))
            for _ in range(data.draw(st.integers(1, 3))):
                pos = data.draw(st.integers(0, max(0, len(body))))
                kind = data.draw(st.sampled_from(["flip", "truncate", "huge", "insert"]))
                if kind == "flip" and pos < len(body):
                    body[pos] ^= data.draw(st.integers(1, 255))
                elif kind == "truncate":
                    del body[pos:]
                elif kind == "huge":
                    body[pos : pos + 4] = struct.pack(">I", data.draw(st.sampled_from(HUGE)))
                else:
                    body[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        outcome = send_and_wait(broker.bootstrap, header + bytes(body), correlation_id)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        assert broker.alive(), f"the broker died on api {api}, body {bytes(body).hex()}:\n{broker._tail()}"

    fuzz()
    print(f"fuzzed frames: {outcomes}")
    assert sum(outcomes.values()) >= 100
    still_healthy(broker, session)


def test_excessive_partition_counts_are_refused_as_kafka_does(victim) -> None:
    """CreateTopics/CreatePartitions asking for 2^31-1 partitions blocked the broker's event loop
    (no answer in 60 s, its etcd lease expired). Kafka refuses more than 10000 new partitions per
    request with POLICY_VIOLATION (KAFKA-17870, KAFKA-19673)."""
    import datetime

    from kio.schema.create_partitions.v0.request import CreatePartitionsRequest, CreatePartitionsTopic
    from kio.schema.create_topics.v5.request import CreatableTopic, CreateTopicsRequest
    from kio.static.primitive import i16, i32

    broker, session = victim
    create = CreateTopicsRequest(
        topics=(
            CreatableTopic(
                name="huge", num_partitions=i32(2**31 - 1), replication_factor=i16(1), assignments=(), configs=()
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    began = time.monotonic()
    answer = session.request(create)
    assert answer.topics[0].error_code == ErrorCode.policy_violation, answer
    assert "Excessively large number of partitions" in (answer.topics[0].error_message or "")
    grow = CreatePartitionsRequest(
        topics=(CreatePartitionsTopic(name=TOPIC, count=i32(2**31 - 1), assignments=None),),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    answer = session.request(grow)
    assert answer.results[0].error_code == ErrorCode.policy_violation, answer
    assert time.monotonic() - began < 10
    assert session.metadata(["huge"]).topics[0].error_code == ErrorCode.unknown_topic_or_partition
    still_healthy(broker, session)

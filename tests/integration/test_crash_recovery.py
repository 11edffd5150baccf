"""Acknowledged data survives SIGKILL: the broker recovers its logs and producer state on restart.

Every test produces through real clients, collects the offsets the broker acknowledged, kills the
broker process with SIGKILL (no shutdown hooks, no clean-shutdown marker, nothing flushed by the
broker), restarts it on the same port and data directory, and reads everything back.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from rawclient import Session, build_batch
from support import BrokerProcess, wait_until

pytestmark = pytest.mark.integration

Acked = dict[int, tuple[bytes | None, bytes | None]]


# --- helpers -------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_handler_crashes(tmp_path):
    """Recovery never surfaces as an exception in the broker's log."""
    yield
    for log_file in tmp_path.glob("*.log"):
        text = log_file.read_text(errors="replace")
        assert "Traceback" not in text, f"{log_file.name}:\n{text[-3000:]}"


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})], operation_timeout=10)
    futures[topic].result(timeout=10)


def produce_kafka_python(
    bootstrap: str, topic: str, acks: int | str, prefix: str, count: int, batch_size: int = 16384
) -> Acked:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks=acks, enable_idempotence=False, linger_ms=5, retries=0, batch_size=batch_size
    )
    try:
        pending = []
        for i in range(count):
            key, value = f"{prefix}-k{i}".encode(), f"{prefix}-v{i}".encode() * (1 + i % 7)
            pending.append((key, value, producer.send(topic, key=key, value=value, partition=0)))
        producer.flush(timeout=15)
        acked: Acked = {}
        for key, value, future in pending:
            metadata = future.get(timeout=15)
            acked[metadata.offset] = (key, value)
        return acked
    finally:
        producer.close(timeout=5)


def produce_confluent(
    bootstrap: str, topic: str, acks: str, prefix: str, count: int, batch_size: int = 1000000
) -> Acked:
    producer = ConfluentProducer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": False,
            "linger.ms": 5,
            "batch.size": batch_size,
        }
    )
    acked: Acked = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[msg.offset()] = (msg.key(), msg.value())

    for i in range(count):
        key, value = f"{prefix}-k{i}".encode(), f"{prefix}-v{i}".encode() * (1 + i % 5)
        producer.produce(topic, key=key, value=value, partition=0, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(15) == 0
    assert not errors, errors
    assert len(acked) == count
    return acked


def consume_all(bootstrap: str, topic: str, partition: int = 0, timeout: float = 20.0) -> list:
    """Every record of one partition from its log start up to its end offset (kafka-python)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        records: list = []
        deadline = time.monotonic() + timeout
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"consumed {len(records)} records, position below end {end}"
            records += consumer.poll(timeout_ms=500).get(tp, [])
        return records
    finally:
        consumer.close()


def assert_all_present(records: list, acked: Acked) -> None:
    by_offset = {r.offset: (r.key, r.value) for r in records}
    assert len(by_offset) == len(records), "an offset was returned twice"
    missing = sorted(set(acked) - set(by_offset))
    assert not missing, f"acknowledged offsets lost after SIGKILL: {missing[:20]}"
    for offset, kv in acked.items():
        assert by_offset[offset] == kv, f"offset {offset} changed: {by_offset[offset]!r} != {kv!r}"


def crash_and_restart(broker: BrokerProcess) -> None:
    broker.kill()
    assert not broker.alive()
    broker.start()


def list_latest(session: Session, topic: str, partition: int = 0) -> int:
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(
            ListOffsetsTopic(
                name=topic,
                partitions=(ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=-1),),
            ),
        ),
    )
    part = session.request(request).topics[0].partitions[0]
    assert part.error_code == ErrorCode.none
    return part.offset


# --- tests ---------------------------------------------------------------------------------------


def test_acknowledged_records_survive_sigkill(broker):
    topic = "crash-basic"
    create_topic(broker.bootstrap, topic)
    acked: Acked = {}
    for acks, prefix in ((1, "kp-acks1"), ("all", "kp-acksall")):
        acked.update(produce_kafka_python(broker.bootstrap, topic, acks, prefix, 150))
    for acks, prefix in (("1", "ck-acks1"), ("all", "ck-acksall")):
        acked.update(produce_confluent(broker.bootstrap, topic, acks, prefix, 150))
    assert sorted(acked) == list(range(600)), "acknowledged offsets are not dense"

    crash_and_restart(broker)

    records = consume_all(broker.bootstrap, topic)
    assert len(records) == 600
    assert_all_present(records, acked)

    # Producing continues at the next offset, through both clients.
    after = produce_kafka_python(broker.bootstrap, topic, "all", "after", 3)
    assert sorted(after) == [600, 601, 602]
    after_c = produce_confluent(broker.bootstrap, topic, "1", "after-c", 2)
    assert sorted(after_c) == [603, 604]
    records = consume_all(broker.bootstrap, topic)
    assert_all_present(records, {**acked, **after, **after_c})


def test_repeated_crashes_keep_every_acknowledged_record(broker):
    topic = "crash-repeat"
    create_topic(broker.bootstrap, topic)
    acked: Acked = {}
    for round_ in range(3):
        acked.update(produce_kafka_python(broker.bootstrap, topic, "all", f"r{round_}", 40))
        acked.update(produce_confluent(broker.bootstrap, topic, "1", f"c{round_}", 40))
        crash_and_restart(broker)
    assert sorted(acked) == list(range(240))
    assert_all_present(consume_all(broker.bootstrap, topic), acked)


async def test_multi_segment_log_survives_sigkill(broker):
    topic = "crash-segments"
    create_topic(broker.bootstrap, topic, config={"segment.bytes": "4096"})
    acked: Acked = {}
    # Small producer batches so that many batches, and so several segments, reach the log.
    acked.update(produce_confluent(broker.bootstrap, topic, "all", "seg-c", 200, batch_size=1024))
    acked.update(produce_kafka_python(broker.bootstrap, topic, 1, "seg-k", 200, batch_size=1024))
    assert sorted(acked) == list(range(400))
    log_dir = Path(broker.data_dir) / f"{topic}-0"
    segments_before = sorted(p.name for p in log_dir.glob("*.log"))
    assert len(segments_before) >= 3, f"expected several segments, got {segments_before}"

    crash_and_restart(broker)

    assert sorted(p.name for p in log_dir.glob("*.log")) == segments_before
    # Read back with a third client (aiokafka), from the very first segment to the last.
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        tp = AIOTopicPartition(topic, 0)
        consumer.assign([tp])
        assert (await consumer.beginning_offsets([tp]))[tp] == 0
        assert (await consumer.end_offsets([tp]))[tp] == 400
        await consumer.seek_to_beginning(tp)
        got: dict[int, tuple[bytes | None, bytes | None]] = {}
        deadline = time.monotonic() + 20
        while len(got) < 400:
            assert time.monotonic() < deadline, f"only {len(got)} of 400 records read back"
            batch = await consumer.getmany(tp, timeout_ms=500)
            for record in batch.get(tp, []):
                assert record.offset not in got
                got[record.offset] = (record.key, record.value)
    finally:
        await consumer.stop()
    assert got == acked

    after = produce_confluent(broker.bootstrap, topic, "all", "after", 5)
    assert sorted(after) == list(range(400, 405))
    assert_all_present(consume_all(broker.bootstrap, topic), {**acked, **after})


def test_idempotent_kafka_python_producer_continues_after_sigkill(broker):
    topic = "crash-idempotent"
    create_topic(broker.bootstrap, topic)
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        reconnect_backoff_ms=50,
        reconnect_backoff_max_ms=500,
        request_timeout_ms=5000,
        delivery_timeout_ms=60000,
    )
    try:
        acked: Acked = {}
        for i in range(50):
            key, value = f"k{i}".encode(), f"before-{i}".encode()
            acked[producer.send(topic, key=key, value=value, partition=0).get(timeout=15).offset] = (key, value)
        assert sorted(acked) == list(range(50))

        broker.kill()
        # Sent while the broker is down: buffered and retried by the client once it is back.
        pending = []
        for i in range(50, 80):
            key, value = f"k{i}".encode(), f"while-down-{i}".encode()
            pending.append((key, value, producer.send(topic, key=key, value=value, partition=0)))
        broker.start()
        for key, value, future in pending:
            acked[future.get(timeout=30).offset] = (key, value)
        for i in range(80, 120):
            key, value = f"k{i}".encode(), f"after-{i}".encode()
            acked[producer.send(topic, key=key, value=value, partition=0).get(timeout=15).offset] = (key, value)
    finally:
        producer.close(timeout=5)

    assert sorted(acked) == list(range(120)), "idempotent producer left a gap or reused an offset"
    records = consume_all(broker.bootstrap, topic)
    assert [r.value for r in records] == [acked[o][1] for o in range(120)], "duplicates or reordering in the log"
    assert_all_present(records, acked)


@pytest.mark.parametrize("segment_bytes", [None, "300"], ids=["one-segment", "rolled-segments"])
def test_producer_state_rebuilt_after_sigkill(broker, segment_bytes):
    """After a crash the broker still recognises a retried idempotent batch and a sequence gap."""
    topic = "crash-producer-state"
    create_topic(broker.bootstrap, topic, config={"segment.bytes": segment_bytes} if segment_bytes else None)
    with Session(broker.bootstrap) as session:
        init = session.request(
            InitProducerIdRequest(
                transactional_id=None, transaction_timeout=timedelta(seconds=60), producer_id=-1, producer_epoch=-1
            )
        )
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch

        def batch(seq: int, n: int = 3) -> bytes:
            rows = [(f"s{seq + i}".encode(), f"value-{seq + i}".encode()) for i in range(n)]
            return build_batch(rows, producer_id=pid, producer_epoch=epoch, base_sequence=seq)

        offsets = []
        for seq in range(0, 15, 3):
            part = session.produce(topic, 0, batch(seq))
            assert part.error_code == ErrorCode.none
            offsets.append(part.base_offset)
        assert offsets == [0, 3, 6, 9, 12]
    segments = list((Path(broker.data_dir) / f"{topic}-0").glob("*.log"))
    assert len(segments) == (1 if segment_bytes is None else 3), segments

    crash_and_restart(broker)

    with Session(broker.bootstrap) as session:
        # A retry of the last batch (e.g. its response was lost in the crash) is answered, not appended.
        dup = session.produce(topic, 0, batch(12))
        assert dup.error_code == ErrorCode.none
        assert dup.base_offset == 12
        # So is a retry of an older batch still among the last five.
        assert session.produce(topic, 0, batch(6)).base_offset == 6
        assert list_latest(session, topic) == 15
        # A gap in the sequence is refused: the broker knows where the producer stands.
        gap = session.produce(topic, 0, batch(30))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        # The next batch in sequence lands right after the recovered log end.
        nxt = session.produce(topic, 0, batch(15))
        assert nxt.error_code == ErrorCode.none
        assert nxt.base_offset == 15
        values = [r.value for r in session.fetch_all(topic, 0)]
        assert values == [f"value-{i}".encode() for i in range(18)]


def test_torn_tail_after_sigkill_is_truncated(broker):
    """A batch half-written when the process died is cut off; everything acknowledged stays."""
    topic = "crash-torn-tail"
    create_topic(broker.bootstrap, topic)
    acked = produce_kafka_python(broker.bootstrap, topic, "all", "torn", 30)
    assert sorted(acked) == list(range(30))
    broker.kill()
    active = max((Path(broker.data_dir) / f"{topic}-0").glob("*.log"))
    torn = build_batch([(b"lost", b"never acknowledged" * 20)])
    with open(active, "ab") as f:
        f.write(torn[: len(torn) // 2])
    broker.start()

    assert_all_present(consume_all(broker.bootstrap, topic), acked)
    after = produce_confluent(broker.bootstrap, topic, "all", "after-torn", 3)
    assert sorted(after) == [30, 31, 32]
    records = consume_all(broker.bootstrap, topic)
    assert len(records) == 33
    assert_all_present(records, {**acked, **after})


def test_sigkill_under_load_loses_no_acknowledged_record(broker):
    """Kill the broker while a producer is streaming: whatever was acknowledged before is on disk."""
    topic = "crash-under-load"
    create_topic(broker.bootstrap, topic)
    acked: Acked = {}
    failures: list = []
    stop = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            acked[msg.offset()] = (msg.key(), msg.value())
        else:
            failures.append(err)

    def stream() -> None:
        producer = ConfluentProducer(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 1,
                "batch.num.messages": 20,
                "reconnect.backoff.max.ms": 200,
            }
        )
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, key=b"load", value=f"load-{i}".encode(), partition=0, on_delivery=on_delivery)
                i += 1
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
        producer.flush(15)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(acked) >= 2000, timeout=30, message="producer did not get going")
        broker.kill()
        acked_before_kill = dict(acked)
        broker.start()
        # The same producer carries on against the restarted broker.
        wait_until(lambda: len(acked) >= len(acked_before_kill) + 500, timeout=30)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()

    records = consume_all(broker.bootstrap, topic)
    assert [r.offset for r in records] == list(range(len(records))), "gap in the recovered log"
    assert_all_present(records, acked_before_kill)
    assert_all_present(records, acked)

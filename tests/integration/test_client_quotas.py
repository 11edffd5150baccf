"""Client quotas on a real two-broker cluster (etcd, S3): AlterClientQuotas and DescribeClientQuotas as
raw protocol requests, their effect on every broker and across a restart, and librdkafka producers
and consumers held near their byte-rate quotas (throttle_time in the answers, KIP-219 muting) while
client ids without a quota run free. Quotas are always set through the broker the client does not
talk to: the change must reach the partition leader through etcd."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntityData, EntryData, OpData
from kio.schema.describe_client_quotas.v1.request import ComponentData, DescribeClientQuotasRequest
from kio.schema.errors import ErrorCode
from rawclient import RawClient
from support import LocalCluster, wait_until

pytestmark = pytest.mark.integration

QUOTA = 256 * 1024  # bytes/s
RECORD = b"x" * 4096
TOPIC = "quota-topic"
DISKLESS_TOPIC = "quota-diskless"  # its records go to S3: the produce quota counts the same
MEASURE_S = 3.0
FREE_BYTES = 8 * 1024 * 1024  # what a client without a quota sends, timed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("quotas")
    # Two 1 s samples: Kafka's default 11 lets a client through in bursts on a few seconds' scale (a
    # whole second's sample leaving the window frees its bytes at once; test_client_quotas_core in
    # tests/unit holds the default to its quota over a minute), and a few seconds is what is measured here.
    overrides = {"broker.session.timeout.ms": "3000", "metrics.port": "0", "quota.window.num": "2"}
    started = LocalCluster(root, 2, 1, overrides, s3=True)
    try:
        started.start()
        admin = AdminClient({"bootstrap.servers": started.bootstrap})
        topics = [NewTopic(TOPIC, 1, 1), NewTopic(DISKLESS_TOPIC, 1, 1, config={"diskless.enabled": "true"})]
        for future in admin.create_topics(topics, operation_timeout=10).values():
            future.result(timeout=15)
        yield started
    finally:
        started.kill_all()


def leader_and_other(cluster: LocalCluster, topic: str) -> tuple[str, str]:
    """The bootstrap of the topic's leader, and of the other broker."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def leader_id() -> int:
        return admin.list_topics(topic, timeout=5).topics[topic].partitions[0].leader

    wait_until(lambda: leader_id() in (0, 1), message="a leader")
    leader = leader_id()
    return cluster.brokers[leader].bootstrap, cluster.brokers[1 - leader].bootstrap


def alter(
    bootstrap: str, entity: dict[str, str | None], ops: dict[str, float | None], validate_only: bool = False
) -> Any:
    request = AlterClientQuotasRequest(
        entries=(
            EntryData(
                entity=tuple(EntityData(entity_type=t, entity_name=n) for t, n in entity.items()),
                ops=tuple(OpData(key=k, value=v or 0.0, remove=v is None) for k, v in ops.items()),
            ),
        ),
        validate_only=validate_only,
    )
    with RawClient(bootstrap) as client:
        return client.request(request).entries[0]


def describe(
    bootstrap: str, client_id: str | None = None
) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    components = () if client_id is None else (ComponentData(entity_type="client-id", match_type=0, match=client_id),)
    with RawClient(bootstrap) as client:
        answer = client.request(DescribeClientQuotasRequest(components=components, strict=False))
    assert answer.error_code == ErrorCode.none, answer
    return {
        tuple(sorted(((e.entity_type, e.entity_name) for e in entry.entity), key=lambda p: p[0])): {
            v.key: v.value for v in entry.values
        }
        for entry in answer.entries or ()
    }


def set_quota(via: str, seen_by: str, client_id: str, key: str, value: float | None) -> float:
    """Set (None: remove) a client id's quota through ``via``; seconds until ``seen_by`` shows it."""
    started = time.monotonic()
    result = alter(via, {"client-id": client_id}, {key: value})
    assert result.error_code == ErrorCode.none, result
    expected = {} if value is None else {(("client-id", client_id),): {key: value}}
    wait_until(lambda: describe(seen_by, client_id) == expected, timeout=10, message="the quota on the other broker")
    return time.monotonic() - started


class Throttles:
    """librdkafka's throttle reports (throttle_cb), from the client's poll."""

    def __init__(self) -> None:
        self.events: list[float] = []  # seconds

    def __call__(self, event: Any) -> None:
        self.events.append(float(event.throttle_time))


def producer_rate(bootstrap: str, client_id: str, until_throttled: bool, topic: str = TOPIC) -> tuple[float, Throttles]:
    """Bytes/s acknowledged to one producer sending as fast as it can. With ``until_throttled``,
    measured over MEASURE_S from its first throttle report (after the burst Kafka's window allows);
    without, the time it takes to send FREE_BYTES (the broker takes hundreds of MB/s: a timed run
    would fill the disk)."""
    throttles = Throttles()
    acked = [0]

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked[0] += len(msg.value())

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "batch.size": 65536,  # requests of at most this: the measured rate moves smoothly
            "acks": 1,
            "queue.buffering.max.kbytes": 1024,
            "throttle_cb": throttles,
        }
    )
    stop = threading.Event()
    budget = float("inf") if until_throttled else FREE_BYTES

    def send() -> None:
        sent = 0
        while not stop.is_set() and sent < budget:
            try:
                producer.produce(topic, RECORD, partition=0, on_delivery=delivered)
                sent += len(RECORD)
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)

    start = time.monotonic()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        if not until_throttled:
            sender.join(30)
            assert producer.flush(30) == 0
            return acked[0] / (time.monotonic() - start), throttles
        wait_until(lambda: throttles.events, timeout=20, message="a throttle report")
        start_bytes, start = acked[0], time.monotonic()
        wait_until(lambda: time.monotonic() - start >= MEASURE_S, timeout=MEASURE_S + 1)
        return (acked[0] - start_bytes) / (time.monotonic() - start), throttles
    finally:
        stop.set()
        sender.join(10)
        producer.flush(15)


def consumer_rate(bootstrap: str, client_id: str, until_throttled: bool) -> tuple[float, Throttles]:
    """Bytes/s one consumer reads from the start of the topic, measured as ``producer_rate`` does."""
    throttles = Throttles()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "group.id": f"g-{client_id}-{time.monotonic()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 65536,  # small answers: the measured rate moves smoothly
            "message.max.bytes": 65536,
            "queued.max.messages.kbytes": 128,  # no read-ahead to drain while measuring
            "max.partition.fetch.bytes": 65536,
            "throttle_cb": throttles,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    read = [0]

    def poll() -> None:
        for msg in consumer.consume(100, 0.05):
            if msg.error() is None:
                read[0] += len(msg.value())

    try:
        if until_throttled:
            wait_until(lambda: poll() or throttles.events, timeout=20, interval=0, message="a throttle report")
        start_bytes, start = read[0], time.monotonic()
        wait_until(lambda: poll() or time.monotonic() - start >= MEASURE_S, timeout=MEASURE_S + 1, interval=0)
        return (read[0] - start_bytes) / (time.monotonic() - start), throttles
    finally:
        consumer.close()


def test_alter_and_describe_client_quotas(cluster: LocalCluster) -> None:
    one, other = (b.bootstrap for b in cluster.brokers)
    entity = {"user": "alice", "client-id": None}
    dry = alter(one, entity, {"producer_byte_rate": 1024.0, "request_percentage": 25.0}, validate_only=True)
    assert dry.error_code == ErrorCode.none
    assert describe(one) == {}
    bad_key = alter(one, {"user": "alice"}, {"bogus": 1.0})
    assert (bad_key.error_code, bad_key.error_message) == (ErrorCode.invalid_request, "Invalid configuration key bogus")
    ip = alter(one, {"ip": "127.0.0.1"}, {"connection_creation_rate": 5.0})
    assert ip.error_code == ErrorCode.invalid_request
    fraction = alter(one, {"user": "alice"}, {"consumer_byte_rate": 10.5})
    assert fraction.error_message == "Configuration consumer_byte_rate must be a Long value"

    started = time.monotonic()
    assert alter(one, entity, {"producer_byte_rate": 1024.0, "request_percentage": 25.0}).error_code == ErrorCode.none
    want = {(("client-id", None), ("user", "alice")): {"producer_byte_rate": 1024.0, "request_percentage": 25.0}}
    wait_until(lambda: describe(other) == want, timeout=10, message="the quota on the other broker")
    assert time.monotonic() - started < 2.0  # through the etcd watch, in about a second at most

    with RawClient(other) as client:  # a strict filter on user alone does not match user+client-id
        strict = client.request(
            DescribeClientQuotasRequest(
                components=(ComponentData(entity_type="user", match_type=0, match="alice"),), strict=True
            )
        )
        assert strict.error_code == ErrorCode.none and not strict.entries
        refused = client.request(
            DescribeClientQuotasRequest(
                components=(ComponentData(entity_type="group", match_type=2, match=None),), strict=False
            )
        )
        assert refused.error_code == ErrorCode.unsupported_version

    # Stored in etcd: a restarted broker has them from the start.
    cluster.brokers[1].stop()
    cluster.brokers[1].start()
    assert describe(other) == want
    assert alter(other, entity, {"producer_byte_rate": None, "request_percentage": None}).error_code == ErrorCode.none
    wait_until(lambda: describe(one) == {}, timeout=10, message="the removal on the other broker")


def held_then_lifted(
    cluster: LocalCluster, measure: Callable[[str, str, bool], tuple[float, Throttles]], kind: str, key: str, topic: str
) -> None:
    """A client id with a ``key`` quota, set through the broker it does not talk to, is held near
    it and told so; another client id runs free; removed, the quota no longer holds the first."""
    leader, other = leader_and_other(cluster, topic)
    assert set_quota(other, leader, f"slow-{kind}", key, QUOTA) < 2.0
    slow, throttles = measure(leader, f"slow-{kind}", True)
    assert throttles.events and max(throttles.events) > 0
    assert slow < 1.5 * QUOTA, f"{slow:.0f} B/s under a {QUOTA} B/s quota"
    assert slow > 0.3 * QUOTA  # throttled, not starved
    fast, fast_throttles = measure(leader, f"free-{kind}", False)
    print(f"{kind}: {slow:.0f} B/s under a {QUOTA} B/s quota, {fast:.0f} B/s without")
    assert fast > 4 * QUOTA and not fast_throttles.events, f"{fast:.0f} B/s without a quota"

    set_quota(other, leader, f"slow-{kind}", key, None)
    lifted, _ = measure(leader, f"slow-{kind}", False)
    assert lifted > 4 * QUOTA, f"{lifted:.0f} B/s once the quota was removed"


def test_producer_held_near_its_byte_rate_quota(cluster: LocalCluster) -> None:
    held_then_lifted(cluster, producer_rate, "producer", "producer_byte_rate", TOPIC)


def test_diskless_producer_held_near_its_byte_rate_quota(cluster: LocalCluster) -> None:
    measure = functools.partial(producer_rate, topic=DISKLESS_TOPIC)
    held_then_lifted(cluster, measure, "diskless-producer", "producer_byte_rate", DISKLESS_TOPIC)


def test_consumer_held_near_its_byte_rate_quota(cluster: LocalCluster) -> None:
    leader, _ = leader_and_other(cluster, TOPIC)
    # Small batches: a fetch answer holds at least one whole batch, whatever its max bytes (KIP-74).
    producer = Producer({"bootstrap.servers": leader, "linger.ms": 5, "batch.size": 16384})
    for _ in range(6 * 1024 * 1024 // len(RECORD)):
        producer.produce(TOPIC, RECORD, partition=0)
        producer.poll(0)
    assert producer.flush(30) == 0
    held_then_lifted(cluster, consumer_rate, "consumer", "consumer_byte_rate", TOPIC)


def test_a_diskless_producers_flush_waits_do_not_count_against_its_request_percentage(cluster: LocalCluster) -> None:
    """request_percentage counts the handler's own steps, as Kafka counts request-handler thread
    time: a diskless produce waits for its WAL flush (diskless.wal.linger.ms) doing nothing. Counted
    as wall time, a producer sending one record at a time spent ~100% of a thread per second on a
    5% quota and was throttled at once."""
    leader, other = leader_and_other(cluster, DISKLESS_TOPIC)
    set_quota(other, leader, "patient", "request_percentage", 5.0)
    try:
        throttles = Throttles()
        producer = Producer(
            {"bootstrap.servers": leader, "client.id": "patient", "acks": "all", "throttle_cb": throttles}
        )
        delivered: list[Any] = []
        for i in range(30):
            producer.produce(DISKLESS_TOPIC, b"r-%d" % i, partition=0, on_delivery=lambda err, _: delivered.append(err))
            assert producer.flush(30) == 0  # one request at a time, each waiting for its flush
        assert delivered == [None] * 30
        assert throttles.events == [], f"throttled for waiting: {throttles.events}"
    finally:
        set_quota(other, leader, "patient", "request_percentage", None)

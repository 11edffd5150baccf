"""An idempotent librdkafka producer with 5 requests in flight keeps per-partition order and gets
no OUT_OF_ORDER_SEQUENCE while PUTs fail and partition leaders move.

Real processes (etcd, SeaweedFS, three brokers in three AZs) and a real client (confluent-kafka,
``enable.idempotence=true``, ``max.in.flight=5``). The producer's representative is broker 0. While
it produces to every partition, object storage is killed and restarted (the PUTs in flight fail,
the next ones succeed: exactly the boundary where a later flush of a partition could commit
while an earlier one failed), then broker 1, leader of some partitions, is killed (those
partitions' leaders move while commits to them are in flight), then storage fails once more.

Checks: librdkafka reports no error at all (no fatal idempotence error, no failed delivery), but
for failing to connect to the broker the test killed; each partition holds exactly the values
produced to it, each once, in produce order.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_until

pytestmark = pytest.mark.integration

TOPIC, PARTITIONS = "ordered", 6
AZ = "az-1"  # broker 0's AZ: the producer's representative


def put_failures(broker: Any) -> float:
    return sum(
        value
        for key, value in broker.metrics().items()
        if key.startswith("diskless_object_store_failures_total") and 'operation="put"' in key
    )


def read_partition(bootstrap: str, partition: int, end: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ordered-reader",
            "client.id": f"ordered-reader diskless_az={AZ}",
            "enable.auto.commit": False,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(TOPIC, partition, 0)])
        deadline = time.monotonic() + 60
        while len(values) < end and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None or msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            if msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_idempotent_producer_keeps_order_through_failed_puts_and_leader_moves(cluster_factory: Any) -> None:
    cluster = cluster_factory(
        s3=True, overrides={"controlled.shutdown.timeout.ms": "2000", "diskless.wal.linger.ms": "5"}
    )
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={"diskless.enabled": "true"})])[TOPIC].result(30)
    representative = cluster.brokers[0]
    assert representative.rack == AZ

    errors: list[str] = []
    killed: list[str] = []  # "host:" of brokers this test killed (each broker has a host of its own)
    produced: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    acked = [0]
    stop = threading.Event()
    lock = threading.Lock()

    def on_error(err: KafkaError) -> None:
        # librdkafka reports failing to connect to a broker as an error, too: for the broker this
        # test killed, that is the test working, not the producer failing. Any other error counts.
        if err.code() == KafkaError._TRANSPORT and any(address in err.str() for address in killed):
            return
        errors.append(f"error_cb: {err}")

    def produce() -> None:
        producer = Producer(
            {
                "bootstrap.servers": representative.bootstrap,
                "client.id": f"ordered-producer diskless_az={AZ}",
                "enable.idempotence": True,
                "max.in.flight.requests.per.connection": 5,
                "acks": "all",
                "linger.ms": 2,
                "batch.num.messages": 20,
                "retry.backoff.ms": 50,
                "message.timeout.ms": 120000,
                "error_cb": on_error,
            }
        )

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"delivery: {err}")
            else:
                with lock:
                    acked[0] += 1

        sent = 0
        try:
            while not stop.is_set():
                while len(producer) >= 300:
                    producer.poll(0.02)
                partition = sent % PARTITIONS
                value = f"p{partition}-{sent // PARTITIONS:06d}".encode()
                producer.produce(TOPIC, value=value, partition=partition, on_delivery=delivered)
                produced[partition].append(value)
                sent += 1
                producer.poll(0)
            assert producer.flush(120) == 0, "records still undelivered"
        except Exception as exc:  # surfaces in the main thread's assertions
            errors.append(f"producer thread: {exc!r}")

    def acked_more(count: int, what: str) -> None:
        target = acked[0] + count
        wait_until(lambda: acked[0] >= target or bool(errors), 90, message=f"no progress {what}")
        assert not errors, errors

    thread = threading.Thread(target=produce, name="ordered-producer")
    thread.start()
    try:
        acked_more(1000, "before the faults")
        assert cluster.s3 is not None
        for outage in range(2):
            failed = put_failures(representative)
            cluster.s3.kill()  # PUTs in flight fail; the ones after the restart succeed
            wait_until(lambda f=failed: put_failures(representative) > f, 30, message="no PUT failed")
            cluster.s3.start()
            acked_more(1000, f"after storage outage {outage + 1}")
            if outage == 0:
                killed.append(f"{cluster.brokers[1].host}:")  # every listener of it
                cluster.brokers[1].kill()  # its partitions' leaders move to brokers 0 and 2
                acked_more(1000, "after a leader died")
    finally:
        stop.set()
        thread.join(150)
    assert not thread.is_alive()
    assert not errors, errors[:10]

    for partition in range(PARTITIONS):
        got = read_partition(cluster.bootstrap, partition, len(produced[partition]))
        want = produced[partition]
        assert len(got) == len(set(got)), f"partition {partition}: records stored twice"
        assert got == want, f"partition {partition}: {len(got)} records, first difference at {_first_diff(got, want)}"


def _first_diff(got: list[bytes], want: list[bytes]) -> Any:
    for index, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return index, a, b
    return min(len(got), len(want))

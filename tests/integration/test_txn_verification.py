"""A diskless transactional batch whose flush outlives its transaction, with a producer that does
not bump its epoch after giving up on a request (aiokafka keeps one epoch for its whole life).

The partition cannot tell such a late batch from the first batch of the producer's next
transaction at the same epoch; only the transaction coordinator can (KIP-890 part 1). The leader
verifies, when the representative accepts the batch, that the partition is in the producer's
ongoing transaction, and hands out a guard that the commit carries; the ABORT marker clears the
guard, so the late commit is refused and joins nothing.

Real processes (etcd, SeaweedFS, three brokers in three AZs) and a real client (aiokafka). The
request the client gives up on is sent on a raw connection with the producer's id, epoch and
next sequence, as a client without KIP-360 that reuses the sequence of a request it never had an
answer for would send it; the flush is held up by stopping the S3 server (SIGSTOP).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib
import os
import signal
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rawclient import Session, build_batch
from support import wait_until
from test_txn_isolation import OVERRIDES, latest_offsets_in, read_committed_in

from diskless.protocol import records

pytestmark = pytest.mark.integration

REQUEST_TIMED_OUT = 7


def txn_produce_request(transactional_id: str, topic: str, batch: bytes, timeout_ms: int) -> Any:
    mod = importlib.import_module("kio.schema.produce.v7.request")
    return mod.ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(
            mod.TopicProduceData(name=topic, partition_data=(mod.PartitionProduceData(index=0, records=batch),)),
        ),
    )


async def test_late_commit_of_an_aborted_transaction_joins_no_later_transaction(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic = "late-verified"
    txn_id = "late-verified"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"diskless.enabled": "true"})])[topic].result(30)
    bootstrap = cluster.bootstrap_in("az-1")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="late diskless_az=az-1", transactional_id=txn_id)
    await producer.start()
    s3 = cluster.s3
    assert s3 is not None and s3.pid is not None
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"before", partition=0)
        # The next transaction adds the partition (its first record is written), then a request of
        # the same producer stalls in the representative's flush while object storage is stopped.
        await producer.begin_transaction()
        aborted = await producer.send_and_wait(topic, b"aborted", partition=0)
        tp = TopicPartition(topic, 0)
        manager = producer._txn_manager
        assert manager is not None
        pid, epoch, seq = manager.producer_id, manager.producer_epoch, manager.sequence_number(tp)
        late = build_batch(
            [(None, b"late")],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            attributes=records.TRANSACTIONAL_FLAG,
        )
        os.kill(s3.pid, signal.SIGSTOP)
        try:
            with Session(bootstrap, timeout=30) as session:
                response = await asyncio.to_thread(session.request, txn_produce_request(txn_id, topic, late, 2000))
            code = response.responses[0].partition_responses[0].error_code
            assert code == REQUEST_TIMED_OUT, f"the stalled request was answered {code}"
            # The client gives up on it and aborts; the ABORT marker is written inline (no S3).
            await producer.abort_transaction()
            # EndTxn is answered once the abort is prepared; the coordinator writes the markers
            # after that. A late commit that reaches the leader before the marker belongs to the
            # aborted transaction and is aborted with it (as in Kafka, where the append would
            # have happened before the marker), and "after", which reuses its sequence, is then a
            # duplicate of it. This test is about the commit that comes after the marker.
            await asyncio.to_thread(
                wait_until,
                lambda: latest_offsets_in("az-1", bootstrap, topic)[1] > aborted.offset,
                30,
                0.1,
                "the ABORT marker was not written",
            )
        finally:
            os.kill(s3.pid, signal.SIGCONT)
        # Same epoch, and the sequence of the request it never had an answer for.
        async with producer.transaction():
            await producer.send_and_wait(topic, b"after", partition=0)
    finally:
        await producer.stop()

    # The representative commits a partition's batches in the order it received them: once "after"
    # is readable, the late batch has been committed or refused.
    got = await asyncio.to_thread(read_committed_in, "az-1", bootstrap, topic, 2)
    assert sorted(got) == [b"after", b"before"], f"read_committed got {got}"
    ends = await asyncio.to_thread(latest_offsets_in, "az-1", bootstrap, topic)
    assert ends[0] == ends[1], f"last stable offset {ends[1]} stuck below the high watermark {ends[0]}"


def test_classic_transactions_with_verification_with_librdkafka(broker_factory) -> None:
    """Classic partitions verify too: a real transactional client's first batch of each
    transaction waits for the coordinator, its pipelined batches queue behind it, a committed
    transaction is read in order by read_committed, an aborted one is invisible, and the next
    committed one is read after it (nothing holds the last stable offset)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
    from confluent_kafka import TopicPartition as Partition

    broker = broker_factory(OVERRIDES)
    topic = "classic-verified"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": "classic-1", "linger.ms": 0, "batch.size": 200}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(200):  # many small batches: pipelined while the first one is verified
        producer.produce(topic, b"c%03d" % i)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for _ in range(20):
        producer.produce(topic, b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()  # visible only if nothing holds the last stable offset
    producer.produce(topic, b"after")
    producer.commit_transaction(30)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "classic-verified",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([Partition(topic, 0, OFFSET_BEGINNING)])  # no group: only the produce path is under test
    seen: list[bytes] = []

    def all_committed() -> bool:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append(message.value())
        return len(seen) >= 201

    wait_until(all_committed, timeout=60)
    assert seen == [b"c%03d" % i for i in range(200)] + [b"after"]
    consumer.close()

"""An operator finds and aborts an open transaction (KIP-664) with kafka-python 3's admin client:
ListTransactions on every broker, DescribeTransactions at the coordinator, DescribeProducers at any
replica, and the abort, a WriteTxnMarkers the operator sends to the partition's leader. A diskless
partition is asked through a broker that holds no replica of it, which forwards to its leader."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KTP
from kafka.admin._transactions import AbortTransactionSpec, TransactionState
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.write_txn_markers.v1.request import (
    WritableTxnMarker,
    WritableTxnMarkerTopic,
    WriteTxnMarkersRequest,
)
from kio.static.primitive import i16, i32, i64
from rawclient import RawClient
from support import wait_until

pytestmark = pytest.mark.integration

OVERRIDES = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}
CLASSIC, DISKLESS = KTP("hang-classic", 0), KTP("hang-diskless", 0)
DISKLESS_HOST = 2  # the only replica of the diskless partition: brokers 0 and 1 forward
DISKLESS_CONFIG = {"diskless.enabled": "true"}
OPEN, AFTER = 5, 3  # records in the open transaction, then plain records behind it


def _ends(bootstrap: str, isolation: str) -> dict[KTP, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, request_timeout_ms=20_000)
    try:
        return consumer.end_offsets([CLASSIC, DISKLESS])
    finally:
        consumer.close()


def _values(bootstrap: str, isolation: str, tp: KTP, count: int) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, consumer_timeout_ms=3_000)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values += [r.value for r in records]
        return values
    finally:
        consumer.close()


def _producer_of(states: Any, producer_id: int) -> Any:
    found = [p for p in states.active_producers if p.producer_id == producer_id]
    assert len(found) == 1, states
    return found[0]


def test_an_operator_finds_and_aborts_an_open_transaction(cluster_factory: Any) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    creator = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for topic in (
        NewTopic(CLASSIC.topic, 1, 3),
        NewTopic(DISKLESS.topic, num_partitions=1, replica_assignment=[[DISKLESS_HOST]], config=DISKLESS_CONFIG),
    ):
        creator.create_topics([topic])[topic.topic].result(30)

    # A transaction left open (its producer gone quiet), then plain records behind it.
    stuck = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": "stuck", "transaction.timeout.ms": 600_000}
    )
    stuck.init_transactions(30)
    stuck.begin_transaction()
    for tp in (CLASSIC, DISKLESS):
        for i in range(OPEN):
            stuck.produce(tp.topic, value=f"open-{i}".encode(), partition=tp.partition)
    assert stuck.flush(30) == 0
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    for tp in (CLASSIC, DISKLESS):
        for i in range(AFTER):
            plain.produce(tp.topic, value=f"after-{i}".encode(), partition=tp.partition)
    assert plain.flush(30) == 0
    high = OPEN + AFTER
    assert _ends(cluster.bootstrap, "read_uncommitted") == {CLASSIC: high, DISKLESS: high}
    assert _ends(cluster.bootstrap, "read_committed") == {CLASSIC: 0, DISKLESS: 0}  # held by the transaction

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    try:
        # Find it: every broker lists the transactions it coordinates; exactly one has it.
        listings = admin.list_transactions()
        assert set(listings) == {0, 1, 2}
        found = [(broker, t) for broker, txns in listings.items() for t in txns if t.transactional_id == "stuck"]
        assert len(found) == 1 and found[0][1].state is TransactionState.ONGOING
        producer_id = found[0][1].producer_id
        ongoing = admin.list_transactions(state_filters=["Ongoing"], duration_filter_ms=0)
        assert "stuck" in {t.transactional_id for txns in ongoing.values() for t in txns}
        done = admin.list_transactions(state_filters=["CompleteCommit", "CompleteAbort"])
        assert "stuck" not in {t.transactional_id for txns in done.values() for t in txns}

        described = admin.describe_transactions(["stuck"])["stuck"]
        assert described.coordinator_id == found[0][0]
        assert described.state is TransactionState.ONGOING and described.producer_id == producer_id
        assert described.topic_partitions == {CLASSIC, DISKLESS}
        assert described.transaction_timeout_ms == 600_000 and described.transaction_start_time_ms > 0

        # Every broker answers DescribeProducers for both partitions: the classic one from its own
        # replica, the diskless one from its only replica or through it.
        for broker in (0, 1, 2):
            states = admin.describe_producers([CLASSIC, DISKLESS], broker_id=broker)
            for tp in (CLASSIC, DISKLESS):
                seen = _producer_of(states[tp], producer_id)
                assert seen.current_transaction_start_offset == 0, (broker, tp, seen)
                assert seen.producer_epoch == described.producer_epoch
                assert seen.last_sequence == OPEN - 1
        seen = {tp: _producer_of(admin.describe_producers([tp])[tp], producer_id) for tp in (CLASSIC, DISKLESS)}

        # Abort it where it hangs: the classic partition through kafka-python (to its leader), the
        # diskless one through a broker without a replica of it, which forwards the marker.
        admin.abort_transaction(
            AbortTransactionSpec(CLASSIC, producer_id, seen[CLASSIC].producer_epoch, seen[CLASSIC].coordinator_epoch)
        )
        marker = WritableTxnMarker(
            producer_id=i64(producer_id),
            producer_epoch=i16(seen[DISKLESS].producer_epoch),
            transaction_result=False,
            topics=(WritableTxnMarkerTopic(name=DISKLESS.topic, partition_indexes=(i32(0),)),),
            coordinator_epoch=i32(seen[DISKLESS].coordinator_epoch),
        )
        with RawClient(cluster.brokers[0].bootstrap, timeout=40) as raw:
            # A COMMIT marker is a coordinator's alone: from a client it is refused, nothing written.
            commit = dataclasses.replace(marker, transaction_result=True)
            refused = raw.request(WriteTxnMarkersRequest(markers=(commit,))).markers[0].topics[0].partitions[0]
            assert refused.error_code.name == "cluster_authorization_failed"
            answer = raw.request(WriteTxnMarkersRequest(markers=(marker,)))
            assert [p.error_code.value for p in answer.markers[0].topics[0].partitions] == [0]
            # A stale marker (an older producer epoch) is refused by the leader, and the refusal
            # comes back through the forwarding broker.
            stale = WriteTxnMarkersRequest(markers=(dataclasses.replace(marker, producer_epoch=i16(-1)),))
            refused = raw.request(stale).markers[0].topics[0].partitions[0]
            assert refused.error_code.name == "invalid_producer_epoch"
            # DescribeProducers through it: the leader's state, the transaction no longer open.
            producers = raw.request(
                DescribeProducersRequest(topics=(TopicRequest(name=DISKLESS.topic, partition_indexes=(i32(0),)),))
            )
            (entry,) = [p for p in producers.topics[0].partitions[0].active_producers if p.producer_id == producer_id]
            assert entry.current_txn_start_offset == -1

        # The last stable offset moves past the aborted records: read_committed reads what follows.
        wait_until(
            lambda: _ends(cluster.bootstrap, "read_committed") == {CLASSIC: high + 1, DISKLESS: high + 1},
            timeout=30,
            message="the last stable offsets did not move past the aborted transaction",
        )
        for tp in (CLASSIC, DISKLESS):
            assert _values(cluster.bootstrap, "read_committed", tp, AFTER) == [
                f"after-{i}".encode() for i in range(AFTER)
            ]
            assert len(_values(cluster.bootstrap, "read_uncommitted", tp, high)) == high
            assert _producer_of(admin.describe_producers([tp])[tp], producer_id).current_transaction_start_offset == -1
    finally:
        admin.close()
        stuck.purge()

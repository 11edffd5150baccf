"""Zone-aligned reads on a lagging follower, on a real cluster (3 brokers in 3 AZs, etcd, S3).

A diskless partition's Metadata tells a client in AZ z that its leader is the replica in z, so a
consumer there reads from a follower. Here the follower lags for certain: its process is stopped
(SIGSTOP) while records are produced through the leader, and the consumer's requests reach the
follower's socket while it is stopped, so they are handled the moment it resumes, before its
replica fetcher can catch up. The follower must answer as the leader would: the records (read
through the leader), and the leader's end offset for the current epoch, never
OFFSET_OUT_OF_RANGE or a lower end offset that would make the client reset or truncate.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from rawclient import RawClient, Session, build_batch, decode_batches, encode_request, fetch_request, metadata_request
from rawclient import response_class as response_class_of
from support import wait_until

pytestmark = pytest.mark.integration

TOPIC = "zoned-reads"
OFFSET_OUT_OF_RANGE = 1


def request_as(client: RawClient, request: Any, client_id: str) -> Any:
    cid = client.correlation()
    client.send_raw(encode_request(request, cid, client_id))
    return client.receive(response_class_of(request), int(type(request).__api_key__), cid)


def partition_view(bootstrap: str, client_az: str) -> Any:
    """Partition 0 of TOPIC as Metadata shows it to a client in ``client_az``."""
    with RawClient(bootstrap) as client:
        response = request_as(client, metadata_request([TOPIC]), f"probe diskless_az={client_az}")
    (topic,) = response.topics
    assert topic.error_code == 0 and topic.partitions
    return topic.partitions[0]


def epoch_request(epoch: int) -> OffsetForLeaderEpochRequest:
    return OffsetForLeaderEpochRequest(
        replica_id=-1,
        topics=(
            OffsetForLeaderTopic(
                topic=TOPIC,
                partitions=(OffsetForLeaderPartition(partition=0, current_leader_epoch=epoch, leader_epoch=epoch),),
            ),
        ),
    )


def values(records: list[Any]) -> dict[int, bytes]:
    return {r.offset: r.value for r in records}


def start(cluster_factory: Any, overrides: dict[str, str]) -> tuple[Any, Any, Any, int]:
    """A cluster with TOPIC (1 partition, 3 replicas, diskless): (cluster, leader, a follower in
    another AZ to which that AZ's clients are sent, leader epoch)."""
    cluster = cluster_factory(s3=True, overrides=overrides)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"diskless.enabled": "true"})])[TOPIC].result(30)

    # The true leader: what a client in an AZ without brokers is told. Wait for a full ISR.
    def settled() -> Any:
        view = partition_view(cluster.brokers[0].bootstrap, "nowhere")
        return view if view.leader_id >= 0 and len(view.isr_nodes) == 3 else None

    truth = wait_until(settled, 30, message="partition never got a leader and a full ISR")
    leader = cluster.brokers[truth.leader_id]
    follower = next(b for b in cluster.brokers if b.rack != leader.rack)
    assert partition_view(leader.bootstrap, follower.rack).leader_id == follower.node_id, "not zone-aligned"
    return cluster, leader, follower, int(truth.leader_epoch)


async def test_a_consumer_zone_aligned_to_a_lagging_follower_gets_what_only_the_leader_has(cluster_factory) -> None:
    # The follower is stopped for well under a second; nothing may time it out meanwhile.
    cluster, leader, follower, epoch = start(
        cluster_factory, {"broker.session.timeout.ms": "10000", "replica.lag.time.max.ms": "10000"}
    )

    produced: dict[int, bytes] = {}
    with Session(leader.bootstrap, timeout=30) as session:
        part = session.produce(TOPIC, 0, build_batch([(b"k", b"before-%d" % i) for i in range(10)]), acks=-1)
        assert part.error_code == 0
        produced.update({part.base_offset + i: b"before-%d" % i for i in range(10)})

    fetch_conn = Session(follower.bootstrap, timeout=30)
    epoch_conn = RawClient(follower.bootstrap, timeout=30)
    try:
        # The follower has replicated everything so far and serves it itself.
        wait_until(lambda: len(fetch_conn.fetch_all(TOPIC, 0)) == 10, 30, message="follower never caught up")

        os.kill(follower.proc.pid, signal.SIGSTOP)
        try:
            with Session(leader.bootstrap, timeout=30) as session:
                for n in range(5):  # separate requests: the follower's pending fetch can get only the first
                    batch = [(b"k", b"during-%d-%d" % (n, i)) for i in range(4)]
                    part = session.produce(TOPIC, 0, build_batch(batch), acks=1)
                    assert part.error_code == 0
                    produced.update({part.base_offset + i: v for i, (_, v) in enumerate(batch)})
            end = max(produced) + 1
            assert end == 30
            # Offset 28 exists only on the leader (the follower stopped at 10, at most one batch
            # more is on its way). Both requests wait in the stopped follower's socket.
            fetch_cid = fetch_conn.send(fetch_request(TOPIC, 0, 28, max_wait_ms=5000))
            epoch_cid = epoch_conn.correlation()
            epoch_conn.send_raw(encode_request(epoch_request(epoch), epoch_cid, f"c diskless_az={follower.rack}"))
        finally:
            os.kill(follower.proc.pid, signal.SIGCONT)

        fetched = fetch_conn.receive(response_class_of(fetch_request(TOPIC, 0, 0)), 1, fetch_cid)
        part = fetched.responses[0].partitions[0]
        assert part.error_code == 0, f"the follower answered {part.error_code!r} for an offset the leader has"
        got = values([r for r in decode_batches(part.records or b"") if r.offset >= 28])
        assert got == {28: produced[28], 29: produced[29]}

        answer = epoch_conn.receive(response_class_of(epoch_request(epoch)), 23, epoch_cid)
        ends = answer.topics[0].partitions[0]
        assert ends.error_code == 0
        assert (ends.leader_epoch, ends.end_offset) == (epoch, end), "an end offset that makes the client truncate"
    finally:
        fetch_conn.close()
        epoch_conn.close()

    # A real consumer in the follower's AZ, with no reset policy to hide an out-of-range answer,
    # resumes at an offset from the leader and reads on to the end.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cluster.bootstrap_in(follower.rack),
        client_id=f"consumer diskless_az={follower.rack}",
        group_id=None,
        auto_offset_reset="none",
    )
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, 12)
        got = {}
        deadline = time.monotonic() + 30
        while len(got) < end - 12 and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=1000)).values():
                got.update({m.offset: m.value for m in messages})
        assert got == {o: v for o, v in produced.items() if o >= 12}
        assert consumer._client.cluster.leader_for_partition(tp) == follower.node_id
    finally:
        await consumer.stop()


async def test_a_follower_paused_across_delete_records_never_serves_below_the_leaders_log_start(
    cluster_factory,
) -> None:
    """DeleteRecords moves the leader's log start while the follower is stopped, with the leader's
    last answer (the old log start) waiting in the follower's socket. On resuming, the follower
    must not serve the deleted offsets from its own log (their WAL objects may be gone): it was out
    of touch for longer than it may serve reads itself, so it asks the leader, and the client gets
    OFFSET_OUT_OF_RANGE with the leader's log start."""
    _, leader, follower, _ = start(
        cluster_factory, {"broker.session.timeout.ms": "10000", "replica.lag.time.max.ms": "2500"}
    )
    with Session(leader.bootstrap, timeout=30) as session:
        part = session.produce(TOPIC, 0, build_batch([(b"k", b"v-%d" % i) for i in range(10)]), acks=-1)
        assert part.error_code == 0 and part.base_offset == 0

    fetch_conn = Session(follower.bootstrap, timeout=30)
    try:
        wait_until(lambda: len(fetch_conn.fetch_all(TOPIC, 0)) == 10, 30, message="follower never caught up")
        os.kill(follower.proc.pid, signal.SIGSTOP)
        try:
            # The leader drops the silent follower from the ISR after replica.lag.time.max.ms, which
            # is longer than a follower may go without hearing from its leader and still serve.
            wait_until(
                lambda: follower.node_id not in partition_view(leader.bootstrap, "nowhere").isr_nodes,
                30,
                message="the stopped follower stayed in the ISR",
            )
            admin = AdminClient({"bootstrap.servers": leader.bootstrap})
            (future,) = admin.delete_records([ConfluentPartition(TOPIC, 0, 5)]).values()
            assert future.result(30).low_watermark == 5
            fetch_cid = fetch_conn.send(fetch_request(TOPIC, 0, 2, max_wait_ms=5000))
        finally:
            os.kill(follower.proc.pid, signal.SIGCONT)
        fetched = fetch_conn.receive(response_class_of(fetch_request(TOPIC, 0, 0)), 1, fetch_cid)
        part = fetched.responses[0].partitions[0]
        assert part.error_code == OFFSET_OUT_OF_RANGE, f"served offset 2 below the leader's log start: {part!r}"
        assert part.log_start_offset == 5

        # Back in the ISR, the follower serves from the new log start.
        wait_until(
            lambda: follower.node_id in partition_view(follower.bootstrap, "nowhere").isr_nodes,
            30,
            message="the follower never rejoined the ISR",
        )
        assert values(fetch_conn.fetch_all(TOPIC, 0, 5)) == {o: b"v-%d" % o for o in range(5, 10)}
    finally:
        fetch_conn.close()

"""A diskless topic deleted and re-created under the same name while a flush of the old topic is
still uploading, or retrying its commit: the old incarnation's batch must never become part of
the new topic.

Real processes (etcd, SeaweedFS, three brokers in three AZs). The upload is held up by stopping
the S3 server (SIGSTOP: the PUT is sent and waits for an answer, nothing fails); the commit is
held up by killing the only replica's broker (the representative retries while the partition has
no leader). The topic is deleted and re-created meanwhile, and the representative goes on. The new
topic must hold only its own records, and every pointer in every replica of it must name a batch
that the WAL object's trailer files under the new topic id.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from rawclient import Session, build_batch
from support import wait_until
from test_diskless_faults import PRODUCER_AZ, load_objects, metric, read_everything

from diskless.broker.replica_manager import PARTITION_METADATA
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.log.segment import POINTERS
from diskless.storage import pointer

pytestmark = pytest.mark.integration

TOPIC = "reborn"
UNKNOWN_TOPIC_OR_PARTITION = 3
OVERRIDES = {"controlled.shutdown.timeout.ms": "2000"}


def topic_state(bootstrap: str, topic: str) -> tuple[uuid.UUID | None, int]:
    """(topic id, leader of partition 0) as one broker's metadata shows them; (None, -1) if absent."""
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=topic),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    with Session(bootstrap, timeout=10) as session:
        response = session.request(request)
    (answer,) = response.topics
    if answer.error_code != 0 or not answer.partitions:
        return None, -1
    return answer.topic_id, int(answer.partitions[0].leader_id)


def create(admin: AdminClient, replicas: list[int] | None = None) -> None:
    """TOPIC with one partition: on every broker, or on ``replicas`` only."""
    config = {"diskless.enabled": "true"}
    if replicas is None:
        new = NewTopic(TOPIC, 1, 3, config=config)
    else:
        new = NewTopic(TOPIC, num_partitions=1, replica_assignment=[replicas], config=config)
    admin.create_topics([new])[TOPIC].result(30)


def visible(bootstrap: str, other_than: uuid.UUID | None = None) -> uuid.UUID:
    """Wait until the broker at ``bootstrap`` shows TOPIC with a leader and an id other than
    ``other_than``; returns that id."""

    def seen() -> uuid.UUID | None:
        topic_id, leader = topic_state(bootstrap, TOPIC)
        return topic_id if topic_id not in (None, other_than) and leader >= 0 else None

    return wait_until(seen, 30, 0.05, f"{TOPIC} never showed up with a new id and a leader")


def deleted(bootstrap: str) -> None:
    wait_until(lambda: topic_state(bootstrap, TOPIC)[0] is None, 30, 0.05, f"{TOPIC} still shown")


def produce(bootstrap: str, value: bytes) -> tuple[int, int]:
    """One acks=all batch over a raw connection (no client retries): (error code, base offset)."""
    with Session(bootstrap, timeout=60) as session:
        response = session.produce(TOPIC, 0, build_batch([(b"k", value)]), acks=-1)
    return int(response.error_code), int(response.base_offset)


def puts(broker: Any) -> float:
    return metric(broker.metrics(), "diskless_object_store_requests_total", operation="put")


def commit_rpcs(broker: Any) -> float:
    return metric(broker.metrics(), "diskless_commit_rpcs_total")


def flushes_done(broker: Any) -> float:
    return metric(broker.metrics(), "diskless_flush_seconds_count")


def pointers_of(broker: Any) -> tuple[str, list[pointer.PointerEntry]]:
    """The topic id a stopped broker's replica of TOPIC-0 belongs to, and its pointer entries."""
    directory = broker.data_dir / f"{TOPIC}-0"
    with open(directory / PARTITION_METADATA) as f:
        topic_id = next(line.split(":", 1)[1].strip() for line in f if line.startswith("topic_id:"))
    log = PartitionLog(str(directory), LogConfig(), 0)
    try:
        entries = []
        for segment in log.segments:
            if segment.kind == POINTERS:
                for location in segment.iter_batches():
                    entry, _ = pointer.decode_entry(segment.read_batch(location), 0)
                    if isinstance(entry, pointer.PointerEntry):
                        entries.append(entry)
        return topic_id, entries
    finally:
        log.close(clean=False)


async def check_only_new_records(cluster: Any, new_id: uuid.UUID, values: list[bytes], brokers: list[Any]) -> None:
    """Consumers of the new topic read exactly ``values``; no replica of it (on ``brokers``) points
    at a batch filed under another topic id."""
    got = await read_everything(cluster.bootstrap, TOPIC, 1)
    assert [value for _, value in got[0]] == values
    for broker in cluster.brokers:
        broker.stop()
    objects = await load_objects(cluster.s3)
    for broker in brokers:
        topic_id, entries = pointers_of(broker)
        assert topic_id == str(new_id)
        assert len(entries) == len(values), f"broker {broker.node_id}: {len(entries)} pointers in the new topic"
        for entry in entries:
            filed = [e for e in objects[entry.key].trailer.entries if e.offset == entry.offset]
            assert [str(e.topic_id) for e in filed] == [topic_id], f"broker {broker.node_id}: {entry.key}"


async def test_recreated_topic_never_gets_the_batch_of_an_upload_in_flight(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    representative = cluster.brokers[0]
    assert representative.rack == PRODUCER_AZ
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    create(admin)
    old_id = await asyncio.to_thread(visible, representative.bootstrap)
    code, _ = await asyncio.to_thread(produce, representative.bootstrap, b"old-before")
    assert code == 0

    s3_pid = cluster.s3.pid
    assert s3_pid is not None
    before = await asyncio.to_thread(puts, representative)
    os.kill(s3_pid, signal.SIGSTOP)
    try:
        # The old incarnation's batch: its PUT is sent and hangs while S3 is stopped.
        stalled = asyncio.create_task(asyncio.to_thread(produce, representative.bootstrap, b"old-stalled"))
        await asyncio.to_thread(
            wait_until, lambda: puts(representative) > before, 30, 0.05, "the stalled flush never sent its PUT"
        )
        assert not stalled.done()
        admin.delete_topics([TOPIC])[TOPIC].result(30)
        await asyncio.to_thread(deleted, representative.bootstrap)
        await asyncio.to_thread(create, admin)
        new_id = await asyncio.to_thread(visible, representative.bootstrap, old_id)
        assert not stalled.done(), "the stalled produce was answered before its upload finished"
        resumed_at = time.monotonic()
    finally:
        os.kill(s3_pid, signal.SIGCONT)

    stalled_code, stalled_offset = await asyncio.wait_for(stalled, 60)
    answered_after = time.monotonic() - resumed_at
    code, new_offset = await asyncio.to_thread(produce, representative.bootstrap, b"new-0")
    assert code == 0
    print(
        f"stalled produce of the old incarnation answered {stalled_code} at offset {stalled_offset}, "
        f"{answered_after:.2f}s after S3 resumed; the new topic's first record went to offset {new_offset}"
    )
    del admin
    await check_only_new_records(cluster, new_id, [b"new-0"], cluster.brokers)
    assert stalled_code == UNKNOWN_TOPIC_OR_PARTITION


async def test_recreated_topic_never_gets_the_batch_of_a_commit_being_retried(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    representative, survivor, victim = cluster.brokers
    assert representative.rack == PRODUCER_AZ
    admin = AdminClient({"bootstrap.servers": representative.bootstrap})
    create(admin, [victim.node_id])
    old_id = await asyncio.to_thread(visible, representative.bootstrap)
    code, _ = await asyncio.to_thread(produce, representative.bootstrap, b"old-before")
    assert code == 0

    # The old incarnation's only replica stops answering: the batch is uploaded and its commit
    # waits on the leader. The topic is deleted and re-created elsewhere meanwhile; then the old
    # leader dies, the commit fails, and the representative retries it.
    victim_pid = victim.pid
    assert victim_pid is not None
    before = await asyncio.to_thread(commit_rpcs, representative)
    flushes = await asyncio.to_thread(flushes_done, representative)
    os.kill(victim_pid, signal.SIGSTOP)
    try:
        stalled = asyncio.create_task(asyncio.to_thread(produce, representative.bootstrap, b"old-stalled"))
        await asyncio.to_thread(
            wait_until, lambda: commit_rpcs(representative) > before, 30, 0.05, "the flush never sent its commit"
        )
        admin.delete_topics([TOPIC])[TOPIC].result(30)
        await asyncio.to_thread(deleted, representative.bootstrap)
        await asyncio.to_thread(create, admin, [survivor.node_id])
        new_id = await asyncio.to_thread(visible, representative.bootstrap, old_id)
        retried_after_recreation = await asyncio.to_thread(flushes_done, representative) == flushes
    finally:
        victim.kill()

    stalled_code, stalled_offset = await asyncio.wait_for(stalled, 60)
    await asyncio.to_thread(
        wait_until, lambda: flushes_done(representative) > flushes, 30, 0.05, "the retried flush never finished"
    )
    code, new_offset = await asyncio.to_thread(produce, representative.bootstrap, b"new-0")
    assert code == 0
    print(
        f"the old incarnation's produce answered {stalled_code} at offset {stalled_offset}; "
        f"the new topic's first record went to offset {new_offset}"
    )
    del admin
    await check_only_new_records(cluster, new_id, [b"new-0"], [survivor])
    assert retried_after_recreation, "the flush finished before the topic was re-created: nothing was tested"
    assert stalled_code != 0

"""read_committed in every AZ of a diskless topic, including AZs with no replica of the partition:
there a broker reads pointers from the leader (FetchPointers) and the data from object storage,
and the last stable offset and the aborted transactions must come from the leader too."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from support import wait_until

AZS = ["az-1", "az-2", "az-3"]
OVERRIDES = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}


def hosts_replica(broker_dir: Path, topic: str) -> bool:
    return any(p.name == f"{topic}-0" for p in broker_dir.rglob(f"{topic}-0") if p.is_dir())


def read_committed_in(az: str, bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[bytes]:
    """Everything a read_committed consumer of ``az`` gets; reads on for 2 s after ``expected``
    values so that anything beyond them (aborted or still-open records) shows up."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"reader diskless_az={az}",
            "group.id": f"rc-{az}-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        idle_until = None
        while time.monotonic() < deadline:
            values.extend(m.value() for m in consumer.consume(1000, 0.5) if m.error() is None)
            if len(values) >= expected:
                idle_until = idle_until or time.monotonic() + 2
                if time.monotonic() > idle_until:
                    break
        return values
    finally:
        consumer.close()


def latest_offsets_in(az: str, bootstrap: str, topic: str) -> tuple[int, int]:
    """(read_uncommitted, read_committed) ListOffsets(latest) answered through a broker of ``az``."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": f"admin diskless_az={az}"})
    tp = TopicPartition(topic, 0)
    found = []
    for level in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED):
        result = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level, request_timeout=30)
        found.append(result[tp].result(30).offset)
    return found[0], found[1]


def offsets_by_time_in(az: str, bootstrap: str, topic: str, timestamp: int) -> dict[str, int]:
    """ListOffsets by timestamp and by max timestamp, at both isolation levels, through ``az``."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": f"admin diskless_az={az}"})
    tp = TopicPartition(topic, 0)
    found = {}
    for level in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED):
        for name, spec in (("time", OffsetSpec.for_timestamp(timestamp)), ("max", OffsetSpec.max_timestamp())):
            result = admin.list_offsets({tp: spec}, isolation_level=level, request_timeout=30)
            found[f"{name} {level.name.lower()}"] = result[tp].result(30).offset
    return found


def test_read_committed_in_azs_without_a_replica(cluster_factory) -> None:
    """The user's report: 3 AZs, replication factor 1, 50 committed and 50 aborted transactional
    records; read_committed consumers in the AZs without a replica got all 100. A transaction
    left open at the end must also stay invisible (reads stop at the leader's LSO)."""
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic = "rc-remote"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"diskless.enabled": "true"})])[topic].result(30)

    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_in("az-1"),
            "client.id": "txn diskless_az=az-1",
            "transactional.id": "rc-remote",
        }
    )
    producer.init_transactions(30)
    committed = []
    for round_, (commit, count) in enumerate([(True, 25), (False, 50), (True, 25)]):
        producer.begin_transaction()
        for i in range(count):
            value = f"{'c' if commit else 'a'}-{round_}-{i}".encode()
            producer.produce(topic, value=value, partition=0)
            if commit:
                committed.append(value)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    # 25 + 50 + 25 records, three markers, then the open transaction's 10 records.
    stable = 25 + 1 + 50 + 1 + 25 + 1
    # Markers are written after EndTxn is answered: wait for the last one, so that every record
    # of the next transaction is younger than it.
    wait_until(lambda: latest_offsets_in("az-1", cluster.bootstrap_in("az-1"), topic)[1] == stable, timeout=30)
    open_since = int(time.time() * 1000) + 1
    wait_until(lambda: time.time() * 1000 > open_since)
    # A transaction still open: its records are in the log (below the HW) but not stable.
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"open-{i}".encode(), partition=0)
    assert producer.flush(30) == 0

    remote = [b.rack for b in cluster.brokers if not hosts_replica(b.data_dir, topic)]
    assert len(remote) == 2, "replication factor 1 over 3 AZs leaves two AZs without a replica"
    try:
        for az in AZS:
            uncommitted_end, committed_end = latest_offsets_in(az, cluster.bootstrap_in(az), topic)
            assert (uncommitted_end, committed_end) == (stable + 10, stable), f"ListOffsets in {az}"
            # As Kafka: a timestamp lookup answers only offsets below the LSO for read_committed.
            by_time = offsets_by_time_in(az, cluster.bootstrap_in(az), topic, open_since)
            assert by_time == {
                "time read_uncommitted": stable,
                "max read_uncommitted": by_time["max read_uncommitted"],
                "time read_committed": -1,
                "max read_committed": -1,
            }, f"ListOffsets by time in {az}"
            assert stable <= by_time["max read_uncommitted"] < stable + 10
            got = read_committed_in(az, cluster.bootstrap_in(az), topic, len(committed))
            assert sorted(got) == sorted(committed), (
                f"read_committed consumer in {az} (replica here: {az not in remote}) got {len(got)} records, "
                f"{sum(v.startswith(b'a-') for v in got)} aborted, {sum(v.startswith(b'open-') for v in got)} open"
            )
    finally:
        producer.abort_transaction(30)


def test_producer_restarted_after_an_abort_initialises_and_commits(cluster_factory) -> None:
    """After a client abort, the coordinator reseals the aborted partitions with the new epoch
    before answering InitProducerId (CONCURRENT_TRANSACTIONS meanwhile): librdkafka retries and
    carries on, and the reseal marker is one more control batch in the partition."""
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic = "rc-restart"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"diskless.enabled": "true"})])[topic].result(30)
    config = {"bootstrap.servers": cluster.bootstrap_in("az-1"), "client.id": "txn diskless_az=az-1"}
    first = Producer({**config, "transactional.id": "rc-restart"})
    first.init_transactions(30)
    first.begin_transaction()
    for i in range(10):
        first.produce(topic, value=f"a-{i}".encode(), partition=0)
    assert first.flush(30) == 0
    first.abort_transaction(30)
    del first

    second = Producer({**config, "transactional.id": "rc-restart"})
    second.init_transactions(30)
    second.begin_transaction()
    committed = [f"c-{i}".encode() for i in range(5)]
    for value in committed:
        second.produce(topic, value=value, partition=0)
    second.commit_transaction(30)

    # 10 aborted records, their ABORT marker, the reseal's ABORT marker, 5 records, COMMIT. The
    # broker in az-2 is a follower: it learns the high watermark with its next fetch.
    seen: list[tuple[int, int]] = []

    def reached() -> bool:
        seen.append(latest_offsets_in("az-2", cluster.bootstrap_in("az-2"), topic))
        return seen[-1] == (18, 18)

    try:
        wait_until(reached, timeout=30, interval=0.2)
    except TimeoutError:
        raise AssertionError(f"ListOffsets (uncommitted, committed) in az-2: {seen[-1]}") from None
    assert sorted(read_committed_in("az-2", cluster.bootstrap_in("az-2"), topic, len(committed))) == committed


def test_a_diskless_commit_that_outlives_its_aborted_transaction_is_never_committed(cluster_factory) -> None:
    """Object storage stalls while a transactional batch is being uploaded; the client's request
    times out, the client aborts (and bumps its epoch, KIP-360), storage comes back, and the
    representative's flush commits the batch after the ABORT marker. The producer's next
    transaction commits. The late record must never become visible to read_committed, and the
    last stable offset must not stay behind the high watermark."""
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic = "late-commit"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"diskless.enabled": "true"})])[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_in("az-1"),
            "client.id": "late diskless_az=az-1",
            "transactional.id": "late-commit",
            "message.timeout.ms": 3000,
            "transaction.timeout.ms": 30000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"before", partition=0)
    producer.commit_transaction(30)

    s3 = cluster.s3
    assert s3 is not None and s3.pid is not None
    failures: list[str] = []
    os.kill(s3.pid, signal.SIGSTOP)
    try:
        producer.begin_transaction()
        producer.produce(topic, value=b"late", partition=0, on_delivery=lambda err, _: failures.append(str(err)))
        wait_until(lambda: producer.poll(0.1) >= 0 and failures, timeout=30, message="the produce never timed out")
        assert failures != ["None"], "the batch was acknowledged while object storage was stopped"
        producer.abort_transaction(30)
    finally:
        os.kill(s3.pid, signal.SIGCONT)

    producer.begin_transaction()
    producer.produce(topic, value=b"after", partition=0)
    producer.commit_transaction(30)
    # The representative commits a partition's batches in the order it received them: once "after"
    # is readable, the late batch has been committed or refused.
    got = read_committed_in("az-1", cluster.bootstrap_in("az-1"), topic, 2)
    assert sorted(got) == [b"after", b"before"], f"read_committed got {got}"
    ends = latest_offsets_in("az-1", cluster.bootstrap_in("az-1"), topic)
    assert ends[0] == ends[1], f"last stable offset {ends[1]} stuck below the high watermark {ends[0]}"

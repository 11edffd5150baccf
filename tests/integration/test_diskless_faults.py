"""Diskless topics under faults: object storage down, a representative SIGKILLed mid-flush, and an
idempotent producer failing over to another representative.

Real processes throughout (etcd, SeaweedFS, three brokers in three AZs) and real clients (aiokafka,
confluent-kafka, and the raw client where an exact error code matters). After each fault the
brokers are stopped, every replica's partition log is opened offline and every pointer entry is
checked against the bucket: the object it names exists, it is a whole WAL object, and the bytes at
the pointer's (offset, size) are exactly the batch the entry describes (``PointerEntry.serve``
compares every header field the leader did not assign; the producer's CRC is then recomputed over
the served records). Objects no pointer names are garbage for the WAL file manager: allowed,
counted and printed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rawclient import Session, build_batch
from support import wait_until

from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.log.segment import POINTERS
from diskless.protocol import records
from diskless.storage import pointer
from diskless.storage.object_store import ObjectStore
from diskless.storage.wal_format import WalObjectReader, parse_wal_object_key

pytestmark = pytest.mark.integration

KAFKA_STORAGE_ERROR = 56
PRODUCER_AZ = "az-1"  # broker 0's AZ: the representative of every producer below
READER_AZ = "az-2"
PUT_FAILURES = "diskless_object_store_failures_total"
# The last broker standing has nobody to hand its leaderships to: do not wait 15 s for that at shutdown.
OVERRIDES = {"controlled.shutdown.timeout.ms": "2000"}
# Uploads of idempotent batches: (partition, producer id, epoch, base sequence, count) -> [(object key, offset)]
Copies = dict[tuple[int, int, int, int, int], list[tuple[str, int]]]


def create_diskless_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3, config={"diskless.enabled": "true"})])[topic].result(30)


async def until(condition: Callable[[], Any], timeout: float, message: str) -> None:
    """Poll ``condition`` on the event loop (so producers keep running) until true or the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        await asyncio.sleep(0.02)


@dataclass
class Acks:
    """What a producer got acknowledged, with when (monotonic seconds) each ack arrived."""

    by_offset: dict[tuple[int, int], bytes] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            assert (partition, offset) not in self.by_offset, f"two records acknowledged at {partition}@{offset}"
            self.by_offset[(partition, offset)] = value
            self.times.append(time.monotonic())

    def __len__(self) -> int:
        return len(self.by_offset)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without any ack, over acks from ``start`` to ``end`` (inclusive bounds)."""
        with self.lock:
            moments = sorted([start, end, *(t for t in self.times if start <= t <= end)])
        return max(b - a for a, b in itertools.pairwise(moments))


async def acked_more(acks: Acks, count: int, message: str, timeout: float = 60.0) -> None:
    target = len(acks) + count
    await until(lambda: len(acks) >= target, timeout, message)


async def send_window(producer: AIOKafkaProducer, topic: str, values: list[bytes], acks: Acks) -> None:
    futures = [(value, await producer.send(topic, key=value, value=value)) for value in values]
    for value, future in futures:
        meta = await future
        acks.add(meta.partition, meta.offset, value)


async def produce_in_windows(producer: AIOKafkaProducer, topic: str, values: list[bytes], acks: Acks) -> None:
    """Send ``values`` in windows of 200 and wait for each window's acks before the next."""
    for start in range(0, len(values), 200):
        await send_window(producer, topic, values[start : start + 200], acks)


async def produce_until(
    producer: AIOKafkaProducer, topic: str, prefix: str, acks: Acks, stop: asyncio.Event
) -> list[bytes]:
    """Windows of 200 distinct values until ``stop`` is set; returns every value sent."""
    sent: list[bytes] = []
    while not stop.is_set():
        window = [f"{prefix}-{len(sent) + i:06d}".encode() for i in range(200)]
        sent += window
        await send_window(producer, topic, window, acks)
    return sent


def raw_produce(bootstrap: str, topic: str, partition: int, value: bytes) -> tuple[int, int]:
    """One non-idempotent acks=all batch over a raw connection: (error code, base offset)."""
    with Session(bootstrap, timeout=30) as session:
        response = session.produce(topic, partition, build_batch([(b"raw", value)]), acks=-1)
    return int(response.error_code), int(response.base_offset)


async def read_everything(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of the topic from offset 0 up to each partition's end offset, as consumed."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=f"faults-reader diskless_az={READER_AZ}",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    got: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        assert set((await consumer.beginning_offsets(tps)).values()) == {0}
        ends = await consumer.end_offsets(tps)

        def behind() -> bool:
            return any((got[tp.partition][-1][0] + 1 if got[tp.partition] else 0) < ends[tp] for tp in tps)

        deadline = time.monotonic() + 60
        while behind():
            reached = {p: messages[-1][0] + 1 for p, messages in got.items() if messages}
            assert time.monotonic() < deadline, f"read up to {reached}, not to the end offsets {ends}"
            for tp, messages in (await consumer.getmany(timeout_ms=500)).items():
                got[tp.partition].extend((m.offset, m.value) for m in messages)
    finally:
        await consumer.stop()
    for tp in tps:
        offsets = [o for o, _ in got[tp.partition]]
        assert offsets == list(range(ends[tp])), f"partition {tp.partition}: offsets not contiguous from 0"
    return dict(got)


def check_acked_readable(acks: Acks, got: dict[int, list[tuple[int, bytes]]]) -> None:
    stored = {(p, o): v for p, messages in got.items() for o, v in messages}
    wrong = {k: v for k, v in acks.by_offset.items() if stored.get(k) != v}
    assert not wrong, f"{len(wrong)} acknowledged records not at their offsets, e.g. {sorted(wrong.items())[:3]}"


@dataclass
class Audit:
    pointer_entries: int  # over all replicas
    referenced: set[str]
    objects: dict[str, WalObjectReader]
    pointers: set[tuple[int, int, str, int]]  # (node id, partition, object key, byte offset) of every entry
    copies: Copies

    @property
    def garbage(self) -> list[str]:
        return sorted(self.objects.keys() - self.referenced)


async def load_objects(s3: Any) -> dict[str, WalObjectReader]:
    """Every WAL object in the bucket, each checked to be whole with every batch intact."""
    store = ObjectStore(s3.endpoint, "diskless", s3.access_key, s3.secret_key)
    try:
        objects = {}
        for key in [info.key async for info in store.list("wal/")]:
            reader = WalObjectReader(await store.get(key))
            reader.verify_batches()  # no torn upload in the bucket
            assert parse_wal_object_key(key).broker_id == reader.trailer.broker_id
            objects[key] = reader
        return objects
    finally:
        await store.close()


def idempotent_copies(objects: dict[str, WalObjectReader]) -> Copies:
    """Every upload of each idempotent batch in ``objects``."""
    copies: Copies = defaultdict(list)
    for key, reader in objects.items():
        for e in reader.trailer.entries:
            if e.producer_id >= 0:  # only idempotent batches are identifiable across objects
                copies[(e.partition, e.producer_id, e.producer_epoch, e.base_sequence, e.record_count)].append(
                    (key, e.offset)
                )
    return dict(copies)


async def audit_pointers(cluster: Any, topic: str, partitions: int) -> Audit:
    """Stop every broker (S3 stays up), then check every pointer entry of every replica's log."""
    for broker in cluster.brokers:
        broker.stop()
    objects = await load_objects(cluster.s3)

    referenced: set[str] = set()
    pointers: set[tuple[int, int, str, int]] = set()
    checked = 0
    for broker in cluster.brokers:
        for partition in range(partitions):
            directory = broker.data_dir / f"{topic}-{partition}"
            assert directory.is_dir(), f"broker {broker.node_id} has no replica of {topic}-{partition}"
            log = PartitionLog(str(directory), LogConfig(), 0)
            try:
                for segment in log.segments:
                    if segment.kind != POINTERS:
                        continue
                    for location in segment.iter_batches():
                        entry, _ = pointer.decode_entry(segment.read_batch(location), 0)
                        if not isinstance(entry, pointer.PointerEntry):
                            continue  # inline control batch: no object behind it
                        where = f"broker {broker.node_id} {topic}-{partition}@{entry.base_offset}"
                        assert entry.key in objects, f"{where}: pointer to missing object {entry.key}"
                        served = entry.serve(objects[entry.key].batch_at(entry.offset, entry.size))
                        assert records.compute_crc(served) == entry.header.crc, f"{where}: records fail their CRC"
                        referenced.add(entry.key)
                        pointers.add((broker.node_id, partition, entry.key, entry.offset))
                        checked += 1
            finally:
                log.close(clean=False)
    return Audit(checked, referenced, objects, pointers, idempotent_copies(objects))


def report(audit: Audit) -> None:
    by_broker = Counter(parse_wal_object_key(k).broker_id for k in audit.garbage)
    twice = sum(1 for places in audit.copies.values() if len(places) > 1)
    print(
        f"{audit.pointer_entries} pointer entries on all replicas checked against {len(audit.objects)} WAL objects; "
        f"{len(audit.referenced)} referenced, {len(audit.garbage)} garbage by uploader {dict(by_broker)}; "
        f"{twice} batches uploaded more than once"
    )


def storage_error_retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        1 for r in caplog.records if r.name == "aiokafka.producer.sender" and "KafkaStorageError" in r.getMessage()
    )


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    return sum(
        value
        for key, value in samples.items()
        if key.partition("{")[0] == name and all(f'{k}="{v}"' in key for k, v in labels.items())
    )


async def kill_mid_flush(broker: Any, committing: bool, timeout: float = 30.0) -> tuple[float, float]:
    """SIGKILL ``broker`` while its representative is in the middle of a flush (a WAL object PUT sent,
    the flush not finished). With ``committing``, only once that flush's commits have gone out to the
    leaders, so the producers of its batches were not answered although their batches may well be
    committed. Returns (flushes under way, commit RPCs sent so far).

    The metrics are read in a thread so that a producer on this event loop keeps producing.
    """
    deadline = time.monotonic() + timeout
    started: tuple[float, float] | None = None  # (flushes finished, commit RPCs) when a flush was seen under way
    while True:
        samples = await asyncio.to_thread(broker.metrics)
        flushes = metric(samples, "diskless_flush_seconds_count")
        commits = metric(samples, "diskless_commit_rpcs_total")
        under_way = metric(samples, "diskless_object_store_requests_total", operation="put") - flushes
        if under_way <= 0:
            started = None
        elif not committing or (started is not None and started[0] == flushes and commits > started[1]):
            broker.kill()
            return under_way, commits
        elif started is None or started[0] != flushes:
            started = (flushes, commits)  # uploading, or a new flush started meanwhile
        assert time.monotonic() < deadline, "never caught the representative in the middle of a flush"


async def kill_with_commits_unanswered(victim: Any, leaders: list[Any], timeout: float = 30.0) -> float:
    """SIGKILL ``victim`` (a representative) while commits it sent to other leaders have no answer: the
    leaders are paused (SIGSTOP) meanwhile, so the commits wait in their sockets. Returns the remote
    commit RPCs the victim had sent. Sampling the victim's metrics and killing it while its commits are
    merely in flight missed the window in every round under load, since commits are answered in a few ms.

    A pause can also catch no commit: the producer keeps one request in flight per broker, and when that
    request waits only for the paused followers' replication of a partition the victim leads, nothing
    new is sent. Then the leaders are resumed and paused again once the producer is moving.
    """
    pids = [leader.pid for leader in leaders]
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            paused_at = time.monotonic()
            # Kept short: paused brokers keep their leases and leadership (a flush comes every linger).
            while (sampled_at := time.monotonic()) < paused_at + 3.0:
                samples = await asyncio.to_thread(victim.metrics)
                # An answer already in the victim's socket when the leaders stopped is read within
                # milliseconds: only a commit still unanswered a while after the pause is one that waits.
                if sampled_at > paused_at + 0.2 and metric(samples, "diskless_commit_rpcs_in_flight") > 0:
                    victim.kill()
                    return metric(samples, "diskless_commit_rpcs_total", target="remote")
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "no pause caught a commit of the representative unanswered"
        sent = metric(await asyncio.to_thread(victim.metrics), "diskless_commit_rpcs_total", target="remote")
        await asyncio.to_thread(
            wait_until,
            lambda sent=sent: metric(victim.metrics(), "diskless_commit_rpcs_total", target="remote") > sent,
            max(deadline - time.monotonic(), 1.0),
            0.05,
            "the representative sent no commit after the leaders resumed",
        )


def isr_complete(bootstrap: str, topic: str, replicas: int) -> bool:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return all(len(p.isrs) == replicas for p in md.topics[topic].partitions.values())


async def test_failed_put_leaves_no_pointer_and_the_producer_retries(cluster_factory, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="aiokafka.producer.sender")
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic, partitions = "s3-outage", 3
    create_diskless_topic(cluster.bootstrap, topic, partitions)
    representative = cluster.brokers[0]
    assert representative.rack == PRODUCER_AZ

    def failed_puts_since(before: dict[str, float], now: dict[str, float] | None = None) -> float:
        now = representative.metrics() if now is None else now
        return metric(now, PUT_FAILURES, operation="put") - metric(before, PUT_FAILURES, operation="put")

    # Not idempotent on purpose: a pointer left behind by a failed request would show up as a duplicate.
    producer = AIOKafkaProducer(
        bootstrap_servers=representative.bootstrap,
        client_id=f"outage-producer diskless_az={PRODUCER_AZ}",
        acks="all",
        linger_ms=5,
    )
    await producer.start()
    acks = Acks()
    values = [f"outage-{i:05d}".encode() for i in range(3000)]
    raw_refused: list[bytes] = []
    raw_acked: dict[tuple[int, int], bytes] = {}
    try:
        task = asyncio.create_task(produce_in_windows(producer, topic, values, acks))
        await until(lambda: len(acks) >= 1000 or task.done(), 60, "producer made no progress before the outage")
        assert not task.done()
        before = representative.metrics()

        killed_at = time.monotonic()
        acked_at_kill = len(acks)
        cluster.s3.kill()
        # Straight from the wire: the PUT fails, the batch gets KAFKA_STORAGE_ERROR, nothing is appended.
        code, _ = await asyncio.to_thread(raw_produce, representative.bootstrap, topic, 0, b"raw-during-outage")
        raw_refused.append(b"raw-during-outage")
        refused_after = time.monotonic() - killed_at
        assert code == KAFKA_STORAGE_ERROR, f"produce while S3 is down answered error {code}"
        # The real client got the same retriable error and keeps retrying: let a few PUTs fail.
        await until(lambda: storage_error_retries(caplog) >= 1, 30, "aiokafka saw no KAFKA_STORAGE_ERROR")
        await until(lambda: failed_puts_since(before) >= 3, 30, "the producer's retries did not reach S3")
        acked_during_outage = len(acks)

        cluster.s3.start()
        restarted_at = time.monotonic()
        for attempt in range(100):
            value = f"raw-after-restart-{attempt}".encode()
            code, base_offset = await asyncio.to_thread(raw_produce, representative.bootstrap, topic, 0, value)
            if code == 0:
                raw_acked[(0, base_offset)] = value
                break
            assert code == KAFKA_STORAGE_ERROR, f"unexpected error {code} after the S3 restart"
            raw_refused.append(value)
            assert time.monotonic() - restarted_at < 60, "produce still failing 60 s after S3 came back"
        await asyncio.wait_for(task, 120)
        done_at = time.monotonic()
    finally:
        await producer.stop()
    after = representative.metrics()

    assert len(acks) == len(values)
    failed_puts = failed_puts_since(before, after)
    first_ack_after = min(t for t in acks.times if t > restarted_at)
    print(
        f"S3 down {restarted_at - killed_at:.2f}s; raw produce got KAFKA_STORAGE_ERROR after {refused_after:.2f}s; "
        f"aiokafka logged {storage_error_retries(caplog)} KafkaStorageError retries; {failed_puts:.0f} failed PUTs; "
        f"{acked_during_outage - acked_at_kill} acks while S3 was down; producer blocked "
        f"{acks.longest_gap(killed_at, done_at):.2f}s, first ack {first_ack_after - restarted_at:.2f}s after restart"
    )

    # Every acknowledged record exactly once; nothing that was refused.
    got = await read_everything(cluster.bootstrap, topic, partitions)
    consumed = Counter(v for messages in got.values() for _, v in messages)
    expected = set(values) | set(raw_acked.values())
    assert not [v for v, n in consumed.items() if n > 1], "records stored twice"
    assert not set(raw_refused) & consumed.keys(), "a refused produce left its record in the log"
    assert consumed.keys() == expected
    check_acked_readable(acks, got)
    check_acked_readable(Acks(by_offset=raw_acked), got)

    audit = await audit_pointers(cluster, topic, partitions)
    report(audit)
    assert audit.pointer_entries > 0


async def test_representative_killed_mid_flush_never_leaves_a_pointer_to_missing_data(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic, partitions = "rep-crash", 6
    create_diskless_topic(cluster.bootstrap, topic, partitions)
    victim = cluster.brokers[0]
    assert victim.rack == PRODUCER_AZ

    total, kill_after = 4000, 1500
    acks = Acks()
    sent = [0]
    finished = threading.Event()

    def produce() -> None:
        # librdkafka bootstrapped to the victim only; it learns the others from metadata and fails over.
        producer = Producer(
            {
                "bootstrap.servers": victim.bootstrap,
                "client.id": f"crash-producer diskless_az={PRODUCER_AZ}",
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 5,
                "retry.backoff.ms": 100,
                "message.timeout.ms": 60000,
            }
        )

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                acks.add(msg.partition(), msg.offset(), msg.value())
            else:
                acks.errors.append(str(err))

        try:
            for i in range(total):
                while len(producer) >= 200:  # at most 200 records in flight: wait for deliveries
                    producer.poll(0.05)
                value = f"crash-{i:05d}".encode()
                producer.produce(topic, key=value, value=value, on_delivery=delivered)
                sent[0] = i + 1
                producer.poll(0)
            assert producer.flush(90) == 0, "records still undelivered"
        finally:
            finished.set()

    thread = threading.Thread(target=produce, name="crash-producer")
    thread.start()
    try:
        await until(lambda: len(acks) >= kill_after or finished.is_set(), 60, "producer made no progress")
        assert not finished.is_set()
        under_way, _ = await kill_mid_flush(victim, committing=False)
        killed_at = time.monotonic()
        acked_at_kill, sent_at_kill = len(acks), sent[0]
        await until(finished.is_set, 120, "producer did not finish after the failover")
        done_at = time.monotonic()
    finally:
        thread.join(120)
    assert not acks.errors, f"delivery failures: {acks.errors[:5]}"
    assert len(acks) == total
    assert set(acks.by_offset.values()) == {f"crash-{i:05d}".encode() for i in range(total)}
    print(
        f"killed the representative with {under_way:.0f} flush(es) under way at {acked_at_kill} acks "
        f"({sent_at_kill} sent); producer blocked "
        f"{acks.longest_gap(killed_at, done_at):.2f}s, then went on through the other brokers"
    )

    got = await read_everything(cluster.bootstrap, topic, partitions)
    check_acked_readable(acks, got)
    duplicates = sum(len(messages) for messages in got.values()) - total
    print(f"{duplicates} records stored twice (a non-idempotent producer resent unanswered batches: allowed)")

    # The victim comes back: it truncates whatever it appended as leader that nobody replicated, which
    # can turn objects it uploaded into garbage; it must never leave a pointer to a missing object.
    victim.start()
    await asyncio.to_thread(
        wait_until, lambda: isr_complete(cluster.bootstrap, topic, 3), 60, 0.1, "victim did not rejoin every ISR"
    )

    audit = await audit_pointers(cluster, topic, partitions)
    report(audit)
    assert audit.pointer_entries > 0


async def test_idempotent_producer_retrying_through_another_broker_gets_no_duplicates(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic, partitions = "idempotent-failover", 6
    create_diskless_topic(cluster.bootstrap, topic, partitions)
    victim = cluster.brokers[0]
    assert victim.rack == PRODUCER_AZ

    # Metadata refreshed every second: after a restart the victim is soon this AZ's representative again.
    producer = AIOKafkaProducer(
        bootstrap_servers=cluster.bootstrap,
        client_id=f"idempotent-producer diskless_az={PRODUCER_AZ}",
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        metadata_max_age_ms=1000,
    )
    await producer.start()
    acks = Acks()
    values: list[bytes] = []
    resent: Copies = {}
    try:
        # The victim dies with its commits unanswered, so its producer resends those batches through
        # another broker. Should nothing have been resent, the round proved nothing: restart the
        # victim and go again.
        for attempt in range(3):
            stop = asyncio.Event()
            task = asyncio.create_task(produce_until(producer, topic, f"idem-{attempt}", acks, stop))
            await acked_more(acks, 600, "producer made no progress")
            # (after a restart, this also waits for the producer to use the victim again)
            others = [b for b in cluster.brokers if b is not victim]
            commits_sent = await kill_with_commits_unanswered(victim, others)
            killed_at = time.monotonic()
            await acked_more(acks, 600, "producer did not fail over")
            stop.set()
            values += await asyncio.wait_for(task, 60)
            print(
                f"round {attempt}: {len(values)} records sent; representative SIGKILLed with commits unanswered"
                f" ({commits_sent:.0f} remote commit RPCs sent so far); idempotent producer blocked "
                f"{acks.longest_gap(killed_at, time.monotonic()):.2f}s"
            )
            copies = idempotent_copies(await load_objects(cluster.s3))
            resent = {identity: places for identity, places in copies.items() if len(places) > 1}
            if resent:
                break
            victim.start()
            await asyncio.to_thread(
                wait_until, lambda: isr_complete(cluster.bootstrap, topic, 3), 60, 0.1, "victim did not rejoin"
            )
    finally:
        await producer.stop()
    assert len(acks) == len(values)
    assert resent, "no kill interrupted an uploaded flush: nothing was resent through another broker"

    got = await read_everything(cluster.bootstrap, topic, partitions)
    consumed = Counter(v for messages in got.values() for _, v in messages)
    assert not {v: n for v, n in consumed.items() if n > 1}, "an idempotent producer's record was stored twice"
    assert consumed.keys() == set(values)
    check_acked_readable(acks, got)

    audit = await audit_pointers(cluster, topic, partitions)
    report(audit)
    assert audit.pointer_entries > 0
    # The interrupted flush's batches were uploaded by the victim and again through another broker;
    # on every surviving replica exactly one of the copies has a pointer.
    resent = {identity: places for identity, places in audit.copies.items() if len(places) > 1}
    survivors = [b.node_id for b in cluster.brokers if b is not victim]
    committed_before_kill = 0
    for (partition, *_), places in resent.items():
        for node in survivors:
            pointed = [(key, offset) for key, offset in places if (node, partition, key, offset) in audit.pointers]
            assert len(pointed) == 1, f"broker {node}: {len(pointed)} pointers to copies of one batch {places}"
        first = [(key, offset) for key, offset in places if parse_wal_object_key(key).broker_id == victim.node_id]
        committed_before_kill += any((survivors[0], partition, key, offset) in audit.pointers for key, offset in first)
    print(
        f"{len(resent)} batches of interrupted flushes were resent through another broker; "
        f"{committed_before_kill} had been committed from the victim's object before the kill, so their "
        f"leaders answered the retry from producer state instead of appending again"
    )

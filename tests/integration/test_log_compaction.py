"""The log cleaner end to end: what consumers of a compacted classic topic read once it has run.

A 3-broker cluster (etcd, no object storage: classic topics only) whose cleaner backs off 100 ms
between passes, and topics that roll a segment every 100 ms or 2 KiB with
``min.cleanable.dirty.ratio=0.01`` and ``delete.retention.ms=1000``: the cleaner finds work within
a second or two of it existing. confluent-kafka produces many versions of a few keys (an
idempotent producer, tombstones among them) and a transactional producer commits some
transactions and aborts others. The tests then poll, against a deadline, a consumer reading the
partition from the beginning until it sees the compacted view:

- exactly one record per live key, holding its latest committed value at the offset it was
  written at (offsets strictly increasing; the cleaner never renumbers);
- no aborted value, in read_committed and read_uncommitted alike (the cleaner drops aborted
  batches, as Kafka's does), no key whose latest record is a tombstone once the tombstone is
  past ``delete.retention.ms``;
- committed group offsets and lags still work (the log start stays 0: compaction deletes no
  offsets range, it thins it);
- the view is the same from a follower that becomes leader (each replica cleans its own log),
  and after every broker restarts (cleaned segments are what is on disk).

A segment is cleaned only once it is not the active one, and a log rolls only on append, so the
polls append a record under a key of their own (``TICK``) each time: its latest value must be in
the view (an older one may be too: see ``as_expected``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import kafka
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import LocalCluster, wait_until

pytestmark = pytest.mark.integration

OVERRIDES = {
    "log.cleaner.backoff.ms": "100",  # Kafka's 15 s would make every test wait
    "log.retention.check.interval.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
}
COMPACTED = {
    "cleanup.policy": "compact",
    "diskless.enabled": "false",
    "segment.ms": "100",
    "segment.bytes": "2048",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "1000",
    "min.insync.replicas": "2",
}
DEADLINE_S = 120.0
TICK = b"__tick__"
PLAIN_KEYS = [f"k{i}".encode() for i in range(10)]
ROUNDS = 20

Record = tuple[int, bytes | None, bytes | None]  # offset, key, value


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(brokers=3, azs=3, overrides=OVERRIDES)


# --- what was written ------------------------------------------------------------------------------


@dataclass
class History:
    """Every record written, with its offset and whether its transaction committed; the
    expected compacted view follows from it."""

    topic: str
    written: list[tuple[int, bytes, bytes | None, bool]] = field(default_factory=list)  # offset, key, value, visible
    tick: tuple[int, bytes] | None = None  # the latest TICK record (offset, value)
    ticks: int = 0

    def expected(self) -> dict[bytes, tuple[bytes, int]]:
        """key -> (value, offset) of each live key: its latest visible record, unless a tombstone."""
        latest: dict[bytes, tuple[bytes | None, int]] = {}
        for offset, key, value, visible in sorted(self.written):
            if visible:
                latest[key] = (value, offset)
        live = {key: (value, offset) for key, (value, offset) in latest.items() if value is not None}
        if self.tick is not None:
            live[TICK] = (self.tick[1], self.tick[0])
        return live  # type: ignore[return-value]


def delivered_into(out: list[tuple[int, bytes, bytes | None]]) -> Callable[..., None]:
    def on_delivery(err: KafkaError | None, msg) -> None:  # type: ignore[no-untyped-def]
        assert err is None, err
        out.append((msg.offset(), msg.key(), msg.value()))

    return on_delivery


def produce_history(bootstrap: str, topic: str) -> History:
    """20 versions of k0..k9 (k7 tombstoned midway and written again, k8 and k9 tombstoned at the
    end) from an idempotent producer, then transactions over k0..k2 and t0..t2: t2 is only ever
    written in aborted transactions, k1's and k2's aborted values come after their last plain one."""
    history = History(topic)
    plain: list[tuple[int, bytes, bytes | None]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "acks": "all"})
    for n in range(ROUNDS):
        for key in PLAIN_KEYS:
            value: bytes | None = f"{key.decode()}:v{n}".encode()
            if key == b"k7" and n == ROUNDS // 2:
                value = None
            producer.produce(topic, key=key, value=value, partition=0, on_delivery=delivered_into(plain))
        assert producer.flush(30) == 0  # a batch (or more) per round: many segments to clean
    for key in (b"k8", b"k9"):
        producer.produce(topic, key=key, value=None, partition=0, on_delivery=delivered_into(plain))
    assert producer.flush(30) == 0
    history.written += [(offset, key, value, True) for offset, key, value in plain]

    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"compaction-{topic}", "acks": "all"})
    txn.init_transactions(30)
    transactions = [
        (True, [(b"t0", b"t0:c1"), (b"t1", b"t1:c1"), (b"k0", b"k0:txn-commit")]),
        (False, [(b"t0", b"t0:a1"), (b"t2", b"t2:a1"), (b"k1", b"k1:txn-abort")]),
        (True, [(b"t1", b"t1:c2")]),
        (False, [(b"k2", b"k2:txn-abort"), (b"t1", b"t1:a2"), (b"t2", b"t2:a2")]),
    ]
    for commit, records in transactions:
        sent: list[tuple[int, bytes, bytes | None]] = []
        txn.begin_transaction()
        for key, value in records:
            txn.produce(topic, key=key, value=value, partition=0, on_delivery=delivered_into(sent))
        assert txn.flush(30) == 0
        if commit:
            txn.commit_transaction(30)
        else:
            txn.abort_transaction(30)
        history.written += [(offset, key, value, commit) for offset, key, value in sent]
    return history


def tick(bootstrap: str, history: History) -> None:
    """Append a TICK record: rolls the active segment once segment.ms has passed, so that the
    records before it become cleanable."""
    out: list[tuple[int, bytes, bytes | None]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    history.ticks += 1
    value = f"tick-{history.ticks}".encode()
    producer.produce(history.topic, key=TICK, value=value, partition=0, on_delivery=delivered_into(out))
    assert producer.flush(30) == 0
    history.tick = (out[0][0], value)


# --- what consumers read -------------------------------------------------------------------------------


def read_view(
    bootstrap: str, topic: str, isolation: str = "read_committed", start: int = OFFSET_BEGINNING
) -> list[Record]:
    """Every record of partition 0 from ``start`` to its end (the high watermark, or the last
    stable offset read_committed), as a consumer gets them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"view-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        out: list[Record] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return out
                raise KafkaException(error)
            out.append((message.offset(), message.key(), message.value()))
        raise TimeoutError(f"no end of partition within 30 s after {len(out)} records")
    finally:
        consumer.close()


def read_with_kafka_python(bootstrap: str, topic: str, isolation: str) -> list[Record]:
    """The same view through kafka-python (its own decoder of gaps and emptied batches)."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation, consumer_timeout_ms=1000
    )
    try:
        tp = kafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]  # the last stable offset read_committed
        out: list[Record] = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"kafka-python stopped at {consumer.position(tp)} of {end}"
            for records in consumer.poll(timeout_ms=500).values():
                out += [(r.offset, r.key, r.value) for r in records]
        return out
    finally:
        consumer.close()


def read_with_aiokafka(bootstrap: str, topic: str, isolation: str) -> list[Record]:
    """The same view through aiokafka."""

    async def read() -> list[Record]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation)
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            out: list[Record] = []
            deadline = time.monotonic() + 30
            while await consumer.position(tp) < end:
                assert time.monotonic() < deadline, f"aiokafka stopped at {await consumer.position(tp)} of {end}"
                for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                    out += [(r.offset, r.key, r.value) for r in records]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(read())


def as_expected(view: list[Record], history: History) -> bool:
    """The compacted view: offsets strictly increasing, one record per key, each live key's latest
    value at the offset it was written at, nothing else."""
    offsets = [offset for offset, _, _ in view]
    if offsets != sorted(set(offsets)):
        return False
    # The ticks of the last two segments stay: the active segment is never cleaned, so the tick in
    # it never supersedes the one in the segment before (Kafka's cleaner leaves them alike).
    ticks = [(offset, value) for offset, key, value in view if key == TICK]
    if history.tick is not None and (not ticks or ticks[-1] != history.tick):
        return False
    data = [(offset, key, value) for offset, key, value in view if key != TICK]
    keys = [key for _, key, _ in data]
    if len(keys) != len(set(keys)):
        return False
    expected = {key: found for key, found in history.expected().items() if key != TICK}
    return {key: (value, offset) for offset, key, value in data} == expected


def wait_compacted(bootstrap: str, history: History) -> list[Record]:
    """Tick and read until both isolation levels read the compacted view; returns it."""

    last: list[object] = []

    def compacted() -> list[Record] | None:
        tick(bootstrap, history)
        view = read_view(bootstrap, history.topic, "read_committed")
        last[:] = ["read_committed", view]
        if not as_expected(view, history):
            return None
        # The cleaner drops aborted batches: read_uncommitted sees the same records.
        uncommitted = read_view(bootstrap, history.topic, "read_uncommitted")
        last[:] = ["read_uncommitted", uncommitted]
        return view if uncommitted == view else None

    try:
        return wait_until(compacted, DEADLINE_S, interval=0.2, message="the log was not compacted in time")
    except TimeoutError as exc:
        raise AssertionError(
            f"not compacted in time: last {last[0]} view {last[1]}, expected {history.expected()}"
        ) from exc


def leader_of(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return metadata.topics[topic].partitions[0].leader


def create(bootstrap: str, topic: str, configs: dict[str, str], replicas: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, replicas, config=configs)])[topic].result(30)


# --- the tests -----------------------------------------------------------------------------------------


def test_compacted_view_with_tombstones_and_transactions(cluster: LocalCluster) -> None:
    topic = "compacted"
    create(cluster.bootstrap, topic, COMPACTED)
    history = produce_history(cluster.bootstrap, topic)
    everything = read_view(cluster.bootstrap, topic, "read_uncommitted")
    assert len(everything) > len(history.expected())  # many versions before the cleaner

    # A group reads part of the log and commits, before compaction removes what it read.
    group = f"compaction-group-{uuid.uuid4()}"
    committed = everything[len(everything) // 3][0] + 1
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, committed)], asynchronous=False)
    consumer.close()

    view = wait_compacted(cluster.bootstrap, history)
    # Other clients decode the gaps and emptied batches (control, aborted, a producer's last) alike.
    for isolation in ("read_committed", "read_uncommitted"):
        assert read_with_kafka_python(cluster.bootstrap, topic, isolation) == view, isolation
        assert read_with_aiokafka(cluster.bootstrap, topic, isolation) == view, isolation
    assert b"t2" not in {key for _, key, _ in view}  # only ever aborted
    assert {key for _, key, _ in view}.isdisjoint({b"k8", b"k9"})  # tombstoned, past the horizon
    expected = history.expected()
    assert expected[b"k7"][0] == f"k7:v{ROUNDS - 1}".encode()  # written again after its tombstone
    assert expected[b"k0"][0] == b"k0:txn-commit" and expected[b"k1"][0] == f"k1:v{ROUNDS - 1}".encode()
    assert (expected[b"t0"][0], expected[b"t1"][0]) == (b"t0:c1", b"t1:c2")

    # The group's offset and lag survive: the committed offset is where it was, the log still
    # starts at 0, and the group resumes at the first record at or after its offset.
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    try:
        (position,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert position.offset == committed
    assert low == 0 and high > committed
    resumed = read_view(cluster.bootstrap, topic, start=committed)
    assert resumed == [record for record in view if record[0] >= committed]


def test_follower_that_becomes_leader_serves_the_compacted_view(cluster: LocalCluster) -> None:
    topic = "compacted-failover"
    create(cluster.bootstrap, topic, COMPACTED)
    history = produce_history(cluster.bootstrap, topic)
    wait_compacted(cluster.bootstrap, history)

    old = leader_of(cluster.bootstrap, topic)
    cluster.brokers[old].stop()
    wait_until(lambda: leader_of(cluster.bootstrap, topic) not in (old, -1), 30, message="no new leader after a stop")
    # Each replica cleans its own log: the new leader's view is the compacted one, with the
    # records at the offsets they were written at.
    wait_compacted(cluster.bootstrap, history)
    cluster.brokers[old].start()


def test_compacted_view_survives_restarts(cluster: LocalCluster) -> None:
    topic = "compacted-restart"
    create(cluster.bootstrap, topic, COMPACTED)
    history = produce_history(cluster.bootstrap, topic)
    before = wait_compacted(cluster.bootstrap, history)

    for broker in cluster.brokers:
        broker.stop()
    first, *rest = cluster.brokers
    first.start()
    for broker in rest:
        broker.spawn()
    for broker in rest:
        broker.wait_ready(60)

    def same_view() -> bool:
        try:
            views = [read_view(cluster.bootstrap, topic, level) for level in ("read_uncommitted", "read_committed")]
        except (KafkaException, TimeoutError):
            return False  # leaders still being elected
        return views == [before, before]

    # Nothing was written since: the view from before, record for record, once the partition is
    # served again (polled only because leadership and the high watermark take a moment to settle).
    wait_until(same_view, 60, interval=0.5, message="the compacted view changed across the restart")


def test_compact_without_delete_ignores_retention(cluster: LocalCluster) -> None:
    """retention.ms deletes segments only when cleanup.policy includes delete (Kafka's
    UnifiedLog.deleteOldSegments): records an hour old in a compacted topic with retention.ms=1000
    stay (the log start stays 0); with compact,delete they go."""
    hour_ago = int(time.time() * 1000) - 3_600_000
    topics = {"compact-only": "compact", "compact-and-delete": "compact,delete"}
    histories = {}
    for topic, policy in topics.items():
        create(cluster.bootstrap, topic, {**COMPACTED, "cleanup.policy": policy, "retention.ms": "1000"})
        history = History(topic)
        sent: list[tuple[int, bytes, bytes | None]] = []
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
        for n in range(5):
            for key in (b"a", b"b", b"c"):
                value = f"{key.decode()}:{n}".encode()
                producer.produce(
                    topic, key=key, value=value, partition=0, timestamp=hour_ago, on_delivery=delivered_into(sent)
                )
            assert producer.flush(30) == 0
        history.written += [(offset, key, value, True) for offset, key, value in sent]
        histories[topic] = history

    def low_watermark(topic: str) -> int:
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"lw-{uuid.uuid4()}"})
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
        finally:
            consumer.close()

    # compact,delete: retention removes the old segments (the log start moves past them).
    def deleted() -> bool:
        tick(cluster.bootstrap, histories["compact-and-delete"])
        return low_watermark("compact-and-delete") > 0

    wait_until(deleted, DEADLINE_S, interval=0.2, message="retention did not delete compact,delete segments")
    # compact only: by the time its log is compacted, retention has had as many chances; nothing
    # was deleted by it, every key is there with its latest value.
    view = wait_compacted(cluster.bootstrap, histories["compact-only"])
    assert low_watermark("compact-only") == 0
    assert {key for _, key, _ in view} == {b"a", b"b", b"c", TICK}


def test_keyless_records_never_reach_a_compacted_log(cluster: LocalCluster) -> None:
    """Refused at produce (INVALID_RECORD), so the cleaner never meets one."""
    topic = "compacted-keys"
    create(cluster.bootstrap, topic, COMPACTED)
    errors: list[int] = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
    producer.produce(
        topic, value=b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err.code() if err else 0)
    )
    producer.flush(30)
    assert errors == [KafkaError.INVALID_RECORD]
    history = History(topic)
    sent: list[tuple[int, bytes, bytes | None]] = []
    for n in range(3):
        producer.produce(topic, key=b"a", value=f"a:{n}".encode(), partition=0, on_delivery=delivered_into(sent))
        assert producer.flush(30) == 0
    history.written += [(offset, key, value, True) for offset, key, value in sent]
    view = wait_compacted(cluster.bootstrap, history)
    assert [(key, value) for _, key, value in view if key != TICK] == [(b"a", b"a:2")]

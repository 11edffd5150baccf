"""Transactions on a 3-broker cluster with diskless topics: a consume-transform-produce loop with
exactly-once output across a broker kill, aborted transactions hidden from read_committed, and
aiokafka's transactional producer."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import wait_until

OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
}
PARTITIONS = 3


def create(cluster, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(t, PARTITIONS, 3, config={"diskless.enabled": "true"}) for t in topics])
    for future in futures.values():
        future.result(30)


def read_all(bootstrap: str, topic: str, isolation: str, expected: int, timeout: float = 60) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{isolation}-{time.monotonic_ns()}",
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    idle_until = None
    while time.monotonic() < deadline:
        batch = consumer.consume(1000, 0.5)
        values.extend(m.value() for m in batch if m.error() is None)
        if len(values) >= expected:
            # Keep reading briefly: anything beyond what we expect would be a duplicate.
            idle_until = idle_until or time.monotonic() + 2
            if time.monotonic() > idle_until:
                break
    consumer.close()
    return values


def test_aborted_transactions_are_invisible_to_read_committed(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    create(cluster, "txn-visibility")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "visibility"})
    producer.init_transactions(30)
    for round_, commit in enumerate([True, False, True, False, True]):
        producer.begin_transaction()
        for i in range(50):
            producer.produce("txn-visibility", value=f"{'c' if commit else 'a'}-{round_}-{i}".encode())
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    committed = read_all(cluster.bootstrap, "txn-visibility", "read_committed", 150)
    everything = read_all(cluster.bootstrap, "txn-visibility", "read_uncommitted", 250)
    assert sorted(committed) == sorted(f"c-{r}-{i}".encode() for r in (0, 2, 4) for i in range(50))
    assert len(everything) == 250 and {v[:1] for v in everything} == {b"c", b"a"}


def test_consume_transform_produce_is_exactly_once_across_a_broker_kill(cluster_factory, tmp_path) -> None:
    """The loop runs as its own process (tests/integration/ctp_app.py) under a small supervisor:
    a broker is killed mid-way, and an instance that dies or stops making progress is replaced
    (its transactional.id fences the old one), as an application would be in production.
    librdkafka can wedge inside send_offsets_to_transaction when the transaction coordinator's
    broker dies, ignoring its own timeout; a restart is what an operator's supervisor does then."""
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    create(cluster, "ctp-in", "ctp-out")
    total = 3000
    feeder = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(total):
        feeder.produce("ctp-in", key=str(i).encode(), value=f"in-{i}".encode())
    assert feeder.flush(60) == 0

    app = Path(__file__).parent / "ctp_app.py"
    instances: list[subprocess.Popen[bytes]] = []

    def start_app() -> Path:
        progress = tmp_path / f"progress-{len(instances)}"
        with open(tmp_path / f"ctp-app-{len(instances)}.log", "wb") as log:
            instances.append(
                subprocess.Popen([sys.executable, str(app), cluster.bootstrap, str(progress)], stdout=log, stderr=log)
            )
        return progress

    def progress_of(path: Path) -> int:
        try:
            return int(path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    watcher = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "transformer"})

    def group_done() -> int:
        try:
            offsets = watcher.committed([TopicPartition("ctp-in", p) for p in range(PARTITIONS)], timeout=10)
        except KafkaException:
            return -1
        return sum(max(tp.offset, 0) for tp in offsets)

    state: dict[str, Any] = {"progress": start_app(), "killed": False, "seen": 0, "seen_at": time.monotonic()}

    def supervise() -> bool:
        """One supervisor round; True once the group has committed past all the input."""
        if group_done() >= total:
            state["done"] = True
            return True
        now = time.monotonic()
        current = progress_of(state["progress"])
        if not state["killed"] and current >= total // 3:
            next(b for b in cluster.brokers if b.alive() and b.node_id != 0).kill()
            state["killed"] = True
        if current != state["seen"]:
            state["seen"], state["seen_at"] = current, now
        if instances[-1].poll() is not None or now - state["seen_at"] > 45:
            instances[-1].kill()
            instances[-1].wait(10)
            state.update(progress=start_app(), seen=0, seen_at=now)
        return False

    try:
        wait_until(supervise, 300, 0.5)
    finally:
        for proc in instances:
            proc.kill()
            proc.wait(10)
        watcher.close()
    killed = state["killed"]
    assert killed, "the loop finished before the broker could be killed"
    assert state.get("done"), "the transformer did not get through its input"

    out = read_all(cluster.bootstrap, "ctp-out", "read_committed", total, timeout=90)
    assert len(out) == len(set(out)), "an input record was output twice"
    assert sorted(out) == sorted(f"out-{i}".encode() for i in range(total)), "an input record was lost"


async def test_aiokafka_transactional_producer(cluster_factory) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    create(cluster, "aio-txn")
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id="aio-1")
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(20):
                await producer.send("aio-txn", value=f"kept-{i}".encode())
        await producer.begin_transaction()
        for i in range(20):
            await producer.send("aio-txn", value=f"dropped-{i}".encode())
        await producer.abort_transaction()
    finally:
        await producer.stop()
    committed = read_all(cluster.bootstrap, "aio-txn", "read_committed", 20)
    assert sorted(committed) == sorted(f"kept-{i}".encode() for i in range(20))

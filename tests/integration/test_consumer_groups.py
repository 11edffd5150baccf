"""Consumer groups on a 3-broker cluster, for classic and diskless topics: members of two client
libraries share the partitions, a dead member's partitions move to the others, and committed
offsets survive the loss of the coordinator's broker."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import BackgroundProducer, wait_until

PARTITIONS = 12
GROUP_OVERRIDES = {"group.initial.rebalance.delay.ms": "0", "offsets.topic.num.partitions": "6"}


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"value-{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


class ConfluentMember:
    """A group member on its own thread; ``assignment`` is what it currently owns."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
        self.consumer.subscribe([topic])
        self.assignment: set[int] = set()
        self.seen: dict[tuple[int, int], bytes] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is None:
                self.seen[(message.partition(), message.offset())] = message.value()
                self.consumer.commit(message=message, asynchronous=False)
            self.assignment = {tp.partition for tp in self.consumer.assignment()}

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()


class AiokafkaMember:
    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )
        self.seen: dict[tuple[int, int], bytes] = {}
        self.task: asyncio.Task[None] | None = None

    @property
    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    async def start(self) -> None:
        await self.consumer.start()
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=200)
            for tp, messages in batches.items():
                for m in messages:
                    self.seen[(tp.partition, m.offset)] = m.value
            if batches:
                await self.consumer.commit()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


@pytest.mark.parametrize("diskless", [False, True], ids=["classic", "diskless"])
async def test_group_shares_rebalances_and_keeps_offsets_across_coordinator_loss(cluster_factory, diskless) -> None:
    cluster = cluster_factory(s3=diskless, overrides=GROUP_OVERRIDES)
    topic, group = "grouped", "the-group"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {"diskless.enabled": "true"} if diskless else {}
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config=configs)])[topic].result(30)
    await asyncio.to_thread(produce, cluster.bootstrap, topic, 1200)

    confluent = [ConfluentMember(cluster.bootstrap, topic, group, f"c{i}") for i in range(2)]
    python = AiokafkaMember(cluster.bootstrap, topic, group)
    await python.start()
    members = [*confluent, python]
    try:
        # Three members of two libraries share the twelve partitions, four each.
        def shared() -> bool:
            sets = [m.assignment for m in members]
            return sorted(len(s) for s in sets) == [4, 4, 4] and set().union(*sets) == set(range(PARTITIONS))

        await asyncio.to_thread(wait_until, shared, 60, 0.2)
        await asyncio.to_thread(wait_until, lambda: sum(len(m.seen) for m in members) >= 1200, 60, 0.2)

        # A member dies: its partitions move to the survivors.
        confluent[0].stop.set()
        confluent[0].thread.join(10)
        confluent[0].consumer.close()
        survivors = [confluent[1], python]

        def rebalanced() -> bool:
            sets = [m.assignment for m in survivors]
            return sorted(len(s) for s in sets) == [6, 6] and set().union(*sets) == set(range(PARTITIONS))

        await asyncio.to_thread(wait_until, rebalanced, 60, 0.2)
    finally:
        confluent[1].close()
        await python.stop()

    # Kill the broker coordinating the group; the committed offsets are still there afterwards.
    probe = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    committed_before = probe.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    probe.close()
    assert sum(tp.offset for tp in committed_before) == 1200
    coordinator = admin.describe_consumer_groups([group])[group].result(30).coordinator.id
    cluster.brokers[coordinator].kill()

    def committed_after() -> list[int] | None:
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
        try:
            return [
                tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=5)
            ]
        except Exception:
            return None
        finally:
            consumer.close()

    offsets = await asyncio.to_thread(wait_until, committed_after, 60, 0.5)
    assert offsets == [tp.offset for tp in committed_before]
    # A new member of the group resumes where the group left off: nothing is read twice.
    produce_more = 120
    await asyncio.to_thread(produce, cluster.bootstrap, topic, produce_more)
    late = ConfluentMember(cluster.bootstrap, topic, group, "late")
    try:
        await asyncio.to_thread(wait_until, lambda: len(late.seen) >= produce_more, 60, 0.2)
        assert all(offset >= committed_before[p].offset for p, offset in late.seen)
    finally:
        late.close()


async def test_member_that_stops_polling_leaves_and_the_other_takes_its_partitions(broker_factory) -> None:
    """aiokafka leaves the group by itself once ``max_poll_interval_ms`` passes without a poll;
    the remaining member must finish the rebalance and consume the idle member's partition within
    about a rebalance timeout, not wait for the member that left.

    The idle member stops by returning from its loop, between two getmany() calls: cancelling a
    pending getmany() would leave aiokafka 0.14 counting a fetch in progress forever (its
    fetch_context has no finally), and such a member never leaves and keeps heartbeating."""
    broker = broker_factory(GROUP_OVERRIDES)
    topic, group = "idle-member", "idle-group"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)

    def member(max_poll_interval_ms: int) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,  # also aiokafka's rebalance timeout
            heartbeat_interval_ms=500,
            max_poll_interval_ms=max_poll_interval_ms,
        )

    idle, busy = member(3000), member(300_000)
    seen: dict[str, set[tuple[int, int]]] = {"idle": set(), "busy": set()}
    polling = {"idle": True, "busy": True}

    async def consume(name: str, consumer: AIOKafkaConsumer) -> None:
        while polling[name]:
            for tp, messages in (await consumer.getmany(timeout_ms=200)).items():
                seen[name].update((tp.partition, m.offset) for m in messages)

    await idle.start()
    idle_task = asyncio.create_task(consume("idle", idle))
    await busy.start()
    busy_task = asyncio.create_task(consume("busy", busy))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    try:
        await asyncio.to_thread(
            wait_until, lambda: len(busy.assignment()) == 1 and len(idle.assignment()) == 1, 30, 0.1
        )
        for i in range(20):
            producer.produce(topic, value=f"first-{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
        await asyncio.to_thread(wait_until, lambda: len(seen["idle"]) == len(seen["busy"]) == 10, 30, 0.1)
        idle_partition = next(iter(idle.assignment())).partition

        polling["idle"] = False  # the idle member's application stops calling getmany()
        await idle_task
        stopped = asyncio.get_running_loop().time()
        for i in range(10):
            producer.produce(topic, value=f"later-{i}".encode(), partition=idle_partition)
        assert producer.flush(30) == 0
        # max.poll.interval (3 s) + the busy member's next heartbeat and rejoin; the rebalance
        # timeout (6 s) bounds any wait for a member that does not rejoin.
        await asyncio.to_thread(
            wait_until, lambda: sum(1 for p, _ in seen["busy"] if p == idle_partition) >= 10, 30, 0.1
        )
        elapsed = asyncio.get_running_loop().time() - stopped
        assert elapsed < 3 + 6 + 10, elapsed  # generous: the machine may be loaded
        assert {tp.partition for tp in busy.assignment()} == {0, 1}
    finally:
        polling["idle"] = polling["busy"] = False
        await asyncio.gather(idle_task, busy_task, return_exceptions=True)
        await busy.stop()
        await idle.stop()


class SteadyMember:
    """A confluent-kafka member that counts its rebalances and the commits that succeeded; errors
    (the coordinator moving) are counted, never raised out of its thread."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                # Longer than a coordinator failover: librdkafka leaves the group by itself after a
                # session's worth of failed heartbeats, which would be a rebalance of its own making.
                "session.timeout.ms": 30000,
                "heartbeat.interval.ms": 500,
            }
        )
        self.assigned = 0
        self.commits = 0
        self.assignment: set[int] = set()
        self.consumer.subscribe([topic], on_assign=self._on_assign)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned += 1
        self.assignment = {tp.partition for tp in partitions}

    def run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            try:
                self.consumer.commit(message=message, asynchronous=False)
                self.commits += 1
            except Exception:
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()


async def test_a_coordinator_failover_costs_no_rebalance(cluster_factory) -> None:
    """The group's record (generation, members, assignment) is in __consumer_offsets: the broker
    that takes the partition over loads the group Stable and the members go on at their generation.
    Before, the new coordinator started the group Empty: every member got UNKNOWN_MEMBER_ID at its
    next heartbeat and the group rebalanced."""
    cluster = cluster_factory(overrides=GROUP_OVERRIDES)  # __consumer_offsets: replication factor 3
    topic, group = "steady", "steady-group"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
    producing = BackgroundProducer(cluster.bootstrap, topic, PARTITIONS)
    members = [SteadyMember(cluster.bootstrap, topic, group, f"m{i}") for i in range(2)]
    try:

        def stable() -> bool:
            described = admin.describe_consumer_groups([group])[group].result(10)
            owned = [m.assignment for m in members]
            return (
                str(described.state).endswith("STABLE")
                and sorted(len(s) for s in owned) == [6, 6]
                and all(m.commits > 0 for m in members)
            )

        await asyncio.to_thread(wait_until, stable, 60, 0.2)
        rebalances = [m.assigned for m in members]
        coordinator = admin.describe_consumer_groups([group])[group].result(30).coordinator.id
        commits = [m.commits for m in members]
        cluster.brokers[coordinator].kill()

        def moved_on() -> bool:
            described = admin.describe_consumer_groups([group])[group].result(10)
            return described.coordinator.id != coordinator and all(
                m.commits > c + 20 for m, c in zip(members, commits, strict=True)
            )

        # Both members commit again, at their generation, through the new coordinator.
        await asyncio.to_thread(wait_until, moved_on, 90, 0.5)
        assert [m.assigned for m in members] == rebalances, "the failover rebalanced the group"
        assert sorted(len(m.assignment) for m in members) == [6, 6]
    finally:
        producing.close()
        for member in members:
            member.close()

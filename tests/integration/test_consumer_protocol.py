"""KIP-848 consumer groups (group.protocol=consumer) with librdkafka on a 3-broker cluster: three
members share the partitions through server-side assignment, consume everything exactly once,
and a member that leaves hands its partitions to the others; the loss of the coordinator's broker
costs the members nothing."""

from __future__ import annotations

import asyncio
import threading

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import BackgroundProducer, wait_until

PARTITIONS = 12
MESSAGES = 600
OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.heartbeat.interval.ms": "500",
}


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"value-{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


class Member:
    """A consumer-protocol member on its own thread; ``assignment`` is what it currently owns."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.consumer.subscribe([topic])
        self.assignment: set[int] = set()
        self.received: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None:
                if message.error() is None:
                    self.received.append((message.partition(), message.offset()))
                    self.consumer.commit(message=message, asynchronous=False)
                else:
                    self.errors.append(str(message.error()))
            self.assignment = {tp.partition for tp in self.consumer.assignment()}

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()


@pytest.mark.parametrize("diskless", [False, True], ids=["classic", "diskless"])
async def test_consumer_protocol_members_share_consume_once_and_rebalance(cluster_factory, diskless) -> None:
    cluster = cluster_factory(s3=diskless, overrides=OVERRIDES)
    topic, group = "kip848", "kip848-group"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {"diskless.enabled": "true"} if diskless else {}
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config=configs)])[topic].result(30)
    await asyncio.to_thread(produce, cluster.bootstrap, topic, MESSAGES)

    members = [Member(cluster.bootstrap, topic, group, f"m{i}") for i in range(3)]
    closed: list[Member] = []
    try:

        def shared(ms: list[Member], sizes: list[int]) -> bool:
            sets = [m.assignment for m in ms]
            return sorted(len(s) for s in sets) == sizes and set().union(*sets) == set(range(PARTITIONS))

        await asyncio.to_thread(wait_until, lambda: shared(members, [4, 4, 4]), 60, 0.2)
        await asyncio.to_thread(wait_until, lambda: sum(len(m.received) for m in members) >= MESSAGES, 60, 0.2)
        received = [r for m in members for r in m.received]
        assert len(received) == len(set(received)) == MESSAGES  # exactly once

        # A member leaves (epoch -1 on close): the other two get six partitions each.
        members[0].close()
        closed.append(members[0])
        survivors = members[1:]
        await asyncio.to_thread(wait_until, lambda: shared(survivors, [6, 6]), 60, 0.2)

        # More records: consumed by the survivors, still nothing twice.
        await asyncio.to_thread(produce, cluster.bootstrap, topic, PARTITIONS * 10)
        total = MESSAGES + PARTITIONS * 10
        await asyncio.to_thread(wait_until, lambda: sum(len(m.received) for m in members) >= total, 60, 0.2)
        received = [r for m in members for r in m.received]
        assert len(received) == len(set(received)) == total

        # The committed offsets are fetched back through a member of the group (OffsetFetch v9 with
        # its member epoch), once its poll thread is stopped: a Consumer is not used from two threads.
        survivors[0].stop.set()
        survivors[0].thread.join(10)
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = await asyncio.to_thread(survivors[0].consumer.committed, partitions, 30)
        assert sum(tp.offset for tp in committed) == total
        described = admin.describe_consumer_groups([group])[group].result(30)
        assert len(described.members) == 2
    finally:
        for m in members:
            if m not in closed:
                m.close()


class SteadyMember:
    """A consumer-protocol member that records its rebalance callbacks (partitions assigned,
    revoked or lost), its fatal errors, and counts the commits that succeeded; other errors (the
    coordinator moving) are never raised out of its thread."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str) -> None:
        self.fatal: list[str] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.name = name
        self.rebalances: list[str] = []
        self.commits = 0
        self.assignment: set[int] = set()
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _, parts: self._changed("assigned", parts),
            on_revoke=lambda _, parts: self._changed("revoked", parts),
            on_lost=lambda _, parts: self._changed("lost", parts),
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def _changed(self, what: str, partitions: list[TopicPartition]) -> None:
        if partitions:  # librdkafka also calls back with nothing to do
            self.rebalances.append(f"{what} {sorted(tp.partition for tp in partitions)}")

    def run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            self.assignment = {tp.partition for tp in self.consumer.assignment()}
            if message is not None and message.error() is not None and message.error().code() == KafkaError._FATAL:
                self.fatal.append(str(message.error()))  # the consumer consumes no more
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
    """The group's records (epochs, members, target and current assignments) are in
    __consumer_offsets: the broker that takes the partition over loads them and the members
    heartbeat on at their epochs, keeping their partitions. Before, the new coordinator knew no
    member nor the group: each member's next heartbeat got GROUP_ID_NOT_FOUND, which librdkafka
    takes as a fatal error (its partitions lost, it consumes no more); a client that rejoined
    instead would have revoked everything and joined again with epoch 0."""
    overrides = {
        **OVERRIDES,
        # Longer than a failover takes, so that no member is expired while the partition moves.
        "group.consumer.session.timeout.ms": "30000",
        "offsets.topic.num.partitions": "6",  # replication factor 3 (the default), on 3 brokers
    }
    cluster = cluster_factory(overrides=overrides)
    topic, group = "steady848", "steady848-group"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
    producing = BackgroundProducer(cluster.bootstrap, topic, PARTITIONS)
    members = [SteadyMember(cluster.bootstrap, topic, group, f"m{i}") for i in range(2)]
    try:

        def stable() -> bool:
            described = admin.describe_consumer_groups([group])[group].result(10)
            return (
                str(described.state).endswith("STABLE")
                and sorted(len(m.assignment) for m in members) == [6, 6]
                and all(m.commits > 0 for m in members)
            )

        await asyncio.to_thread(wait_until, stable, 60, 0.2)
        rebalances = [list(m.rebalances) for m in members]
        coordinator = admin.describe_consumer_groups([group])[group].result(30).coordinator.id
        commits = [m.commits for m in members]
        cluster.brokers[coordinator].kill()

        def moved_on() -> bool:
            for member, before in zip(members, rebalances, strict=True):
                assert not member.fatal, f"{member.name}: {member.fatal[0]}"
                assert member.rebalances == before, f"the failover rebalanced the group: {member.rebalances}"
            try:
                described = admin.describe_consumer_groups([group])[group].result(10)
            except KafkaException:
                return False  # the admin client's connection to the dead broker, or no coordinator yet
            return described.coordinator.id != coordinator and all(
                m.commits > c + 20 for m, c in zip(members, commits, strict=True)
            )

        # Both members commit again, at their epochs, through the new coordinator.
        await asyncio.to_thread(wait_until, moved_on, 90, 0.5)
        assert [m.rebalances for m in members] == rebalances
        assert sorted(len(m.assignment) for m in members) == [6, 6]
    finally:
        producing.close()
        for member in members:
            member.close()

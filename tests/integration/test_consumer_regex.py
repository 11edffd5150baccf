"""KIP-848 regex subscriptions with librdkafka (group.protocol=consumer sends SubscribedTopicRegex):
a consumer subscribed to ``^rx-.*`` gets the records of the matching topics and not of ``rx`` or
``other-rx-1`` (full match, as Kafka's RE2/J), a matching topic created later is resolved at the
group's next refresh and its records arrive too, and an invalid regex is Kafka's
INVALID_REGULAR_EXPRESSION for the consumer."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support import PolledConsumer, wait_until

OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "1",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.heartbeat.interval.ms": "500",
}
PER_TOPIC = 20


def produce(bootstrap: str, topics: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for topic in topics:
        for i in range(PER_TOPIC):
            producer.produce(topic, value=f"{topic}:{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0


class RegexConsumer:
    """A consumer-protocol member subscribed to ``pattern``, keeping what it received and its errors."""

    def __init__(self, bootstrap: str, group: str, pattern: str) -> None:
        self.received: set[str] = set()
        self.errors: list[KafkaError] = []
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            # Where librdkafka reports a fatal error.
            "error_cb": self.errors.append,
        }
        self.polled = PolledConsumer(config, [pattern], self.take)

    def take(self, message: Message) -> None:
        if message.error() is None:
            self.received.add(message.value().decode())
        else:
            self.errors.append(message.error())

    def topics(self) -> set[str]:
        return {value.split(":")[0] for value in self.received}

    def close(self) -> None:
        self.polled.close()


async def test_a_regex_subscription_consumes_matching_topics_and_new_ones(cluster_factory) -> None:
    cluster = cluster_factory(brokers=1, azs=1, overrides=OVERRIDES)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    names = ["rx-1", "rx-2", "rx", "other-rx-1"]
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in names]).values():
        future.result(30)
    await asyncio.to_thread(produce, cluster.bootstrap, names)
    good = RegexConsumer(cluster.bootstrap, "rx-group", "^rx-.*")
    # librdkafka refuses at subscribe() what its own regex engine cannot compile (``^rx-(``); a
    # backreference it takes, RE2 (Kafka's RE2/J, and ours) does not: the broker's error.
    bad = RegexConsumer(cluster.bootstrap, "rx-bad-group", r"^rx-(a)\1")
    try:
        expected = {f"{t}:{i}" for t in ("rx-1", "rx-2") for i in range(PER_TOPIC)}
        await asyncio.to_thread(wait_until, lambda: expected <= good.received, 30, 0.2)
        assert good.topics() == {"rx-1", "rx-2"}

        # A third matching topic: resolved at the group's next refresh (at most every 10 s, as Kafka).
        admin.create_topics([NewTopic("rx-3", 2, 1)])["rx-3"].result(30)
        created = time.monotonic()
        await asyncio.to_thread(produce, cluster.bootstrap, ["rx-3"])
        expected |= {f"rx-3:{i}" for i in range(PER_TOPIC)}
        await asyncio.to_thread(wait_until, lambda: expected <= good.received, 25, 0.2)
        assert good.topics() == {"rx-1", "rx-2", "rx-3"}, "a non-matching topic was consumed"
        assert time.monotonic() - created < 25
        assert not good.errors, good.errors

        # librdkafka takes INVALID_REGULAR_EXPRESSION (128) as fatal (_FATAL to error_cb), and
        # names it by its code's description.
        def refused() -> bool:
            return any(
                e.code() == KafkaError._FATAL and "Broker: The regular expression is not valid" in e.str()
                for e in bad.errors
            )

        await asyncio.to_thread(wait_until, refused, 15, 0.2)
        assert not bad.received
    finally:
        good.close()
        bad.close()

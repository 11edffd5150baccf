"""KIP-227 fetch sessions for replica fetches on a real cluster (replication/fetch_session.py).

Three brokers, a classic topic of many partitions replicated twice with min.insync.replicas=2, so
an acks=all produce is acknowledged only once the follower fetched the record. Followers open one
session per leader; once the ISRs are full their quiet fetches name (almost) no partition. The
session must keep replicating through records on every partition, partitions added mid-session,
the topic deleted and re-created under its name (new topic id: the old ids are forgotten), and a
broker restart (sessions with it are lost and opened anew), and sessions evicted all the time.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from support import wait_until

pytestmark = pytest.mark.integration

TOPIC = "sessions"
CONFIG = {"min.insync.replicas": "2"}


def _partitions(admin: AdminClient) -> dict[int, Any]:
    meta = admin.list_topics(timeout=10).topics.get(TOPIC)  # all topics: naming one may auto-create it
    return {} if meta is None or meta.error is not None else dict(meta.partitions)


def _replicated(admin: AdminClient, count: int, replicas: int = 2) -> bool:
    parts = _partitions(admin)
    return len(parts) == count and all(p.leader >= 0 and len(p.isrs) == replicas for p in parts.values())


def _metric(broker: Any, name: str) -> float:
    return sum(v for k, v in broker.metrics().items() if k == name or k.startswith(name + "{"))


def _followers(admin: AdminClient, leader: int) -> set[int]:
    return {r for p in _partitions(admin).values() if p.leader == leader for r in p.replicas if r != leader}


def _sessions(broker: Any) -> float:
    return _metric(broker, "diskless_fetch_sessions")


def _fetch_counts(broker: Any) -> tuple[float, float]:
    """Replica fetches served and partitions they named, so far."""
    return _metric(broker, "diskless_replica_fetches_total"), _metric(broker, "diskless_replica_fetch_partitions_total")


def _produce_everywhere(bootstrap: str, partitions: range, value: bytes) -> None:
    """One acks=all record to each partition; every one must be acknowledged."""
    errors: list[str] = []
    delivered: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(f"{msg.partition()}: {err}")
        else:
            delivered.append(msg.partition())

    for index in partitions:
        producer.produce(TOPIC, value=value, partition=index, on_delivery=report)
    assert producer.flush(90) == 0, "records still unacknowledged"
    assert errors == []
    assert sorted(delivered) == list(partitions)


def test_replication_through_fetch_sessions(cluster_factory: Any) -> None:
    cluster = cluster_factory(overrides={"replica.fetch.wait.max.ms": "200"})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    count = 300
    admin.create_topics([NewTopic(TOPIC, count, 2, config=CONFIG)])[TOPIC].result(30)
    wait_until(lambda: _replicated(admin, count), 60, message="ISRs never filled")

    # One session per (leader, follower) pair with partitions between them.
    wait_until(
        lambda: all(_sessions(b) == len(_followers(admin, b.node_id)) for b in cluster.brokers),
        30,
        message="sessions never opened",
    )
    # Quiet incremental fetches name next to nothing (a sessionless fetch names every partition).
    before = [_fetch_counts(b) for b in cluster.brokers]
    wait_until(
        lambda: all(_fetch_counts(b)[0] >= f + 10 for b, (f, _) in zip(cluster.brokers, before, strict=True)), 60
    )
    for broker, (fetches, named) in zip(cluster.brokers, before, strict=True):
        now_fetches, now_named = _fetch_counts(broker)
        delta_fetches, delta_named = now_fetches - fetches, now_named - named
        assert delta_named / delta_fetches < 5, (broker.node_id, delta_named, delta_fetches)

    _produce_everywhere(cluster.bootstrap, range(count), b"one")

    # Partitions added mid-session join the followers' sessions.
    admin.create_partitions([NewPartitions(TOPIC, count + 20)])[TOPIC].result(30)
    wait_until(lambda: _replicated(admin, count + 20), 60, message="new partitions never replicated")
    _produce_everywhere(cluster.bootstrap, range(count, count + 20), b"added")

    # Deleted and re-created under the same name: the old topic id leaves the sessions, the new one joins.
    admin.delete_topics([TOPIC])[TOPIC].result(30)
    wait_until(lambda: not _partitions(admin), 30, message="topic never deleted")
    count = 40
    admin.create_topics([NewTopic(TOPIC, count, 2, config=CONFIG)])[TOPIC].result(30)
    wait_until(lambda: _replicated(admin, count), 60, message="re-created topic never replicated")
    _produce_everywhere(cluster.bootstrap, range(count), b"two")

    # A broker restart loses its sessions and its followers' connections: sessions open again.
    victim = cluster.brokers[1]
    victim.stop()
    victim.start()
    wait_until(lambda: _replicated(admin, count), 60, message="ISRs never filled after the restart")
    _produce_everywhere(cluster.bootstrap, range(count), b"three")
    # The restarted follower's new sessions replaced its old ones on the other leaders (a follower
    # that stopped fetching from a leader since the re-creation may have left one behind).
    for broker in cluster.brokers:
        assert len(_followers(admin, broker.node_id)) <= _sessions(broker) <= 2


def test_replication_while_sessions_are_evicted_all_the_time(cluster_factory: Any) -> None:
    """One session slot per leader and two followers each: every follower's session is evicted by
    the other's, so its incremental fetches get FETCH_SESSION_ID_NOT_FOUND and it starts over with
    full fetches. Replication must go on (acks=all with both followers required)."""
    cluster = cluster_factory(
        overrides={"replica.fetch.wait.max.ms": "200", "max.incremental.fetch.session.cache.slots": "1"}
    )
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    count = 30
    admin.create_topics([NewTopic(TOPIC, count, 3, config={"min.insync.replicas": "3"})])[TOPIC].result(30)
    wait_until(lambda: _replicated(admin, count, replicas=3), 60, message="ISRs never filled")
    full_before = [_metric(b, 'diskless_replica_fetches_total{kind="full"}') for b in cluster.brokers]
    _produce_everywhere(cluster.bootstrap, range(count), b"evicted")
    assert _replicated(admin, count, replicas=3)
    # Full fetches go on after the first ones: the evicted sessions were noticed and replaced.
    wait_until(
        lambda: all(
            _metric(b, 'diskless_replica_fetches_total{kind="full"}') >= before + 4
            for b, before in zip(cluster.brokers, full_before, strict=True)
        ),
        30,
        message="no follower ever started over",
    )
    assert all(_sessions(b) == 1 for b in cluster.brokers)

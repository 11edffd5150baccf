"""Every broker still learns metadata changes after etcd restarts.

The WAL manager's etcd watch could go silent forever after an etcd restart (chaos testing found
it). A broker keeps its whole copy of the cluster metadata current by a watch on the prefix too
(cluster/etcd_store.py): if that watch died silently, a broker would never learn of a topic created
through another one. Here etcd is killed and restarted several times; after each restart a topic is
created through one broker and every broker must list it within a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from rawclient import Session, metadata_request
from support import LocalCluster, wait_until

pytestmark = pytest.mark.integration

RESTARTS = 3
DEADLINE_S = 20.0


def knows(bootstrap: str, topic: str) -> bool:
    try:
        with Session(bootstrap, timeout=5) as session:
            response = session.request(metadata_request([topic]))
    except OSError:
        return False
    return any(t.name == topic and int(t.error_code) == 0 and len(t.partitions) == 2 for t in response.topics)


def create_topic(bootstrap: str, topic: str) -> None:
    """Create ``topic`` through one broker. Right after an etcd restart the broker's etcd channel
    may still be backing off (CreateTopics then fails with an unknown server error): try again
    until the deadline."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    errors: list[str] = []

    def attempt() -> bool:
        try:
            admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" in str(exc):
                return True
            errors.append(str(exc))
            return False
        return True

    wait_until(attempt, DEADLINE_S, 0.5, message=f"could not create {topic}: {errors[-1:]}")


def test_every_broker_learns_new_topics_after_etcd_restarts(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(brokers=3, azs=1)
    wait_until(lambda: knows_all(cluster, None), DEADLINE_S, 0.2, message="cluster did not come up")
    for restart in range(RESTARTS):
        cluster.etcd.kill()
        time.sleep(1.0)  # etcd down for a while, as a crash and restart would have it
        cluster.etcd.start()
        began = time.monotonic()
        topic = f"after-restart-{restart}"
        creator = cluster.brokers[restart % len(cluster.brokers)]
        create_topic(creator.bootstrap, topic)
        for broker in cluster.brokers:
            wait_until(
                lambda broker=broker, topic=topic: knows(broker.bootstrap, topic),
                DEADLINE_S,
                0.2,
                message=f"broker {broker.node_id} never learned {topic} after etcd restart {restart + 1}",
            )
        print(f"etcd restart {restart + 1}: every broker knows {topic} after {time.monotonic() - began:.1f}s")


def knows_all(cluster: LocalCluster, _: object) -> bool:
    """Every broker answers Metadata listing all three brokers."""
    for broker in cluster.brokers:
        try:
            with Session(broker.bootstrap, timeout=5) as session:
                response = session.request(metadata_request(None))
        except OSError:
            return False
        if len(response.brokers) != len(cluster.brokers):
            return False
    return True

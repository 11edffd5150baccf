"""Automatic unclean leader election (``unclean.leader.election.enable``), as Kafka's controller
does it: a partition without a live ISR member is led by its first live replica, ISR reset to it,
when the topic's effective setting is true; it stays offline otherwise. Decided by the sans-IO
controller functions when brokers die, when an out-of-sync replica comes back, and when the
setting is turned on; the broker runs them again at once on a topic or broker config change."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fake_etcd import FakeEtcd
from isr_store import open_store, put_topic, stored_state

from diskless.broker.broker import Broker
from diskless.cluster.controller import NO_LEADER, elect_on_broker_change, next_state
from diskless.cluster.etcd_store import EtcdMetadataStore
from diskless.cluster.metadata import (
    ClusterMetadata,
    PartitionState,
    TopicMetadata,
)
from diskless.config import load_config

# Broker 0 leads alone (1 and 2 fell out of the ISR), then dies.
LAST_ISR = PartitionState(replicas=[0, 1, 2], leader=0, leader_epoch=4, isr=[0])


def _cluster(state: PartitionState, configs: dict[str, str] | None = None) -> ClusterMetadata:
    metadata = ClusterMetadata("c")
    metadata.topics["t"] = TopicMetadata("t", "id", [state], dict(configs or {}))
    return metadata


def test_dead_isr_with_a_live_out_of_sync_replica_elects_it_when_enabled() -> None:
    assert next_state(LAST_ISR, live={1, 2}, unclean=True) == PartitionState([0, 1, 2], 1, 5, [1])
    # Replica order, not broker id order, picks the leader.
    state = PartitionState(replicas=[0, 2, 1], leader=0, leader_epoch=4, isr=[0])
    assert next_state(state, live={1, 2}, unclean=True) == PartitionState([0, 2, 1], 2, 5, [2])


def test_dead_isr_stays_offline_when_disabled() -> None:
    offline = PartitionState([0, 1, 2], NO_LEADER, 5, [0])
    assert next_state(LAST_ISR, live={1, 2}) == offline
    assert next_state(LAST_ISR, live={1, 2}, unclean=False) == offline
    for changes in (
        elect_on_broker_change(_cluster(LAST_ISR), {1, 2}),
        elect_on_broker_change(_cluster(LAST_ISR), {1, 2}, lambda topic: False),
    ):
        assert [(c.state, c.unclean) for c in changes] == [(offline, False)]


def test_a_live_isr_member_is_preferred_over_an_out_of_sync_replica() -> None:
    state = PartitionState(replicas=[0, 1, 2], leader=0, leader_epoch=4, isr=[0, 2])
    assert next_state(state, live={1, 2}, unclean=True) == PartitionState([0, 1, 2], 2, 5, [2])


def test_no_live_replica_at_all_still_goes_offline_when_enabled() -> None:
    assert next_state(LAST_ISR, live={3}, unclean=True) == PartitionState([0, 1, 2], NO_LEADER, 5, [0])


def test_the_topic_setting_decides_per_topic() -> None:
    metadata = _cluster(LAST_ISR, {"unclean.leader.election.enable": "true"})
    metadata.topics["u"] = TopicMetadata("u", "id-u", [LAST_ISR], {})
    changes = elect_on_broker_change(metadata, {1, 2}, lambda topic: topic.name == "t")
    by_topic = {c.topic: c for c in changes}
    assert by_topic["t"].state == PartitionState([0, 1, 2], 1, 5, [1]) and by_topic["t"].unclean
    assert by_topic["u"].state.leader == NO_LEADER and not by_topic["u"].unclean


def test_out_of_sync_broker_returning_to_an_offline_partition_leads_when_enabled() -> None:
    # Every replica dead: offline, whatever the setting.
    offline = next_state(LAST_ISR, live=set(), unclean=True)
    assert offline == PartitionState([0, 1, 2], NO_LEADER, 5, [0])
    # Out-of-sync broker 1 comes back (broker 0, the last ISR, does not).
    assert next_state(offline, live={1}) is None
    changes = elect_on_broker_change(_cluster(offline), {1}, lambda topic: True)
    assert [(c.state, c.unclean) for c in changes] == [(PartitionState([0, 1, 2], 1, 6, [1]), True)]


def test_turning_the_setting_on_elects_with_the_same_live_brokers() -> None:
    offline = next_state(LAST_ISR, live={1, 2})
    assert offline is not None and offline.leader == NO_LEADER
    metadata = _cluster(offline)
    assert elect_on_broker_change(metadata, {1, 2}, lambda topic: False) == []
    changes = elect_on_broker_change(metadata, {1, 2}, lambda topic: True)
    assert [(c.topic, c.partition, c.state) for c in changes] == [("t", 0, PartitionState([0, 1, 2], 1, 6, [1]))]


def test_only_the_given_topics_are_considered_and_the_predicate_is_asked_once_per_topic() -> None:
    offline = PartitionState([0, 1, 2], NO_LEADER, 5, [0])
    metadata = _cluster(offline)
    metadata.topics["t"].partitions.append(offline)
    metadata.topics["u"] = TopicMetadata("u", "id-u", [offline], {})
    asked: list[str] = []

    def enabled(topic: TopicMetadata) -> bool:
        asked.append(topic.name)
        return True

    changes = elect_on_broker_change(metadata, {1, 2}, enabled, topics={"t"})
    assert [(c.topic, c.partition) for c in changes] == [("t", 0), ("t", 1)]
    assert asked == ["t"]


# --- the broker's trigger on a config change ----------------------------------------------------


async def _controller(tmp_path: Path, state: PartitionState) -> tuple[Broker, FakeEtcd, EtcdMetadataStore]:
    """Broker 1, controller of a cluster on a fake etcd where brokers 1 and 3 are live and topic "t"
    (replicas 2 and 3, not on broker 1: no log to open) is in ``state``."""
    config = load_config(
        overrides={"node.id": "1", "log.dirs": str(tmp_path), "metadata.etcd.endpoints": "127.0.0.1:2379"}
    )
    broker = Broker(config)
    fake, store, _ = await open_store((1, 3), broker.metadata)
    broker.backend = store
    await put_topic(fake, store, "id-t", state)
    await store._load()
    broker.metadata.controller_id = 1
    return broker, fake, store


OFFLINE = PartitionState([2, 3], NO_LEADER, 5, [2])  # broker 2, the last ISR, is dead; 3 is out of sync


def test_topic_config_turned_on_elects_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, fake, store = await _controller(tmp_path, OFFLINE)
        await broker._apply_change(("topic", "t"), 0)  # a change, setting unchanged: stays offline
        assert stored_state(fake, store) == OFFLINE
        broker.metadata.topics["t"].configs = {"unclean.leader.election.enable": "true"}  # IncrementalAlterConfigs
        await broker._apply_change(("topic", "t"), 0)
        assert stored_state(fake, store) == PartitionState([2, 3], 3, 6, [3])

    asyncio.run(scenario())


def test_cluster_wide_broker_default_turned_on_elects_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, fake, store = await _controller(tmp_path, OFFLINE)
        broker.metadata.broker_configs["default"] = {"unclean.leader.election.enable": "true"}
        await broker._apply_change(("broker-config", "default"), 0)
        assert stored_state(fake, store) == PartitionState([2, 3], 3, 6, [3])

    asyncio.run(scenario())


def test_topic_override_false_wins_over_an_enabled_broker_default(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, fake, store = await _controller(tmp_path, OFFLINE)
        broker.metadata.topics["t"].configs = {"unclean.leader.election.enable": "false"}
        broker.metadata.broker_configs["default"] = {"unclean.leader.election.enable": "true"}
        await broker._apply_change(("broker-config", "default"), 0)
        await broker._reconcile()
        assert stored_state(fake, store) == OFFLINE

    asyncio.run(scenario())

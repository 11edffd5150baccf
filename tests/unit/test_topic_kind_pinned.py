"""A topic's kind (``diskless.enabled``) is pinned in its configs when it is created.

Each broker decides whether a topic is diskless from the topic's configs, or else from its own
default for ``diskless.enabled``. Brokers whose defaults differ (set per broker, or during a
rolling change) treated a topic created without the config as both kinds at once: producers on
some brokers had their batches committed as pointers while the leader appended others as
records. The creating broker now writes its default into the topic, as it does after the config
is deleted."""

from __future__ import annotations

from pathlib import Path

from diskless.broker.broker import Broker
from diskless.cluster.metadata import BrokerInfo
from diskless.config import load_config


def broker(tmp_path: Path, diskless_default: str) -> Broker:
    node = Broker(
        load_config(overrides={"node.id": "0", "log.dirs": str(tmp_path), "diskless.enabled": diskless_default})
    )
    node.metadata.brokers[0] = BrokerInfo(0, "h", 9092)
    return node


async def test_a_topic_created_without_the_config_carries_the_creating_brokers_default(tmp_path: Path) -> None:
    creator = broker(tmp_path / "a", "true")
    topic = await creator.create_topic("t", 1, 1, {}, validate_only=True)
    assert topic.configs.get("diskless.enabled") == "true"
    # Another broker with the other default now sees the same kind.
    other = broker(tmp_path / "b", "false")
    assert other.is_diskless(topic) and creator.is_diskless(topic)


async def test_an_explicit_kind_is_kept_and_its_alias_is_not_doubled(tmp_path: Path) -> None:
    creator = broker(tmp_path, "true")
    assert (await creator.create_topic("t", 1, 1, {"diskless.enabled": "false"}, validate_only=True)).configs[
        "diskless.enabled"
    ] == "false"
    aliased = await creator.create_topic("u", 1, 1, {"diskless.enable": "false"}, validate_only=True)
    assert aliased.configs == {"diskless.enabled": "false"}


async def test_deleting_the_config_pins_the_default_again(tmp_path: Path) -> None:
    creator = broker(tmp_path, "false")
    creator.metadata.create_topic("t", 1, 1, {"diskless.enabled": "true", "retention.ms": "1000"})
    planned: list[dict[str, str]] = []
    plan = creator.metadata.plan_configs

    def recorded(name: str, updates: dict[str, str | None]) -> dict[str, str]:
        planned.append(plan(name, updates))
        return planned[-1]

    creator.metadata.plan_configs = recorded  # type: ignore[method-assign]
    await creator.alter_topic_configs("t", {"diskless.enabled": None}, validate_only=True)
    assert planned[-1] == {"diskless.enabled": "false", "retention.ms": "1000"}

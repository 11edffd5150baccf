"""An in-memory broker for driving the admin and config handlers (AdminApis, ConfigApis) without
a metadata store: topic changes go straight to a ClusterMetadata, as the controller would apply
them. Shared by the tests that compare diskless's admin refusals with Kafka's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, MetadataError
from diskless.config import BrokerConfig


class FakeBroker:
    """Node 0 of a three-broker cluster, with no topics unless the test creates them."""

    def __init__(self) -> None:
        self.config = BrokerConfig()
        self.metadata = ClusterMetadata("c")
        for n in (0, 1, 2):
            self.metadata.brokers[n] = BrokerInfo(n, "h", 9000 + n)
        self.node_id = 0
        self.operations = SimpleNamespace(static_config=BrokerConfig())

    async def create_topic(
        self,
        name: str,
        partitions: int,
        rf: int,
        configs: dict[str, str],
        assignments: Any = (),
        validate_only: bool = False,
        internal: bool = False,
    ) -> Any:
        return self.metadata.create_topic(name, partitions, rf, configs, assignments, validate_only=validate_only)

    async def delete_topic(self, name: str) -> Any:
        if name not in self.metadata.topics:
            raise MetadataError(ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist.")
        return self.metadata.delete_topic(name)

    async def add_partitions(self, name: str, count: int, validate_only: bool, assignments: Any = None) -> None:
        new = self.metadata.plan_new_partitions(name, count, assignments)
        if not validate_only:
            self.metadata.topics[name].partitions.extend(s for _, s in sorted(new.items()))

    async def alter_topic_configs(self, name: str, updates: Any, validate_only: bool) -> None:
        self.metadata.alter_topic_configs(name, updates, validate_only)


def broker_with_topic(configs: dict[str, str] | None = None) -> FakeBroker:
    """A FakeBroker with topic "t": one partition, one replica, the given overrides."""
    broker = FakeBroker()
    broker.metadata.create_topic("t", 1, 1, dict(configs or {}))
    return broker

"""Topic and broker config validation against Kafka (LogConfig's ConfigDef, ControllerConfigurationValidator,
ConfigAdminManager.preprocess, DynamicBrokerConfig.validate). Handlers driven on an in-memory broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from admin_broker import FakeBroker, broker_with_topic
from kio.schema.errors import ErrorCode

from diskless.broker.api_base import OP_APPEND, OP_SET, RESOURCE_BROKER, RESOURCE_TOPIC
from diskless.broker.config_apis import ConfigApis
from diskless.broker.operations import Operations
from diskless.config import load_config
from diskless.log.config import ConfigError


def incremental(broker: FakeBroker, resource_type: int, name: str, configs: list[tuple[str, int, str | None]]) -> Any:
    res = SimpleNamespace(
        resource_type=resource_type,
        resource_name=name,
        configs=[SimpleNamespace(name=n, config_operation=op, value=v) for n, op, v in configs],
    )
    request = SimpleNamespace(resources=[res], validate_only=False)
    return asyncio.run(ConfigApis(broker).incremental_alter_configs(None, request))["responses"][0]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("retention.ms", str(2**63)),
        ("retention.bytes", str(2**63)),
        ("retention.bytes", str(-(2**63) - 1)),
        ("message.timestamp.before.max.ms", "99999999999999999999"),
    ],
)
def test_long_config_beyond_java_long_is_invalid_config(name: str, value: str) -> None:
    """LONG configs are parsed with Long.parseLong: a value outside [-2^63, 2^63) is "Not a number"
    -> INVALID_CONFIG. Diskless checked the range of INT configs only and stored such a LONG."""
    broker = broker_with_topic()
    out = incremental(broker, RESOURCE_TOPIC, "t", [(name, OP_SET, value)])
    assert out["error_code"] == ErrorCode.invalid_config
    assert broker.metadata.topics["t"].configs == {}
    # The broker-level synonym is checked against the same table at startup.
    synonym = {"retention.ms": "log.retention.ms", "retention.bytes": "log.retention.bytes"}.get(name)
    if synonym:
        with pytest.raises(ConfigError):
            load_config(environ={}, overrides={synonym: value})


def test_long_config_bounds_are_accepted() -> None:
    broker = broker_with_topic()
    bounds = [("retention.ms", OP_SET, str(2**63 - 1)), ("retention.bytes", OP_SET, str(-(2**63)))]
    out = incremental(broker, RESOURCE_TOPIC, "t", bounds)
    assert out["error_code"] == ErrorCode.none
    assert broker.metadata.topics["t"].configs == {"retention.ms": str(2**63 - 1), "retention.bytes": str(-(2**63))}


def legacy(broker: FakeBroker, resource_type: int, name: str, configs: list[tuple[str, str]]) -> Any:
    res = SimpleNamespace(
        resource_type=resource_type, resource_name=name, configs=[SimpleNamespace(name=n, value=v) for n, v in configs]
    )
    request = SimpleNamespace(resources=[res], validate_only=False)
    return asyncio.run(ConfigApis(broker).alter_configs(None, request))["responses"][0]  # type: ignore[arg-type]


def test_alter_configs_of_an_impossible_topic_name() -> None:
    """ControllerConfigurationValidator.validateTopicName runs before the existence check: the
    empty name is INVALID_REQUEST "Default topic resources are not allowed.", an illegal name
    INVALID_TOPIC_EXCEPTION. Diskless answered UNKNOWN_TOPIC_OR_PARTITION (a retriable error) for both."""
    broker = broker_with_topic()
    for alter in (
        lambda name: incremental(broker, RESOURCE_TOPIC, name, [("retention.ms", OP_SET, "1000")]),
        lambda name: legacy(broker, RESOURCE_TOPIC, name, [("retention.ms", "1000")]),
    ):
        assert alter("")["error_code"] == ErrorCode.invalid_request
        for name in ("bad/name", "x" * 250, ".."):
            assert alter(name)["error_code"] == ErrorCode.invalid_topic_exception, name
        assert alter("missing")["error_code"] == ErrorCode.unknown_topic_or_partition
    assert broker.metadata.topics["t"].configs == {}


def broker_with_operations() -> FakeBroker:
    """A FakeBroker whose dynamic broker configs go through the real Operations into its metadata."""
    broker = FakeBroker()

    async def update_broker_configs(name: str, configs: dict[str, str]) -> bool:
        broker.metadata.broker_configs[name] = dict(configs)
        return True

    broker.backend = SimpleNamespace(update_broker_configs=update_broker_configs)  # type: ignore[attr-defined]
    broker.operations = Operations(broker)  # type: ignore[arg-type,assignment]
    return broker


@pytest.mark.parametrize("resource", ["0", ""])
def test_broker_config_refusals_are_invalid_request(resource: str) -> None:
    """Kafka validates a broker resource on the receiving broker (ConfigAdminManager.preprocess):
    DynamicBrokerConfig throws ConfigException ("Cannot update these configs dynamically:
    Set(num.partitions)", a bad value), which is answered INVALID_REQUEST, not INVALID_CONFIG
    (KAFKA-13609 keeps it so for compatibility; kafka-configs.sh prints InvalidRequestException).
    Diskless answered INVALID_CONFIG. APPEND to a non-list config stays INVALID_CONFIG, as Kafka's
    prepareIncrementalConfigs throws InvalidConfigurationException."""
    broker = broker_with_operations()
    for change in (("num.partitions", OP_SET, "3"), ("log.retention.ms", OP_SET, "soon")):
        out = incremental(broker, RESOURCE_BROKER, resource, [change])
        assert out["error_code"] == ErrorCode.invalid_request, change
    out = legacy(broker, RESOURCE_BROKER, resource, [("num.partitions", "3")])
    assert out["error_code"] == ErrorCode.invalid_request
    out = incremental(broker, RESOURCE_BROKER, resource, [("log.retention.ms", OP_APPEND, "1")])
    assert out["error_code"] == ErrorCode.invalid_config
    assert broker.metadata.broker_configs == {}
    # A dynamic config with a valid value is stored.
    out = incremental(broker, RESOURCE_BROKER, resource, [("log.retention.ms", OP_SET, "1000")])
    assert out["error_code"] == ErrorCode.none
    assert broker.metadata.broker_configs == {resource or "default": {"log.retention.ms": "1000"}}

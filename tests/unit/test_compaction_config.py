"""Log compaction's configuration against Kafka 4.0's: topic configs (TopicConfig, LogConfig),
their broker synonyms and the cleaner's broker configs (CleanerConfig, LogCleaner's reconfigurable
set), DescribeConfigs types, and the refusals: Kafka's cross-checks and no compacted diskless topic.

Config and admin handlers are driven on the in-memory broker of ``admin_broker.py``; nothing
here needs a cleaner.
"""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from admin_broker import FakeBroker, broker_with_topic
from kio.schema.errors import ErrorCode

from diskless.broker.admin_apis import AdminApis
from diskless.broker.api_base import OP_APPEND, OP_DELETE, OP_SET, OP_SUBTRACT, RESOURCE_BROKER, RESOURCE_TOPIC
from diskless.broker.config_apis import ConfigApis, topic_config_entries
from diskless.broker.operations import Operations
from diskless.cluster import broker_configs as bc
from diskless.config import BrokerConfig, load_config
from diskless.log.config import (
    DEFAULT_DEDUPE_BUFFER_SIZE,
    DOUBLE_MAX,
    LONG_MAX,
    TOPIC_CONFIGS,
    CleanerConfig,
    ConfigError,
    LogConfig,
    effective_values,
    parse_java_double,
    render_java_double,
    validate_overrides,
)

# --- Java doubles ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.5", 0.5),
        (".5", 0.5),
        ("5.", 5.0),
        ("1e-2", 0.01),
        ("1E+2", 100.0),
        ("0.25f", 0.25),
        ("0.25D", 0.25),
        ("0x1p-1", 0.5),
        ("+1", 1.0),
        (" 1 ", 1.0),
        ("Infinity", float("inf")),
        ("-Infinity", float("-inf")),
        ("1e400", float("inf")),  # Java rounds to Infinity too
    ],
)
def test_parse_java_double(text: str, value: float) -> None:
    assert parse_java_double(text) == value


@pytest.mark.parametrize("text", ["inf", "nan", "infinity", "1_0", "", ".", "e5", "0.5x", "1,5", "\u0661", "NaNd"])
def test_parse_java_double_refuses_what_java_refuses(text: str) -> None:
    """Python's float() takes these; Double.parseDouble throws NumberFormatException."""
    with pytest.raises(ValueError):
        parse_java_double(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.5, "0.5"),
        (1.0, "1.0"),
        (0.0, "0.0"),
        (100.0, "100.0"),
        (0.01, "0.01"),
        (0.001, "0.001"),
        (1e-4, "1.0E-4"),
        (9999999.0, "9999999.0"),
        (1e7, "1.0E7"),
        (123.456, "123.456"),
        (-2.5, "-2.5"),
        (DOUBLE_MAX, "1.7976931348623157E308"),
        (float("inf"), "Infinity"),
    ],
)
def test_render_java_double(value: float, text: str) -> None:
    """Double.toString, as Kafka's DescribeConfigs shows a DOUBLE."""
    assert render_java_double(value) == text
    assert parse_java_double(text) == value


# --- topic configs: names, types, defaults, synonyms ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "default", "synonym"),
    [
        ("cleanup.policy", "list", "delete", "log.cleanup.policy"),
        ("delete.retention.ms", "long", 86400000, "log.cleaner.delete.retention.ms"),
        ("min.cleanable.dirty.ratio", "double", 0.5, "log.cleaner.min.cleanable.ratio"),
        ("min.compaction.lag.ms", "long", 0, "log.cleaner.min.compaction.lag.ms"),
        ("max.compaction.lag.ms", "long", LONG_MAX, "log.cleaner.max.compaction.lag.ms"),
    ],
)
def test_compaction_topic_configs_are_kafkas(name: str, kind: str, default: Any, synonym: str) -> None:
    definition = TOPIC_CONFIGS[name]
    assert (definition.kind, definition.default, definition.broker_synonym) == (kind, default, synonym)


@pytest.mark.parametrize(
    ("raw", "stored", "policy", "compact", "delete"),
    [
        ("delete", "delete", "delete", False, True),
        ("compact", "compact", "compact", True, False),
        ("compact,delete", "compact,delete", "compact,delete", True, True),
        ("delete,compact", "delete,compact", "compact,delete", True, True),
        (" delete , compact ", "delete,compact", "compact,delete", True, True),
        ("compact,compact", "compact,compact", "compact", True, False),  # Kafka 4.0 keeps duplicates
        ("", "", "", False, False),  # Kafka 4.0: the empty list, neither policy
        ("  ", "", "", False, False),
    ],
)
def test_cleanup_policy_spellings(raw: str, stored: str, policy: str, compact: bool, delete: bool) -> None:
    """ConfigDef LIST: items split on commas with blanks dropped, each one of compact, delete.
    The stored (and described) value is Kafka's convertToString; LogConfig's is one spelling per policy."""
    assert validate_overrides({"cleanup.policy": raw}) == {"cleanup.policy": stored}
    values = effective_values({"cleanup.policy": stored}, lambda _: None)
    config = LogConfig.from_values({name: value for name, (value, _) in values.items()})
    assert (config.cleanup_policy, config.compact, config.delete) == (policy, compact, delete)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("cleanup.policy", "compacted"),
        ("cleanup.policy", "Compact"),  # ValidString is case sensitive
        ("cleanup.policy", "compact,"),  # an empty item
        ("cleanup.policy", ","),
        ("cleanup.policy", None),
        ("delete.retention.ms", "-1"),
        ("delete.retention.ms", "1.5"),
        ("min.cleanable.dirty.ratio", "-0.1"),
        ("min.cleanable.dirty.ratio", "1.01"),
        ("min.cleanable.dirty.ratio", "half"),
        ("min.cleanable.dirty.ratio", "NaN"),
        ("min.cleanable.dirty.ratio", "Infinity"),
        ("min.cleanable.dirty.ratio", "nan"),
        ("min.compaction.lag.ms", "-1"),
        ("max.compaction.lag.ms", "0"),
        ("max.compaction.lag.ms", str(2**63)),
    ],
)
def test_bad_compaction_values(name: str, value: str | None) -> None:
    with pytest.raises(ConfigError):
        validate_overrides({name: value})


@pytest.mark.parametrize(
    ("name", "raw", "stored"),
    [
        ("min.cleanable.dirty.ratio", "0", "0.0"),
        ("min.cleanable.dirty.ratio", "1", "1.0"),
        ("min.cleanable.dirty.ratio", ".010", "0.01"),
        ("min.cleanable.dirty.ratio", "1e-4", "1.0E-4"),
        ("delete.retention.ms", "0", "0"),
        ("min.compaction.lag.ms", "0", "0"),
        ("max.compaction.lag.ms", "1", "1"),
    ],
)
def test_good_compaction_values_are_normalised(name: str, raw: str, stored: str) -> None:
    assert validate_overrides({name: raw}) == {name: stored}


def test_log_config_fields_from_effective_values() -> None:
    broker = {"log.cleaner.delete.retention.ms": "100", "log.cleaner.min.cleanable.ratio": "0.25"}
    overrides = {"cleanup.policy": "compact", "min.compaction.lag.ms": "7", "max.compaction.lag.ms": "3000"}
    values = effective_values(overrides, broker.get)
    assert values["delete.retention.ms"] == (100, "broker")
    assert values["min.cleanable.dirty.ratio"] == (0.25, "broker")
    assert values["min.compaction.lag.ms"] == (7, "topic")
    config = LogConfig.from_values({name: value for name, (value, _) in values.items()})
    assert config.delete_retention_ms == 100 and config.min_cleanable_dirty_ratio == 0.25
    assert config.min_compaction_lag_ms == 7 and config.max_compaction_lag_ms == 3000
    # LogConfig.maxSegmentMs: a compacted log rolls by max.compaction.lag.ms too.
    assert config.max_segment_ms == 3000
    assert dataclasses.replace(config, cleanup_policy="delete").max_segment_ms == config.segment_ms
    assert LogConfig().cleanup_policy == "delete" and LogConfig().delete and not LogConfig().compact


# --- cross-checks ------------------------------------------------------------------------------------


def test_min_compaction_lag_above_max_is_refused_with_kafkas_words() -> None:
    with pytest.raises(ConfigError, match=r"conflict topic config setting min.compaction.lag.ms \(10\) > max"):
        validate_overrides({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert validate_overrides({"min.compaction.lag.ms": "5", "max.compaction.lag.ms": "5"})
    # Against the broker's synonyms when they are given (the admin APIs give them).
    with pytest.raises(ConfigError, match="conflict"):
        validate_overrides({"min.compaction.lag.ms": "10"}, broker_value={"log.cleaner.max.compaction.lag.ms": "5"}.get)


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_compacted_diskless_topic_is_refused(policy: str) -> None:
    with pytest.raises(ConfigError, match="Diskless topics cannot be compacted"):
        validate_overrides({"cleanup.policy": policy, "diskless.enabled": "true"})
    with pytest.raises(ConfigError, match="Diskless topics cannot be compacted"):
        validate_overrides({"cleanup.policy": policy, "diskless.enable": "true"})  # Inkless's spelling
    # A broker default says diskless, or compact.
    with pytest.raises(ConfigError):
        validate_overrides({"cleanup.policy": policy}, broker_value={"diskless.enabled": "true"}.get)
    with pytest.raises(ConfigError):
        validate_overrides({"diskless.enabled": "true"}, broker_value={"log.cleanup.policy": policy}.get)
    # Classic compacted topics, and diskless topics that delete or keep everything, are fine.
    assert validate_overrides({"cleanup.policy": policy, "diskless.enabled": "false"})
    assert validate_overrides({"cleanup.policy": "delete", "diskless.enabled": "true"})
    assert validate_overrides({"cleanup.policy": "", "diskless.enabled": "true"})


def test_compacted_topic_becoming_diskless_says_so() -> None:
    before = {"cleanup.policy": "compact", "diskless.enabled": "false"}
    with pytest.raises(ConfigError, match=r"compacted topic \(cleanup.policy=compact\) cannot become diskless"):
        validate_overrides({"cleanup.policy": "compact", "diskless.enabled": "true"}, previous=before)
    # Both at once: no longer compacted, it may become diskless.
    assert validate_overrides({"cleanup.policy": "delete", "diskless.enabled": "true"}, previous=before)


# --- admin APIs ----------------------------------------------------------------------------------


def incremental(broker: FakeBroker, resource_type: int, name: str, configs: list[tuple[str, int, str | None]]) -> Any:
    res = SimpleNamespace(
        resource_type=resource_type,
        resource_name=name,
        configs=[SimpleNamespace(name=n, config_operation=op, value=v) for n, op, v in configs],
    )
    request = SimpleNamespace(resources=[res], validate_only=False)
    return asyncio.run(ConfigApis(broker).incremental_alter_configs(None, request))["responses"][0]  # type: ignore[arg-type]


def legacy(broker: FakeBroker, name: str, configs: dict[str, str]) -> Any:
    res = SimpleNamespace(
        resource_type=RESOURCE_TOPIC,
        resource_name=name,
        configs=[SimpleNamespace(name=n, value=v) for n, v in configs.items()],
    )
    request = SimpleNamespace(resources=[res], validate_only=False)
    return asyncio.run(ConfigApis(broker).alter_configs(None, request))["responses"][0]  # type: ignore[arg-type]


def create(broker: FakeBroker, name: str, configs: dict[str, str], validate_only: bool = False) -> Any:
    topic = SimpleNamespace(
        name=name,
        num_partitions=1,
        replication_factor=1,
        assignments=[],
        configs=[SimpleNamespace(name=n, value=v) for n, v in configs.items()],
    )
    request = SimpleNamespace(topics=[topic], validate_only=validate_only, timeout=1000)
    header = SimpleNamespace(api_version=7)
    return asyncio.run(AdminApis(broker).create_topics(header, request))["topics"][0]  # type: ignore[arg-type]


def with_topic_defaults(broker: FakeBroker, **defaults: str) -> FakeBroker:
    broker.config = dataclasses.replace(broker.config, topic_defaults=dict(defaults))
    return broker


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact", "delete", ""])
def test_create_classic_topic_with_any_policy(policy: str) -> None:
    broker = FakeBroker()
    out = create(broker, "c", {"cleanup.policy": policy})
    assert out["error_code"] == ErrorCode.none, out
    entries = {c["name"]: c for c in out["configs"]}
    assert entries["cleanup.policy"]["value"] == policy
    assert entries["cleanup.policy"]["config_source"] == bc.SOURCE_TOPIC


def test_create_compacted_diskless_topic_is_invalid_config() -> None:
    broker = FakeBroker()
    out = create(broker, "d", {"cleanup.policy": "compact", "diskless.enabled": "true"})
    assert out["error_code"] == ErrorCode.invalid_config
    assert "Diskless topics cannot be compacted" in out["error_message"]
    # The broker's default makes topics diskless: a compacted topic must say diskless.enabled=false.
    broker = with_topic_defaults(FakeBroker(), **{"diskless.enabled": "true"})
    assert create(broker, "d", {"cleanup.policy": "compact"})["error_code"] == ErrorCode.invalid_config
    assert create(broker, "c", {"cleanup.policy": "compact", "diskless.enabled": "false"})["error_code"] == 0
    # validate_only refuses alike and creates nothing.
    out = create(FakeBroker(), "d", {"cleanup.policy": "compact", "diskless.enabled": "true"}, validate_only=True)
    assert out["error_code"] == ErrorCode.invalid_config
    assert "d" not in broker.metadata.topics


def test_create_with_lag_conflicting_with_broker_default() -> None:
    broker = with_topic_defaults(FakeBroker(), **{"log.cleaner.max.compaction.lag.ms": "5"})
    out = create(broker, "c", {"min.compaction.lag.ms": "10"})
    assert out["error_code"] == ErrorCode.invalid_config and "conflict topic config" in out["error_message"]
    assert "c" not in broker.metadata.topics
    # Other refusals keep Kafka's precedence: a bad name is still INVALID_TOPIC_EXCEPTION.
    assert (
        create(broker, "bad/name", {"min.compaction.lag.ms": "10"})["error_code"] == ErrorCode.invalid_topic_exception
    )


def test_alter_diskless_topic_to_compact_is_invalid_config() -> None:
    broker = broker_with_topic({"diskless.enabled": "true"})
    for policy in ("compact", "compact,delete"):
        out = incremental(broker, RESOURCE_TOPIC, "t", [("cleanup.policy", OP_SET, policy)])
        assert out["error_code"] == ErrorCode.invalid_config, policy
        assert "Diskless topics cannot be compacted" in out["error_message"]
    out = incremental(broker, RESOURCE_TOPIC, "t", [("cleanup.policy", OP_APPEND, "compact")])
    assert out["error_code"] == ErrorCode.invalid_config
    assert legacy(broker, "t", {"diskless.enabled": "true", "cleanup.policy": "compact"})["error_code"] == 40
    assert broker.metadata.topics["t"].configs == {"diskless.enabled": "true"}


def test_compacted_classic_topic_cannot_become_diskless() -> None:
    broker = broker_with_topic({"cleanup.policy": "compact", "diskless.enabled": "false"})
    out = incremental(broker, RESOURCE_TOPIC, "t", [("diskless.enabled", OP_SET, "true")])
    assert out["error_code"] == ErrorCode.invalid_config
    assert "cannot become diskless" in out["error_message"]
    out = legacy(broker, "t", {"cleanup.policy": "compact", "diskless.enable": "true"})
    assert out["error_code"] == ErrorCode.invalid_config
    # Dropping diskless.enabled takes the broker's default, as the broker pins it: diskless here.
    with_topic_defaults(broker, **{"diskless.enabled": "true"})
    out = incremental(broker, RESOURCE_TOPIC, "t", [("diskless.enabled", OP_DELETE, None)])
    assert out["error_code"] == ErrorCode.invalid_config
    assert broker.metadata.topics["t"].configs == {"cleanup.policy": "compact", "diskless.enabled": "false"}
    # Compaction dropped in the same request: allowed.
    out = incremental(
        broker, RESOURCE_TOPIC, "t", [("diskless.enabled", OP_SET, "true"), ("cleanup.policy", OP_SET, "delete")]
    )
    assert out["error_code"] == ErrorCode.none
    assert broker.metadata.topics["t"].configs == {"cleanup.policy": "delete", "diskless.enabled": "true"}


def test_classic_topic_policy_list_operations() -> None:
    broker = broker_with_topic()
    out = incremental(broker, RESOURCE_TOPIC, "t", [("cleanup.policy", OP_APPEND, "compact")])
    assert out["error_code"] == ErrorCode.none
    assert broker.metadata.topics["t"].configs == {"cleanup.policy": "delete,compact"}
    out = incremental(broker, RESOURCE_TOPIC, "t", [("cleanup.policy", OP_SUBTRACT, "delete")])
    assert out["error_code"] == ErrorCode.none
    assert broker.metadata.topics["t"].configs == {"cleanup.policy": "compact"}
    out = incremental(
        broker, RESOURCE_TOPIC, "t", [("min.compaction.lag.ms", OP_SET, "10"), ("max.compaction.lag.ms", OP_SET, "9")]
    )
    assert out["error_code"] == ErrorCode.invalid_config


def test_describe_topic_compaction_configs() -> None:
    """Types (DOUBLE is 6), values as Kafka renders them, sources and synonym chains."""
    broker = with_topic_defaults(
        broker_with_topic({"cleanup.policy": "compact"}), **{"log.cleaner.min.cleanable.ratio": "0.25"}
    )
    broker.operations = SimpleNamespace(static_config=broker.config)
    entries = {e["name"]: e for e in topic_config_entries(broker, broker.metadata.topics["t"], None, True, False)}  # type: ignore[arg-type]
    ratio = entries["min.cleanable.dirty.ratio"]
    assert (ratio["config_type"], ratio["value"], ratio["config_source"]) == (
        bc.TYPE_DOUBLE,
        "0.25",
        bc.SOURCE_STATIC_BROKER,
    )
    assert [(s["name"], s["value"]) for s in ratio["synonyms"]] == [
        ("log.cleaner.min.cleanable.ratio", "0.25"),
        ("log.cleaner.min.cleanable.ratio", "0.5"),
    ]
    policy = entries["cleanup.policy"]
    assert (policy["config_type"], policy["value"], policy["config_source"]) == (
        bc.TYPE_LIST,
        "compact",
        bc.SOURCE_TOPIC,
    )
    assert [s["name"] for s in policy["synonyms"]] == ["cleanup.policy", "log.cleanup.policy"]
    expected = {
        "delete.retention.ms": (bc.TYPE_LONG, "86400000", "log.cleaner.delete.retention.ms"),
        "min.compaction.lag.ms": (bc.TYPE_LONG, "0", "log.cleaner.min.compaction.lag.ms"),
        "max.compaction.lag.ms": (bc.TYPE_LONG, str(LONG_MAX), "log.cleaner.max.compaction.lag.ms"),
    }
    for name, (kind, value, synonym) in expected.items():
        entry = entries[name]
        assert (entry["config_type"], entry["value"], entry["config_source"]) == (kind, value, bc.SOURCE_DEFAULT)
        assert entry["synonyms"] == [{"name": synonym, "value": value, "source": bc.SOURCE_DEFAULT}]


# --- broker configs --------------------------------------------------------------------------------


def test_cleaner_broker_config_defaults() -> None:
    config = load_config(environ={})
    cleaner = config.cleaner_config()
    assert cleaner == CleanerConfig()
    assert (cleaner.enable, cleaner.threads, cleaner.backoff_ms) == (True, 1, 15000)
    assert cleaner.dedupe_buffer_size == DEFAULT_DEDUPE_BUFFER_SIZE == 32 * 1024 * 1024
    assert cleaner.io_buffer_size == 524288 and cleaner.dedupe_buffer_load_factor == 0.9
    assert cleaner.io_max_bytes_per_second == DOUBLE_MAX
    # ~128 bytes a key in a Python dict: size / threads / 128 x load factor.
    assert cleaner.max_map_entries == 32 * 1024 * 1024 // 128 * 9 // 10
    assert dataclasses.replace(cleaner, threads=2).max_map_entries == cleaner.max_map_entries // 2
    assert cleaner.io_buffer_per_cleaner == 262144


def test_cleaner_broker_configs_load_from_any_source(tmp_path: Any) -> None:
    path = tmp_path / "server.properties"
    path.write_text("log.cleaner.backoff.ms=50\nlog.cleaner.io.max.bytes.per.second=1e6\n")
    config = load_config(
        str(path),
        environ={"DISKLESS_LOG_CLEANER_THREADS": "2"},
        overrides={"log.cleaner.enable": "false", "log.cleaner.dedupe.buffer.size": "8388608"},
    )
    assert config.cleaner_config() == CleanerConfig(
        enable=False, threads=2, dedupe_buffer_size=8388608, io_max_bytes_per_second=1e6, backoff_ms=50
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("log.cleaner.threads", "0"),
        ("log.cleaner.threads", "two"),
        ("log.cleaner.dedupe.buffer.size", "1048576"),  # Kafka: at least 1MB per cleaner thread
        ("log.cleaner.io.buffer.size", "-1"),
        ("log.cleaner.io.buffer.load.factor", "nan"),
        ("log.cleaner.io.buffer.load.factor", "0"),  # the map would hold no key
        ("log.cleaner.io.max.bytes.per.second", "fast"),
        ("log.cleaner.backoff.ms", "-1"),
        ("log.cleaner.enable", "yes"),
        ("log.cleaner.min.cleanable.ratio", "2"),
        ("log.cleaner.delete.retention.ms", "-1"),
        ("log.cleaner.max.compaction.lag.ms", "0"),
        ("log.cleanup.policy", "shrink"),
    ],
)
def test_bad_cleaner_broker_configs_stop_the_broker(name: str, value: str) -> None:
    with pytest.raises(ConfigError):
        load_config(environ={}, overrides={name: value})


def test_broker_log_defaults_are_checked_together() -> None:
    """LogConfig.validateBrokerLogConfigValues at startup; and a default topic that would be a
    compacted diskless one (every topic created without overrides refused) stops the broker too."""
    with pytest.raises(ConfigError, match="conflict topic config setting"):
        load_config(
            environ={},
            overrides={"log.cleaner.min.compaction.lag.ms": "10", "log.cleaner.max.compaction.lag.ms": "5"},
        )
    with pytest.raises(ConfigError, match="Diskless topics cannot be compacted"):
        load_config(environ={}, overrides={"log.cleanup.policy": "compact", "diskless.enabled": "true"})
    config = load_config(
        environ={},
        overrides={"log.cleanup.policy": "compact,delete", "log.cleaner.min.cleanable.ratio": ".10"},
    )
    assert config.topic_defaults == {"log.cleanup.policy": "compact,delete", "log.cleaner.min.cleanable.ratio": "0.1"}


def test_broker_describe_types_and_dynamic_flags() -> None:
    """Kafka's types; read-only unless Kafka reconfigures it at runtime (all but log.cleaner.enable)."""
    static = load_config(environ={}, overrides={"log.cleaner.backoff.ms": "100"})
    entries = {e.name: e for e in bc.broker_entries(static, {}, 0)}
    expected = {
        "log.cleaner.enable": (bc.TYPE_BOOLEAN, "true", True),
        "log.cleaner.threads": (bc.TYPE_INT, "1", False),
        "log.cleaner.dedupe.buffer.size": (bc.TYPE_LONG, str(DEFAULT_DEDUPE_BUFFER_SIZE), False),
        "log.cleaner.io.buffer.load.factor": (bc.TYPE_DOUBLE, "0.9", False),
        "log.cleaner.io.buffer.size": (bc.TYPE_INT, "524288", False),
        "log.cleaner.io.max.bytes.per.second": (bc.TYPE_DOUBLE, "1.7976931348623157E308", False),
        "log.cleaner.backoff.ms": (bc.TYPE_LONG, "100", False),
        "log.cleaner.delete.retention.ms": (bc.TYPE_LONG, "86400000", False),
        "log.cleaner.min.cleanable.ratio": (bc.TYPE_DOUBLE, "0.5", False),
        "log.cleaner.min.compaction.lag.ms": (bc.TYPE_LONG, "0", False),
        "log.cleaner.max.compaction.lag.ms": (bc.TYPE_LONG, str(LONG_MAX), False),
        "log.cleanup.policy": (bc.TYPE_LIST, "delete", False),
    }
    for name, (kind, value, read_only) in expected.items():
        entry = entries[name]
        assert (entry.config_type, entry.value, entry.read_only) == (kind, value, read_only), name
    assert entries["log.cleaner.backoff.ms"].source == bc.SOURCE_STATIC_BROKER
    assert entries["log.cleaner.threads"].source == bc.SOURCE_DEFAULT
    # The other DOUBLE settings are reported so too (they were STRING).
    assert entries["diskless.s3.hedge.quantile"].config_type == bc.TYPE_DOUBLE


def broker_with_operations() -> FakeBroker:
    broker = FakeBroker()

    async def update_broker_configs(name: str, configs: dict[str, str]) -> bool:
        broker.metadata.broker_configs[name] = dict(configs)
        return True

    broker.backend = SimpleNamespace(update_broker_configs=update_broker_configs)  # type: ignore[attr-defined]
    broker.operations = Operations(broker)  # type: ignore[arg-type,assignment]
    return broker


@pytest.mark.parametrize("resource", ["0", ""])
def test_dynamic_cleaner_configs(resource: str) -> None:
    broker = broker_with_operations()
    changes = [
        ("log.cleaner.threads", OP_SET, "2"),
        ("log.cleaner.backoff.ms", OP_SET, "200"),
        ("log.cleaner.io.max.bytes.per.second", OP_SET, "1e6"),
        ("log.cleaner.min.cleanable.ratio", OP_SET, "0.2"),
    ]
    assert incremental(broker, RESOURCE_BROKER, resource, changes)["error_code"] == ErrorCode.none
    stored = broker.metadata.broker_configs[resource or "default"]
    assert stored == {
        "log.cleaner.threads": "2",
        "log.cleaner.backoff.ms": "200",
        "log.cleaner.io.max.bytes.per.second": "1000000.0",
        "log.cleaner.min.cleanable.ratio": "0.2",
    }
    cleaner = bc.cleaner_config(BrokerConfig(), broker.metadata.broker_configs, 0)
    assert (cleaner.threads, cleaner.backoff_ms, cleaner.io_max_bytes_per_second) == (2, 200, 1e6)
    assert cleaner.dedupe_buffer_size == DEFAULT_DEDUPE_BUFFER_SIZE  # the static value below
    # Refused as Kafka's DynamicBrokerConfig refuses: INVALID_REQUEST, nothing stored.
    for change in [
        ("log.cleaner.enable", OP_SET, "false"),  # not reconfigurable in Kafka
        ("log.cleaner.threads", OP_SET, "0"),
        ("log.cleaner.io.buffer.load.factor", OP_SET, "NaN"),
        ("log.cleaner.dedupe.buffer.size", OP_SET, "1_000"),
        ("log.cleaner.dedupe.buffer.size", OP_SET, "2097152"),  # 1 MiB per thread with 2 threads
        ("log.cleaner.min.compaction.lag.ms", OP_SET, "100"),  # above the max set next
    ]:
        if change[0] == "log.cleaner.min.compaction.lag.ms":
            assert (
                incremental(broker, RESOURCE_BROKER, resource, [("log.cleaner.max.compaction.lag.ms", OP_SET, "50")])[
                    "error_code"
                ]
                == ErrorCode.none
            )
        out = incremental(broker, RESOURCE_BROKER, resource, [change])
        assert out["error_code"] == ErrorCode.invalid_request, change
    assert "log.cleaner.min.compaction.lag.ms" not in broker.metadata.broker_configs[resource or "default"]


def test_cleaner_config_layers() -> None:
    static = BrokerConfig(log_cleaner_backoff_ms=1000, log_cleaner_threads=2)
    dynamic = {"default": {"log.cleaner.backoff.ms": "10"}, "1": {"log.cleaner.backoff.ms": "5"}}
    assert bc.cleaner_config(static, dynamic, 0).backoff_ms == 10
    assert bc.cleaner_config(static, dynamic, 1).backoff_ms == 5
    assert bc.cleaner_config(static, {}, 0) == static.cleaner_config()

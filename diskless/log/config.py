"""Topic-level configuration with Kafka's names, types, defaults and broker synonyms.

``TOPIC_CONFIGS`` is the single table behind CreateTopics validation, Describe/Alter configs
and the ``LogConfig`` that a partition log reads. A topic stores only its overrides; the
effective value is override, else the broker's ``log.*`` synonym, else Kafka's default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

LONG_MAX = 2**63 - 1


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    kind: str  # "long" | "int" | "string" | "boolean" | "list"
    default: Any
    broker_synonym: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    also: tuple[int, ...] = ()  # values allowed outside [minimum, maximum] (gzip's -1, "default")
    doc: str = ""

    def parse(self, raw: str | None) -> Any:
        if raw is None:
            raise ConfigError(f"{self.name}: null is not a valid value")
        raw = raw.strip()
        if self.kind in ("long", "int"):
            try:
                if "_" in raw:  # Python's int() accepts "1_000"; Kafka's Long.parseLong does not
                    raise ValueError(raw)
                value = int(raw)
            except ValueError:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: Not a number") from None
            # Kafka parses with Integer.parseInt / Long.parseLong: beyond the Java type is no number.
            bits = 31 if self.kind == "int" else 63
            if not -(2**bits) <= value < 2**bits:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: out of {self.kind} range")
            if value in self.also:
                return value
            if self.minimum is not None and value < self.minimum:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: must be >= {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: must be <= {self.maximum}")
            return value
        if self.kind == "boolean":
            if raw.lower() not in ("true", "false"):
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: Expected true or false")
            return raw.lower() == "true"
        if self.choices is not None:
            parts = [p.strip() for p in raw.split(",")] if self.kind == "list" else [raw]
            bad = [p for p in parts if p not in self.choices]
            if bad:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: allowed {list(self.choices)}")
        return raw

    def render(self, value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


def _defs(*items: ConfigDef) -> dict[str, ConfigDef]:
    return {d.name: d for d in items}


TOPIC_CONFIGS: dict[str, ConfigDef] = _defs(
    ConfigDef("cleanup.policy", "list", "delete", "log.cleanup.policy", choices=("delete",)),
    ConfigDef(
        "compression.type",
        "string",
        "producer",
        "compression.type",
        choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
    ),
    # KIP-390's levels, used when compression.type makes the broker write batches in that codec.
    ConfigDef("compression.gzip.level", "int", -1, "compression.gzip.level", minimum=1, maximum=9, also=(-1,)),
    ConfigDef("compression.lz4.level", "int", 9, "compression.lz4.level", minimum=1, maximum=17),
    ConfigDef("compression.zstd.level", "int", 3, "compression.zstd.level", minimum=-131072, maximum=22),
    ConfigDef("retention.ms", "long", 604800000, "log.retention.ms", minimum=-1),
    ConfigDef("retention.bytes", "long", -1, "log.retention.bytes"),
    ConfigDef("segment.bytes", "int", 1073741824, "log.segment.bytes", minimum=14),
    ConfigDef("segment.ms", "long", 604800000, "log.roll.ms", minimum=1),
    ConfigDef("segment.index.bytes", "int", 10485760, "log.index.size.max.bytes", minimum=8),
    ConfigDef("index.interval.bytes", "int", 4096, "log.index.interval.bytes", minimum=0),
    ConfigDef("max.message.bytes", "int", 1048588, "message.max.bytes", minimum=0),
    ConfigDef(
        "message.timestamp.type",
        "string",
        "CreateTime",
        "log.message.timestamp.type",
        choices=("CreateTime", "LogAppendTime"),
    ),
    ConfigDef("message.timestamp.before.max.ms", "long", LONG_MAX, "log.message.timestamp.before.max.ms", minimum=0),
    ConfigDef("message.timestamp.after.max.ms", "long", LONG_MAX, "log.message.timestamp.after.max.ms", minimum=0),
    ConfigDef("min.insync.replicas", "int", 1, "min.insync.replicas", minimum=1),
    ConfigDef("unclean.leader.election.enable", "boolean", False, "unclean.leader.election.enable"),
    ConfigDef("file.delete.delay.ms", "long", 60000, "log.segment.delete.delay.ms", minimum=0),
    ConfigDef("flush.messages", "long", LONG_MAX, "log.flush.interval.messages", minimum=1),
    ConfigDef("flush.ms", "long", LONG_MAX, "log.flush.interval.ms", minimum=0),
    ConfigDef("diskless.enabled", "boolean", False, "diskless.enabled"),
)

# Aiven's Inkless spells the switch "diskless.enable"; both names address one setting.
CONFIG_ALIASES = {"diskless.enable": "diskless.enabled"}


def canonical_name(name: str) -> str:
    return CONFIG_ALIASES.get(name, name)


def validate_overrides(raw: Mapping[str, str | None]) -> dict[str, str]:
    """Check and normalise topic overrides; raises ConfigError naming the first bad entry."""
    out: dict[str, str] = {}
    for name, value in raw.items():
        name = canonical_name(name)
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise ConfigError(f"Unknown topic config name: {name}")
        out[name] = definition.render(definition.parse(value))
    return out


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Effective configuration a partition log works with."""

    retention_ms: int = 604800000
    retention_bytes: int = -1
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = LONG_MAX
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False  # read by the controller (cluster/controller.py)
    diskless_enabled: bool = False
    # Durability knobs, as Kafka's UnifiedLog/LogManager read them (partition_log.py).
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    file_delete_delay_ms: int = 60000
    producer_id_expiration_ms: int = 86400000  # the broker's producer.id.expiration.ms

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> LogConfig:
        fields = cls.__dataclass_fields__
        return cls(**{k.replace(".", "_"): v for k, v in values.items() if k.replace(".", "_") in fields})


ValueSource = Callable[[str], str | None]


def effective_values(overrides: Mapping[str, str], broker_value: ValueSource) -> dict[str, tuple[Any, str]]:
    """Every topic config as (value, source) where source is topic, broker or default."""
    out: dict[str, tuple[Any, str]] = {}
    for name, definition in TOPIC_CONFIGS.items():
        if name in overrides:
            out[name] = (definition.parse(overrides[name]), "topic")
            continue
        synonym = broker_value(definition.broker_synonym) if definition.broker_synonym else None
        if synonym is not None:
            out[name] = (definition.parse(synonym), "broker")
        else:
            out[name] = (definition.default, "default")
    return out

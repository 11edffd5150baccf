"""Topic-level configuration with Kafka's names, types, defaults and broker synonyms.

``TOPIC_CONFIGS`` is the single table behind CreateTopics validation, Describe/Alter configs
and the ``LogConfig`` that a partition log reads. A topic stores only its overrides; the
effective value is override, else the broker's ``log.*`` synonym, else Kafka's default.

Values are checked one by one (``ConfigDef.parse``) and then together (``check_combination``):
Kafka's LogConfig.validateValues (``min.compaction.lag.ms`` <= ``max.compaction.lag.ms``) and this
project's rule that a diskless topic is never compacted (its batches live in shared WAL objects,
which a cleaner cannot rewrite per partition; Aiven's Inkless does not support compacted diskless
topics either).

``CleanerConfig`` is the log cleaner's broker-wide settings (Kafka's CleanerConfig), built from the
broker's static and dynamic configuration by ``cluster/broker_configs.cleaner_config``.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

LONG_MAX = 2**63 - 1
DOUBLE_MAX = sys.float_info.max  # Java's Double.MAX_VALUE

CLEANUP_POLICY = "cleanup.policy"
COMPACT = "compact"
DELETE = "delete"
DISKLESS_ENABLED = "diskless.enabled"

# A broker-level value by name (its topic-config synonyms), None when the broker does not set it.
ValueSource = Callable[[str], str | None]


class ConfigError(ValueError):
    pass


# Java's Double.parseDouble grammar (FloatingDecimal.readJavaFormatString): decimal with optional
# exponent and an optional f/F/d/D suffix, NaN, Infinity, or a hexadecimal float. Python's float()
# also takes "inf", "nan", "1_0" and other spellings Java refuses, so the text is matched first.
_JAVA_DECIMAL = re.compile(r"[+-]?(?:NaN|Infinity|(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fFdD]?)", re.ASCII)
_JAVA_HEX = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?\d+[fFdD]?", re.ASCII)


def parse_java_double(text: str) -> float:
    """``text`` as Java's Double.parseDouble reads it (ValueError where Java throws
    NumberFormatException). Surrounding whitespace is ignored, as Java's trim() does."""
    text = text.strip()
    if _JAVA_DECIMAL.fullmatch(text):
        if text[-1] in "fFdD":
            text = text[:-1]
        return float(text)
    if _JAVA_HEX.fullmatch(text):
        if text[-1] in "fFdD":
            text = text[:-1]
        return float.fromhex(text)
    raise ValueError(f"not a Java double: {text!r}")


def render_java_double(value: float) -> str:
    """``value`` as Java's Double.toString writes it (what Kafka's DescribeConfigs shows for a
    DOUBLE): the shortest digits that read back as the value, plain between 10^-3 and 10^7
    ("0.5", "1.0"), else computerized scientific notation ("1.0E-4", "1.7976931348623157E308")."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    # repr() gives the shortest round-tripping digits, as Java's Double.toString does (JDK 19+).
    exact = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exact.exponent, int)
    point = len(exact.digits) + exact.exponent  # value = 0.<digits> x 10^point
    digits = "".join(map(str, exact.digits)).rstrip("0") or "0"
    if 1e-3 <= abs(value) < 1e7:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{sign}{digits}{'0' * (point - len(digits))}.0"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    kind: str  # "long" | "int" | "double" | "string" | "boolean" | "list"
    default: Any
    broker_synonym: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
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
        if self.kind == "double":
            try:
                number = parse_java_double(raw)
            except ValueError:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: Not a number") from None
            # Kafka's Range validator lets NaN through (every comparison with it is false); a NaN
            # ratio or rate would silently disable what it sets, so it is refused here.
            if math.isnan(number):
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: Not a number")
            if self.minimum is not None and number < self.minimum:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: must be >= {self.minimum}")
            if self.maximum is not None and number > self.maximum:
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: must be <= {self.maximum}")
            return number
        if self.kind == "boolean":
            if raw.lower() not in ("true", "false"):
                raise ConfigError(f"Invalid value {raw} for configuration {self.name}: Expected true or false")
            return raw.lower() == "true"
        if self.kind == "list":
            # ConfigDef.parseType: an empty (or blank) value is the empty list; otherwise items are
            # split on commas with the blanks around them dropped, an empty item staying one.
            parts = [p.strip() for p in raw.split(",")] if raw else []
            if self.choices is not None:
                bad = [p for p in parts if p not in self.choices]
                if bad:
                    allowed = list(self.choices)
                    raise ConfigError(f"Invalid value {raw} for configuration {self.name}: allowed {allowed}")
            return ",".join(parts)  # ConfigDef.convertToString of the list
        if self.choices is not None and raw not in self.choices:
            raise ConfigError(f"Invalid value {raw} for configuration {self.name}: allowed {list(self.choices)}")
        return raw

    def render(self, value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return render_java_double(value)
        return str(value)


def _defs(*items: ConfigDef) -> dict[str, ConfigDef]:
    return {d.name: d for d in items}


TOPIC_CONFIGS: dict[str, ConfigDef] = _defs(
    # Kafka 4.0: a list of compact and delete, empty allowed (neither: no retention deletes, as
    # UnifiedLog.deleteOldSegments does without "delete"), duplicates kept as given.
    ConfigDef(CLEANUP_POLICY, "list", DELETE, "log.cleanup.policy", choices=(COMPACT, DELETE)),
    # Compaction (LogConfig / CleanerConfig): read by the log cleaner of classic topics.
    ConfigDef("delete.retention.ms", "long", 86400000, "log.cleaner.delete.retention.ms", minimum=0),
    ConfigDef("min.cleanable.dirty.ratio", "double", 0.5, "log.cleaner.min.cleanable.ratio", minimum=0, maximum=1),
    ConfigDef("min.compaction.lag.ms", "long", 0, "log.cleaner.min.compaction.lag.ms", minimum=0),
    ConfigDef("max.compaction.lag.ms", "long", LONG_MAX, "log.cleaner.max.compaction.lag.ms", minimum=1),
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
    ConfigDef(DISKLESS_ENABLED, "boolean", False, DISKLESS_ENABLED),
)

# Aiven's Inkless spells the switch "diskless.enable"; both names address one setting.
CONFIG_ALIASES = {"diskless.enable": "diskless.enabled"}


def canonical_name(name: str) -> str:
    return CONFIG_ALIASES.get(name, name)


def policy_items(policy: str) -> list[str]:
    """The items of a (parsed) ``cleanup.policy`` value."""
    return [p for p in policy.split(",") if p]


def validate_overrides(
    raw: Mapping[str, str | None],
    previous: Mapping[str, str] | None = None,
    broker_value: ValueSource | None = None,
) -> dict[str, str]:
    """Check and normalise topic overrides; raises ConfigError naming the first bad entry.

    The result is then checked as a whole (``check_topic``) against the broker's synonyms when
    ``broker_value`` is given, else against Kafka's defaults; ``previous`` (the topic's overrides
    before an alteration) only words the refusal of a compacted topic becoming diskless."""
    out: dict[str, str] = {}
    for name, value in raw.items():
        name = canonical_name(name)
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise ConfigError(f"Unknown topic config name: {name}")
        out[name] = definition.render(definition.parse(value))
    check_topic(out, broker_value or _no_broker_value, previous)
    return out


def _no_broker_value(name: str) -> str | None:
    return None


def check_topic(overrides: Mapping[str, str], broker_value: ValueSource, previous: Mapping[str, str] | None) -> None:
    """Check a topic's (valid) overrides together with the broker's synonyms; ConfigError if the
    combination is refused (``check_combination``)."""
    values = {name: value for name, (value, _) in effective_values(overrides, broker_value).items()}
    before = None
    if previous is not None:
        try:
            before = {name: value for name, (value, _) in effective_values(previous, broker_value).items()}
        except ConfigError:
            before = None  # stored by an older version that took it: it only words the refusal
    check_combination(values, before)


def check_combination(values: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> None:
    """Refuse effective topic values that are each valid but not together (ConfigError, which
    the admin APIs answer INVALID_CONFIG). ``before``: the topic's values before an alteration."""
    min_lag, max_lag = values["min.compaction.lag.ms"], values["max.compaction.lag.ms"]
    if min_lag > max_lag:
        # Kafka's LogConfig.validateValues, word for word.
        raise ConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > max.compaction.lag.ms ({max_lag})"
        )
    if values[DISKLESS_ENABLED] and COMPACT in policy_items(values[CLEANUP_POLICY]):
        policy = values[CLEANUP_POLICY]
        if before is not None and not before[DISKLESS_ENABLED] and COMPACT in policy_items(before[CLEANUP_POLICY]):
            raise ConfigError(
                f"A compacted topic (cleanup.policy={policy}) cannot become diskless: diskless topics cannot be "
                "compacted. Set cleanup.policy=delete with diskless.enabled=true, or keep the topic classic."
            )
        raise ConfigError(
            f"Diskless topics cannot be compacted: cleanup.policy={policy} is not allowed with "
            "diskless.enabled=true. Create a classic topic (diskless.enabled=false) for compaction."
        )


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
    # Compaction (classic topics only: check_combination refuses it for diskless ones). The policy
    # is normalised in __post_init__: "delete", "compact", "compact,delete", or "" for neither.
    cleanup_policy: str = DELETE
    delete_retention_ms: int = 86400000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    # Durability knobs, as Kafka's UnifiedLog/LogManager read them (partition_log.py).
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    file_delete_delay_ms: int = 60000
    producer_id_expiration_ms: int = 86400000  # the broker's producer.id.expiration.ms

    def __post_init__(self) -> None:
        # One spelling per policy, whatever order or repetition the topic's value has (Kafka
        # keeps the list as given; only whether it contains each item matters, as in LogConfig).
        items = set(policy_items(self.cleanup_policy))
        object.__setattr__(self, "cleanup_policy", ",".join(p for p in (COMPACT, DELETE) if p in items))

    @property
    def compact(self) -> bool:
        """The log cleaner keeps only the latest record of each key (and drops tombstones after
        ``delete.retention.ms``); produce refuses records without a key (Kafka's LogValidator)."""
        return COMPACT in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        """retention.ms and retention.bytes delete old segments (UnifiedLog.deleteOldSegments);
        without it only the log start offset (DeleteRecords) removes data."""
        return DELETE in self.cleanup_policy.split(",")

    @property
    def max_segment_ms(self) -> int:
        """How long a segment may stay active: a compacted log rolls by max.compaction.lag.ms too,
        so the cleaner (which never cleans the active segment) can honour it (LogConfig.maxSegmentMs)."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> LogConfig:
        fields = cls.__dataclass_fields__
        return cls(**{k.replace(".", "_"): v for k, v in values.items() if k.replace(".", "_") in fields})


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


# --- the log cleaner's broker-wide settings ----------------------------------------------------

# Bytes one entry of a cleaner's key -> offset map costs in CPython: a dict slot, a 16-byte key
# digest (bytes object) and an int offset measured 123-133 bytes with tracemalloc (the spread is
# the dict's power-of-two table). Kafka's SkimpyOffsetMap needs 24 (a 16-byte MD5 and an 8-byte
# offset in one ByteBuffer), so the same log.cleaner.dedupe.buffer.size holds ~5x fewer keys here.
DEDUPE_ENTRY_BYTES = 128
# Kafka's default is 128 MiB, allocated up front; here the map grows only as large as the keys of
# the dirty section being cleaned, up to the bound. 32 MiB (~230k keys per pass at load factor
# 0.9) keeps a full map within the project's 300 MB RSS budget next to the 96 MiB
# diskless.cache.max.bytes and the 64 MiB diskless.produce.buffer.max.bytes; a pass that cannot
# hold every dirty key cleans the segments whose keys fit and leaves the rest to the next pass,
# as Kafka's cleaner does.
DEFAULT_DEDUPE_BUFFER_SIZE = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The log cleaner's settings, as Kafka's CleanerConfig (built per broker, with its dynamic
    values, by ``cluster/broker_configs.cleaner_config``)."""

    enable: bool = True  # log.cleaner.enable (static)
    threads: int = 1  # log.cleaner.threads: logs cleaned at once
    dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE  # log.cleaner.dedupe.buffer.size, all cleaners together
    dedupe_buffer_load_factor: float = 0.9  # log.cleaner.io.buffer.load.factor
    io_buffer_size: int = 512 * 1024  # log.cleaner.io.buffer.size: read/write buffers, all cleaners
    io_max_bytes_per_second: float = DOUBLE_MAX  # log.cleaner.io.max.bytes.per.second: reads + writes
    backoff_ms: int = 15000  # log.cleaner.backoff.ms: sleep when no log is cleanable

    @property
    def max_map_entries(self) -> int:
        """Keys one cleaner's offset map may hold in a pass: its share of the dedupe buffer over
        ``DEDUPE_ENTRY_BYTES``, times the load factor (Kafka: slots x load factor)."""
        return int(
            self.dedupe_buffer_size // max(self.threads, 1) // DEDUPE_ENTRY_BYTES * self.dedupe_buffer_load_factor
        )

    @property
    def io_buffer_per_cleaner(self) -> int:
        """Each cleaner's read (and write) buffer: Kafka gives each thread io.buffer.size / threads / 2."""
        return self.io_buffer_size // max(self.threads, 1) // 2

    def validate(self) -> None:
        """Kafka's startup checks (KafkaConfig, LogCleaner): ConfigError if the cleaner could not run."""
        if self.threads < 1:
            raise ConfigError("log.cleaner.threads must be at least 1")
        if self.io_buffer_size < 0:
            raise ConfigError(f"Invalid value {self.io_buffer_size} for configuration log.cleaner.io.buffer.size")
        if self.backoff_ms < 0:
            raise ConfigError(f"Invalid value {self.backoff_ms} for configuration log.cleaner.backoff.ms")
        if self.dedupe_buffer_size // self.threads <= 1024 * 1024:
            raise ConfigError("log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread.")
        if self.max_map_entries < 1:
            raise ConfigError(
                "offset map is too small to fit in even a single message, so log cleaning will never make "
                "progress. You can increase log.cleaner.dedupe.buffer.size or decrease log.cleaner.threads"
            )

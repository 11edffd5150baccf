"""Broker configs as DescribeConfigs reports them, and the dynamic ones (sans-IO).

Every broker property has Kafka's config type (INT, LONG, BOOLEAN, LIST, PASSWORD...), is
read-only unless Kafka lets it change at runtime, and has a source: a dynamic per-broker value
(``IncrementalAlterConfigs`` on resource ``<node id>``), a dynamic cluster-wide default (resource
``""``), the static configuration (file, environment, flags), or the built-in default. An unset
value is null, not ''; passwords are never shown.

Dynamic values live in the metadata store (``broker-configs/<node id>`` and
``broker-configs/default``); a broker lays them over its static configuration
(``BrokerConfig.topic_defaults`` and fields), most specific first, as Kafka's DynamicBrokerConfig.
The settings that are dynamic here are those Kafka allows at runtime and this broker honours at
runtime: the broker-level synonyms of topic configs (``log.retention.ms``, ``message.max.bytes``,
...: Kafka's DynamicLogConfig), the leader's replication throttle, the connection limits
(``max.connections``, ``max.connections.per.ip(.overrides)``: Kafka's SocketServer
reconfigurables, per broker or cluster-wide; they apply to connections accepted afterwards), and
the log cleaner's settings but ``log.cleaner.enable`` (Kafka's LogCleaner.ReconfigurableConfigs;
the cleaner reads them through ``cleaner_config`` at each pass).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from diskless.broker.connection_quotas import INT_MAX, LimitError, parse_overrides
from diskless.config import SECRET_PROPERTIES, BrokerConfig
from diskless.log.config import (
    TOPIC_CONFIGS,
    CleanerConfig,
    ConfigDef,
    ConfigError,
    check_combination,
    effective_values,
    parse_java_double,
    render_java_double,
)

# DescribeConfigs ConfigSource and ConfigType codes (Kafka's DescribeConfigsResponse).
SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST, TYPE_PASSWORD = 1, 2, 3, 5, 6, 7, 9
KIND_TYPES = {
    "boolean": TYPE_BOOLEAN,
    "string": TYPE_STRING,
    "int": TYPE_INT,
    "long": TYPE_LONG,
    "double": TYPE_DOUBLE,
    "list": TYPE_LIST,
}

DEFAULT_RESOURCE = "default"  # the store's name for the cluster-wide default (resource name "")

# Kafka declares these ".ms"-style settings as INT; other integer ".ms" settings are LONG.
_INT_DURATIONS = {
    "broker.session.timeout.ms",
    "replica.fetch.wait.max.ms",
    "group.initial.rebalance.delay.ms",
    "group.min.session.timeout.ms",
    "group.max.session.timeout.ms",
    "group.consumer.session.timeout.ms",
    "group.consumer.heartbeat.interval.ms",
    "transaction.max.timeout.ms",
}
_LONGS = {
    "diskless.cache.max.bytes",
    "diskless.cache.lagging.max.bytes",
    "diskless.produce.buffer.max.bytes",
    "diskless.wal.max.bytes",
    "queued.max.request.bytes",  # LONG in Kafka too
    "log.cleaner.dedupe.buffer.size",
}
_LISTS = {"listeners", "advertised.listeners", "log.dirs", "group.consumer.assignors", "sasl.enabled.mechanisms"}
_SYNONYMS = {d.broker_synonym: d for d in TOPIC_CONFIGS.values() if d.broker_synonym}

# Broker properties (not topic synonyms) that may change at runtime, with their parsers.
DYNAMIC_BROKER_FIELDS: dict[str, str] = {
    # Honoured by leaders for replicas a reassignment adds (broker/operations.py); the follower
    # side (follower.replication.throttled.rate) is not implemented, so it is not offered.
    "leader.replication.throttled.rate": "long",
    # Fields of BrokerConfig too (their static value is the next layer); the server's quotas take
    # them when they change (Operations.apply_dynamic_configs).
    "max.connections": "int",
    "max.connections.per.ip": "int",
    "max.connections.per.ip.overrides": "overrides",
    # The log cleaner's (LogCleaner.ReconfigurableConfigs; not log.cleaner.enable): read by the
    # cleaner at each pass (cleaner_config).
    "log.cleaner.threads": "int",
    "log.cleaner.dedupe.buffer.size": "long",
    "log.cleaner.io.buffer.load.factor": "double",
    "log.cleaner.io.buffer.size": "int",
    "log.cleaner.io.max.bytes.per.second": "double",
    "log.cleaner.backoff.ms": "long",
}
_DYNAMIC_TYPES = {"long": TYPE_LONG, "int": TYPE_INT, "double": TYPE_DOUBLE, "overrides": TYPE_STRING}
# Lower bounds other than 0 (LogCleaner.validateReconfiguration: "at least 1").
_DYNAMIC_MINIMUM = {"log.cleaner.threads": 1}


def is_sensitive(name: str) -> bool:
    """Answered as null (DescribeConfigs): every credential, the S3 access key and etcd user too."""
    return "password" in name or "secret" in name or name in SECRET_PROPERTIES or name == "metadata.etcd.username"


def config_type(name: str, value: Any) -> int:
    if is_sensitive(name):
        return TYPE_PASSWORD
    if name in _SYNONYMS:
        return KIND_TYPES[_SYNONYMS[name].kind]
    if name in _LISTS:
        return TYPE_LIST
    if isinstance(value, bool):
        return TYPE_BOOLEAN
    if isinstance(value, float):
        return TYPE_DOUBLE
    if isinstance(value, int):
        if name in _LONGS or (name.endswith(".ms") and name not in _INT_DURATIONS):
            return TYPE_LONG
        return TYPE_INT
    return TYPE_STRING


def synonym_definition(name: str) -> ConfigDef | None:
    """The topic config a broker-level synonym stands for."""
    return _SYNONYMS.get(name)


def is_dynamic(name: str) -> bool:
    return name in _SYNONYMS or name in DYNAMIC_BROKER_FIELDS


def validate_dynamic(updates: Mapping[str, str | None]) -> dict[str, str | None]:
    """Check values for dynamic broker configs and normalise them; None deletes.

    A refusal is INVALID_REQUEST, not INVALID_CONFIG: Kafka's ConfigAdminManager turns the
    ConfigException of DynamicBrokerConfig.validate (a static config, a bad value) into an
    InvalidRequestException, and keeps it so for compatibility (KAFKA-13609)."""
    out: dict[str, str | None] = {}
    for name, raw in updates.items():
        if not is_dynamic(name):
            raise BrokerConfigError(ErrorCode.invalid_request, f"Cannot update these configs dynamically: Set({name})")
        if raw is None:
            out[name] = None
            continue
        try:
            if name in _SYNONYMS:
                definition = _SYNONYMS[name]
                out[name] = definition.render(definition.parse(raw))
            elif DYNAMIC_BROKER_FIELDS[name] == "overrides":
                parse_overrides(raw)
                out[name] = raw.strip()
            elif DYNAMIC_BROKER_FIELDS[name] == "double":
                number = parse_java_double(raw)
                if number != number:  # NaN: refused as at startup (diskless/config.py)
                    raise ValueError(raw)
                out[name] = render_java_double(number)
            else:
                if "_" in raw:  # Python's int() takes "1_000", Java's parseLong does not
                    raise ValueError(raw)
                value = int(raw.strip())
                if value < _DYNAMIC_MINIMUM.get(name, 0) or (DYNAMIC_BROKER_FIELDS[name] == "int" and value > INT_MAX):
                    raise ValueError(raw)
                out[name] = str(value)
        except (ConfigError, ValueError, LimitError):
            message = f"Invalid value {raw} for configuration {name}"
            raise BrokerConfigError(ErrorCode.invalid_request, message) from None
    return out


class BrokerConfigError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_dynamic_combination(static: BrokerConfig, dynamic: Mapping[str, Mapping[str, str]], node_id: int) -> None:
    """The broker's topic defaults and cleaner settings once ``dynamic`` is in force, checked
    together as at startup (Kafka's DynamicLogConfig / LogCleaner.validateReconfiguration run
    LogConfig.validateBrokerLogConfigValues and the cleaner's checks): INVALID_REQUEST if refused."""
    defaults = layered_topic_defaults(static, dynamic, node_id)
    values = {name: value for name, (value, _) in effective_values({}, defaults.get).items()}
    try:
        check_combination(values)
        cleaner_config(static, dynamic, node_id).validate()
    except ConfigError as exc:
        raise BrokerConfigError(ErrorCode.invalid_request, str(exc)) from None


def cleaner_config(static: BrokerConfig, dynamic: Mapping[str, Mapping[str, str]], node_id: int) -> CleanerConfig:
    """The log cleaner's settings on broker ``node_id``: dynamic values (per broker, then the
    cluster default) over the static ones. The cleaner asks at each pass, so a change applies
    from its next pass on, as Kafka's LogCleaner.reconfigure restarts its threads."""

    def value(name: str) -> str:
        return dynamic_field(static, dynamic, node_id, name)

    return CleanerConfig(
        enable=static.log_cleaner_enable,
        threads=int(value("log.cleaner.threads")),
        dedupe_buffer_size=int(value("log.cleaner.dedupe.buffer.size")),
        dedupe_buffer_load_factor=parse_java_double(value("log.cleaner.io.buffer.load.factor")),
        io_buffer_size=int(value("log.cleaner.io.buffer.size")),
        io_max_bytes_per_second=parse_java_double(value("log.cleaner.io.max.bytes.per.second")),
        backoff_ms=int(value("log.cleaner.backoff.ms")),
    )


def dynamic_field(static: BrokerConfig, dynamic: Mapping[str, Mapping[str, str]], node_id: int, name: str) -> str:
    """A dynamic BrokerConfig field's effective raw value: per-broker, cluster default, static."""
    value = dynamic_value(dynamic, node_id, name)
    if value is not None:
        return value
    return str(getattr(static, next(f.name for f in dataclasses.fields(static) if f.metadata.get("property") == name)))


def layered_topic_defaults(
    static: BrokerConfig, dynamic: Mapping[str, Mapping[str, str]], node_id: int
) -> dict[str, str]:
    """The broker's topic-config synonyms with dynamic values laid over the static ones."""
    merged = dict(static.topic_defaults)
    for layer in (dynamic.get(DEFAULT_RESOURCE, {}), dynamic.get(str(node_id), {})):
        merged.update({k: v for k, v in layer.items() if k in _SYNONYMS})
    return merged


def dynamic_value(dynamic: Mapping[str, Mapping[str, str]], node_id: int, name: str) -> str | None:
    """A dynamic broker field's value: per-broker, else cluster default, else None."""
    for layer in (dynamic.get(str(node_id), {}), dynamic.get(DEFAULT_RESOURCE, {})):
        if name in layer:
            return layer[name]
    return None


@dataclass(frozen=True)
class Entry:
    name: str
    value: str | None
    source: int
    config_type: int
    read_only: bool
    sensitive: bool
    synonyms: list[tuple[str, str | None, int]]
    doc: str | None


def _render(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return render_java_double(value)  # as Kafka shows a DOUBLE: "1.7976931348623157E308"
    return str(value)


def broker_entries(static: BrokerConfig, dynamic: Mapping[str, Mapping[str, str]], node_id: int) -> Iterator[Entry]:
    """Every config of broker ``node_id``: its fields, the topic-config synonyms and the dynamic
    broker settings. A field is static (not default) when its value differs from the default."""
    own = dynamic.get(str(node_id), {})
    cluster = dynamic.get(DEFAULT_RESOURCE, {})
    defaults = BrokerConfig()
    seen: set[str] = set()
    for f in dataclasses.fields(static):
        name = f.metadata.get("property")
        if name is None or name in _SYNONYMS:
            continue
        seen.add(name)
        value = getattr(static, f.name)
        default = _render(getattr(defaults, f.name))
        is_set = value != getattr(defaults, f.name)
        chain = []
        if name in DYNAMIC_BROKER_FIELDS:
            chain += [(name, own[name], SOURCE_DYNAMIC_BROKER)] if name in own else []
            chain += [(name, cluster[name], SOURCE_DYNAMIC_DEFAULT)] if name in cluster else []
        chain += [(name, _render(value), SOURCE_STATIC_BROKER)] if is_set else []
        chain.append((name, default, SOURCE_DEFAULT))
        yield _entry(name, config_type(name, value), chain, f.metadata.get("doc") or None)
    for name, definition in sorted(_SYNONYMS.items()):
        if name in seen:
            continue
        seen.add(name)
        chain = []
        if name in own:
            chain.append((name, own[name], SOURCE_DYNAMIC_BROKER))
        if name in cluster:
            chain.append((name, cluster[name], SOURCE_DYNAMIC_DEFAULT))
        if name in static.topic_defaults:
            chain.append((name, static.topic_defaults[name], SOURCE_STATIC_BROKER))
        chain.append((name, definition.render(definition.default), SOURCE_DEFAULT))
        yield _entry(name, KIND_TYPES[definition.kind], chain, definition.doc or None)
    for name in sorted(DYNAMIC_BROKER_FIELDS):
        if name in seen:
            continue
        chain = []
        if name in own:
            chain.append((name, own[name], SOURCE_DYNAMIC_BROKER))
        if name in cluster:
            chain.append((name, cluster[name], SOURCE_DYNAMIC_DEFAULT))
        # Kafka's default for the throttles: Long.MAX_VALUE, i.e. unthrottled.
        chain.append((name, str(2**63 - 1), SOURCE_DEFAULT))
        yield _entry(name, TYPE_LONG, chain, None)


def default_entries(dynamic: Mapping[str, Mapping[str, str]]) -> Iterator[Entry]:
    """The cluster-wide dynamic defaults (DescribeConfigs of broker resource "")."""
    for name, value in sorted(dynamic.get(DEFAULT_RESOURCE, {}).items()):
        kind = KIND_TYPES[_SYNONYMS[name].kind] if name in _SYNONYMS else _DYNAMIC_TYPES[DYNAMIC_BROKER_FIELDS[name]]
        yield _entry(name, kind, [(name, value, SOURCE_DYNAMIC_DEFAULT)], None)


def _entry(name: str, kind: int, chain: list[tuple[str, str | None, int]], doc: str | None) -> Entry:
    sensitive = is_sensitive(name)
    top_value, top_source = chain[0][1], chain[0][2]
    if sensitive:
        chain = [(n, None, s) for n, _, s in chain]
        top_value = None
    return Entry(name, top_value, top_source, kind, not is_dynamic(name), sensitive, chain, doc)

"""Config APIs: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, for topics and brokers.

Topics: every topic config with its effective value and where it comes from (the topic's override,
the broker's dynamic or static synonym, Kafka's default), its type and, on request, the synonym
chain and documentation. Brokers (``cluster/broker_configs.py``): every broker property with
Kafka's type, read-only flag, source and synonyms, null when unset, passwords hidden; resource
``""`` is the cluster-wide dynamic default. Only configs Kafka lets change at runtime can be
altered on a broker; they are stored in the metadata store and every broker lays them over its
static configuration (``operations.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from diskless.cluster import broker_configs as bc
from diskless.cluster.metadata import MetadataError, TopicMetadata, validate_topic_name
from diskless.log.config import TOPIC_CONFIGS, ConfigError, canonical_name, check_topic, effective_values
from diskless.protocol import messages as m

from .api_base import OP_APPEND, OP_DELETE, OP_SET, OP_SUBTRACT, RESOURCE_BROKER, RESOURCE_TOPIC, ApiFamily

if TYPE_CHECKING:
    from .broker import Broker


def synonym_layers(broker: Broker, synonym: str) -> list[tuple[str, int]]:
    """The values a broker-level synonym has, most specific first, with their sources."""
    dynamic = broker.metadata.broker_configs
    layers = []
    own = dynamic.get(str(broker.node_id), {})
    if synonym in own:
        layers.append((own[synonym], bc.SOURCE_DYNAMIC_BROKER))
    cluster = dynamic.get(bc.DEFAULT_RESOURCE, {})
    if synonym in cluster:
        layers.append((cluster[synonym], bc.SOURCE_DYNAMIC_DEFAULT))
    static = broker.operations.static_config.topic_defaults
    if synonym in static:
        layers.append((static[synonym], bc.SOURCE_STATIC_BROKER))
    return layers


def topic_config_entries(
    broker: Broker, topic: TopicMetadata, keys: Iterable[str] | None, synonyms: bool, documentation: bool
) -> list[dict[str, Any]]:
    wanted = None if not keys else {canonical_name(k) for k in keys}  # empty: all, as Kafka
    out = []
    for name, (value, source) in effective_values(topic.configs, broker.config.broker_value).items():
        if wanted is not None and name not in wanted:
            continue
        definition = TOPIC_CONFIGS[name]
        chain: list[dict[str, Any]] = []
        if name in topic.configs:
            chain.append({"name": name, "value": topic.configs[name], "source": bc.SOURCE_TOPIC})
        synonym = definition.broker_synonym
        if synonym:
            chain += [{"name": synonym, "value": v, "source": s} for v, s in synonym_layers(broker, synonym)]
        chain.append(
            {"name": synonym or name, "value": definition.render(definition.default), "source": bc.SOURCE_DEFAULT}
        )
        out.append(
            {
                "name": name,
                "value": definition.render(value),
                "read_only": False,
                "config_source": chain[0]["source"] if source != "default" else bc.SOURCE_DEFAULT,
                "is_default": source == "default",
                "is_sensitive": False,
                "config_type": bc.KIND_TYPES[definition.kind],
                "documentation": definition.doc if documentation else None,
                "synonyms": chain if synonyms else [],
            }
        )
    return out


def check_with_broker_defaults(
    broker: Broker, overrides: Mapping[str, str], previous: Mapping[str, str] | None = None
) -> None:
    """A topic's valid overrides checked together with this broker's topic defaults (its
    ``log.*`` synonyms, dynamic ones included), as Kafka's controller validates the merged
    config: INVALID_CONFIG for a compacted diskless topic or min.compaction.lag.ms above
    max.compaction.lag.ms. The metadata checks the overrides against Kafka's defaults only; here
    a default such as ``log.cleanup.policy=compact`` or ``diskless.enabled=true`` counts too."""
    try:
        check_topic(overrides, broker.config.broker_value, previous)
    except ConfigError as exc:
        raise MetadataError(ErrorCode.invalid_config, str(exc)) from None


def _refuse_unclear(configs: Any, names: list[str], needs_value: Callable[[Any], bool]) -> None:
    """Kafka's ConfigAdminManager.preprocess: a key twice, or a null value where one is needed
    (it would delete the setting), is INVALID_REQUEST."""
    if len(set(names)) != len(names):
        raise MetadataError(ErrorCode.invalid_request, "Error due to duplicate config keys")
    for c in configs:
        if c.value is None and needs_value(c):
            raise MetadataError(ErrorCode.invalid_request, f"Null value not supported for : {c.name}")


def _illegal_topic_name(name: str) -> MetadataError | None:
    """Why ``name`` can never be a topic, or None. Kafka's ConfigHelper runs Topic.validate before
    looking a topic resource up, so an illegal name is INVALID_TOPIC_EXCEPTION, not the retriable
    UNKNOWN_TOPIC_OR_PARTITION a client would keep asking again about."""
    try:
        validate_topic_name(name)
    except MetadataError as exc:
        return exc
    return None


class ConfigApis(ApiFamily):
    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_DESCRIBE_CONFIGS: self.describe_configs,
            m.API_ALTER_CONFIGS: self.alter_configs,
            m.API_INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
        }

    def _broker_entries(
        self, resource: str, keys: Iterable[str] | None, synonyms: bool, documentation: bool
    ) -> list[dict[str, Any]]:
        wanted = None if not keys else set(keys)  # empty: all, as Kafka
        dynamic = self._meta.broker_configs
        if resource == "":
            entries = bc.default_entries(dynamic)
        else:
            entries = bc.broker_entries(self.broker.operations.static_config, dynamic, self.broker.node_id)
        out = []
        for e in entries:
            if wanted is not None and e.name not in wanted:
                continue
            out.append(
                {
                    "name": e.name,
                    "value": e.value,
                    "read_only": e.read_only,
                    "config_source": e.source,
                    "is_default": e.source == bc.SOURCE_DEFAULT,
                    "is_sensitive": e.sensitive,
                    "config_type": e.config_type,
                    "documentation": e.doc if documentation else None,
                    "synonyms": [{"name": n, "value": v, "source": s} for n, v, s in e.synonyms] if synonyms else [],
                }
            )
        return out

    def describe_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        results = []
        synonyms = getattr(request, "include_synonyms", False)
        documentation = getattr(request, "include_documentation", False)
        for res in request.resources:
            entry: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "error_message": None,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
                "configs": [],
            }
            if res.resource_type == RESOURCE_TOPIC:
                topic = self._meta.topics.get(res.resource_name)
                illegal = _illegal_topic_name(res.resource_name)
                if illegal is not None:
                    entry.update(error_code=illegal.code, error_message=str(illegal))
                elif topic is None:
                    entry.update(
                        error_code=ErrorCode.unknown_topic_or_partition,
                        error_message=f"Topic {res.resource_name} does not exist",
                    )
                else:
                    entry["configs"] = topic_config_entries(
                        self.broker, topic, res.configuration_keys, synonyms, documentation
                    )
            elif res.resource_type == RESOURCE_BROKER and res.resource_name in ("", str(self.broker.node_id)):
                entry["configs"] = self._broker_entries(
                    res.resource_name, res.configuration_keys, synonyms, documentation
                )
            else:
                entry.update(
                    error_code=ErrorCode.invalid_request, error_message=f"Unsupported resource {res.resource_name}"
                )
            results.append(entry)
        return {"throttle_time": 0, "results": results}

    async def alter_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """Legacy AlterConfigs: the given set replaces all of the resource's overrides."""

        def updates(res: Any, current: dict[str, str]) -> dict[str, str | None]:
            canonical = canonical_name if res.resource_type == RESOURCE_TOPIC else str
            _refuse_unclear(res.configs, [canonical(c.name) for c in res.configs], lambda c: True)
            new = {canonical(c.name): c.value for c in res.configs}
            return {**{k: None for k in current if k not in new}, **new}

        return await self._alter(request, updates)

    async def incremental_alter_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        def updates(res: Any, current: dict[str, str]) -> dict[str, str | None]:
            topic = res.resource_type == RESOURCE_TOPIC
            out: dict[str, str | None] = {}
            names = [canonical_name(c.name) if topic else c.name for c in res.configs]
            _refuse_unclear(res.configs, names, lambda c: c.config_operation != OP_DELETE)
            for c in res.configs:
                name = canonical_name(c.name) if topic else c.name
                if c.config_operation == OP_SET:
                    out[name] = c.value
                elif c.config_operation == OP_DELETE:
                    out[name] = None
                elif c.config_operation in (OP_APPEND, OP_SUBTRACT):
                    out[name] = _list_change(name, current, c.value, c.config_operation, topic)
                else:
                    raise MetadataError(ErrorCode.invalid_request, f"unknown config operation {c.config_operation}")
            return out

        return await self._alter(request, updates)

    async def _alter(
        self, request: Any, updates_for: Callable[[Any, dict[str, str]], dict[str, str | None]]
    ) -> dict[str, Any]:
        responses = []
        resources = [(res.resource_type, res.resource_name) for res in request.resources]
        for res in request.resources:
            entry: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "error_message": None,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
            }
            if resources.count((res.resource_type, res.resource_name)) > 1:
                entry.update(
                    error_code=ErrorCode.invalid_request, error_message="Each resource must appear at most once."
                )
                responses.append(entry)
                continue
            try:
                if res.resource_type == RESOURCE_TOPIC:
                    # Kafka's ControllerConfigurationValidator checks the name before the topic's
                    # existence: "" would be a default topic resource, which Kafka does not have.
                    if res.resource_name == "":
                        raise MetadataError(ErrorCode.invalid_request, "Default topic resources are not allowed.")
                    illegal = _illegal_topic_name(res.resource_name)
                    if illegal is not None:
                        raise illegal
                    topic = self._meta.topics.get(res.resource_name)
                    if topic is None:
                        raise MetadataError(
                            ErrorCode.unknown_topic_or_partition, f"Topic {res.resource_name} does not exist"
                        )
                    updates = updates_for(res, dict(topic.configs))
                    # The overrides the broker would store (INVALID_CONFIG as it would refuse them);
                    # one that drops diskless.enabled takes the broker's default, as the broker
                    # pins it, which effective values give too.
                    planned = self._meta.plan_configs(res.resource_name, updates)
                    check_with_broker_defaults(self.broker, planned, topic.configs)
                    await self.broker.alter_topic_configs(res.resource_name, updates, request.validate_only)
                elif res.resource_type == RESOURCE_BROKER:
                    if res.resource_name != "" and not res.resource_name.isdigit():
                        raise MetadataError(ErrorCode.invalid_request, f"Invalid broker id {res.resource_name}")
                    await self.broker.operations.alter_broker_configs(
                        res.resource_name, lambda current, r=res: updates_for(r, current), request.validate_only
                    )
                else:
                    raise MetadataError(ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}")
            except (MetadataError, bc.BrokerConfigError) as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            responses.append(entry)
        return {"throttle_time": 0, "responses": responses}


def _list_change(name: str, current: dict[str, str], raw: str | None, operation: int, topic: bool) -> str:
    """APPEND/SUBTRACT on a LIST config: the new comma-separated value."""
    definition = TOPIC_CONFIGS.get(name) if topic else bc.synonym_definition(name)
    if definition is None or definition.kind != "list":
        raise MetadataError(ErrorCode.invalid_config, f"{name} is not a list config")
    existing = [v for v in (current.get(name) or definition.default).split(",") if v]
    values = [v.strip() for v in (raw or "").split(",") if v.strip()]
    if operation == OP_APPEND:
        existing += [v for v in values if v not in existing]
    else:
        existing = [v for v in existing if v not in values]
    return ",".join(existing)

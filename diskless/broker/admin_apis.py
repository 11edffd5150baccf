"""Topic administration: Create/Delete topics, CreatePartitions, DeleteRecords and the config APIs."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.metadata import MetadataError, TopicMetadata
from diskless.log.config import TOPIC_CONFIGS, canonical_name, effective_values
from diskless.log.partition_log import OffsetOutOfRange
from diskless.protocol import messages as m

from .api_base import (
    CONFIG_TYPES,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    SOURCE_TOPIC,
    ApiFamily,
    _find_partition,
)

log = structlog.get_logger(__name__)


class AdminApis(ApiFamily):
    """Topic and config administration."""

    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            m.API_CREATE_TOPICS: self.create_topics,
            m.API_DELETE_TOPICS: self.delete_topics,
            m.API_CREATE_PARTITIONS: self.create_partitions,
            m.API_DELETE_RECORDS: self.delete_records,
            m.API_DESCRIBE_CONFIGS: self.describe_configs,
            m.API_ALTER_CONFIGS: self.alter_configs,
            m.API_INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
        }

    async def create_topics(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        names = [t.name for t in request.topics]
        results = []
        for item in request.topics:
            entry: dict[str, Any] = {
                "name": item.name,
                "topic_id": None,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": None,
            }
            if names.count(item.name) > 1:
                entry.update(error_code=ErrorCode.invalid_request, error_message=f"Duplicate topic name {item.name}")
                results.append(entry)
                continue
            partitions = item.num_partitions
            rf = item.replication_factor
            assignments = [list(a.broker_ids) for a in sorted(item.assignments, key=lambda a: a.partition_index)]
            if not assignments:
                partitions = self.broker.config.num_partitions if partitions == -1 else partitions
                rf = self.broker.config.default_replication_factor if rf == -1 else rf
            configs = {c.name: c.value for c in item.configs}
            try:
                topic = await self.broker.create_topic(
                    item.name,
                    partitions,
                    rf,
                    configs,
                    assignments,
                    validate_only=getattr(request, "validate_only", False),
                )
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
                results.append(entry)
                continue
            entry.update(
                error_code=ErrorCode.none,
                error_message=None,
                topic_id=uuid.UUID(topic.topic_id),
                num_partitions=len(topic.partitions),
                replication_factor=len(topic.partitions[0].replicas),
                configs=[
                    {
                        "name": c["name"],
                        "value": c["value"],
                        "read_only": False,
                        "config_source": c["config_source"],
                        "is_sensitive": False,
                    }
                    for c in self._topic_config_entries(topic, None, False, False)
                ],
            )
            results.append(entry)
        return {"throttle_time": 0, "topics": results}

    async def delete_topics(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        items: list[tuple[str | None, uuid.UUID | None]] = [(n, None) for n in getattr(request, "topic_names", ())]
        items += [(t.name, t.topic_id) for t in getattr(request, "topics", ())]
        responses = []
        for name, topic_id in items:
            entry: dict[str, Any] = {
                "name": name,
                "topic_id": topic_id,
                "error_code": ErrorCode.none,
                "error_message": None,
            }
            if name is None and topic_id is not None:
                found = self._meta.topic_by_id(str(topic_id))
                if found is None:
                    entry["error_code"] = ErrorCode.unknown_topic_id
                    responses.append(entry)
                    continue
                name = entry["name"] = found.name
            try:
                deleted = await self.broker.delete_topic(name or "")
                entry["topic_id"] = uuid.UUID(deleted.topic_id)
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            responses.append(entry)
        return {"throttle_time": 0, "responses": responses}

    async def create_partitions(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        results = []
        for item in request.topics:
            entry: dict[str, Any] = {"name": item.name, "error_code": ErrorCode.none, "error_message": None}
            assignments = [list(a.broker_ids) for a in item.assignments] if item.assignments else None
            try:
                await self.broker.add_partitions(item.name, item.count, request.validate_only, assignments)
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            results.append(entry)
        return {"throttle_time": 0, "results": results}

    async def delete_records(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        topics = []
        forwards: dict[int, list[tuple[dict[str, Any], str, int, int]]] = {}
        for topic in request.topics:
            parts = []
            diskless = self._is_diskless(topic.name)
            for p in topic.partitions:
                code, plog, _ = self._leader_log(topic.name, p.partition_index)
                entry = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": code}
                local = self.broker.replicas.partitions.get((topic.name, p.partition_index))
                leader = self._forward_target(topic.name, p.partition_index, diskless, None if plog is None else local)
                if plog is None and leader is not None:
                    forwards.setdefault(leader, []).append((entry, topic.name, p.partition_index, p.offset))
                elif plog is not None:
                    target = plog.high_watermark if p.offset == -1 else p.offset
                    try:
                        if target < 0:
                            raise OffsetOutOfRange("negative offset")
                        entry["low_watermark"] = plog.delete_records_before(target)
                    except OffsetOutOfRange:
                        entry["error_code"] = ErrorCode.offset_out_of_range
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        for leader, items in forwards.items():
            body = {
                "topics": [{"name": t, "partitions": [{"partition_index": i, "offset": o}]} for _, t, i, o in items],
                "timeout": 30000,
            }
            answer = await self._forward(leader, m.API_DELETE_RECORDS, 2, body)
            for entry, topic_name, index, _ in items:
                found = _find_partition(answer, topic_name, index, "name", "partition_index")
                if found is None:
                    entry["error_code"] = ErrorCode.not_leader_or_follower
                else:
                    entry.update(error_code=found.error_code, low_watermark=found.low_watermark)
        return {"throttle_time": 0, "topics": topics}

    # --- configs --------------------------------------------------------------------------------

    def _topic_config_entries(
        self, topic: TopicMetadata, keys: Iterable[str] | None, synonyms: bool, documentation: bool
    ) -> list[dict[str, Any]]:
        wanted = None if keys is None else {canonical_name(k) for k in keys}
        out = []
        broker_value = self.broker.config.broker_value
        for name, (value, source) in effective_values(topic.configs, broker_value).items():
            if wanted is not None and name not in wanted:
                continue
            definition = TOPIC_CONFIGS[name]
            code = {"topic": SOURCE_TOPIC, "broker": SOURCE_STATIC_BROKER, "default": SOURCE_DEFAULT}[source]
            entry: dict[str, Any] = {
                "name": name,
                "value": definition.render(value),
                "read_only": False,
                "config_source": code,
                "is_default": source == "default",
                "is_sensitive": False,
                "config_type": CONFIG_TYPES[definition.kind],
                "documentation": definition.doc if documentation else None,
                "synonyms": [],
            }
            if synonyms:
                chain = []
                if name in topic.configs:
                    chain.append({"name": name, "value": topic.configs[name], "source": SOURCE_TOPIC})
                synonym = definition.broker_synonym
                if synonym and broker_value(synonym) is not None:
                    chain.append({"name": synonym, "value": broker_value(synonym), "source": SOURCE_STATIC_BROKER})
                chain.append(
                    {"name": synonym or name, "value": definition.render(definition.default), "source": SOURCE_DEFAULT}
                )
                entry["synonyms"] = chain
            out.append(entry)
        return out

    def _broker_config_entries(self, keys: Iterable[str] | None) -> list[dict[str, Any]]:
        wanted = None if keys is None else set(keys)
        out = []
        for name, value, explicit in self.broker.describe_broker_config():
            if wanted is not None and name not in wanted:
                continue
            out.append(
                {
                    "name": name,
                    "value": value,
                    "read_only": True,
                    "config_source": SOURCE_STATIC_BROKER if explicit else SOURCE_DEFAULT,
                    "is_default": not explicit,
                    "is_sensitive": False,
                    "config_type": 2,
                    "synonyms": [],
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
                if topic is None:
                    entry.update(
                        error_code=ErrorCode.unknown_topic_or_partition,
                        error_message=f"Topic {res.resource_name} does not exist",
                    )
                else:
                    entry["configs"] = self._topic_config_entries(
                        topic, res.configuration_keys, synonyms, documentation
                    )
            elif res.resource_type == RESOURCE_BROKER and res.resource_name in ("", str(self.broker.node_id)):
                entry["configs"] = self._broker_config_entries(res.configuration_keys)
            else:
                entry.update(
                    error_code=ErrorCode.invalid_request, error_message=f"Unsupported resource {res.resource_name}"
                )
            results.append(entry)
        return {"throttle_time": 0, "results": results}

    async def alter_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        """Legacy AlterConfigs: the given set replaces all of a topic's overrides."""

        def updates(res: Any) -> dict[str, str | None]:
            topic = self._meta.topics.get(res.resource_name)
            current = topic.configs if topic else {}
            new = {canonical_name(c.name): c.value for c in res.configs}
            return {**{k: None for k in current if k not in new}, **new}

        return await self._alter(request, updates)

    async def incremental_alter_configs(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        def updates(res: Any) -> dict[str, str | None]:
            topic = self._meta.topics.get(res.resource_name)
            current = topic.configs if topic else {}
            out: dict[str, str | None] = {}
            for c in res.configs:
                name = canonical_name(c.name)
                if c.config_operation == OP_SET:
                    out[name] = c.value
                elif c.config_operation == OP_DELETE:
                    out[name] = None
                elif c.config_operation in (OP_APPEND, OP_SUBTRACT):
                    definition = TOPIC_CONFIGS.get(name)
                    if definition is None or definition.kind != "list":
                        raise MetadataError(ErrorCode.invalid_config, f"{name} is not a list config")
                    existing = [v for v in (current.get(name) or definition.default).split(",") if v]
                    values = [v.strip() for v in (c.value or "").split(",") if v.strip()]
                    if c.config_operation == OP_APPEND:
                        existing += [v for v in values if v not in existing]
                    else:
                        existing = [v for v in existing if v not in values]
                    out[name] = ",".join(existing)
                else:
                    raise MetadataError(ErrorCode.invalid_request, f"unknown config operation {c.config_operation}")
            return out

        return await self._alter(request, updates)

    async def _alter(self, request: Any, updates_for: Callable[[Any], dict[str, str | None]]) -> dict[str, Any]:
        responses = []
        for res in request.resources:
            entry: dict[str, Any] = {
                "error_code": ErrorCode.none,
                "error_message": None,
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
            }
            try:
                if res.resource_type != RESOURCE_TOPIC:
                    raise MetadataError(ErrorCode.invalid_request, "only topic configs can be altered at runtime")
                if res.resource_name not in self._meta.topics:
                    raise MetadataError(
                        ErrorCode.unknown_topic_or_partition, f"Topic {res.resource_name} does not exist"
                    )
                await self.broker.alter_topic_configs(res.resource_name, updates_for(res), request.validate_only)
            except MetadataError as exc:
                entry.update(error_code=exc.code, error_message=str(exc))
            responses.append(entry)
        return {"throttle_time": 0, "responses": responses}

"""An error answer for any request: what a broker sends when a handler fails unexpectedly.

Kafka answers a failed request with its error code in the response rather than dropping the
connection (``AbstractRequest.getErrorResponse``); clients then retry or surface the error per
topic or partition. Where the code goes differs per API: a top-level ``error_code``, one per
topic, per partition, per group, per resource. ``error_response`` derives it from the schemas:
it walks the response type of the request's version and, for every list whose elements carry an
error code somewhere, mirrors the request's matching list (same name, or the renamed pairs in
``_ALIASES``), copying the fields that identify an item (names, ids, partition indexes) and
setting every error code it meets. Lists whose elements carry no error (brokers, members,
records) stay empty.
"""

from __future__ import annotations

import asyncio
from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

from . import messages as m

UNKNOWN_SERVER_ERROR_MESSAGE = "The server experienced an unexpected error when processing the request."

# Response list name -> request list names it answers, where Kafka's schemas renamed them.
_ALIASES: dict[str, tuple[str, ...]] = {
    "responses": ("topic_data", "topics", "topic_names", "resources"),
    "partition_responses": ("partition_data",),
    "results": ("resources", "topics", "groups_names", "creations", "users", "upsertions", "deletions"),
    "filter_results": ("filters",),
    "coordinators": ("coordinator_keys",),
    "groups": ("group_ids",),
    "results_by_topic_v3_and_below": ("v3_and_below_topics",),
    "results_by_partition": ("partitions",),
    "partitions": ("partition_indexes",),
    "replica_election_results": ("topic_partitions",),  # ElectLeaders
    "partition_result": ("partitions",),
    "transaction_states": ("transactional_ids",),  # DescribeTransactions
}

# Fields that say which item an answer is about; everything else an error answer leaves at its
# "unknown" value.
_IDENTITY = frozenset(
    {
        "name",
        "topic",
        "topic_id",
        "topic_name",
        "index",
        "partition",
        "partition_index",
        "partition_id",
        "resource_type",
        "resource_name",
        "group_id",
        "key",
        "producer_id",
        "member_id",
        "group_instance_id",
        "user",
        "transactional_id",
        "entity_type",
        "entity_name",
    }
)
# Lists of identity fields only, answered as the request gave them (AlterClientQuotas' entity).
_COPIED = frozenset({"entity"})

_ANSWERED_TOGETHER = {"upsertions": ("deletions",)}

# Identity fields that the request and the response name differently (Fetch's ``partition``
# is answered as ``partition_index``).
_SAME_AS: dict[str, tuple[str, ...]] = {
    "partition_index": ("partition", "index"),
    "partition": ("partition_index",),
    "index": ("partition_index",),
    "topic": ("name",),
    "name": ("topic",),
    "user": ("name",),
}

# "Unknown" values Kafka uses where kio's schema has no default (-1 offsets, epochs, ids).
_UNKNOWN = {
    "base_offset": -1,
    "high_watermark": -1,
    "offset": -1,
    "timestamp": -1,
    "leader_epoch": -1,
    "end_offset": -1,
    "low_watermark": -1,
    "committed_offset": -1,
    "committed_leader_epoch": -1,
    "generation_id": -1,
    "member_epoch": -1,
    "leader_id": -1,
    "node_id": -1,
    "controller_id": -1,
    "producer_id": -1,
    "producer_epoch": -1,
    "num_partitions": -1,
    "replication_factor": -1,
    "port": -1,
}


def code_for(exc: BaseException) -> ErrorCode:
    """The error code an unexpected failure is answered with: its own Kafka code if it carries
    one (``MetadataError``), REQUEST_TIMED_OUT for a timeout, else UNKNOWN_SERVER_ERROR."""
    code = getattr(exc, "code", None)
    if isinstance(code, ErrorCode):
        return code
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return ErrorCode.request_timed_out
    return ErrorCode.unknown_server_error


def error_response(api_key: int, version: int, request: Any, code: ErrorCode, message: str | None = None) -> dict:
    """A response body (the dict ``messages.encode_response`` takes) answering ``request`` with ``code``."""
    cls = m._response_type(api_key, version)
    text = message
    if api_key == API_ALTER_REPLICA_LOG_DIRS:
        return _alter_replica_log_dirs(request, code)
    if text is None and code == ErrorCode.unknown_server_error:
        text = UNKNOWN_SERVER_ERROR_MESSAGE
    return _fill(cls, request, code, text, top=True)


@cache
def _carries_error(cls: type) -> bool:
    """Whether an entity has an error code field, directly or in a nested entity."""
    for plan in m._plan(cls):
        if plan.kafka_type == "error_code":
            return True
        if plan.entity is not None and _carries_error(plan.entity):
            return True
    return False


def _request_list(request: Any, name: str) -> tuple[str, Any] | None:
    """The request's list answered by the response list ``name``: (its name, its items)."""
    if request is None or not is_dataclass(request):
        return None
    present = {f.name for f in fields(request)}
    for candidate in (name, *_ALIASES.get(name, ())):
        if candidate in present:
            value = getattr(request, candidate)
            if isinstance(value, tuple):
                # AlterUserScramCredentials answers its upsertions and deletions in one list.
                for other in _ANSWERED_TOGETHER.get(candidate, ()):
                    if other in present and isinstance(getattr(request, other), tuple):
                        value = (*value, *getattr(request, other))
                return candidate, value
    return None


def _key_field(cls: type, item: Any) -> str | None:
    """Where a scalar request item (a topic name, a group id, a partition index) goes in ``cls``."""
    want = ("string",) if isinstance(item, str) else ("int32", "int16", "int64")
    for plan in m._plan(cls):
        if plan.name in _IDENTITY and plan.kafka_type in want and not plan.is_tuple:
            return plan.name
    return None


def _fill(cls: type, source: Any, code: ErrorCode, message: str | None, top: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for plan in m._plan(cls):
        if plan.kafka_type == "error_code":
            out[plan.name] = code
        elif plan.name == "error_message" and message is not None:
            out[plan.name] = message
        elif plan.is_tuple and plan.entity is not None:
            out[plan.name] = _fill_list(plan.entity, plan.name, source, code, message)
        elif plan.entity is not None or plan.is_tuple:
            continue  # nested single entities and scalar lists keep their defaults
        elif not top and plan.name in _IDENTITY and (found := _identity(source, plan.name)) is not None:
            out[plan.name] = found[0]
        elif plan.name in _UNKNOWN and not plan.has_default:
            out[plan.name] = _UNKNOWN[plan.name]
    return out


def _fill_list(entity: type, name: str, source: Any, code: ErrorCode, message: str | None) -> list[dict[str, Any]]:
    copied = name in _COPIED
    if not copied and not _carries_error(entity):
        return []
    found = _request_list(source, name)
    if found is None:
        return []
    if copied:
        return [_fill(entity, item, code, message) for item in found[1]]
    items: list[dict[str, Any]] = []
    for item in found[1]:
        if is_dataclass(item):
            items.append(_fill(entity, item, code, message))
            continue
        answer = _fill(entity, None, code, message)
        key = _key_field(entity, item)
        if key is not None:
            answer[key] = item
        items.append(answer)
    return items


API_ALTER_REPLICA_LOG_DIRS = 34


def _alter_replica_log_dirs(request: Any, code: ErrorCode) -> dict[str, Any]:
    """AlterReplicaLogDirs asks per directory and is answered per topic: every partition of every
    directory's topics gets the code (Kafka's AlterReplicaLogDirsRequest.getErrorResponse)."""
    results: dict[str, list[dict[str, Any]]] = {}
    for directory in getattr(request, "dirs", None) or ():
        for topic in directory.topics:
            parts = results.setdefault(topic.name, [])
            parts += [{"partition_index": p, "error_code": code} for p in topic.partitions]
    return {"throttle_time": 0, "results": [{"topic_name": t, "partitions": p} for t, p in results.items()]}


def _identity(source: Any, name: str) -> tuple[Any] | None:
    """The request item's value for the response's identity field ``name``, boxed (it may be None)."""
    if source is None or not is_dataclass(source):
        return None
    present = {f.name for f in fields(source)}
    for candidate in (name, *_SAME_AS.get(name, ())):
        if candidate in present:
            return (getattr(source, candidate),)
    return None

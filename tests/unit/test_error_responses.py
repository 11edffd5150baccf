"""Error answers for every API and version the broker serves: they encode, decode, carry the
error code wherever the response has one, and name every topic, partition, group or resource the
request asked about (so a client can tell which of its items failed)."""

from __future__ import annotations

import datetime
import io
import itertools
import uuid
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from diskless.protocol import error_responses as er
from diskless.protocol import messages as m

ALL_VERSIONS = [(key, v) for key, (lo, hi) in sorted(m.SUPPORTED_VERSIONS.items()) for v in range(lo, hi + 1)]

# Request lists whose items are not answered one by one (the response has no per-item error).
UNANSWERED = {"protocols", "forgotten_topics_data", "assignments", "configs", "states_filter", "topic_partitions"}
UNANSWERED |= {"creations"}  # CreateAcls answers its creations by position, with no names
SCALAR_LISTS = {"topic_names", "groups", "group_ids", "groups_names", "coordinator_keys", "partitions"}
SCALAR_LISTS |= {"partition_indexes"}
IDENTITY = {"name", "topic", "topic_id", "partition", "partition_index", "index", "resource_name", "group_id"}
# Not answered per item asked about: DescribeLogDirs answers per directory (the topics asked about
# are not directories), ListPartitionReassignments with one top-level code (its topics carry none).
TOP_LEVEL_ONLY = {35, 46}


class Sample:
    """Builds a request with two items in every list and a distinct value in every field."""

    def __init__(self) -> None:
        self.counter = itertools.count(100)

    def value(self, plan: Any) -> Any:
        n = next(self.counter)
        match plan.kafka_type:
            case "string":
                return f"s{n}"
            case "bool":
                return True
            case "bytes":
                return b"x"
            case "records":
                return None
            case "uuid":
                return uuid.UUID(int=n)
            case "timedelta_i32" | "timedelta_i64":
                return datetime.timedelta(milliseconds=n)
            case "int8":
                return n % 100
            case "error_code":
                return ErrorCode.none
            case _:
                return n

    def build(self, cls: type) -> Any:
        kwargs: dict[str, Any] = {}
        for plan in m._plan(cls):
            if plan.entity is not None:
                made = [self.build(plan.entity) for _ in range(2)]
                kwargs[plan.name] = tuple(made) if plan.is_tuple else made[0]
            elif plan.is_tuple:
                kwargs[plan.name] = tuple(self.value(plan) for _ in range(2))
            else:
                kwargs[plan.name] = self.value(plan)
        return cls(**kwargs)


def asked_about(entity: Any, inside_list: bool = False) -> set[Any]:
    """Identity values of the items a request asks about (names, ids, partition indexes)."""
    found: set[Any] = set()
    for f in fields(entity):
        value = getattr(entity, f.name)
        if f.name in UNANSWERED:
            continue
        if isinstance(value, tuple):
            for item in value:
                if is_dataclass(item):
                    found |= asked_about(item, inside_list=True)
                elif f.name in SCALAR_LISTS:
                    found.add(item)
        elif is_dataclass(value):
            continue
        elif inside_list and f.name in IDENTITY and value is not None:
            found.add(value)
    return found


def answered(entity: Any) -> tuple[set[Any], list[ErrorCode]]:
    """Every scalar value in a response and every error code it carries."""
    values: set[Any] = set()
    codes: list[ErrorCode] = []
    for f in fields(entity):
        value = getattr(entity, f.name)
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if is_dataclass(item):
                more, more_codes = answered(item)
                values |= more
                codes += more_codes
            elif f.metadata.get("kafka_type") == "error_code":
                codes.append(item)
            elif isinstance(item, str | int | uuid.UUID):
                values.add(item)
    return values, codes


def decode_response(api_key: int, version: int, frame: bytes) -> Any:
    cls = load_response_schema(api_key, version)
    body = memoryview(frame)[8:]  # size, correlation id
    if cls.__flexible__ and api_key != m.API_API_VERSIONS:
        assert body[0] == 0  # no tagged fields in the response header
        body = body[1:]
    entity, size = entity_reader(cls)(body, 0)
    assert size == len(body)
    return entity


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS, ids=[f"{k}v{v}" for k, v in ALL_VERSIONS])
@pytest.mark.parametrize("code", [ErrorCode.unknown_server_error, ErrorCode.request_timed_out])
def test_error_response_for_every_served_api_version(api_key: int, version: int, code: ErrorCode) -> None:
    request = Sample().build(load_request_schema(api_key, version))
    header = m.RequestHeader(api_key, version, 77, "tests")
    body = er.error_response(api_key, version, request, code)
    frame = m.encode_response(header, body)
    assert frame[4:8] == (77).to_bytes(4, "big")
    response = decode_response(api_key, version, frame)
    values, codes = answered(response)
    assert codes, "the error answer carries no error code"
    assert set(codes) == {code}
    missing = set() if api_key in TOP_LEVEL_ONLY else asked_about(request) - values
    assert not missing, f"items the request asked about are absent from the answer: {missing}"


def test_per_partition_answer_mirrors_the_request() -> None:
    request = m.build(
        load_request_schema(m.API_PRODUCE, 9),
        {
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {"name": "a", "partition_data": [{"index": 0, "records": None}, {"index": 3, "records": None}]},
                {"name": "b", "partition_data": [{"index": 1, "records": None}]},
            ],
        },
    )
    body = er.error_response(m.API_PRODUCE, 9, request, ErrorCode.unknown_server_error)
    got = [
        (t["name"], p["index"], p["error_code"], p["base_offset"])
        for t in body["responses"]
        for p in t["partition_responses"]
    ]
    assert got == [
        ("a", 0, ErrorCode.unknown_server_error, -1),
        ("a", 3, ErrorCode.unknown_server_error, -1),
        ("b", 1, ErrorCode.unknown_server_error, -1),
    ]
    assert body["responses"][0]["partition_responses"][0]["error_message"] == er.UNKNOWN_SERVER_ERROR_MESSAGE


def test_code_for_exceptions() -> None:
    from diskless.cluster.metadata import MetadataError

    assert er.code_for(RuntimeError("boom")) == ErrorCode.unknown_server_error
    assert er.code_for(TimeoutError()) == ErrorCode.request_timed_out
    assert er.code_for(MetadataError(ErrorCode.invalid_partitions, "x")) == ErrorCode.invalid_partitions


def test_sample_encodes() -> None:
    """The sample requests themselves are valid entities of their version (guards the test)."""
    from kio.serial import entity_writer

    for api_key, version in ALL_VERSIONS:
        cls = load_request_schema(api_key, version)
        entity_writer(cls)(io.BytesIO(), Sample().build(cls))

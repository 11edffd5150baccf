"""Encoded Metadata answers are reused only for the same request, client and version, while the
cluster metadata's generation holds and for at most MAX_AGE_S; error answers never; a change of
topics or brokers invalidates at once."""

from __future__ import annotations

from typing import Any

import pytest
from kio.index import load_request_schema

from diskless.broker import metadata_cache as mc
from diskless.protocol import messages as m


def request(*names: str) -> Any:
    return m.build(load_request_schema(m.API_METADATA, 12), {"topics": [{"name": n} for n in names]})


def answer(header: m.RequestHeader, code: int = 0) -> tuple[dict[str, Any], bytes]:
    body = {"brokers": [], "controller_id": 1, "topics": [{"error_code": code, "name": "t", "partitions": []}]}
    return body, m.encode_response(header, body)


def test_reused_with_the_callers_correlation_id_until_the_generation_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = mc.MetadataAnswerCache()
    now = [100.0]
    monkeypatch.setattr(mc.time, "monotonic", lambda: now[0])
    first = m.RequestHeader(m.API_METADATA, 12, 7, "client")
    body, frame = answer(first)
    cache.put(first, request("t"), (5, 0), body, frame)
    again = m.RequestHeader(m.API_METADATA, 12, 8, "client")
    reused = cache.get(again, request("t"), (5, 0))
    assert reused == m.encode_response(again, body)
    assert cache.get(again, request("t"), (6, 0)) is not None  # metadata changed, but the answer is that young
    now[0] += mc.MIN_AGE_S * 1.5
    assert cache.get(again, request("t"), (5, 0)) is not None
    assert cache.get(again, request("t"), (6, 0)) is None  # metadata changed
    assert cache.get(again, request("u"), (5, 0)) is None  # another request
    assert cache.get(m.RequestHeader(m.API_METADATA, 11, 8, "client"), request("t"), (5, 0)) is None
    assert cache.get(m.RequestHeader(m.API_METADATA, 12, 8, "other diskless_az=b"), request("t"), (5, 0)) is None


def test_never_older_than_max_age(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = mc.MetadataAnswerCache()
    header = m.RequestHeader(m.API_METADATA, 12, 1, "c")
    now = [100.0]
    monkeypatch.setattr(mc.time, "monotonic", lambda: now[0])
    cache.put(header, request("t"), (1, 0), *answer(header))
    now[0] += mc.MAX_AGE_S / 2
    assert cache.get(header, request("t"), (1, 0)) is not None
    now[0] += mc.MAX_AGE_S
    assert cache.get(header, request("t"), (1, 0)) is None


def test_error_answers_are_not_reused() -> None:
    cache = mc.MetadataAnswerCache()
    header = m.RequestHeader(m.API_METADATA, 12, 1, "c")
    cache.put(header, request("t"), (1, 0), *answer(header, code=3))  # UNKNOWN_TOPIC_OR_PARTITION
    assert cache.get(header, request("t"), (1, 0)) is None


def test_a_change_of_topics_invalidates_even_a_young_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """CreatePartitions then Metadata: the client must see the new partitions, not a 250 ms old answer."""
    cache = mc.MetadataAnswerCache()
    header = m.RequestHeader(m.API_METADATA, 12, 1, "c")
    monkeypatch.setattr(mc.time, "monotonic", lambda: 100.0)
    cache.put(header, request("t"), (5, 2), *answer(header))
    assert cache.get(header, request("t"), (6, 2)) is not None  # leader/ISR churn: forgiven while young
    assert cache.get(header, request("t"), (6, 3)) is None  # a topic changed

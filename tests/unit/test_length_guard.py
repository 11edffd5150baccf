"""The request length guard (protocol/length_guard.py) on arrays of fixed-size entities, which it
steps over in one move per element (a sessionless consumer's Fetch names every partition)."""

from __future__ import annotations

import io
import uuid

import pytest
from fetch_requests import consumer_fetch

from diskless.protocol import messages as m
from diskless.protocol.length_guard import LengthError, check_lengths


def fetch_body(version: int, partitions: int) -> tuple[type, bytes]:
    cls = m._request_type(m.API_FETCH, version)
    out = io.BytesIO()
    m._writer(cls)(out, consumer_fetch(version, "t", uuid.uuid4(), list(range(partitions))))
    return cls, out.getvalue()


@pytest.mark.parametrize("version", [11, 12, 13])
def test_a_thousand_partitions_pass_and_every_truncation_is_refused(version: int) -> None:
    cls, body = fetch_body(version, 1000)
    check_lengths(cls, memoryview(body))
    # Cut anywhere inside the partitions (and the fields after them): refused, never read past.
    for cut in range(len(body) - 1, len(body) - 2000, -7):
        with pytest.raises(LengthError):
            check_lengths(cls, memoryview(body[:cut]))


def test_a_tagged_field_in_a_fixed_size_partition_is_checked() -> None:
    cls, body = fetch_body(12, 1)
    # The body ends: partition's tags, topic's tags, no forgotten topics, empty rack, request's tags.
    assert body[-5:] == b"\x00\x00\x01\x01\x00"
    part_end = len(body) - 5
    # One unknown tagged field claiming 100 bytes that are not there.
    bad = body[:part_end] + b"\x01\x05\x64" + body[part_end + 1 :]
    with pytest.raises(LengthError):
        check_lengths(cls, memoryview(bad))
    # The same field with its 2 bytes present passes (unknown tags are skipped).
    good = body[:part_end] + b"\x01\x05\x02ab" + body[part_end + 1 :]
    check_lengths(cls, memoryview(good))

"""Fetch responses (v4-v13) written straight from the handler's dicts with ``struct``.

A consumer that opens no KIP-227 fetch session (librdkafka's do not) names every partition it is
assigned in every Fetch, and is answered for every one of them, most with nothing to read.
Building a kio entity per partition and walking kio's generic writer cost ~13 µs per partition:
13 ms of a broker's CPU for each answer at 1,000 partitions, paid again whenever an append ends
a long poll. Here one partition with nothing to read is one ``struct.pack`` call, and the
records of the whole answer are copied once (the frame is a single join of the parts).

The bytes are the same as kio's for every field the broker answers with
(tests/unit/test_fetch_response.py checks them against kio for every version). The dicts are the
ones ``messages.encode_response`` takes: keys as in FetchResponse.json, a missing key meaning what
``messages.build`` makes of it (the field's default, else zero or empty).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .response_wire import I32, frame, frame_start, length, milliseconds, string, topic_uuid

__all__ = ["FIRST_VERSION", "LAST_VERSION", "KeptPartitionAnswer", "encode_fetch_response"]

FIRST_VERSION = 4
LAST_VERSION = 13
FLEXIBLE_FROM = 12

_ABORTED = struct.Struct(">qq")
_NO_DIVERGENCE = (-1, -1)


# The fixed fields that open a partition's answer: index, error, high watermark, last stable
# offset, log start offset (v5+).
_HEAD_V4 = struct.Struct(">ihqq")
_HEAD_V5 = struct.Struct(">ihqqq")
# Tagged field 0 (diverging_epoch): tag, size 13, epoch, end offset, the struct's empty tags.
_DIVERGING = struct.Struct(">BBiqB")


def _topic(entry: Mapping[str, Any], version: int, flexible: bool) -> bytes:
    if version >= 13:
        return topic_uuid(entry.get("topic_id")).bytes
    return string(str(entry.get("topic", "")), flexible)


def _quiet_format(version: int, flexible: bool, aborted_null: bool) -> struct.Struct:
    """A partition with nothing to say beyond its offsets, in one ``struct``: the fixed head, an
    empty or null aborted-transactions list, no preferred replica (v11+), empty records, no tags."""
    fmt = ">ihqqq" if version >= 5 else ">ihqq"
    fmt += "B" if flexible else "i"  # aborted transactions: null (-1) or empty (0)
    fmt += "i" if version >= 11 else ""  # preferred read replica -1
    fmt += "BB" if flexible else "i"  # empty records (length 0), then (flexible) no tagged fields
    return struct.Struct(fmt)


_QUIET = {
    (version, aborted_null): _quiet_format(version, version >= FLEXIBLE_FROM, aborted_null)
    for version in range(FIRST_VERSION, LAST_VERSION + 1)
    for aborted_null in (False, True)
}


def _quiet_values(version: int, flexible: bool, aborted_null: bool) -> tuple[int, ...]:
    """What follows the offsets in a ``_QUIET`` struct."""
    if flexible:
        aborted = 0 if aborted_null else 1  # compact lengths are length + 1
        return (aborted, -1, 1, 0) if version >= 11 else (aborted, 1, 0)
    aborted = -1 if aborted_null else 0
    return (aborted, -1, 0) if version >= 11 else (aborted, 0)


_QUIET_TAIL = {key: _quiet_values(key[0], key[0] >= FLEXIBLE_FROM, key[1]) for key in _QUIET}


class KeptPartitionAnswer(Mapping[str, Any]):
    """A partition's answer kept to be sent again and again (broker/idle_fetches.py): read-only,
    so its bytes, written once per Fetch version, stay right for as long as it is reused. At 1,000
    idle partitions a reused answer is then one lookup instead of a partition's encoding."""

    __slots__ = ("_fields", "_wire")

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = dict(fields)
        self._wire: dict[int, bytes] = {}

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"KeptPartitionAnswer({self._fields!r})"

    def wire(self, version: int) -> bytes:
        """The partition's bytes in a Fetch ``version`` answer (written on the first call)."""
        wire = self._wire.get(version)
        if wire is None:
            parts: list[bytes | memoryview] = []
            _partition(self._fields, version, version >= FLEXIBLE_FROM, parts)
            wire = self._wire[version] = b"".join(parts)
        return wire


def _partition(p: Mapping[str, Any], version: int, flexible: bool, out: list[bytes | memoryview]) -> None:
    if type(p) is KeptPartitionAnswer:
        out.append(p.wire(version))
        return
    records = p.get("records", b"")
    aborted = p.get("aborted_transactions", ())
    if (
        records == b""
        and not aborted
        and p.get("preferred_read_replica", -1) == -1
        and p.get("diverging_epoch") is None
    ):
        # A tail consumer's usual partition (most of a sessionless Fetch's): one pack.
        key = (version, aborted is None)
        offsets = (
            p["partition_index"],
            p.get("error_code", 0),
            p.get("high_watermark", 0),
            p.get("last_stable_offset", -1),
        )
        if version >= 5:
            offsets += (p.get("log_start_offset", -1),)
        out.append(_QUIET[key].pack(*offsets, *_QUIET_TAIL[key]))
        return
    head = _HEAD_V5 if version >= 5 else _HEAD_V4
    fixed = (
        p["partition_index"],
        p.get("error_code", 0),
        p.get("high_watermark", 0),
        p.get("last_stable_offset", -1),
    )
    out.append(head.pack(*fixed, p.get("log_start_offset", -1)) if version >= 5 else head.pack(*fixed))
    aborted = p.get("aborted_transactions", ())
    if aborted is None:
        out.append(length(-1, flexible))
    else:
        out.append(length(len(aborted), flexible))
        tail = b"\x00" if flexible else b""
        out.extend(_ABORTED.pack(a["producer_id"], a["first_offset"]) + tail for a in aborted)
    if version >= 11:
        out.append(I32.pack(p.get("preferred_read_replica", -1)))
    records = p.get("records", b"")
    if records is None:
        out.append(length(-1, flexible))
    else:
        out.append(length(len(records), flexible))
        if records:
            out.append(records)
    if flexible:
        diverging = p.get("diverging_epoch")
        pair = _NO_DIVERGENCE if diverging is None else (diverging["epoch"], diverging["end_offset"])
        # Tagged fields equal to their default are left out, as kio and Kafka do.
        out.append(b"\x00" if pair == _NO_DIVERGENCE else b"\x01" + _DIVERGING.pack(0, 13, *pair, 0))


def encode_fetch_response(version: int, correlation_id: int, body: Mapping[str, Any]) -> bytes:
    """The whole response frame (size, header, body) of a Fetch ``version`` answer."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise ValueError(f"Fetch v{version} responses are not written here")
    flexible = version >= FLEXIBLE_FROM
    out = frame_start(correlation_id, flexible)
    out.append(I32.pack(milliseconds(body.get("throttle_time", 0))))
    if version >= 7:
        out.append(struct.pack(">hi", body.get("error_code", 0), body.get("session_id", 0)))
    topics: Iterable[Mapping[str, Any]] = body.get("responses", ())
    topics = list(topics)
    out.append(length(len(topics), flexible))
    for topic in topics:
        out.append(_topic(topic, version, flexible))
        partitions = topic.get("partitions", ())
        out.append(length(len(partitions), flexible))
        for p in partitions:
            _partition(p, version, flexible, out)
        if flexible:
            out.append(b"\x00")
    if flexible:
        out.append(b"\x00")
    return frame(out)

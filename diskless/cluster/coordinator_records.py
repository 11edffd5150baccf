"""The envelope of the records coordinators keep in internal topics (``__consumer_offsets``,
``__transaction_state``): one version byte, then a msgpack list. Each coordinator's own module
says what the lists hold; this one only frames them and refuses what it cannot read."""

from __future__ import annotations

import msgpack

Record = tuple[bytes, bytes | None]

OFFSETS_TOPIC = "__consumer_offsets"
TXN_TOPIC = "__transaction_state"
# Kafka's internal topics (Topic.INTERNAL_TOPICS; share groups' state too, which this broker does
# not keep): clients may not add them to a transaction or write to them.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_TOPIC, "__share_group_state"})


class RecordFormatError(ValueError):
    """An internal-topic record this code cannot decode."""


def pack(version: int, items: list[object]) -> bytes:
    return bytes([version]) + msgpack.packb(items, use_bin_type=True)


def unpack(data: bytes, what: str) -> tuple[int, list[object]]:
    """(version, items) of a key or value; RecordFormatError for anything malformed."""
    if not data:
        raise RecordFormatError(f"empty {what}")
    try:
        items = msgpack.unpackb(data[1:], raw=False)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise RecordFormatError(f"undecodable {what}: {exc}") from exc
    if not isinstance(items, list):
        raise RecordFormatError(f"{what} is not a list")
    return data[0], items

"""The tier entry: how a partition log records "offsets [a, b] now live in segment object S". Sans-IO.

A TierCommit accepted by a leader is appended to the partition log as one control batch (producer
id -1, not transactional) whose single control record has the key (version 0, type
``TIER_CONTROL_TYPE``) and, as value, the msgpack of the segment's ``SegmentInfo``. Being an entry
of the log, it is replicated to followers like any other, truncated with an uncommitted tail, and
takes effect (fetches of [a, b] served from the segment, the range's WAL references dropped, the
pointer segments below it deleted) only once the high watermark has passed it, so a leader change
can never lose a tier entry that already dropped references. Like a transaction marker it takes
one offset; consumers skip control batches they do not know (Kafka's clients ignore unknown
control record types, as they do KRaft's), so records keep their offsets.

``TierCommitError`` carries the Kafka error code and a message a job can log; validation changes
nothing in the log.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack

from diskless.protocol import records
from diskless.storage.segment_object import SegmentInfo

TIER_CONTROL_TYPE = 32010
_CONTROL_KEY = struct.Struct(">hh")  # version, type (as transaction markers)


class TierCommitError(Exception):
    """A TierCommit refused; nothing changed. ``error`` is a Kafka ErrorCode name."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier entry of a log: the segment and the offset of the entry itself."""

    info: SegmentInfo
    entry_offset: int

    @property
    def base_offset(self) -> int:
        return self.info.base_offset

    @property
    def last_offset(self) -> int:
        return self.info.last_offset

    def to_list(self) -> list[object]:
        return [self.info.to_dict(), self.entry_offset]

    @classmethod
    def from_list(cls, data: list[object]) -> Tier:
        return cls(SegmentInfo.from_dict(data[0]), int(data[1]))  # type: ignore[arg-type, call-overload]


# A replica fetch below the pointer entries a leader still has (a follower that fell behind a
# tier, a new replica) is answered with the leader's tier state instead of entries: this envelope
# (base offset -2, unlike any batch or the pointer envelope's -1) around a msgpack map of the tiers,
# the aborted transactions of tiered ranges, the log start and the offset pointer entries resume at.
_TIER_ENVELOPE = struct.Struct(">qi")
_TIER_MARK = -2


def wrap_tier_state(tiers: list[Tier], aborted: list[list[int]], log_start: int, resume: int) -> bytes:
    body = msgpack.packb(
        {"tiers": [t.to_list() for t in tiers], "aborted": aborted, "log_start": log_start, "resume": resume}
    )
    return _TIER_ENVELOPE.pack(_TIER_MARK, len(body)) + body


def unwrap_tier_state(data: bytes | memoryview) -> dict[str, object] | None:
    """The tier state a replica fetch answered with, or None for entries or batches."""
    if len(data) < _TIER_ENVELOPE.size or _TIER_ENVELOPE.unpack_from(data, 0)[0] != _TIER_MARK:
        return None
    _, length = _TIER_ENVELOPE.unpack_from(data, 0)
    state = msgpack.unpackb(bytes(data[_TIER_ENVELOPE.size : _TIER_ENVELOPE.size + length]))
    state["tiers"] = [Tier.from_list(t) for t in state["tiers"]]
    return state


def tier_batch(info: SegmentInfo, now_ms: int) -> bytes:
    """The control batch recording ``info`` (base offset 0: the log assigns it)."""
    key = _CONTROL_KEY.pack(0, TIER_CONTROL_TYPE)
    value = msgpack.packb(info.to_dict(), use_bin_type=True)
    return records.build_batch([(key, value)], now_ms, attributes=records.CONTROL_FLAG)


def may_be_tier(header: records.BatchHeader) -> bool:
    """Whether a batch with this header can be a tier entry (cheap test before decoding)."""
    return header.is_control and not header.is_transactional and header.producer_id == records.NO_PRODUCER_ID


def decode_tier_batch(batch: bytes | bytearray | memoryview) -> SegmentInfo | None:
    """The segment a tier entry's batch records, or None when the batch is not a tier entry."""
    header = records.parse_header(batch)
    if not may_be_tier(header) or header.record_count != 1:
        return None
    for _, key, value in records.iter_records(bytes(batch)):
        if key is None or len(key) != _CONTROL_KEY.size or value is None:
            return None
        if _CONTROL_KEY.unpack(key) != (0, TIER_CONTROL_TYPE):
            return None
        return SegmentInfo.from_dict(msgpack.unpackb(value, raw=False))
    return None

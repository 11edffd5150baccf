"""Transactions as one partition sees them: open transactions, the last stable offset, aborted ones.

A transactional batch opens its producer's transaction at the batch's first offset (if none is
open); a control batch (commit or abort marker, written by the leader on the coordinator's word)
closes it. The first offset of the oldest transaction not yet decided *and replicated* bounds the
last stable offset (LSO): read_committed consumers never read at or past it. A transaction whose
marker is still above the high watermark counts as open (Kafka's unreplicated transactions): a
new leader without the marker would have it open, and the LSO must never go back. Aborted transactions are remembered as
(producer id, first offset, marker offset) so read_committed fetches can tell consumers which
records to drop (Kafka's aborted transaction index). Rebuilt by replaying batch headers (and the
few control batches) after a restart or truncation.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field

from diskless.protocol import records

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


def marker_fields(batch: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(COMMIT or ABORT, coordinator epoch) of a control batch's marker record (None if not a
    marker). The coordinator epoch is -1 when the value is missing (a marker the leader wrote)."""
    for _, key, value in records.iter_records(bytes(batch)):
        if key is not None and len(key) >= _CONTROL_KEY.size:
            kind = _CONTROL_KEY.unpack_from(key, 0)[1]
            epoch = _MARKER_VALUE.unpack_from(value, 0)[1] if value and len(value) >= _MARKER_VALUE.size else -1
            return kind, epoch
    return None


def control_type(batch: bytes | bytearray | memoryview) -> int | None:
    """COMMIT or ABORT for a control batch's marker record (None if not a marker)."""
    fields = marker_fields(batch)
    return None if fields is None else fields[0]


def marker_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, now_ms: int) -> bytes:
    """A control batch carrying one end-of-transaction marker, as the leader writes it."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    attributes = records.TRANSACTIONAL_FLAG | records.CONTROL_FLAG
    return records.build_batch([(key, value)], now_ms, producer_id, producer_epoch, -1, attributes)


@dataclass
class TxnIndex:
    ongoing: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    aborted: list[AbortedTxn] = field(default_factory=list)  # by marker offset
    # (first offset, marker offset) of transactions ended by a marker not yet below the high
    # watermark, in marker order; dropped as the high watermark passes their markers.
    unreplicated: list[tuple[int, int]] = field(default_factory=list)

    def on_batch(self, header: records.BatchHeader, marker: int | None = None) -> None:
        """Account for an appended batch; ``marker`` is the control type for control batches."""
        if not header.is_transactional:
            return
        if not header.is_control:
            self.ongoing.setdefault(header.producer_id, header.base_offset)
            return
        first = self.ongoing.pop(header.producer_id, None)
        if first is None:
            return
        self.unreplicated.append((first, header.base_offset))
        if marker == CONTROL_ABORT:
            self.aborted.append(AbortedTxn(header.producer_id, first, header.base_offset))

    def on_high_watermark(self, high_watermark: int) -> None:
        """Transactions whose markers are now below the high watermark are stable."""
        if self.unreplicated and self.unreplicated[0][1] < high_watermark:
            self.unreplicated = [t for t in self.unreplicated if t[1] >= high_watermark]

    def first_unstable_offset(self) -> int | None:
        firsts = [*self.ongoing.values(), *(first for first, _ in self.unreplicated)]
        return min(firsts) if firsts else None

    def last_stable_offset(self, high_watermark: int) -> int:
        self.on_high_watermark(high_watermark)
        first = self.first_unstable_offset()
        return high_watermark if first is None else min(first, high_watermark)

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions a read of offsets [start, end) must know about."""
        lasts = [a.last_offset for a in self.aborted]
        i = bisect.bisect_left(lasts, start)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def drop_before(self, log_start: int) -> None:
        self.aborted = [a for a in self.aborted if a.last_offset >= log_start]

    def reset(self) -> None:
        self.ongoing.clear()
        self.aborted.clear()
        self.unreplicated.clear()

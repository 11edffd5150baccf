"""Tiered segment objects: one partition's committed batches in Kafka's log-segment layout. Sans-IO.

The tiering job (``diskless/spark/tier_job.py``) turns a committed range of a diskless partition
into two objects, keyed by the range and by the job run that wrote them::

    segments/<topic-id>/<partition>/<base:020d>-<last:020d>-<run>.log     the batches
    segments/<topic-id>/<partition>/<base:020d>-<last:020d>-<run>.index   the offset index

A rerun of the same range writes the same bytes under other keys. With the range alone as key,
the WAL manager could delete a failed run's object (unreferenced, past its hold) just as a rerun
put the same key again and committed it: the tier would point at a deleted object. Keys of older
versions have no ``-<run>``.

``.log`` is a Kafka log segment: v2 record batches back to back, byte for byte as a consumer gets
them from a fetch (final ``baseOffset`` and ``partitionLeaderEpoch``, the producer's CRC, records
never re-encoded; transaction markers and other control batches included). ``.index`` is Kafka's
offset index layout with one entry per batch: big-endian (int32 offset relative to the segment's
base offset, int32 byte position in ``.log``). A batch ends where the next begins, the last one at
the end of ``.log``.

A segment is described by a ``SegmentInfo`` (carried by TierCommit, stored in the partition log's
tier entries and answered by FetchPointers): keys, offsets, sizes, max timestamp and a *range
digest*, crc32c over (base offset, last offset, leader epoch, batch CRC, size) of every batch.
The leader computes the same digest from its own pointer entries, so a TierCommit whose segment
does not hold exactly the batches of the range is refused without reading the segment.

Reading (for the broker's fetch and the Spark data source)::

    info = SegmentInfo.from_dict(d)
    index = SegmentIndex(index_bytes, info.base_offset, info.size)
    start, end = index.byte_range(offset, max_bytes)        # ranged GET [start, end) of info.log_key
    for batch in iter_batches(data): ...                    # whole v2 batches, final offsets
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import crc32c

from diskless.protocol import records
from diskless.protocol.records import HEADER_SIZE, BatchHeader

SEGMENTS_PREFIX = "segments/"
_INDEX_ENTRY = struct.Struct(">ii")  # relative offset, position
_DIGEST_ITEM = struct.Struct(">qqiIi")  # base offset, last offset, leader epoch, batch crc, size
_INT32_MAX = 2**31 - 1
MAX_SEGMENT_BYTES = _INT32_MAX  # positions in the index are int32, as in Kafka


class CorruptSegment(Exception):
    """Bytes that are not the segment (or index) object they are said to be."""


def segment_keys(topic_id: str, partition: int, base_offset: int, last_offset: int, run: str = "") -> tuple[str, str]:
    """The (``.log``, ``.index``) keys of the segment holding [base_offset, last_offset], as job
    run ``run`` wrote it (empty: a key of an older version)."""
    stem = f"{SEGMENTS_PREFIX}{topic_id}/{partition}/{base_offset:020d}-{last_offset:020d}"
    if run:
        stem += f"-{run}"
    return stem + ".log", stem + ".index"


def parse_segment_key(key: str) -> tuple[str, int, int, int] | None:
    """(topic id, partition, base, last) of a segment object key (either suffix), else None."""
    if not key.startswith(SEGMENTS_PREFIX):
        return None
    parts = key[len(SEGMENTS_PREFIX) :].split("/")
    if len(parts) != 3:
        return None
    topic_id, partition, name = parts
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix not in ("log", "index"):
        return None
    fields = stem.split("-")
    if len(fields) not in (2, 3) or (len(fields) == 3 and not fields[2].isalnum()):
        return None
    base, last = fields[0], fields[1]
    if not (partition.isdigit() and base.isdigit() and last.isdigit()):
        return None
    return topic_id, int(partition), int(base), int(last)


def digest_update(digest: int, header: BatchHeader) -> int:
    """The range digest after one more batch (start from 0)."""
    item = _DIGEST_ITEM.pack(
        header.base_offset, header.last_offset, header.partition_leader_epoch, header.crc, header.size
    )
    return crc32c.crc32c(item, digest)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    topic_id: str
    partition: int
    base_offset: int
    last_offset: int
    size: int  # bytes of .log
    index_size: int  # bytes of .index
    max_timestamp: int
    digest: int  # range digest (see module docstring)
    batches: int
    # When the writer started putting the objects (its clock): leaders refuse TierCommits of
    # segments older than diskless.tier.commit.timeout.ms, which is what lets the WAL manager
    # delete an unreferenced segment after its grace (safety rule 3). Not part of the identity:
    # a rerun writes the same segment at another time.
    created_ms: int = field(default=-1, compare=False)
    # Which job run wrote the objects (part of their keys, see the module docstring). Not part of
    # the identity either: a rerun's commit of a range already tiered is that tier again.
    run: str = field(default="", compare=False)

    @property
    def log_key(self) -> str:
        return segment_keys(self.topic_id, self.partition, self.base_offset, self.last_offset, self.run)[0]

    @property
    def index_key(self) -> str:
        return segment_keys(self.topic_id, self.partition, self.base_offset, self.last_offset, self.run)[1]

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> SegmentInfo:
        try:
            return cls(
                topic_id=str(data["topic_id"]),
                partition=int(data["partition"]),  # type: ignore[call-overload]
                base_offset=int(data["base_offset"]),  # type: ignore[call-overload]
                last_offset=int(data["last_offset"]),  # type: ignore[call-overload]
                size=int(data["size"]),  # type: ignore[call-overload]
                index_size=int(data["index_size"]),  # type: ignore[call-overload]
                max_timestamp=int(data["max_timestamp"]),  # type: ignore[call-overload]
                digest=int(data["digest"]),  # type: ignore[call-overload]
                batches=int(data["batches"]),  # type: ignore[call-overload]
                created_ms=int(data.get("created_ms", -1)),  # type: ignore[call-overload]
                run=str(data.get("run", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptSegment(f"not a segment description: {exc}") from None


class SegmentWriter:
    """Builds one segment object and its index from whole batches with final offsets, in order."""

    def __init__(self, topic_id: str, partition: int) -> None:
        self.topic_id = topic_id
        self.partition = partition
        self._chunks: list[bytes] = []
        self._index = bytearray()
        self.size = 0
        self.base_offset = -1
        self.next_offset = -1
        self.max_timestamp = records.NO_TIMESTAMP
        self.digest = 0
        self.batches = 0

    def add(self, batch: bytes | bytearray | memoryview) -> None:
        """Append one v2 batch as a consumer would receive it; offsets must continue the segment."""
        header = records.parse_header(batch)
        if header.magic != 2 or header.size != len(batch):
            raise CorruptSegment(f"not exactly one v2 batch ({len(batch)} bytes, header says {header.size})")
        if self.base_offset < 0:
            self.base_offset = header.base_offset
        elif header.base_offset < self.next_offset:
            raise CorruptSegment(f"batch at {header.base_offset} goes back before {self.next_offset}")
        if self.size + len(batch) > MAX_SEGMENT_BYTES or header.last_offset - self.base_offset > _INT32_MAX:
            raise CorruptSegment("segment would exceed the int32 positions of its index")
        self._index += _INDEX_ENTRY.pack(header.base_offset - self.base_offset, self.size)
        self._chunks.append(bytes(batch))
        self.size += len(batch)
        self.next_offset = header.last_offset + 1
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        self.digest = digest_update(self.digest, header)
        self.batches += 1

    def finish(self, created_ms: int = -1, run: str = "") -> tuple[bytes, bytes, SegmentInfo]:
        """(.log bytes, .index bytes, description); ``created_ms``: when the objects are put,
        ``run``: the job run putting them (in their keys)."""
        if self.batches == 0:
            raise ValueError("an empty segment")
        info = SegmentInfo(
            self.topic_id,
            self.partition,
            self.base_offset,
            self.next_offset - 1,
            self.size,
            len(self._index),
            self.max_timestamp,
            self.digest,
            self.batches,
            created_ms,
            run,
        )
        return b"".join(self._chunks), bytes(self._index), info


class SegmentIndex:
    """A parsed ``.index``: where each batch of the segment starts."""

    def __init__(self, data: bytes | bytearray | memoryview, base_offset: int, log_size: int) -> None:
        if len(data) % _INDEX_ENTRY.size or not data:
            raise CorruptSegment(f"an offset index of {len(data)} bytes")
        self.base_offset = base_offset
        self.log_size = log_size
        self.offsets: list[int] = []
        self.positions: list[int] = []
        for relative, position in _INDEX_ENTRY.iter_unpack(bytes(data)):
            if self.positions and (position <= self.positions[-1] or relative <= self.offsets[-1] - base_offset):
                raise CorruptSegment("offset index entries out of order")
            self.offsets.append(base_offset + relative)
            self.positions.append(position)
        if self.positions[0] != 0 or self.positions[-1] >= log_size:
            raise CorruptSegment("offset index does not describe the segment")

    def batch_at(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (the first one for offsets before the segment)."""
        return max(bisect.bisect_right(self.offsets, offset) - 1, 0)

    def batch_end(self, i: int) -> int:
        return self.positions[i + 1] if i + 1 < len(self.positions) else self.log_size

    def byte_range(self, offset: int, max_bytes: int, min_one: bool = True) -> tuple[int, int]:
        """[start, end) of the whole batches from the one holding ``offset``, at most ``max_bytes``
        (but the first batch whatever its size with ``min_one``, KIP-74). Empty when none fit."""
        first = self.batch_at(offset)
        start = self.positions[first]
        end = start
        i = first
        while i < len(self.positions):
            nxt = self.batch_end(i)
            if nxt - start > max_bytes and (end > start or not min_one):
                break
            end = nxt
            i += 1
        return start, end


def iter_batches(data: bytes | bytearray | memoryview) -> Iterator[memoryview]:
    """The whole v2 batches of segment bytes (a ``.log`` object or a ranged read of it)."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if len(view) - pos < HEADER_SIZE:
            raise CorruptSegment(f"truncated batch at {pos}")
        _, size = records.peek_offset_and_size(view, pos)
        if size < HEADER_SIZE or pos + size > len(view):
            raise CorruptSegment(f"batch at {pos} of {size} bytes runs past the data")
        yield view[pos : pos + size]
        pos += size


def check_segment(data: bytes | bytearray | memoryview, info: SegmentInfo) -> None:
    """Raise CorruptSegment unless ``data`` is exactly the segment ``info`` describes."""
    if len(data) != info.size:
        raise CorruptSegment(f"{info.log_key}: {len(data)} bytes, expected {info.size}")
    digest = 0
    for batch in iter_batches(data):
        header = records.parse_header(batch)
        if records.compute_crc(batch) != header.crc:
            raise CorruptSegment(f"{info.log_key}: batch at {header.base_offset} fails its CRC")
        digest = digest_update(digest, header)
    if digest != info.digest:
        raise CorruptSegment(f"{info.log_key}: range digest mismatch")

"""WAL object format, version 1: object keys, body, trailer index and footer. Sans-IO.

A WAL object holds the v2 record batches one broker collected from many producers for many
partitions during one flush interval. The broker uploads it, then commits a pointer per batch to
each partition's leader (see ``diskless.storage.pointer``). Nothing here performs I/O: callers
hand in bytes and get bytes, offsets and parsed structures back.

Object key
==========
::

    wal/<yyyy>/<mm>/<dd>/<hh>/<unix_ms:013d>-<az>-<broker>-<uuid>.wal

* ``yyyy/mm/dd/hh`` is the UTC hour of ``unix_ms``, the object's creation time in ms.
* ``unix_ms`` is zero-padded to 13 digits (valid until the year 2286), so keys sort
  lexicographically by creation time, both within an hour prefix and across prefixes. A scan
  (e.g. the WAL manager listing with S3 ``StartAfter``) can skip whole old hours.
* ``az`` is the writer's availability zone, ``[A-Za-z0-9._-]{0,64}``; it may contain ``-`` and may
  be empty. ``broker`` is a non-negative decimal broker id without leading zeros. ``uuid`` is 32
  lowercase hex digits. Parsing works from both ends: ``unix_ms`` is everything before the first
  ``-``, ``uuid`` after the last, ``broker`` between the last two, and ``az`` is the rest.
* ``parse_wal_object_key`` accepts exactly the keys ``wal_object_key`` produces (it re-renders
  and compares), so the mapping key <-> ``WalKeyInfo`` is a bijection.

Object body
===========
All integers big endian. ``V`` = format version (1).
::

    0        header   8 bytes    b"DLWAL", version uint8, 2 reserved bytes (written 0, ignored)
    8        batches             the producers' v2 record batches byte for byte, grouped by
                                 (topic id, partition): groups in order of first arrival, batches
                                 within a group in arrival order; no padding between batches
    T        trailer  L bytes    msgpack document, zstd-compressed iff that is smaller (flag bit 0)
    T+L      footer   22 bytes   see below
    T+L+22   end of object

Footer (``FOOTER_SIZE`` = 22 bytes, the last bytes of the object)::

    0   trailer_offset  int64    T, absolute position of the trailer
    8   trailer_length  int32    L, stored (possibly compressed) trailer length
    12  trailer_crc     uint32   crc32c of the L stored trailer bytes
    16  flags           uint8    bit 0: trailer is zstd-compressed; other bits must be 0
    17  version         uint8    format version, equal to the header's
    18  magic           4 bytes  b"DLWF"

Trailer (msgpack map, after decompression)::

    {
      "format_version": int,
      "created_ms": int,            # creation time, the same as in the key
      "broker_id": int,
      "az": str,
      "partitions": [               # one group per run of batches of one (topic id, partition)
        [topic_id: bin(16), partition: int,
         [[offset, size, record_count, producer_id, producer_epoch, base_sequence,
           base_timestamp, max_timestamp, attributes], ...]],
        ...
      ]
    }

``offset`` is the absolute byte position of the batch in the object and ``size`` its total length
(12 + batchLength). The other batch fields are copied from the batch header (``attributes`` is
the int16 batch attributes), so readers never need to decode records. The topic id is stored once
per group rather than once per batch: the trailer of an 8 MiB object with 2,000 batches stays
small. A reader must not assume one group per partition (a later writer may interleave).

Compatibility rule: a version-1 reader ignores unknown map keys and extra trailing elements in
group and batch arrays, so such additions do not need a new version; anything that changes the
meaning of existing fields or the layout does, and readers reject versions they do not know
(``UnsupportedWalVersion``).

Reading only the trailer
========================
A reader that wants to know which partitions an object involves asks for the object's tail
(S3 suffix range ``bytes=-N``): ``parse_tail`` takes those bytes, parses the footer and, when the
tail was long enough, the trailer. ``TAIL_READ_HINT`` is large enough for typical trailers, so one
ranged GET usually suffices; otherwise ``Footer.tail_size`` (or ``Footer.trailer_range``) says
exactly what to fetch next.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import UUID, uuid4

import crc32c
import msgpack
import zstandard

from diskless.protocol import records
from diskless.protocol.records import HEADER_SIZE as BATCH_HEADER_SIZE

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({FORMAT_VERSION})

OBJECT_MAGIC = b"DLWAL"
_OBJECT_HEADER = struct.Struct(">5sB2x")  # magic, version, 2 reserved bytes
OBJECT_HEADER_SIZE = _OBJECT_HEADER.size  # 8

FOOTER_MAGIC = b"DLWF"
_FOOTER = struct.Struct(">qiIBB4s")  # trailer offset, length, crc32c, flags, version, magic
FOOTER_SIZE = _FOOTER.size  # 22

FLAG_ZSTD = 0x01
_KNOWN_FLAGS = FLAG_ZSTD

# Suffix length a reader asks for first when it wants the trailer: enough for objects of a few
# thousand batches after compression, small enough to be cheap when it is more than needed.
TAIL_READ_HINT = 64 * 1024

# A trailer decompressing to more than this is treated as corrupt rather than allocated.
MAX_TRAILER_SIZE = 256 * 1024 * 1024

_INT32_MAX = 2**31 - 1
_ZSTD_LEVEL = 3

WAL_KEY_ROOT = "wal/"
_KEY_SUFFIX = ".wal"
HOUR_MS = 3_600_000
MAX_CREATED_MS = 10**13 - 1  # 13 digits keep keys fixed-width, hence time-sorted
_AZ_RE = re.compile(r"[A-Za-z0-9._-]{0,64}")
_UUID_HEX_RE = re.compile(r"[0-9a-f]{32}")


class CorruptWalObject(Exception):
    """The bytes are not a valid WAL object (or a pointer does not match the object's bytes)."""


class UnsupportedWalVersion(CorruptWalObject):
    """A well-formed header or footer naming a format version this code cannot read."""


# --- keys ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WalKeyInfo:
    created_ms: int
    az: str
    broker_id: int
    uuid: str  # 32 lowercase hex digits

    @property
    def key(self) -> str:
        return wal_object_key(self.created_ms, self.az, self.broker_id, self.uuid)


def wal_hour_prefix(ms: int) -> str:
    """``wal/yyyy/mm/dd/hh/`` of the UTC hour holding ``ms``."""
    t = time.gmtime(ms // 1000)  # integer seconds: exact, unlike float datetime arithmetic
    return f"{WAL_KEY_ROOT}{t.tm_year:04d}/{t.tm_mon:02d}/{t.tm_mday:02d}/{t.tm_hour:02d}/"


def wal_hour_prefixes(start_ms: int, end_ms: int) -> list[str]:
    """Hour prefixes to list for objects created in ``[start_ms, end_ms]``, oldest first."""
    return [wal_hour_prefix(hour * HOUR_MS) for hour in range(start_ms // HOUR_MS, end_ms // HOUR_MS + 1)]


def wal_key_lower_bound(ms: int) -> str:
    """A string sorting before every key created at or after ``ms`` and after every older key."""
    _check_created_ms(ms)
    return f"{wal_hour_prefix(ms)}{ms:013d}"


def _check_created_ms(ms: int) -> None:
    if not 0 <= ms <= MAX_CREATED_MS:
        raise ValueError(f"creation time {ms} ms is outside the key format's range")


def wal_object_key(created_ms: int, az: str, broker_id: int, uuid_hex: str | None = None) -> str:
    """The key of a WAL object created at ``created_ms`` (UTC) by ``broker_id`` in ``az``."""
    _check_created_ms(created_ms)
    if not _AZ_RE.fullmatch(az):
        raise ValueError(f"availability zone {az!r} may only use [A-Za-z0-9._-], at most 64 characters")
    if not 0 <= broker_id <= _INT32_MAX:
        raise ValueError(f"broker id {broker_id} must be a non-negative int32")
    uuid_hex = uuid4().hex if uuid_hex is None else uuid_hex.lower()
    if not _UUID_HEX_RE.fullmatch(uuid_hex):
        raise ValueError(f"uuid {uuid_hex!r} must be 32 hex digits")
    return f"{wal_hour_prefix(created_ms)}{created_ms:013d}-{az}-{broker_id}-{uuid_hex}{_KEY_SUFFIX}"


def parse_wal_object_key(key: str) -> WalKeyInfo:
    """Inverse of ``wal_object_key``; raises ``ValueError`` for anything it would not produce."""
    name = key.rsplit("/", 1)[-1]
    if not key.startswith(WAL_KEY_ROOT) or not name.endswith(_KEY_SUFFIX):
        raise ValueError(f"{key!r} is not a WAL object key")
    stem = name[: -len(_KEY_SUFFIX)]
    # From both ends: the AZ is the only part that may contain '-'.
    head, sep, rest = stem.partition("-")
    rest_parts = rest.rsplit("-", 2)
    if not sep or len(rest_parts) != 3:
        raise ValueError(f"{key!r} is not a WAL object key")
    az, broker, uuid_hex = rest_parts
    try:
        info = WalKeyInfo(int(head), az, int(broker), uuid_hex)
        canonical = info.key
    except ValueError as exc:
        raise ValueError(f"{key!r} is not a WAL object key: {exc}") from None
    # int() is lenient ('+1', ' 1', '1_0', other scripts' digits) and the hour prefix must agree
    # with the time: re-rendering and comparing rejects every non-canonical spelling at once.
    if canonical != key:
        raise ValueError(f"{key!r} is not a canonical WAL object key (expected {canonical!r})")
    return info


# --- parsed structures -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchRef:
    """Where one added batch ended up in the object."""

    topic_id: UUID
    partition: int
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class TrailerEntry:
    topic_id: UUID
    partition: int
    offset: int
    size: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    base_timestamp: int
    max_timestamp: int
    attributes: int


@dataclass(frozen=True, slots=True)
class Trailer:
    format_version: int
    created_ms: int
    broker_id: int
    az: str
    entries: tuple[TrailerEntry, ...]  # in object (byte offset) order

    def partitions(self) -> list[tuple[UUID, int]]:
        """Every (topic id, partition) with batches in the object, in order of first appearance."""
        return list(dict.fromkeys((e.topic_id, e.partition) for e in self.entries))

    def entries_for(self, topic_id: UUID, partition: int) -> list[TrailerEntry]:
        return [e for e in self.entries if e.partition == partition and e.topic_id == topic_id]


@dataclass(frozen=True, slots=True)
class Footer:
    trailer_offset: int
    trailer_length: int
    trailer_crc: int
    flags: int
    version: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_ZSTD)

    @property
    def object_size(self) -> int:
        return self.trailer_offset + self.trailer_length + FOOTER_SIZE

    @property
    def tail_size(self) -> int:
        """Suffix length (``bytes=-N``) that holds the trailer and the footer."""
        return self.trailer_length + FOOTER_SIZE

    def trailer_range(self) -> tuple[int, int]:
        """Absolute ``[start, end)`` of the stored trailer (an HTTP range is ``start``..``end-1``)."""
        return self.trailer_offset, self.trailer_offset + self.trailer_length


class FinishedWalObject(NamedTuple):
    data: bytes
    refs: list[BatchRef]  # one per add() call, in add() order


# --- writing -------------------------------------------------------------------------------------


class WalObjectWriter:
    """Collects batches for one WAL object and assembles its bytes.

    Batches are grouped by (topic id, partition) only in ``finish``, so their final byte offsets
    are known only then: ``add`` returns the batch's index and ``finish`` returns the bytes with
    one ``BatchRef`` per added batch, in ``add`` order. Grouping keeps each partition's batches
    contiguous, so a reader (fetch, tiering) fetches one partition with one ranged GET.

    Batches passed as ``bytes`` are kept by reference; anything else (memoryview, bytearray) is
    copied at ``add`` because the caller may reuse or mutate that buffer before ``finish``.
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[UUID, int], list[int]] = {}
        self._batches: list[bytes] = []
        # Trailer fields taken from each batch header at add(): record_count, producer_id,
        # producer_epoch, base_sequence, base_timestamp, max_timestamp, attributes.
        self._meta: list[tuple[int, int, int, int, int, int, int]] = []
        self._size = OBJECT_HEADER_SIZE
        self._finished = False

    @property
    def size(self) -> int:
        """Object size so far without the trailer and footer (they are added by ``finish``)."""
        return self._size

    def __len__(self) -> int:
        return len(self._batches)

    def add(self, topic_id: UUID, partition: int, batch: bytes | bytearray | memoryview) -> int:
        """Add one whole v2 batch; returns its index into ``finish().refs``."""
        if self._finished:
            raise RuntimeError("the WAL object is already finished")
        if not isinstance(topic_id, UUID):
            raise TypeError("topic_id must be a uuid.UUID")
        if not 0 <= partition <= _INT32_MAX:
            raise ValueError(f"partition {partition} must be a non-negative int32")
        data = batch if isinstance(batch, bytes) else bytes(batch)
        if len(data) < BATCH_HEADER_SIZE:
            raise ValueError("a record batch is at least 61 bytes long")
        header = records.parse_header(data)
        if header.magic != 2:
            raise ValueError(f"only v2 record batches can be stored (magic {header.magic})")
        if header.size != len(data):
            raise ValueError(f"batch length field says {header.size} bytes, got {len(data)}")
        index = len(self._batches)
        self._batches.append(data)
        self._meta.append(
            (
                header.record_count,
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.base_timestamp,
                header.max_timestamp,
                header.attributes,
            )
        )
        self._groups.setdefault((topic_id, partition), []).append(index)
        self._size += len(data)
        return index

    def finish(self, created_ms: int, broker_id: int, az: str) -> FinishedWalObject:
        """Assemble the object. The writer cannot be used afterwards."""
        if self._finished:
            raise RuntimeError("the WAL object is already finished")
        self._finished = True
        parts: list[bytes] = [_OBJECT_HEADER.pack(OBJECT_MAGIC, FORMAT_VERSION)]
        refs: list[BatchRef | None] = [None] * len(self._batches)
        groups: list[list[Any]] = []
        position = OBJECT_HEADER_SIZE
        for (topic_id, partition), indexes in self._groups.items():
            rows = []
            for i in indexes:
                data = self._batches[i]
                parts.append(data)
                refs[i] = BatchRef(topic_id, partition, position, len(data))
                rows.append([position, len(data), *self._meta[i]])
                position += len(data)
            groups.append([topic_id.bytes, partition, rows])
        document = {
            "format_version": FORMAT_VERSION,
            "created_ms": created_ms,
            "broker_id": broker_id,
            "az": az,
            "partitions": groups,
        }
        raw = msgpack.packb(document, use_bin_type=True)
        compressed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(raw)
        stored, flags = (compressed, FLAG_ZSTD) if len(compressed) < len(raw) else (raw, 0)
        if len(stored) > _INT32_MAX:
            raise ValueError("trailer too large for the footer's int32 length")
        parts.append(stored)
        parts.append(_FOOTER.pack(position, len(stored), crc32c.crc32c(stored), flags, FORMAT_VERSION, FOOTER_MAGIC))
        # Drop the references so the batches can be freed as soon as the caller lets go of the bytes.
        self._batches.clear()
        self._meta.clear()
        self._groups.clear()
        return FinishedWalObject(b"".join(parts), refs)  # type: ignore[arg-type]  # all filled


# --- reading -------------------------------------------------------------------------------------


def parse_footer(buf: bytes | bytearray | memoryview, object_size: int | None = None) -> Footer:
    """The footer in the last ``FOOTER_SIZE`` bytes of ``buf`` (the object or any tail of it).

    With ``object_size`` (e.g. from a Content-Range header) the footer's offsets are also checked
    against it; without it they can only be checked once the trailer is read.
    """
    if len(buf) < FOOTER_SIZE:
        raise CorruptWalObject(f"need the last {FOOTER_SIZE} bytes for the footer, got {len(buf)}")
    offset, length, crc, flags, version, magic = _FOOTER.unpack_from(buf, len(buf) - FOOTER_SIZE)
    if magic != FOOTER_MAGIC:
        raise CorruptWalObject(f"bad footer magic {magic!r}")
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedWalVersion(f"WAL object format version {version} is not supported")
    if flags & ~_KNOWN_FLAGS:
        raise CorruptWalObject(f"unknown footer flags {flags:#04x}")
    if offset < OBJECT_HEADER_SIZE or length <= 0:
        raise CorruptWalObject(f"footer names an impossible trailer (offset {offset}, length {length})")
    footer = Footer(offset, length, crc, flags, version)
    if object_size is not None and footer.object_size != object_size:
        raise CorruptWalObject(f"footer implies a {footer.object_size}-byte object, the object has {object_size}")
    return footer


def parse_trailer(buf: bytes | bytearray | memoryview, footer: Footer) -> Trailer:
    """Decode the stored trailer bytes (exactly ``footer.trailer_range()``) and validate them."""
    if len(buf) != footer.trailer_length:
        raise CorruptWalObject(f"trailer is {footer.trailer_length} bytes, got {len(buf)}")
    if crc32c.crc32c(buf) != footer.trailer_crc:
        raise CorruptWalObject("trailer crc32c mismatch")
    try:
        raw = _decompress_trailer(bytes(buf)) if footer.compressed else buf
        document = msgpack.unpackb(raw, raw=False, use_list=True)
    except (ValueError, zstandard.ZstdError) as exc:  # msgpack's errors are ValueErrors
        raise CorruptWalObject(f"undecodable trailer: {exc}") from None
    return _trailer_from_document(document, footer)


def parse_tail(tail: bytes | bytearray | memoryview, object_size: int | None = None) -> tuple[Footer, Trailer | None]:
    """Footer and, if ``tail`` reaches back far enough, trailer from the last bytes of an object.

    Returns ``(footer, None)`` when the tail is too short: fetch ``footer.tail_size`` bytes from
    the end (or ``footer.trailer_range()``) and call again (or ``parse_trailer``).
    """
    footer = parse_footer(tail, object_size)
    if len(tail) < footer.tail_size:
        return footer, None
    end = len(tail) - FOOTER_SIZE
    return footer, parse_trailer(memoryview(tail)[end - footer.trailer_length : end], footer)


def _decompress_trailer(data: bytes) -> bytes:
    size = zstandard.frame_content_size(data)
    if size < 0 or size > MAX_TRAILER_SIZE:  # our writer always records the content size
        raise CorruptWalObject(f"compressed trailer declares an unusable size ({size})")
    return zstandard.ZstdDecompressor().decompress(data)


def _trailer_from_document(document: Any, footer: Footer) -> Trailer:
    # The crc proves the bytes are what some writer wrote, not that the writer was right: check
    # every type, so a bad trailer surfaces as CorruptWalObject and not as an arbitrary error.
    if not isinstance(document, dict):
        raise CorruptWalObject("trailer is not a msgpack map")
    version = document.get("format_version")
    if version != footer.version:
        raise CorruptWalObject(f"trailer version {version!r} differs from footer version {footer.version}")
    created_ms, broker_id, az = document.get("created_ms"), document.get("broker_id"), document.get("az")
    if type(created_ms) is not int or type(broker_id) is not int or not isinstance(az, str):
        raise CorruptWalObject("trailer lacks a valid created_ms, broker_id or az")
    groups = document.get("partitions")
    if not isinstance(groups, list):
        raise CorruptWalObject("trailer lacks its partitions list")
    entries = []
    for group in groups:
        if not (isinstance(group, list) and len(group) >= 3 and isinstance(group[0], bytes) and len(group[0]) == 16):
            raise CorruptWalObject(f"malformed trailer group {group!r:.80}")
        topic_id, partition, rows = UUID(bytes=group[0]), group[1], group[2]
        if type(partition) is not int or not isinstance(rows, list):
            raise CorruptWalObject(f"malformed trailer group {group!r:.80}")
        for row in rows:
            if not isinstance(row, list) or len(row) < 9 or not all(type(v) is int for v in row[:9]):
                raise CorruptWalObject(f"malformed trailer entry {row!r:.80}")
            entry = TrailerEntry(topic_id, partition, *row[:9])
            # Catch writer bugs and pointers into the trailer or footer before anyone slices with them.
            if entry.offset < OBJECT_HEADER_SIZE or entry.offset + entry.size > footer.trailer_offset:
                raise CorruptWalObject(f"trailer entry {entry.offset}+{entry.size} lies outside the batch area")
            if entry.size < BATCH_HEADER_SIZE:
                raise CorruptWalObject(f"trailer entry at {entry.offset} is smaller than a batch header")
            entries.append(entry)
    return Trailer(version, created_ms, broker_id, az, tuple(entries))


class WalObjectReader:
    """Validated view over a whole WAL object held in memory."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data)
        if len(self._view) < OBJECT_HEADER_SIZE + FOOTER_SIZE:
            raise CorruptWalObject(f"{len(self._view)} bytes is too short for a WAL object")
        magic, version = _OBJECT_HEADER.unpack_from(self._view, 0)
        if magic != OBJECT_MAGIC:
            raise CorruptWalObject(f"bad object magic {magic!r}")
        if version not in SUPPORTED_VERSIONS:
            raise UnsupportedWalVersion(f"WAL object format version {version} is not supported")
        self.footer = parse_footer(self._view, len(self._view))
        if self.footer.version != version:
            raise CorruptWalObject(f"header version {version} differs from footer version {self.footer.version}")
        start, end = self.footer.trailer_range()
        self.trailer = parse_trailer(self._view[start:end], self.footer)

    @property
    def version(self) -> int:
        return self.footer.version

    def batches(self) -> Iterator[tuple[TrailerEntry, memoryview]]:
        """Every batch with its trailer entry, in object order (zero-copy views)."""
        for entry in self.trailer.entries:
            yield entry, self._view[entry.offset : entry.offset + entry.size]

    def batch_at(self, offset: int, size: int) -> memoryview:
        """The batch a pointer ``(offset, size)`` names, checked against the batch's length field."""
        if offset < OBJECT_HEADER_SIZE or size < BATCH_HEADER_SIZE or offset + size > self.footer.trailer_offset:
            raise CorruptWalObject(f"range {offset}+{size} is not inside the object's batch area")
        view = self._view[offset : offset + size]
        _, batch_size = records.peek_offset_and_size(view, 0)
        if batch_size != size:
            raise CorruptWalObject(f"batch at {offset} is {batch_size} bytes, the pointer says {size}")
        return view

    def verify_batches(self) -> None:
        """Check every batch against its trailer entry and its own crc32c (reads all record bytes).

        The trailer crc does not cover the batches: each carries its producer's CRC instead.
        """
        for entry, view in self.batches():
            h = records.parse_header(view)
            described = (h.magic, h.size, h.record_count, h.producer_id, h.producer_epoch, h.base_sequence)
            described += (h.base_timestamp, h.max_timestamp, h.attributes)
            expected = (2, entry.size, entry.record_count, entry.producer_id, entry.producer_epoch)
            expected += (entry.base_sequence, entry.base_timestamp, entry.max_timestamp, entry.attributes)
            if described != expected:
                raise CorruptWalObject(f"batch at {entry.offset} does not match its trailer entry")
            if records.compute_crc(view) != h.crc:
                raise CorruptWalObject(f"batch at {entry.offset} fails its crc32c")

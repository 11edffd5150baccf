"""WAL object format and diskless pointer entries: round trips, tail-only reads, corruption, keys, serving."""

from __future__ import annotations

import contextlib
import struct
import time
from uuid import UUID, uuid4

import crc32c
import msgpack
import pytest
import zstandard
from batches import CODECS, crc_ok, decode_batch, make_batch
from hypothesis import given
from hypothesis import strategies as st

from diskless.protocol import records
from diskless.storage import pointer as p
from diskless.storage import wal_format as w

TS = 1_700_000_000_000
TOPIC_A = UUID("00000000-0000-4000-8000-00000000000a")
TOPIC_B = UUID("00000000-0000-4000-8000-00000000000b")


@st.composite
def batch_st(draw: st.DrawFn) -> bytes:
    """A real, CRC-correct v2 batch with random size, codec and producer fields."""
    count = draw(st.integers(min_value=1, max_value=8))
    value_size = draw(st.integers(min_value=0, max_value=300))
    value = draw(st.binary(min_size=min(value_size, 8), max_size=8)) * (value_size // 8 + 1)
    return make_batch(
        [value[:value_size]] * count,
        compression=draw(st.sampled_from(CODECS)),
        base_timestamp=draw(st.integers(min_value=0, max_value=2 * TS)),
        producer_id=draw(st.integers(min_value=-1, max_value=2**62)),
        producer_epoch=draw(st.integers(min_value=-1, max_value=2**15 - 1)),
        base_sequence=draw(st.integers(min_value=-1, max_value=2**31 - 1)),
        transactional=draw(st.booleans()),
        log_append_time=draw(st.booleans()),
    )


@st.composite
def adds_st(draw: st.DrawFn, max_size: int = 30) -> list[tuple[UUID, int, bytes]]:
    topics = draw(st.lists(st.uuids(), min_size=1, max_size=3, unique=True))
    n = draw(st.integers(min_value=0, max_value=max_size))
    return [
        (draw(st.sampled_from(topics)), draw(st.integers(min_value=0, max_value=4)), draw(batch_st())) for _ in range(n)
    ]


def _build(adds: list[tuple[UUID, int, bytes]], created_ms: int = TS, broker: int = 3, az: str = "eu-west-1b"):
    writer = w.WalObjectWriter()
    for topic_id, partition, batch in adds:
        writer.add(topic_id, partition, batch)
    return writer.finish(created_ms, broker, az)


def _many_batches(n: int = 200) -> list[tuple[UUID, int, bytes]]:
    return [
        ((TOPIC_A, TOPIC_B)[i % 2], i % 7, make_batch([b"x" * (i % 50)] * (1 + i % 3), base_sequence=i, producer_id=9))
        for i in range(n)
    ]


# Empty (raw trailer), one batch, and enough batches for a zstd trailer of several hundred bytes.
SAMPLE_OBJECTS = [[], [(TOPIC_A, 0, make_batch([b"v"]))], _many_batches(50)]
SAMPLE_IDS = ["empty", "one", "many"]


def _flip(data: bytes, pos: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[pos] ^= mask
    return bytes(out)


# --- object round trip -----------------------------------------------------------------------------


@given(
    adds=adds_st(), created_ms=st.integers(min_value=0, max_value=w.MAX_CREATED_MS), broker=st.integers(0, 2**31 - 1)
)
def test_round_trip_groups_batches_and_indexes_every_one(
    adds: list[tuple[UUID, int, bytes]], created_ms: int, broker: int
) -> None:
    writer = w.WalObjectWriter()
    indexes = [writer.add(t, part, memoryview(b) if i % 2 else b) for i, (t, part, b) in enumerate(adds)]
    assert indexes == list(range(len(adds)))
    assert writer.size == w.OBJECT_HEADER_SIZE + sum(len(b) for _, _, b in adds)
    assert len(writer) == len(adds)
    data, refs = writer.finish(created_ms, broker, "us-east-1a")
    assert len(refs) == len(adds)

    # Every ref points at its batch, byte for byte.
    for (topic_id, partition, batch), ref in zip(adds, refs, strict=True):
        assert (ref.topic_id, ref.partition, ref.size) == (topic_id, partition, len(batch))
        assert data[ref.offset : ref.offset + ref.size] == batch

    # Layout: header, then groups in first-arrival order with arrival order inside, no gaps.
    first_seen = list(dict.fromkeys((t, part) for t, part, _ in adds))
    expected_order = [i for key in first_seen for i, (t, part, _) in enumerate(adds) if (t, part) == key]
    pos = w.OBJECT_HEADER_SIZE
    for i in expected_order:
        assert refs[i].offset == pos
        pos += refs[i].size

    reader = w.WalObjectReader(data)
    reader.verify_batches()
    trailer = reader.trailer
    stored, raw, footer = _stored_and_raw_trailer(data)  # zstd only when it is smaller
    assert len(stored) < len(raw) if footer.compressed else len(zstandard.compress(raw, 3)) >= len(raw)
    assert (trailer.format_version, trailer.created_ms, trailer.broker_id, trailer.az) == (
        w.FORMAT_VERSION,
        created_ms,
        broker,
        "us-east-1a",
    )
    assert reader.footer.trailer_offset == pos
    assert reader.footer.object_size == len(data)
    assert trailer.partitions() == first_seen
    read = list(reader.batches())
    assert [(e.topic_id, e.partition, e.offset, e.size) for e, _ in read] == [
        (refs[i].topic_id, refs[i].partition, refs[i].offset, refs[i].size) for i in expected_order
    ]
    for (entry, view), i in zip(read, expected_order, strict=True):
        batch = adds[i][2]
        assert bytes(view) == batch
        assert reader.batch_at(entry.offset, entry.size) == view
        h = records.parse_header(batch)
        assert (
            entry.record_count,
            entry.producer_id,
            entry.producer_epoch,
            entry.base_sequence,
            entry.base_timestamp,
            entry.max_timestamp,
            entry.attributes,
        ) == (
            h.record_count,
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            h.base_timestamp,
            h.max_timestamp,
            h.attributes,
        )
    for topic_id, partition in first_seen:
        assert [e.offset for e in trailer.entries_for(topic_id, partition)] == [
            refs[i].offset for i, (t, part, _) in enumerate(adds) if (t, part) == (topic_id, partition)
        ]


def _stored_and_raw_trailer(data: bytes) -> tuple[bytes, bytes, w.Footer]:
    footer = w.parse_footer(data)
    start, end = footer.trailer_range()
    stored = data[start:end]
    raw = zstandard.ZstdDecompressor().decompress(stored) if footer.compressed else stored
    return stored, raw, footer


def test_trailer_is_compressed_only_when_smaller() -> None:
    # An empty object's trailer is too small for zstd to win.
    stored, raw, footer = _stored_and_raw_trailer(w.WalObjectWriter().finish(TS, 0, "").data)
    assert not footer.compressed and stored == raw
    assert len(zstandard.ZstdCompressor(level=3).compress(raw)) >= len(raw)
    stored, raw, footer = _stored_and_raw_trailer(_build(_many_batches()).data)
    assert footer.compressed and len(stored) < len(raw)
    assert msgpack.unpackb(raw)["format_version"] == 1


def test_empty_object_round_trips() -> None:
    data, refs = w.WalObjectWriter().finish(TS, 0, "")
    assert refs == []
    reader = w.WalObjectReader(data)
    assert reader.trailer.entries == ()
    assert reader.trailer.partitions() == []
    assert reader.footer.trailer_offset == w.OBJECT_HEADER_SIZE


def test_exact_layout_of_header_and_footer() -> None:
    data = _build([(TOPIC_A, 1, make_batch([b"v"]))]).data
    assert data[:8] == b"DLWAL\x01\x00\x00"
    offset, length, crc, flags, version, magic = struct.unpack(">qiIBB4s", data[-22:])
    assert (version, magic) == (1, b"DLWF")
    assert flags in (0, 1)
    assert offset + length + 22 == len(data)
    assert crc == crc32c.crc32c(data[offset : offset + length])
    assert w.FOOTER_SIZE == 22


def test_writer_copies_mutable_buffers_and_rejects_bad_input() -> None:
    batch = bytearray(make_batch([b"hello"]))
    writer = w.WalObjectWriter()
    writer.add(TOPIC_A, 0, memoryview(batch))
    original = bytes(batch)
    batch[-1] ^= 0xFF  # the caller reuses its buffer before the object is finished
    data, refs = writer.finish(TS, 1, "az")
    assert data[refs[0].offset : refs[0].offset + refs[0].size] == original

    writer = w.WalObjectWriter()
    with pytest.raises(ValueError):
        writer.add(TOPIC_A, 0, original + b"extra")  # length field disagrees
    with pytest.raises(ValueError):
        writer.add(TOPIC_A, 0, original[:60])
    with pytest.raises(ValueError):
        writer.add(TOPIC_A, -1, original)
    with pytest.raises(ValueError):
        writer.add(TOPIC_A, 0, make_batch([b"v"], magic=1))
    with pytest.raises(TypeError):
        writer.add(TOPIC_A.bytes, 0, original)  # type: ignore[arg-type]
    writer.finish(TS, 1, "az")
    with pytest.raises(RuntimeError):
        writer.add(TOPIC_A, 0, original)
    with pytest.raises(RuntimeError):
        writer.finish(TS, 1, "az")


# --- reading the trailer from the tail alone -------------------------------------------------------


@pytest.mark.parametrize(
    "adds", [[], [(TOPIC_A, 0, make_batch([b"v"]))], _many_batches()], ids=["empty", "one", "many"]
)
def test_trailer_from_tail_bytes_only(adds: list[tuple[UUID, int, bytes]]) -> None:
    data = _build(adds).data
    full = w.WalObjectReader(data)

    # A footer-only tail tells how much more to ask for.
    footer, trailer = w.parse_tail(data[-w.FOOTER_SIZE :], object_size=len(data))
    assert trailer is None
    assert footer == full.footer
    start, end = footer.trailer_range()
    assert w.parse_trailer(data[start:end], footer) == full.trailer

    # Any tail that reaches the trailer's first byte is enough; one byte less is not.
    assert w.parse_tail(data[-(footer.tail_size - 1) :])[1] is None
    for size in (footer.tail_size, footer.tail_size + 1, len(data), w.TAIL_READ_HINT):
        got_footer, got = w.parse_tail(data[-size:], object_size=len(data))
        assert got_footer == footer
        assert got == full.trailer
    # Without the object size the trailer crc still vouches for what was read.
    assert w.parse_tail(data[-footer.tail_size :])[1] == full.trailer


def test_parse_footer_checks_the_object_size_it_is_given() -> None:
    data = _build(_many_batches(10)).data
    with pytest.raises(w.CorruptWalObject):
        w.parse_footer(data, object_size=len(data) + 1)
    with pytest.raises(w.CorruptWalObject):
        w.parse_footer(data[-w.FOOTER_SIZE + 1 :])
    with pytest.raises(w.CorruptWalObject):
        w.parse_trailer(b"short", w.parse_footer(data))


# --- corruption ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "adds", [[], [(TOPIC_A, 0, make_batch([b"v"]))], _many_batches(50)], ids=["empty", "one", "many"]
)
@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_any_flipped_footer_or_trailer_byte_is_detected(adds: list[tuple[UUID, int, bytes]], mask: int) -> None:
    data = _build(adds).data
    footer = w.parse_footer(data)
    for pos in range(footer.trailer_offset, len(data)):
        bad = _flip(data, pos, mask)
        with pytest.raises(w.CorruptWalObject):
            w.WalObjectReader(bad)
        with pytest.raises(w.CorruptWalObject):
            w.parse_tail(bad[-footer.tail_size :], object_size=len(bad))


msgpack_st = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=16), children, max_size=4),
    max_leaves=20,
)


@given(
    document=msgpack_st,
    partitions=st.lists(st.lists(msgpack_st, max_size=4) | msgpack_st, max_size=3),
    compress=st.booleans(),
    garbage=st.binary(min_size=1, max_size=100),
)
def test_any_crc_valid_trailer_parses_or_raises_corrupt(
    document: object, partitions: list, compress: bool, garbage: bytes
) -> None:
    """A trailer that passes the crc but is not what the writer produces is reported, not crashed on."""
    base = {"format_version": 1, "created_ms": TS, "broker_id": 1, "az": "a", "partitions": partitions}
    docs = (document, base, {**base, "partitions": [[TOPIC_A.bytes, 0, partitions]]})
    for raw in [msgpack.packb(doc, use_bin_type=True) for doc in docs] + [garbage]:
        stored = zstandard.compress(raw, 3) if compress and raw is not garbage else raw
        footer = w.Footer(1000, len(stored), crc32c.crc32c(stored), w.FLAG_ZSTD if compress else 0, 1)
        with contextlib.suppress(w.CorruptWalObject):
            trailer = w.parse_trailer(stored, footer)
            assert all(e.offset >= w.OBJECT_HEADER_SIZE and e.offset + e.size <= 1000 for e in trailer.entries)


def test_header_corruption_and_truncation_are_detected() -> None:
    data = _build(_many_batches(5)).data
    for pos in range(6):  # magic and version
        with pytest.raises(w.CorruptWalObject):
            w.WalObjectReader(_flip(data, pos))
    w.WalObjectReader(_flip(data, 6))  # reserved bytes are ignored
    for bad in (data[:-1], data[1:], data + b"\x00", data[:20], b""):
        with pytest.raises(w.CorruptWalObject):
            w.WalObjectReader(bad)


def test_unknown_versions_are_rejected_as_unsupported() -> None:
    data = bytearray(_build(_many_batches(5)).data)
    data[5] = 2  # header version
    data[-5] = 2  # footer version
    with pytest.raises(w.UnsupportedWalVersion):
        w.WalObjectReader(bytes(data))
    with pytest.raises(w.UnsupportedWalVersion):
        w.parse_footer(bytes(data))
    data[5] = 1  # header and footer disagree
    with pytest.raises(w.CorruptWalObject):
        w.WalObjectReader(bytes(data))


def test_batch_corruption_is_caught_by_verify_and_bad_pointers_by_batch_at() -> None:
    adds = _many_batches(20)
    data, refs = _build(adds)
    ref = refs[3]
    for pos in (ref.offset + 8, ref.offset + 21, ref.offset + ref.size - 1):  # length, attributes, last record
        reader = w.WalObjectReader(_flip(data, pos))  # the trailer does not cover batches
        with pytest.raises(w.CorruptWalObject):
            reader.verify_batches()
    reader = w.WalObjectReader(data)
    assert bytes(reader.batch_at(ref.offset, ref.size)) == adds[3][2]
    for offset, size in ((ref.offset, ref.size - 1), (ref.offset + 1, ref.size), (0, ref.size)):
        with pytest.raises(w.CorruptWalObject):
            reader.batch_at(offset, size)
    with pytest.raises(w.CorruptWalObject):
        reader.batch_at(reader.footer.trailer_offset - 10, 61)  # reaches into the trailer


# --- keys ------------------------------------------------------------------------------------------

az_st = st.from_regex(r"[A-Za-z0-9._-]{0,64}", fullmatch=True)


@given(
    created_ms=st.integers(min_value=0, max_value=w.MAX_CREATED_MS),
    az=az_st,
    broker=st.integers(min_value=0, max_value=2**31 - 1),
    uid=st.uuids(),
)
def test_key_round_trip(created_ms: int, az: str, broker: int, uid: UUID) -> None:
    key = w.wal_object_key(created_ms, az, broker, uid.hex)
    info = w.parse_wal_object_key(key)
    assert info == w.WalKeyInfo(created_ms, az, broker, uid.hex)
    assert info.key == key
    t = time.gmtime(created_ms // 1000)
    assert key.startswith(f"wal/{t.tm_year:04d}/{t.tm_mon:02d}/{t.tm_mday:02d}/{t.tm_hour:02d}/")
    assert key.startswith(w.wal_hour_prefix(created_ms))
    assert key > w.wal_key_lower_bound(created_ms)
    assert key.endswith(".wal")


@pytest.mark.parametrize("az", ["us-east-1a", "use1-az1", "-", "--", "", "a-1-2", "zone-7-", "1"])
@pytest.mark.parametrize("broker", [0, 1, 12, 2**31 - 1])
def test_dashes_in_az_never_confuse_parsing(az: str, broker: int) -> None:
    uid = uuid4().hex
    info = w.parse_wal_object_key(w.wal_object_key(1_717_171_717_171, az, broker, uid))
    assert (info.created_ms, info.az, info.broker_id, info.uuid) == (1_717_171_717_171, az, broker, uid)


def test_key_format_and_generated_uuid() -> None:
    key = w.wal_object_key(1_700_000_000_123, "eu-west-1b", 7, "AB" * 16)
    assert key == f"wal/2023/11/14/22/1700000000123-eu-west-1b-7-{'ab' * 16}.wal"
    a, b = (w.parse_wal_object_key(w.wal_object_key(TS, "z", 1)) for _ in range(2))
    assert len(a.uuid) == 32 and a.uuid != b.uuid
    assert w.wal_object_key(5, "z", 1, "0" * 32).startswith("wal/1970/01/01/00/0000000000005-")


@given(
    a=st.tuples(st.integers(0, w.MAX_CREATED_MS), az_st, st.integers(0, 999)),
    b=st.tuples(st.integers(0, w.MAX_CREATED_MS), az_st, st.integers(0, 999)),
)
def test_keys_sort_by_creation_time(a: tuple[int, str, int], b: tuple[int, str, int]) -> None:
    key_a, key_b = w.wal_object_key(*a), w.wal_object_key(*b)
    if a[0] < b[0]:
        assert key_a < key_b
        assert w.wal_key_lower_bound(b[0]) > key_a
    elif a[0] > b[0]:
        assert key_a > key_b


@pytest.mark.parametrize(
    "key",
    [
        "wal/2023/11/14/22/1700000000123-eu-west-1b-07-" + "ab" * 16 + ".wal",  # leading zero in broker
        "wal/2023/11/14/22/1700000000123-eu-west-1b-7-" + "AB" * 16 + ".wal",  # uppercase uuid
        "wal/2023/11/14/23/1700000000123-eu-west-1b-7-" + "ab" * 16 + ".wal",  # wrong hour
        "wal/2023/11/14/22/170000000012-eu-west-1b-7-" + "ab" * 16 + ".wal",  # 12-digit time
        "wal/2023/11/14/22/1700000000123-eu-west-1b-+7-" + "ab" * 16 + ".wal",
        "wal/2023/11/14/22/1700000000123-eu-west-1b-7_0-" + "ab" * 16 + ".wal",
        "wal/2023/11/14/22/1700000000123-eu-west-1b-7-" + "ab" * 15 + ".wal",
        "wal/2023/11/14/22/1700000000123-eu-west-1b-7-" + "ab" * 16,
        "wal/2023/11/14/22/1700000000123-eu-west-1b-7-" + "ab" * 16 + ".wal.tmp",
        "wal/2023/11/14/22/1700000000123-eu west-7-" + "ab" * 16 + ".wal",
        "wal/2023/11/14/22/1700000000123-7-" + "ab" * 16 + ".wal",  # no az part at all
        "x/wal/2023/11/14/22/1700000000123-az-7-" + "ab" * 16 + ".wal",
        "wal/2023/11/14/1700000000123-az-7-" + "ab" * 16 + ".wal",
        "wal/1700000000123-az-7-" + "ab" * 16 + ".wal",
        "",
        "wal/.wal",
    ],
)
def test_malformed_keys_are_rejected(key: str) -> None:
    with pytest.raises(ValueError):
        w.parse_wal_object_key(key)


def test_key_arguments_are_validated() -> None:
    for args in (
        (TS, "eu/west", 1, None),
        (TS, "eu west", 1, None),
        (TS, "a" * 65, 1, None),
        (TS, "az", -1, None),
        (TS, "az", 2**31, None),
        (TS, "az", 1, "xyz"),
        (TS, "az", 1, str(uuid4())),
        (-1, "az", 1, None),
        (10**13, "az", 1, None),
    ):
        with pytest.raises(ValueError):
            w.wal_object_key(*args)


def test_hour_prefixes_cover_a_time_range() -> None:
    start = 1_704_067_200_000 - 2 * w.HOUR_MS + 1  # 2023-12-31T22:00:00.001Z
    end = 1_704_067_200_000 + w.HOUR_MS  # 2024-01-01T01:00:00Z
    assert w.wal_hour_prefixes(start, end) == [
        "wal/2023/12/31/22/",
        "wal/2023/12/31/23/",
        "wal/2024/01/01/00/",
        "wal/2024/01/01/01/",
    ]
    assert w.wal_hour_prefixes(start, start) == ["wal/2023/12/31/22/"]
    assert w.wal_hour_prefixes(end, start) == []


@given(start=st.integers(0, 10**12), span=st.integers(0, 30 * w.HOUR_MS), at=st.floats(0, 1))
def test_every_key_in_a_range_is_under_one_of_its_prefixes(start: int, span: int, at: float) -> None:
    created = start + int(span * at)
    prefixes = w.wal_hour_prefixes(start, start + span)
    assert sorted(prefixes) == prefixes
    assert len(prefixes) == (start + span) // w.HOUR_MS - start // w.HOUR_MS + 1
    key = w.wal_object_key(created, "az", 1)
    assert sum(key.startswith(prefix) for prefix in prefixes) == 1


# --- pointer entries -------------------------------------------------------------------------------


def _assigned(batch: bytes, base_offset: int, epoch: int) -> bytes:
    out = bytearray(batch)
    records.assign_offset(out, base_offset, epoch)
    return bytes(out)


@given(
    batch=batch_st(),
    base_offset=st.integers(0, 2**62),
    epoch=st.integers(0, 2**31 - 1),
    az=az_st,
    offset=st.integers(0, 2**40),
)
def test_pointer_entry_round_trip(batch: bytes, base_offset: int, epoch: int, az: str, offset: int) -> None:
    header61 = _assigned(batch, base_offset, epoch)[: records.HEADER_SIZE]
    key = w.wal_object_key(TS, az, 4)
    entry_bytes = p.encode_pointer_entry(header61, key, offset, len(batch))
    assert len(entry_bytes) == p.POINTER_ENTRY_OVERHEAD + len(key.encode())
    assert p.pointer_entry_size(entry_bytes, 0) == len(entry_bytes)
    buf = b"junk" + entry_bytes + b"more"
    entry, next_pos = p.decode_pointer_entry(buf, 4)
    assert next_pos == 4 + len(entry_bytes)
    assert (entry.header_bytes, entry.key, entry.offset, entry.size) == (header61, key, offset, len(batch))
    assert entry.header == records.parse_header(header61)
    assert (entry.base_offset, entry.last_offset) == (base_offset, base_offset + entry.header.last_offset_delta)
    assert p.entry_header_at(buf, 4) == entry.header
    assert records.last_offset_at(buf, 4 + p.ENTRY_HEADER_POS) == entry.last_offset


def test_exact_pointer_entry_layout() -> None:
    batch = _assigned(make_batch([b"a", b"b"]), 100, 5)
    key = "wal/k.wal"
    raw = p.encode_pointer_entry(batch[:61], key, 4096, len(batch))
    length, crc, kind = struct.unpack_from(">iIb", raw)
    assert (length, kind) == (len(raw) - 4, 1)
    assert crc == crc32c.crc32c(raw[8:])
    assert raw[9:70] == batch[:61]
    assert struct.unpack_from(">H", raw, 70) == (len(key),)
    assert raw[72 : 72 + len(key)] == key.encode()
    assert struct.unpack_from(">qi", raw, 72 + len(key)) == (4096, len(batch))
    assert len(raw) == 84 + len(key) == p.POINTER_ENTRY_OVERHEAD + len(key)


@given(batches=st.lists(st.tuples(batch_st(), st.booleans()), min_size=1, max_size=12))
def test_a_segment_of_mixed_entries_is_walkable(batches: list[tuple[bytes, bool]]) -> None:
    key = w.wal_object_key(TS, "us-east-1a", 2)
    segment = bytearray()
    expected = []
    next_offset = 0
    for i, (batch, inline) in enumerate(batches):
        assigned = _assigned(batch, next_offset, 3)
        if inline:
            segment += p.encode_inline_entry(assigned)
        else:
            segment += p.encode_pointer_entry(assigned[:61], key, 8 + i * 1000, len(assigned))
        expected.append((next_offset, inline, assigned))
        next_offset = records.parse_header(assigned).last_offset + 1

    # Walk by the 4-byte lengths only, as a segment scanner does, then decode fully.
    pos, seen = 0, []
    while pos < len(segment):
        size = p.pointer_entry_size(segment, pos)
        seen.append(p.entry_header_at(segment, pos).base_offset)
        entry, next_pos = p.decode_entry(segment, pos)
        assert next_pos == pos + size
        base, inline, assigned = expected[len(seen) - 1]
        if inline:
            assert isinstance(entry, p.InlineEntry)
            assert entry.batch == assigned
            with pytest.raises(ValueError):
                p.decode_pointer_entry(segment, pos)
        else:
            assert isinstance(entry, p.PointerEntry)
            assert entry.header_bytes == assigned[:61]
        assert entry.base_offset == base
        pos = next_pos
    assert seen == [base for base, _, _ in expected]


def test_pointer_entry_corruption_and_truncation_are_detected() -> None:
    batch = _assigned(make_batch([b"a"] * 3), 7, 1)
    raw = p.encode_pointer_entry(batch[:61], w.wal_object_key(TS, "az", 1), 8, len(batch))
    follower = p.encode_inline_entry(_assigned(make_batch([b"z"]), 10, 1))
    for mask in (0x01, 0xFF):
        for pos in range(len(raw)):
            with pytest.raises(p.CorruptEntry):
                p.decode_entry(_flip(raw, pos, mask) + follower, 0)
    for cut in range(len(raw)):
        with pytest.raises(p.CorruptEntry):
            p.decode_entry(raw[:cut], 0)
    zeros = bytes(100)  # a zero-filled tail after a crash
    assert p.pointer_entry_size(zeros, 0) < p.MIN_ENTRY_SIZE
    assert p.pointer_entry_size(b"\xff" * 4, 0) < p.MIN_ENTRY_SIZE
    for garbage in (zeros, b"\xff" * 100, b"\x00\x00\x00\x05" + bytes(20), b"\x00\x00"):
        with pytest.raises(p.CorruptEntry):
            p.decode_entry(garbage, 0)
    with pytest.raises(p.CorruptEntry):
        p.pointer_entry_size(b"\x00\x00", 0)


@given(garbage=st.binary(max_size=200), kind=st.integers(-128, 127), body=st.binary(max_size=200))
def test_decode_entry_raises_only_corrupt_entry(garbage: bytes, kind: int, body: bytes) -> None:
    """Garbage, and garbage with a correct frame and crc, never escapes as another exception type."""
    header = make_batch([b"a"])[:61]
    framed = [
        garbage,
        struct.pack(">iIb", 5 + len(body), crc32c.crc32c(struct.pack(">b", kind) + body), kind) + body,
        *(
            struct.pack(">iIb", 5 + len(header + tail), crc32c.crc32c(struct.pack(">b", k) + header + tail), k)
            + header
            + tail
            for k in (p.KIND_POINTER, p.KIND_INLINE)
            for tail in (body, body[:2], body[:14])
        ),
    ]
    for data in framed:
        with contextlib.suppress(p.CorruptEntry):
            p.decode_entry(data, 0)


def test_pointer_entry_arguments_are_validated() -> None:
    batch = make_batch([b"a"])
    with pytest.raises(ValueError):
        p.encode_pointer_entry(batch[:60], "k", 8, len(batch))
    with pytest.raises(ValueError):
        p.encode_pointer_entry(batch[:61], "k", 8, len(batch) + 1)  # size must match the header
    with pytest.raises(ValueError):
        p.encode_pointer_entry(batch[:61], "k", -1, len(batch))
    with pytest.raises(ValueError):
        p.encode_pointer_entry(batch[:61], "k" * 70_000, 8, len(batch))
    with pytest.raises(ValueError):
        p.encode_inline_entry(batch + b"x")


# --- serving ---------------------------------------------------------------------------------------


@given(batch=batch_st(), base_offset=st.integers(0, 2**62), epoch=st.integers(0, 2**31 - 1))
def test_serve_batch_sets_leader_fields_and_keeps_the_crc(batch: bytes, base_offset: int, epoch: int) -> None:
    before = bytes(batch)
    served = p.serve_batch(memoryview(batch), base_offset, epoch)
    assert batch == before  # the WAL bytes are not touched
    h = records.parse_header(served)
    assert (h.base_offset, h.partition_leader_epoch) == (base_offset, epoch)
    assert records.compute_crc(served) == h.crc == records.parse_header(batch).crc
    assert crc_ok(bytes(served))
    assert served[8:12] == batch[8:12] and served[16:] == batch[16:]


def test_serve_batch_rejects_ranges_that_are_not_one_batch() -> None:
    batch = make_batch([b"a", b"b"])
    for bad in (batch[:-1], batch + b"\x00", batch[:40], b""):
        with pytest.raises(w.CorruptWalObject):
            p.serve_batch(bad, 0, 0)


def test_write_commit_and_serve_end_to_end() -> None:
    """Writer refs -> pointer entries -> ranged reads of the object -> served batches with records."""
    adds = _many_batches(30)
    data, refs = _build(adds)
    key = w.wal_object_key(TS, "eu-west-1b", 3)
    next_offsets: dict[tuple[UUID, int], int] = {}
    entries = []
    for (topic_id, partition, batch), ref in zip(adds, refs, strict=True):
        base = next_offsets.get((topic_id, partition), 0)
        next_offsets[(topic_id, partition)] = base + records.parse_header(batch).record_count
        header61 = _assigned(batch, base, 9)[:61]
        entries.append(p.decode_pointer_entry(p.encode_pointer_entry(header61, key, ref.offset, ref.size), 0)[0])
    for entry, (_, _, batch) in zip(entries, adds, strict=True):
        wal_range = data[entry.offset : entry.offset + entry.size]  # what a ranged GET returns
        served = entry.serve(wal_range)
        decoded = decode_batch(bytes(served))
        assert decoded.base_offset == entry.base_offset and decoded.partition_leader_epoch == 9
        assert [r.value for r in decoded.records] == [r.value for r in decode_batch(batch).records]
        assert crc_ok(bytes(served))
    # A range holding some other batch (even one of the same size) is never served for this pointer.
    other = make_batch([b""], base_sequence=12345, producer_id=9)
    assert len(other) == refs[0].size
    with pytest.raises(w.CorruptWalObject):
        entries[0].serve(other)
    with pytest.raises(w.CorruptWalObject):
        entries[0].serve(data[refs[0].offset : refs[0].offset + refs[0].size + 1])

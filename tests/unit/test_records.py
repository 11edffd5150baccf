"""v2 record batches at the header level: parsing, validation, framing, offset and time stamping."""

from __future__ import annotations

import struct

import pytest
from batches import (
    CODEC_NAMES,
    CODECS,
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    Record,
    crc_ok,
    decode_batch,
    make_batch,
    values_batch,
)
from hypothesis import given
from hypothesis import strategies as st

from diskless.protocol import records as r

TS = 1_700_000_000_000

record_st = st.builds(
    Record,
    value=st.one_of(st.none(), st.binary(max_size=64)),
    key=st.one_of(st.none(), st.binary(max_size=16)),
    timestamp=st.integers(min_value=TS - 10**9, max_value=TS + 10**9),
    headers=st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=2).map(
        tuple
    ),
)
records_st = st.lists(record_st, min_size=1, max_size=20)
codec_st = st.sampled_from(CODECS)


def _with_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, r.compute_crc(batch))
    return bytes(batch)


# --- helper self-check -----------------------------------------------------------------------


@given(recs=records_st, codec=codec_st)
def test_helper_round_trips_records(recs: list[Record], codec: int) -> None:
    batch = make_batch(recs, compression=codec, base_offset=7)
    assert crc_ok(batch)
    decoded = decode_batch(batch)
    assert [(d.offset, d.timestamp, d.key, d.value, d.headers) for d in decoded.records] == [
        (7 + i, rec.timestamp, rec.key, rec.value, tuple((k, v) for k, v in rec.headers)) for i, rec in enumerate(recs)
    ]


# --- parse / validate ------------------------------------------------------------------------


@given(recs=records_st, codec=codec_st)
def test_parse_header_reads_every_field(recs: list[Record], codec: int) -> None:
    batch = make_batch(
        recs,
        base_offset=1234,
        compression=codec,
        producer_id=99,
        producer_epoch=3,
        base_sequence=17,
        partition_leader_epoch=5,
    )
    h = r.parse_header(batch)
    timestamps = [rec.timestamp for rec in recs]
    assert h.base_offset == 1234
    assert h.size == len(batch)
    assert h.partition_leader_epoch == 5
    assert h.magic == 2
    assert h.compression == codec
    assert h.last_offset_delta == len(recs) - 1
    assert h.last_offset == 1234 + len(recs) - 1
    assert h.base_timestamp == timestamps[0]
    assert h.max_timestamp == max(timestamps)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (99, 3, 17)
    assert h.record_count == len(recs)
    assert not h.is_log_append_time and not h.is_transactional and not h.is_control
    assert r.validate_batch(memoryview(batch), 1 << 20, from_client=False) == h
    assert r.peek_offset_and_size(batch, 0) == (1234, len(batch))
    assert r.last_offset_at(batch, 0) == h.last_offset


def test_parse_header_too_short() -> None:
    with pytest.raises(r.InvalidBatch) as exc:
        r.parse_header(b"\x00" * 60)
    assert exc.value.error == "corrupt_message"


@given(data=st.data(), codec=codec_st)
def test_any_flipped_covered_byte_is_corrupt_message(data: st.DataObject, codec: int) -> None:
    batch = bytearray(values_batch(data.draw(st.integers(1, 10)), compression=codec))
    pos = data.draw(st.integers(r.CRC_START - 4, len(batch) - 1), label="pos")  # crc field or covered bytes
    batch[pos] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(r.InvalidBatch) as exc:
        r.validate_batch(memoryview(batch), 1 << 20)
    assert exc.value.error == "corrupt_message"


@given(data=st.data())
def test_uncovered_fields_do_not_affect_validation(data: st.DataObject) -> None:
    batch = bytearray(values_batch(3))
    r.assign_offset(batch, data.draw(st.integers(0, 2**62)), data.draw(st.integers(-1, 2**31 - 1)))
    r.validate_batch(memoryview(batch), 1 << 20, from_client=False)  # a client's base offset must be 0


def test_message_too_large() -> None:
    batch = values_batch(10)
    r.validate_batch(memoryview(batch), len(batch))
    with pytest.raises(r.InvalidBatch) as exc:
        r.validate_batch(memoryview(batch), len(batch) - 1)
    assert exc.value.error == "message_too_large"


@pytest.mark.parametrize(("magic", "error"), [(0, "invalid_record"), (1, "invalid_record"), (3, "corrupt_message")])
def test_bad_magic(magic: int, error: str) -> None:
    """As Kafka: magic 0/1 in a v3+ produce is INVALID_RECORD, an unknown magic CORRUPT_MESSAGE."""
    batch = make_batch([b"x"], magic=magic)
    with pytest.raises(r.InvalidBatch) as exc:
        r.validate_batch(memoryview(batch), 1 << 20)
    assert exc.value.error == error


@pytest.mark.parametrize(("count", "delta"), [(3, 3), (3, 1), (0, -1), (-1, -2), (3, -1)])
def test_record_count_and_last_offset_delta_must_agree(count: int, delta: int) -> None:
    batch = bytearray(values_batch(3))
    struct.pack_into(">i", batch, 57, count)
    struct.pack_into(">i", batch, 23, delta)
    batch = _with_crc(batch)
    with pytest.raises(r.InvalidBatch) as exc:
        r.validate_batch(memoryview(batch), 1 << 20)
    assert exc.value.error == "invalid_record"


def test_clients_may_not_produce_control_batches() -> None:
    with pytest.raises(r.InvalidBatch) as exc:
        r.validate_batch(memoryview(make_batch([b"x"], control=True)), 1 << 20)
    assert exc.value.error == "invalid_record"


def test_flags_are_exposed() -> None:
    h = r.parse_header(make_batch([b"x"], transactional=True, log_append_time=True, compression=LZ4))
    assert h.is_transactional and h.is_log_append_time and not h.is_control
    assert h.compression == LZ4


# --- split_batches ---------------------------------------------------------------------------


@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6), codec=codec_st)
def test_split_batches_returns_each_batch(sizes: list[int], codec: int) -> None:
    batches = [values_batch(n, tag=f"b{i}", compression=codec) for i, n in enumerate(sizes)]
    parts = r.split_batches(b"".join(batches))
    assert [bytes(p) for p in parts] == batches


@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_split_batches_on_truncated_input(sizes: list[int], data: st.DataObject) -> None:
    batches = [values_batch(n, tag=f"b{i}") for i, n in enumerate(sizes)]
    payload = b"".join(batches)
    boundaries = {0}
    acc = 0
    for b in batches:
        acc += len(b)
        boundaries.add(acc)
    cut = data.draw(st.integers(1, len(payload) - 1).filter(lambda c: c not in boundaries), label="cut")
    with pytest.raises(r.InvalidBatch) as exc:
        r.split_batches(payload[:cut])
    assert exc.value.error == "corrupt_message"


def test_split_batches_empty_and_bad_lengths() -> None:
    assert r.split_batches(b"") == []
    batch = bytearray(values_batch(2))
    for bad_length in (-1, 0, 48, 10**6):
        struct.pack_into(">i", batch, 8, bad_length)
        with pytest.raises(r.InvalidBatch) as exc:
            r.split_batches(bytes(batch))
        assert exc.value.error == "corrupt_message"


# --- offsets and LogAppendTime -----------------------------------------------------------------


@given(base=st.integers(0, 2**62), epoch=st.integers(-1, 2**31 - 1), codec=codec_st)
def test_assign_offset_keeps_crc(base: int, epoch: int, codec: int) -> None:
    original = values_batch(4, compression=codec)
    batch = bytearray(original)
    r.assign_offset(batch, base, epoch)
    assert crc_ok(bytes(batch))
    h = r.parse_header(batch)
    assert (h.base_offset, h.partition_leader_epoch) == (base, epoch)
    assert batch[r.CRC_START :] == original[r.CRC_START :]
    assert [t for _, t in r.iter_record_timestamps(bytes(batch))] == [t for _, t in r.iter_record_timestamps(original)]
    assert [o for o, _ in r.iter_record_timestamps(bytes(batch))] == list(range(base, base + 4))


@given(now=st.integers(0, 2**62), codec=codec_st)
def test_set_log_append_time_keeps_crc_valid(now: int, codec: int) -> None:
    batch = bytearray(values_batch(5, compression=codec, transactional=True))
    r.set_log_append_time(batch, now)
    assert crc_ok(bytes(batch))
    h = r.validate_batch(memoryview(batch), 1 << 20)
    assert h.is_log_append_time and h.is_transactional and h.compression == codec
    assert h.max_timestamp == now
    assert list(r.iter_record_timestamps(bytes(batch))) == [(i, now) for i in range(5)]
    # the records themselves are untouched: the test-side decoder still reads them
    assert [rec.value for rec in decode_batch(bytes(batch)).records] == [f"v-{i}".encode() for i in range(5)]


# --- record timestamps ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_iter_record_timestamps_every_codec(codec: int) -> None:
    timestamps = [TS + 5, TS, TS + 100, TS - 3, TS + 100, TS + 7]
    batch = make_batch(
        [Record(f"r{i}".encode() * 50, timestamp=t) for i, t in enumerate(timestamps)], compression=codec
    )
    batch = bytearray(batch)
    r.assign_offset(batch, 1000, 0)
    assert list(r.iter_record_timestamps(bytes(batch))) == [(1000 + i, t) for i, t in enumerate(timestamps)]


def test_iter_record_timestamps_raw_snappy() -> None:
    timestamps = [TS + i * 3 for i in range(10)]
    batch = make_batch([Record(b"x" * 100, timestamp=t) for t in timestamps], compression=SNAPPY, xerial=False)
    assert list(r.iter_record_timestamps(batch)) == list(enumerate(timestamps))


def test_iter_record_timestamps_large_xerial_snappy_has_several_chunks() -> None:
    recs = [Record(bytes([i % 251]) * 5000, timestamp=TS + i) for i in range(20)]  # > one 32 KiB chunk
    batch = make_batch(recs, compression=SNAPPY)
    assert list(r.iter_record_timestamps(batch)) == [(i, TS + i) for i in range(20)]


@given(recs=records_st, codec=st.sampled_from([NONE, GZIP, SNAPPY, LZ4, ZSTD]))
def test_iter_record_timestamps_matches_independent_decoder(recs: list[Record], codec: int) -> None:
    batch = make_batch(recs, compression=codec, base_offset=50)
    assert list(r.iter_record_timestamps(batch)) == [(d.offset, d.timestamp) for d in decode_batch(batch).records]


def test_unknown_codec_is_corrupt_message() -> None:
    batch = bytearray(values_batch(2))
    struct.pack_into(">h", batch, 21, 6)
    with pytest.raises(r.InvalidBatch) as exc:
        list(r.iter_record_timestamps(_with_crc(batch)))
    assert exc.value.error == "corrupt_message"

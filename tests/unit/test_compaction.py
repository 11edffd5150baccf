"""Log compaction's sans-IO core (diskless.log.compaction) against Kafka's LogCleaner rules.

Batches are built and read back with the test-side codec (``batches.py``), not the code under test:
what a pass keeps is checked on the bytes a consumer would decode.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

import pytest
from batches import CODECS, GZIP, LZ4, DecodedBatch, Record, crc_ok, decode_batch, make_batch
from hypothesis import given
from hypothesis import strategies as st

from diskless.log.compaction import (
    DELETE_HORIZON_FLAG,
    BatchCleaner,
    CleanedTransactions,
    KeyMap,
    is_aborted,
)
from diskless.log.txn_index import CONTROL_ABORT, CONTROL_COMMIT, AbortedTxn
from diskless.protocol import records

T0 = 1_700_000_000_000
NOW = T0 + 60_000
RETENTION = 86_400_000


def rec(key: bytes | None, value: bytes | None, ts: int | None = None, headers: Sequence = ()) -> Record:
    return Record(value, key=key, timestamp=ts, headers=tuple(headers))


def marker(offset: int, pid: int, kind: int, epoch: int = 0, **kwargs: object) -> bytes:
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, 5)
    return make_batch(
        [rec(key, value)],
        base_offset=offset,
        producer_id=pid,
        producer_epoch=epoch,
        transactional=True,
        control=True,
        **kwargs,  # type: ignore[arg-type]
    )


def full_map(log: Iterable[bytes], aborted: Sequence[AbortedTxn] = (), max_entries: int = 10**6) -> KeyMap:
    key_map = KeyMap(max_entries)
    for batch in log:
        assert key_map.add_batch(batch, is_aborted(records.parse_header(batch), aborted))
    return key_map


def clean(
    log: Sequence[bytes],
    *,
    key_map: KeyMap | None = None,
    now: int = NOW,
    retention: int = RETENTION,
    aborted: Sequence[AbortedTxn] = (),
    last_of: Mapping[int, int] | None = None,
    round_end: int | None = None,
) -> tuple[list[bytes], BatchCleaner]:
    """One pass over ``log``: the batches written, each checked to be a sound v2 batch."""
    if key_map is None:
        key_map = full_map(log, aborted)
    cleaner = BatchCleaner(key_map, aborted, last_of or {}, now, retention, round_end_offset=round_end)
    out = []
    for batch in log:
        result = cleaner.clean(batch)
        if result is not None:
            out.append(bytes(result))
    assert_sound(out)
    return out, cleaner


def assert_sound(log: Sequence[bytes]) -> None:
    """Valid v2 batches (CRC, framing, records decode to the declared count) at increasing offsets."""
    previous = -1
    for batch in log:
        assert crc_ok(batch)
        decoded = decode_batch(batch)  # asserts every record's length and the body's end
        assert decoded.magic == 2
        assert decoded.size == len(batch)
        assert decoded.record_count == len(decoded.records)
        assert decoded.base_offset > previous
        for record in decoded.records:
            assert decoded.base_offset <= record.offset <= decoded.last_offset
            assert record.offset > previous
            previous = record.offset
        previous = decoded.last_offset


def kv(log: Iterable[bytes]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in log for r in decode_batch(b).records]


# --- the key map ---------------------------------------------------------------------------------


def test_key_map_keeps_latest_offset_per_key_and_covers_whole_batches() -> None:
    key_map = KeyMap(10)
    assert key_map.end_offset == -1 and len(key_map) == 0
    assert key_map.add_batch(make_batch([rec(b"a", b"1"), rec(b"b", b"1"), rec(b"a", b"2")]), False)
    assert key_map.add_batch(make_batch([rec(None, b"x"), rec(b"b", None)], base_offset=3), False)
    assert key_map.latest(b"a") == 2
    assert key_map.latest(b"b") == 4  # a tombstone is a key's latest record too
    assert key_map.latest(b"c") is None
    assert len(key_map) == 2
    assert key_map.end_offset == 5


def test_key_map_refuses_a_batch_that_would_overflow_it_and_changes_nothing() -> None:
    key_map = KeyMap(2)
    assert key_map.add_batch(make_batch([rec(b"a", b"1"), rec(b"b", b"1")]), False)
    overflowing = make_batch([rec(b"a", b"2"), rec(b"c", b"1")], base_offset=2)
    assert not key_map.add_batch(overflowing, False)
    assert (len(key_map), key_map.end_offset, key_map.latest(b"a"), key_map.latest(b"c")) == (2, 2, 0, None)
    # Keys already in the map take no room: the same keys again fit.
    assert key_map.add_batch(make_batch([rec(b"b", b"2"), rec(b"a", b"3")], base_offset=2), False)
    assert (key_map.end_offset, key_map.latest(b"a"), key_map.latest(b"b")) == (4, 3, 2)


def test_empty_key_map_refuses_a_first_batch_too_large_for_it() -> None:
    key_map = KeyMap(1)
    assert not key_map.add_batch(make_batch([rec(b"a", b"1"), rec(b"b", b"1")]), False)
    assert (len(key_map), key_map.end_offset) == (0, -1)


def test_key_map_control_and_aborted_batches_add_no_keys_but_advance() -> None:
    key_map = KeyMap(0)
    txn = make_batch([rec(b"a", b"1")], producer_id=7, transactional=True)
    assert key_map.add_batch(txn, True)
    assert key_map.add_batch(marker(1, 7, CONTROL_ABORT), False)
    assert (len(key_map), key_map.end_offset, key_map.latest(b"a")) == (0, 2, None)
    assert not key_map.add_batch(make_batch([rec(b"a", b"1")], base_offset=2), False)


def test_key_map_and_cleaner_refuse_batches_out_of_order() -> None:
    key_map = KeyMap(10)
    key_map.add_batch(make_batch([rec(b"a", b"1"), rec(b"b", b"1")], base_offset=5), False)
    with pytest.raises(ValueError):
        key_map.add_batch(make_batch([rec(b"a", b"1")], base_offset=6), False)
    cleaner = BatchCleaner(key_map, [], {}, NOW, RETENTION)
    cleaner.clean(make_batch([rec(b"a", b"1"), rec(b"b", b"1")], base_offset=5))
    with pytest.raises(ValueError):
        cleaner.clean(make_batch([rec(b"a", b"1")], base_offset=6))


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_batches_other_than_v2_are_refused(magic: int) -> None:
    batch = make_batch([rec(b"a", b"1")], magic=magic)
    with pytest.raises(records.InvalidBatch, match="v2"):
        KeyMap(10).add_batch(batch, False)
    with pytest.raises(records.InvalidBatch, match="v2"):
        BatchCleaner(KeyMap(10), [], {}, NOW, RETENTION).clean(batch)


def test_only_the_latest_record_of_each_key_survives_at_its_offset() -> None:
    log = [
        make_batch([rec(b"a", b"a0"), rec(b"b", b"b0")], base_offset=0),
        make_batch([rec(b"a", b"a1")], base_offset=2),
        make_batch([rec(b"c", b"c0"), rec(b"b", b"b1"), rec(b"a", b"a2")], base_offset=3),
    ]
    out, cleaner = clean(log)
    assert kv(out) == [(3, b"c", b"c0"), (4, b"b", b"b1"), (5, b"a", b"a2")]
    assert out == [log[2]]  # the first two batches emptied and went
    assert cleaner.stats.batches_dropped == 2 and cleaner.stats.records_written == 3


def test_a_batch_kept_whole_is_returned_as_the_same_object() -> None:
    batch = make_batch([rec(b"a", b"1"), rec(b"b", b"1")], compression=GZIP)
    key_map = full_map([batch])
    for given_batch in (batch, memoryview(batch), bytearray(batch)):
        cleaner = BatchCleaner(key_map, [], {}, NOW, RETENTION)
        assert cleaner.clean(given_batch) is given_batch
        assert cleaner.stats.batches_unchanged == 1 and cleaner.stats.batches_rewritten == 0


def test_a_partly_kept_batch_keeps_its_offsets_producer_fields_and_timestamps() -> None:
    batch = make_batch(
        [rec(b"a", b"1", T0), rec(b"b", b"1", T0 + 5), rec(b"c", b"1", T0 + 9), rec(b"d", b"1", T0 + 2)],
        base_offset=100,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        partition_leader_epoch=8,
    )
    later = make_batch([rec(b"a", b"2"), rec(b"c", b"2")], base_offset=104)
    out, _ = clean([batch, later], last_of={42: 103})
    got = decode_batch(out[0])
    assert (got.base_offset, got.last_offset_delta, got.record_count) == (100, 3, 2)
    assert (got.producer_id, got.producer_epoch, got.base_sequence) == (42, 3, 17)
    assert got.partition_leader_epoch == 8
    assert got.attributes == 0  # no tombstone: no delete horizon
    assert [(r.offset, r.key, r.timestamp) for r in got.records] == [(101, b"b", T0 + 5), (103, b"d", T0 + 2)]
    # Kafka's builder: base timestamp of the first kept record, max of the kept ones.
    assert (got.base_timestamp, got.max_timestamp) == (T0 + 5, T0 + 5)


def test_records_keep_attributes_key_value_and_headers_bytes() -> None:
    headers = [("h1", b"x"), ("h2", None), ("", b"")]
    batch = make_batch([rec(b"a", b"1", T0), rec(b"b", b"v" * 300, T0 + 70, headers)], base_offset=0)
    out, _ = clean([batch, make_batch([rec(b"a", None)], base_offset=2)])
    (kept,) = decode_batch(out[0]).records
    assert (kept.offset, kept.key, kept.value, kept.headers, kept.timestamp) == (
        1,
        b"b",
        b"v" * 300,
        tuple(headers),
        T0 + 70,
    )


def test_a_record_whose_last_header_is_null_is_not_a_tombstone() -> None:
    batch = make_batch([rec(b"a", b"", T0, [("h", None)]), rec(b"b", b"1", T0, [("h", b"x"), ("g", None)])])
    out, _ = clean([batch])
    assert out == [batch]  # no tombstone: no horizon, no rewrite


def test_keyless_records_go_unless_beyond_the_map() -> None:
    first = make_batch([rec(None, b"x"), rec(b"a", b"1")], base_offset=0)
    tail = make_batch([rec(None, b"y")], base_offset=2)
    key_map = full_map([first])
    out, cleaner = clean([first, tail], key_map=key_map)
    assert kv(out) == [(1, b"a", b"1"), (2, None, b"y")]
    assert cleaner.stats.keyless_dropped == 1


def test_records_beyond_the_map_survive_untouched() -> None:
    log = [make_batch([rec(b"k", str(i).encode()), rec(b"j", b"v")], base_offset=2 * i) for i in range(5)]
    key_map = KeyMap(2)
    assert key_map.add_batch(log[0], False) and key_map.add_batch(log[1], False)
    out, _ = clean(log, key_map=key_map)
    assert kv(out) == [(2, b"k", b"1"), (3, b"j", b"v"), *kv(log[2:])]
    assert out[1:] == log[2:]


def test_an_empty_map_cleans_no_records() -> None:
    log = [make_batch([rec(b"k", b"1")]), make_batch([rec(b"k", b"2"), rec(None, b"x")], base_offset=1)]
    out, _ = clean(log, key_map=KeyMap(0))
    assert out == log


@pytest.mark.parametrize("codec", CODECS)
def test_a_rebuilt_batch_keeps_its_codec(codec: int) -> None:
    values = [rec(f"k{i % 7}".encode(), f"value {i} ".encode() * 20, T0 + i) for i in range(40)]
    batch = make_batch(values, compression=codec, base_offset=10)
    out, _ = clean([batch])
    got = decode_batch(out[0])
    assert got.attributes & records.COMPRESSION_MASK == codec
    assert [(r.offset, r.key, r.value, r.timestamp) for r in got.records] == [
        (10 + i, values[i].key, values[i].value, T0 + i) for i in range(33, 40)
    ]
    assert got.last_offset == 49
    if codec:  # compressed for real, at the codec's default level (gzip level 0 would store it)
        body_size = sum(len(v.value or b"") for v in values[33:])
        assert len(out[0]) - records.HEADER_SIZE < body_size / 2


def test_a_log_append_time_batch_keeps_its_append_time() -> None:
    batch = make_batch([rec(b"a", b"1", T0), rec(b"b", b"1", T0 + 3)], log_append_time=True)
    # make_batch sets the max timestamp from the records: the append time the log stamped.
    out, _ = clean([batch, make_batch([rec(b"b", b"2")], base_offset=2)])
    got = decode_batch(out[0])
    assert got.attributes & records.TIMESTAMP_TYPE_LOG_APPEND
    assert got.max_timestamp == T0 + 3  # not the kept record's own (create) time
    assert [(r.offset, r.timestamp) for r in got.records] == [(0, T0 + 3)]


def test_a_corrupt_batch_is_refused_rather_than_rewritten_with_a_fresh_crc() -> None:
    batch = bytearray(make_batch([rec(b"a", b"1"), rec(b"b", b"1")]))
    batch[-2] ^= 0xFF  # the last value's byte (a header count follows): the framing still parses
    later = make_batch([rec(b"a", b"2")], base_offset=2)
    with pytest.raises(records.InvalidBatch, match="CRC"):
        clean([bytes(batch), later])


def test_a_record_overrunning_its_length_is_refused() -> None:
    batch = bytearray(make_batch([rec(b"a", b"1")]))
    batch[records.HEADER_SIZE] = 0x7E  # the record's length varint: 63 bytes, past the body's end
    with pytest.raises(records.InvalidBatch, match="overruns"):
        KeyMap(10).add_batch(bytes(batch), False)


# --- tombstones and the delete horizon -----------------------------------------------------------


def timestamps(batch: bytes) -> list[tuple[int, int]]:
    return list(records.iter_record_timestamps(batch))


def test_first_pass_sets_the_delete_horizon_and_keeps_absolute_timestamps() -> None:
    batch = make_batch([rec(b"a", None, T0 + 40), rec(b"b", b"1", T0), rec(b"c", None, T0 + 7)], compression=LZ4)
    out, cleaner = clean([batch], now=NOW, retention=1000)
    got = decode_batch(out[0])
    assert got.attributes & DELETE_HORIZON_FLAG
    assert got.attributes & ~DELETE_HORIZON_FLAG == LZ4
    assert got.base_timestamp == NOW + 1000
    assert got.max_timestamp == T0 + 40
    assert timestamps(out[0]) == timestamps(batch) == [(0, T0 + 40), (1, T0), (2, T0 + 7)]
    assert [(r.key, r.value) for r in got.records] == [(b"a", None), (b"b", b"1"), (b"c", None)]
    assert cleaner.stats.horizons_set == 1


def test_tombstones_survive_until_the_horizon_then_go() -> None:
    log = [
        make_batch([rec(b"a", b"1"), rec(b"b", b"1")]),
        make_batch([rec(b"a", None), rec(b"c", b"1")], base_offset=2),
    ]
    first, _ = clean(log, now=NOW, retention=1000)
    assert kv(first) == [(1, b"b", b"1"), (2, b"a", None), (3, b"c", b"1")]
    assert decode_batch(first[1]).base_timestamp == NOW + 1000

    before, cleaner = clean(first, key_map=full_map(first), now=NOW + 999, retention=1000)
    assert before == first and cleaner.stats.batches_rewritten == 0

    after, cleaner = clean(first, key_map=full_map(first), now=NOW + 1000, retention=1000)
    assert kv(after) == [(1, b"b", b"1"), (3, b"c", b"1")]
    assert cleaner.stats.tombstones_dropped == 1
    # The batch keeps its horizon: its timestamps stay as they were.
    got = decode_batch(after[1])
    assert got.attributes & DELETE_HORIZON_FLAG and got.base_timestamp == NOW + 1000
    assert [r.timestamp for r in got.records] == [r.timestamp for r in decode_batch(first[1]).records[1:]]


def test_a_batch_with_a_horizon_is_not_given_another() -> None:
    log = [make_batch([rec(b"a", None), rec(b"b", b"1")]), make_batch([rec(b"b", b"2")], base_offset=2)]
    first, _ = clean(log[:1], now=NOW, retention=1000)
    second, _ = clean(first + log[1:], now=NOW + 500, retention=1000)
    got = decode_batch(second[0])
    assert got.base_timestamp == NOW + 1000 and [r.key for r in got.records] == [b"a"]


def test_a_batch_without_tombstones_gets_no_horizon() -> None:
    batch = make_batch([rec(b"a", b"1"), rec(b"b", b"1")])
    out, _ = clean([batch])
    assert out == [batch]


def test_a_superseded_tombstone_goes_at_once_and_sets_no_horizon() -> None:
    log = [make_batch([rec(b"a", None), rec(b"b", b"1")]), make_batch([rec(b"a", b"2")], base_offset=2)]
    out, _ = clean(log)
    assert not decode_batch(out[0]).attributes & DELETE_HORIZON_FLAG
    assert kv(out) == [(1, b"b", b"1"), (2, b"a", b"2")]


def test_tombstones_beyond_the_map_stay_but_get_a_horizon() -> None:
    log = [make_batch([rec(b"a", b"1")]), make_batch([rec(b"a", None)], base_offset=1)]
    key_map = full_map(log[:1])
    out, _ = clean(log, key_map=key_map, now=NOW + 10**9)
    assert kv(out) == [(0, b"a", b"1"), (1, b"a", None)]
    assert decode_batch(out[1]).base_timestamp == NOW + 10**9 + RETENTION


def test_a_huge_delete_retention_does_not_wrap_the_horizon() -> None:
    out, _ = clean([make_batch([rec(b"a", None)])], retention=2**63 - 1)
    assert decode_batch(out[0]).base_timestamp == 2**63 - 1


# --- transactions --------------------------------------------------------------------------------


def txn_batch(offset: int, pid: int, *entries: Record, **kwargs: object) -> bytes:
    return make_batch(list(entries), base_offset=offset, producer_id=pid, transactional=True, **kwargs)  # type: ignore[arg-type]


def test_is_aborted() -> None:
    aborted = [AbortedTxn(7, 10, 20)]
    header = records.parse_header
    assert is_aborted(header(txn_batch(10, 7, rec(b"a", b"1"))), aborted)
    assert is_aborted(header(txn_batch(19, 7, rec(b"a", b"1"))), aborted)
    assert not is_aborted(header(txn_batch(9, 7, rec(b"a", b"1"))), aborted)
    assert not is_aborted(header(txn_batch(21, 7, rec(b"a", b"1"))), aborted)
    assert not is_aborted(header(txn_batch(12, 8, rec(b"a", b"1"))), aborted)
    not_txn = make_batch([rec(b"a", b"1")], base_offset=12, producer_id=7)
    assert not is_aborted(header(not_txn), aborted)
    assert not is_aborted(header(marker(20, 7, CONTROL_ABORT)), aborted)


def test_aborted_batches_go_and_their_marker_goes_two_passes_later() -> None:
    log = [
        txn_batch(0, 7, rec(b"a", b"aborted")),
        make_batch([rec(b"b", b"1")], base_offset=1),
        txn_batch(2, 7, rec(b"c", b"aborted")),
        marker(3, 7, CONTROL_ABORT),
    ]
    aborted = [AbortedTxn(7, 0, 3)]
    first, cleaner = clean(log, aborted=aborted)
    assert first == [log[1], log[3]]  # the marker stays while batches of its transaction were met
    assert cleaner.kept_aborted == aborted
    assert cleaner.stats.aborted_batches_dropped == 2

    second, cleaner = clean(first, aborted=aborted)
    assert kv(second) == kv(first) and cleaner.kept_aborted == []
    horizon_marker = decode_batch(second[1])
    assert horizon_marker.attributes & DELETE_HORIZON_FLAG and horizon_marker.base_timestamp == NOW + RETENTION

    third, _ = clean(second, aborted=aborted, now=NOW + RETENTION - 1)
    assert third == second
    fourth, cleaner = clean(second, aborted=aborted, now=NOW + RETENTION)
    assert fourth == [log[1]] and cleaner.stats.markers_dropped == 1


def test_a_commit_marker_stays_while_data_of_its_transaction_does() -> None:
    log = [txn_batch(0, 7, rec(b"a", b"1"), rec(b"b", b"1")), marker(2, 7, CONTROL_COMMIT)]
    out = log
    for step in range(3):
        out, _ = clean(out, now=NOW + step * 2 * RETENTION)
        assert out == log


def test_a_commit_marker_goes_after_its_data_did() -> None:
    log = [
        txn_batch(0, 7, rec(b"a", b"1")),
        marker(1, 7, CONTROL_COMMIT),
        make_batch([rec(b"a", b"2")], base_offset=2),
    ]
    first, _ = clean(log)
    assert first == log[1:]  # the data was traversed in this pass: the marker is left as it was
    second, _ = clean(first)
    assert decode_batch(second[0]).base_timestamp == NOW + RETENTION
    assert decode_batch(second[0]).attributes & DELETE_HORIZON_FLAG
    assert kv(second) == kv(first)
    third, _ = clean(second, now=NOW + RETENTION)
    assert third == log[2:]


def test_an_emptied_control_batch_is_discardable() -> None:
    txns = CleanedTransactions([])
    empty_marker = marker(0, 7, CONTROL_COMMIT)
    header = records.parse_header(empty_marker)
    assert txns.on_control_batch(header, None)


def test_an_unknown_control_record_is_never_removed() -> None:
    leader_change = make_batch(
        [rec(struct.pack(">hh", 0, 2), b"\x00")], producer_id=-1, control=True, base_timestamp=T0
    )
    out, _ = clean([leader_change], now=NOW)
    assert out == [leader_change]
    out, _ = clean(out, now=NOW + 10 * RETENTION)
    assert out == [leader_change]


def test_an_aborted_transaction_whose_marker_is_gone_aborts_nothing_after_it() -> None:
    # Transaction 0-1 of producer 7 was aborted and its data and marker removed by earlier passes;
    # an aborted list that still names it must not make the producer's next transaction aborted.
    log = [txn_batch(2, 7, rec(b"a", b"committed")), marker(3, 7, CONTROL_COMMIT)]
    stale = [AbortedTxn(7, 0, 1)]
    out, cleaner = clean(log, aborted=stale)
    assert out == log and cleaner.kept_aborted == []
    # A later aborted transaction of the same producer is still told apart.
    log += [txn_batch(4, 7, rec(b"a", b"aborted")), marker(5, 7, CONTROL_ABORT)]
    out, cleaner = clean(log, aborted=[*stale, AbortedTxn(7, 4, 5)])
    assert out == [log[0], log[1], log[3]] and cleaner.kept_aborted == [AbortedTxn(7, 4, 5)]


def test_interleaved_transactions_are_told_apart() -> None:
    log = [
        txn_batch(0, 7, rec(b"a", b"aborted")),
        txn_batch(1, 8, rec(b"a", b"committed")),
        marker(2, 7, CONTROL_ABORT),
        marker(3, 8, CONTROL_COMMIT),
    ]
    aborted = [AbortedTxn(7, 0, 2)]
    key_map = full_map(log, aborted)
    assert key_map.latest(b"a") == 1
    out, _ = clean(log, key_map=key_map, aborted=aborted)
    assert out == log[1:]


# --- batches kept empty --------------------------------------------------------------------------


def test_the_last_batch_of_an_active_producer_is_kept_empty() -> None:
    idempotent = make_batch(
        [rec(b"a", b"1"), rec(b"b", b"1"), rec(b"a", b"2")],
        base_offset=10,
        producer_id=5,
        producer_epoch=2,
        base_sequence=30,
        partition_leader_epoch=4,
        compression=GZIP,
        base_timestamp=T0,
    )
    later = make_batch([rec(b"a", b"3"), rec(b"b", b"2")], base_offset=13)
    out, cleaner = clean([idempotent, later], last_of={5: 12})
    empty = decode_batch(out[0])
    assert (empty.base_offset, empty.last_offset_delta, empty.record_count) == (10, 2, 0)
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (5, 2, 30)
    assert empty.partition_leader_epoch == 4
    assert empty.attributes == 0  # no codec for no body (Kafka's writeEmptyHeader)
    assert (empty.base_timestamp, empty.max_timestamp) == (-1, T0)
    assert len(out[0]) == records.HEADER_SIZE
    assert cleaner.stats.batches_emptied == 1
    # Emptied already: the same object again; an inactive producer's goes.
    again = BatchCleaner(full_map(out), [], {5: 12}, NOW, RETENTION)
    assert again.clean(out[0]) is out[0]
    gone, _ = clean([idempotent, later], last_of={5: 11})
    assert gone == [later]


def test_an_aborted_last_batch_of_an_active_producer_is_kept_empty() -> None:
    log = [txn_batch(0, 7, rec(b"a", b"1"), rec(b"b", b"1"))]
    out, _ = clean(log, aborted=[AbortedTxn(7, 0, 5)], last_of={7: 1})
    got = decode_batch(out[0])
    assert (got.record_count, got.last_offset, got.producer_id) == (0, 1, 7)
    assert got.attributes == records.TRANSACTIONAL_FLAG


def test_a_marker_that_is_its_producers_last_batch_is_kept_empty_past_its_horizon() -> None:
    log = [txn_batch(0, 7, rec(b"a", b"1")), marker(1, 7, CONTROL_ABORT, epoch=3)]
    aborted = [AbortedTxn(7, 0, 1)]
    out, _ = clean(log, aborted=aborted, last_of={7: 1})
    out, _ = clean(out, aborted=aborted, last_of={7: 1})
    out, _ = clean(out, aborted=aborted, last_of={7: 1}, now=NOW + RETENTION)
    got = decode_batch(out[0])
    assert (got.base_offset, got.record_count, got.producer_epoch) == (1, 0, 3)
    assert got.attributes == records.TRANSACTIONAL_FLAG | records.CONTROL_FLAG


def test_the_last_batch_of_the_round_is_kept_empty() -> None:
    log = [make_batch([rec(b"a", b"1")]), make_batch([rec(None, b"x"), rec(b"a", None)], base_offset=1)]
    key_map = full_map(log)
    out, _ = clean(log, key_map=key_map, round_end=3, now=NOW + RETENTION + 1)
    assert kv(out) == [(2, b"a", None)]
    out, _ = clean(out, key_map=key_map, round_end=3, now=NOW + 2 * RETENTION + 1)
    assert kv(out) == [] and decode_batch(out[0]).last_offset == 2


def test_stats_account_for_every_batch_and_byte() -> None:
    log = [
        make_batch([rec(b"a", b"1"), rec(b"b", b"1")]),
        make_batch([rec(b"a", b"2")], base_offset=2),
        make_batch([rec(b"c", b"1")], base_offset=3),
    ]
    out, cleaner = clean(log)
    stats = cleaner.stats
    assert (stats.batches_read, stats.records_read, stats.bytes_read) == (3, 4, sum(map(len, log)))
    assert (stats.batches_written, stats.records_written, stats.bytes_written) == (3, 3, sum(map(len, out)))
    assert (stats.batches_unchanged, stats.batches_rewritten, stats.batches_dropped) == (2, 1, 0)


# --- property: a random log against a model of Kafka's rules -------------------------------------

KEYS = [b"k0", b"k1", b"k2", b"k3", b"k4"]
PLAIN, IDEMPOTENT, TXN, END = "plain", "idempotent", "txn", "end"


class Log:
    """A generated log and what the model needs to know of it."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.aborted: list[AbortedTxn] = []
        self.aborted_batches: set[int] = set()  # base offsets of aborted data batches
        self.last_of: dict[int, int] = {}
        self.has_markers = False

    def __repr__(self) -> str:
        shown = "\n  ".join(
            f"{d.base_offset}-{d.last_offset} pid={d.producer_id} attrs={d.attributes:#x} "
            + str([(r.offset, r.key, r.value) for r in d.records])
            for d in map(decode_batch, self.batches)
        )
        return f"Log(aborted={self.aborted}, last_of={self.last_of}\n  {shown})"


@st.composite
def generated_logs(draw: st.DrawFn) -> Log:
    log = Log()
    offset = draw(st.integers(0, 3))
    ts = T0
    open_txns: dict[int, tuple[int, list[int]]] = {}  # pid -> (first offset, batch base offsets)
    sequences: dict[int, int] = {}
    records_of = st.lists(
        st.builds(
            rec,
            st.sampled_from([*KEYS, None]),
            st.one_of(st.none(), st.binary(min_size=0, max_size=12)),
            st.integers(-3000, 3000).map(lambda d: T0 + d),
            st.lists(
                st.tuples(st.sampled_from(["h", "trace"]), st.one_of(st.none(), st.binary(max_size=4))), max_size=2
            ),
        ),
        min_size=1,
        max_size=5,
    )

    def end_txn(pid: int, commit: bool) -> None:
        nonlocal offset
        first, bases = open_txns.pop(pid)
        log.batches.append(marker(offset, pid, CONTROL_COMMIT if commit else CONTROL_ABORT, base_timestamp=ts))
        if not commit:
            log.aborted.append(AbortedTxn(pid, first, offset))
            log.aborted_batches.update(bases)
        log.last_of[pid] = offset
        log.has_markers = True
        offset += 1

    for _ in range(draw(st.integers(1, 14))):
        action = draw(st.sampled_from([PLAIN, PLAIN, IDEMPOTENT, TXN, TXN, END]))
        ts += draw(st.integers(0, 100))
        if action == END:
            if open_txns:
                end_txn(draw(st.sampled_from(sorted(open_txns))), draw(st.booleans()))
            continue
        entries = draw(records_of)
        codec = draw(st.sampled_from(CODECS))
        fields: dict[str, object] = {"base_offset": offset, "compression": codec, "base_timestamp": ts}
        fields["log_append_time"] = draw(st.integers(0, 5)) == 0
        if action == IDEMPOTENT:
            pid = draw(st.sampled_from([1, 2]))
            fields.update(producer_id=pid, producer_epoch=0, base_sequence=sequences.get(pid, 0))
            sequences[pid] = sequences.get(pid, 0) + len(entries)
        elif action == TXN:
            pid = draw(st.sampled_from([10, 11, 12]))
            fields.update(producer_id=pid, producer_epoch=0, transactional=True)
            open_txns.setdefault(pid, (offset, []))[1].append(offset)
        batch = make_batch(entries, **fields)  # type: ignore[arg-type]
        log.batches.append(batch)
        if action != PLAIN:
            log.last_of[pid] = offset + len(entries) - 1
        offset += len(entries) + draw(st.sampled_from([0, 0, 0, 2]))  # gaps: an earlier compaction's
    for pid in sorted(open_txns):  # the cleanable range stops at the LSO: every transaction is decided
        end_txn(pid, draw(st.booleans()))
    if not log.batches:
        log.batches.append(make_batch([rec(b"k0", b"only")], base_offset=offset))
    # Some producers expired: their last batches need not stay.
    log.last_of = {pid: last for pid, last in log.last_of.items() if draw(st.booleans())}
    return log


def read_committed(batches: Iterable[bytes], aborted_batches: set[int]) -> dict[bytes, bytes]:
    """What a read_committed consumer of the whole log ends up with: each key's latest value."""
    state: dict[bytes, bytes] = {}
    for batch in batches:
        decoded = decode_batch(batch)
        if decoded.attributes & records.CONTROL_FLAG or decoded.base_offset in aborted_batches:
            continue
        for record in decoded.records:
            if record.key is None:
                continue
            if record.value is None:
                state.pop(record.key, None)
            else:
                state[record.key] = record.value
    return state


def horizon_of(batch: DecodedBatch) -> int | None:
    return batch.base_timestamp if batch.attributes & DELETE_HORIZON_FLAG else None


def expected_data_records(log: Log, batches: Sequence[bytes], end: int, now: int) -> set[tuple]:
    """The data records a pass must keep, by Kafka's Cleaner.shouldRetainRecord, from the decoded log."""
    decoded = [decode_batch(b) for b in batches]
    data = [b for b in decoded if not b.attributes & records.CONTROL_FLAG and b.base_offset not in log.aborted_batches]
    latest: dict[bytes, int] = {}
    for batch in data:
        if batch.last_offset < end:  # a batch the map covers
            for record in batch.records:
                if record.key is not None:
                    latest[record.key] = max(latest.get(record.key, -1), record.offset)
    kept = set()
    for batch in data:
        horizon = horizon_of(batch)
        for r in batch.records:
            if r.offset >= end:
                keep = True
            elif r.key is None:
                keep = False
            else:
                is_latest = r.offset >= latest.get(r.key, -1)
                keep = is_latest and (r.value is not None or horizon is None or now < horizon)
            if keep:
                kept.add((r.offset, r.key, r.value, r.headers, r.timestamp))
    return kept


def data_records(batches: Iterable[bytes]) -> set[tuple]:
    return {
        (r.offset, r.key, r.value, r.headers, r.timestamp)
        for b in map(decode_batch, batches)
        if not b.attributes & records.CONTROL_FLAG
        for r in b.records
    }


def markers(batches: Iterable[bytes]) -> dict[int, DecodedBatch]:
    return {d.base_offset: d for d in map(decode_batch, batches) if d.attributes & records.CONTROL_FLAG}


def discardable_markers(log: Log, batches: Sequence[bytes]) -> set[int]:
    """Offsets of markers no data of their transaction precedes any more (in ``batches``)."""
    out = set()
    since_marker: dict[int, list[int]] = {}  # pid -> base offsets of its transactional batches since its last marker
    for d in map(decode_batch, batches):
        if not d.attributes & records.TRANSACTIONAL_FLAG:
            continue
        if d.attributes & records.CONTROL_FLAG:
            if not since_marker.pop(d.producer_id, []):
                out.add(d.base_offset)
        else:
            since_marker.setdefault(d.producer_id, []).append(d.base_offset)
    return out


def one_pass(log: Log, batches: Sequence[bytes], key_map: KeyMap, now: int, round_end: int | None) -> list[bytes]:
    out, _ = clean(
        batches, key_map=key_map, now=now, retention=1000, aborted=log.aborted, last_of=log.last_of, round_end=round_end
    )
    # Every record the rules keep, and no other: (1) each key's latest committed record in the map's
    # range that is not an expired tombstone, with its offset, key, value, headers and timestamp;
    # (2) nothing older than its key's latest in that range; (3) everything beyond the map's end.
    assert data_records(out) == expected_data_records(log, batches, key_map.end_offset, now)
    # (5) A read_committed consumer sees the same values.
    assert read_committed(out, log.aborted_batches) == read_committed(log.batches, log.aborted_batches)
    # Batches left without records are those a producer or the round needs.
    for d in map(decode_batch, out):
        if d.record_count == 0:
            assert log.last_of.get(d.producer_id) == d.last_offset or d.last_offset + 1 == round_end
    return out


def covering_map(batches: Sequence[bytes], log: Log, max_entries: int) -> KeyMap:
    key_map = KeyMap(max_entries)
    for batch in batches:
        header = records.parse_header(batch)
        assert is_aborted(header, log.aborted) == (header.base_offset in log.aborted_batches)
        if not key_map.add_batch(batch, header.base_offset in log.aborted_batches):
            break
    return key_map


def check_markers(log: Log, before: Sequence[bytes], after: Sequence[bytes], now: int, round_end: int | None) -> None:
    """Each marker of ``before`` as Kafka's cleaner leaves it after a pass at ``now``: kept while data
    of its transaction remains; given a horizon by the first pass that finds none; removed by a pass
    past that horizon (kept empty if its producer or the round needs it)."""
    discardable = discardable_markers(log, before)
    left = markers(after)
    for offset, d in markers(before).items():
        kept_empty = log.last_of.get(d.producer_id) == offset or offset + 1 == round_end
        horizon = horizon_of(d)
        if d.record_count == 0:
            assert left[offset] == d if kept_empty else offset not in left
        elif offset in discardable and horizon is not None and horizon <= now:
            assert left[offset].record_count == 0 if kept_empty else offset not in left
        elif offset in discardable and horizon is None:
            assert horizon_of(left[offset]) == now + 1000 and left[offset].records == d.records
        else:
            assert left[offset] == d


@given(generated_logs(), st.sampled_from([10**6, 0, 1, 2, 3]), st.booleans())
def test_cleaning_keeps_what_kafka_keeps(log: Log, max_entries: int, round_end_given: bool) -> None:
    round_end = decode_batch(log.batches[-1]).last_offset + 1 if round_end_given else None
    now = T0 + 10_000
    key_map = covering_map(log.batches, log, max_entries)
    first = one_pass(log, log.batches, key_map, now, round_end)
    # The first pass meets every transaction's data before its marker: no marker changes.
    assert markers(first) == markers(log.batches)

    # (6) Cleaning again with the same map and time changes nothing once markers have settled: the
    # pass after the one that removed a transaction's data sets the horizon of its markers.
    again = one_pass(log, first, key_map, now, round_end)
    check_markers(log, first, again, now, round_end)
    if log.has_markers:
        assert one_pass(log, again, key_map, now, round_end) == again
    else:
        assert again == first

    # Passes once horizons have passed, each with the map rebuilt over the cleaned log: expired
    # tombstones go, markers whose data went get a horizon, then go.
    for later in (now + 1000, now + 2000, now + 3000):
        before = again
        again = one_pass(log, before, covering_map(before, log, max_entries), later, round_end)
        check_markers(log, before, again, later, round_end)

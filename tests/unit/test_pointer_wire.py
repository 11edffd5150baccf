"""Pointer entries on the replica-fetch wire (storage/pointer_wire.py via replication/partition.py).

Followers in other AZs copy every pointer entry their leader appends, so an entry's bytes on the
wire are bytes crossing AZs for every produced batch (issue 10: <= 1 % of payload). A segment
entry carries the WAL object's whole key (~75 bytes) and a frame; on the wire an entry must cost
little more than the 61-byte batch header, and the follower must get back exactly the segment
bytes the leader has.
"""

from __future__ import annotations

import struct

import pytest
from batches import Record, make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from diskless.protocol import records
from diskless.replication.partition import collect_pointer_keys, unwrap_pointers, wrap_pointers
from diskless.storage import pointer
from diskless.storage.wal_format import wal_object_key

T0 = 1_763_840_000_000
# Per entry after the first of a run: a kind byte, the header's fields as differences from the
# entry before (the CRC as it is), a key reference and the offset in the object.
PER_ENTRY_BOUND = 32
FIRST_ENTRY_BOUND = 40  # the first entry's fields are whole numbers (offsets, times, producer ids)
PER_KEY_BOUND = 40  # a canonical WAL object key: time, AZ, broker and uuid, not the 75-byte text
ENVELOPE_BOUND = 24


def _header(base_offset: int, value_bytes: int = 1000, epoch: int = 3, sequence: int = -1) -> bytes:
    """The header of an idempotent producer's one-record batch, ``sequence`` (offset if -1) and a few ms apart."""
    seq = base_offset if sequence < 0 else sequence
    ts = T0 + 7 * seq
    batch = bytearray(
        make_batch(
            [Record(b"v" * value_bytes, timestamp=ts)],
            base_timestamp=ts,
            producer_id=4_000_123,
            producer_epoch=0,
            base_sequence=seq,
        )
    )
    records.assign_offset(batch, base_offset, epoch)
    return bytes(batch[: records.HEADER_SIZE])


def _entry(base_offset: int, key: str, position: int) -> bytes:
    header = _header(base_offset)
    return pointer.encode_pointer_entry(header, key, position, records.parse_header(header).size)


def test_one_pointer_entry_on_the_wire_is_smaller_than_its_header_and_key() -> None:
    key = wal_object_key(T0, "az-1", 1)
    entries = _entry(0, key, 4096)
    wrapped = wrap_pointers(entries)
    assert len(wrapped) <= ENVELOPE_BOUND + PER_KEY_BOUND + FIRST_ENTRY_BOUND, (len(entries), len(wrapped))
    assert unwrap_pointers(wrapped) == entries


@pytest.mark.parametrize("count, keys", [(20, 3), (200, 1)])
def test_replica_fetch_answer_of_n_entries_is_bounded_by_n_header_differences(count: int, keys: int) -> None:
    names = [wal_object_key(T0 + k, f"az-{k % 3 + 1}", k + 1) for k in range(keys)]
    entries = b"".join(_entry(i, names[i % keys], 100 + 1100 * i) for i in range(count))
    wrapped = wrap_pointers(entries)
    bound = ENVELOPE_BOUND + keys * PER_KEY_BOUND + FIRST_ENTRY_BOUND + (count - 1) * PER_ENTRY_BOUND
    assert len(wrapped) <= bound, f"{count} entries: {len(wrapped)} bytes on the wire > {bound} ({len(entries)} raw)"
    assert unwrap_pointers(wrapped) == entries


_keys = st.one_of(
    st.builds(
        wal_object_key,
        st.integers(0, 10**13 - 1),
        st.from_regex(r"[A-Za-z0-9._-]{0,64}", fullmatch=True),
        st.integers(0, 2**31 - 1),
        st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
    ),
    st.text(min_size=0, max_size=80),  # any key a segment may hold (tests, older layouts)
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("pointer"), _keys, st.integers(0, 2**63 - 1), st.integers(0, 2**40)),
            st.tuples(st.just("inline"), st.integers(0, 300)),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_round_trip_gives_the_leaders_segment_bytes_exactly(items: list[tuple]) -> None:
    out = []
    offset = 0
    for item in items:
        if item[0] == "pointer":
            _, key, position, _gap = item
            header = _header(offset, value_bytes=5, sequence=item[2] % 2**31)
            out.append(pointer.encode_pointer_entry(header, key, position, records.parse_header(header).size))
        else:
            batch = bytearray(make_batch([Record(b"i" * item[1], timestamp=T0)], base_timestamp=T0))
            records.assign_offset(batch, offset, 1)
            out.append(pointer.encode_inline_entry(batch))
        offset += 1 + (item[3] if item[0] == "pointer" else 0) % 1000
    entries = b"".join(out)
    assert unwrap_pointers(wrap_pointers(entries)) == entries


# --- one key table for a whole replica fetch answer ---------------------------------------------


def _answer_runs(partitions: int, keys: list[str]) -> list[bytes]:
    """One run per partition, as a flush of one WAL object (or a few) reaches many partitions."""
    return [_entry(100 + p, keys[p % len(keys)], 1100 * p) for p in range(partitions)]


def _shared_answer(runs: list[bytes]) -> list[bytes]:
    shared: dict[str, int] = {}
    return [wrap_pointers(run, shared) for run in runs]


def test_an_answer_writes_each_key_once_across_its_partitions() -> None:
    """At 1,000 partitions a follower's answer holds ~one batch a partition, most from the same few
    WAL objects: without a shared table every run wrote its key (~31 bytes of ~65)."""
    keys = [wal_object_key(T0, "az-1", 1), wal_object_key(T0 + 3, "az-2", 2)]
    runs = _answer_runs(30, keys)
    alone = sum(len(wrap_pointers(run)) for run in runs)
    together = _shared_answer(runs)
    saved = alone - sum(len(run) for run in together)
    assert saved >= (len(runs) - len(keys)) * 25, (alone, saved)
    table: dict[int, bytes] = {}
    for wrapped in together:
        collect_pointer_keys(wrapped, table)
    assert len(table) == len(keys)
    assert [unwrap_pointers(wrapped, table) for wrapped in together] == runs


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.tuples(_keys, st.integers(0, 2**40)), min_size=1, max_size=4), min_size=1, max_size=8),
    st.randoms(use_true_random=False),
)
def test_any_run_of_an_answer_decodes_with_the_answers_table_in_any_order(runs_spec: list, rng: object) -> None:
    """The follower applies the runs it still asked for, in its own order, after gathering the keys
    of every run: each decodes to its leader's segment bytes exactly."""
    runs = []
    offset = 0
    for spec in runs_spec:
        entries = []
        for key, position in spec:
            header = _header(offset, value_bytes=5)
            entries.append(pointer.encode_pointer_entry(header, key, position, records.parse_header(header).size))
            offset += 1
        runs.append(b"".join(entries))
    wrapped = _shared_answer(runs)
    order = list(range(len(runs)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    table: dict[int, bytes] = {}
    for i in order:
        collect_pointer_keys(wrapped[i], table)
    for i in order[: max(1, len(order) // 2)]:
        assert unwrap_pointers(wrapped[i], table) == runs[i]


def test_a_run_sent_uncompacted_adds_no_key_to_the_answers_table() -> None:
    """A run the compact form cannot carry goes as segment bytes: had its keys entered the table,
    a later run would refer to a key no run of the answer writes."""
    key = wal_object_key(T0, "az-1", 1)
    odd = bytearray(_entry(0, key, 0))
    odd[-4:] = struct.pack(">i", 1)  # a pointed size that is not its header's
    shared: dict[str, int] = {}
    assert wrap_pointers(bytes(odd), shared)[:8] == b"\xff" * 8
    assert shared == {}
    later = _entry(1, key, 500)
    wrapped = wrap_pointers(later, shared)
    assert unwrap_pointers(wrapped, {}) == later  # it writes the key itself


def test_a_run_referring_to_a_key_no_run_wrote_is_refused() -> None:
    key = wal_object_key(T0, "az-1", 1)
    _, second = _shared_answer([_entry(0, key, 0), _entry(1, key, 900)])
    with pytest.raises(pointer.CorruptEntry):
        unwrap_pointers(second, {})  # the run that wrote the key was not gathered


def test_the_uncompact_envelope_of_older_leaders_still_unwraps() -> None:
    entries = _entry(7, wal_object_key(T0, "az-2", 2), 0)
    assert unwrap_pointers(struct.pack(">qi", -1, len(entries)) + entries) == entries


def test_a_damaged_compact_answer_is_refused_not_appended() -> None:
    entries = b"".join(_entry(i, wal_object_key(T0, "az-1", 1), 1000 * i) for i in range(3))
    wrapped = bytearray(wrap_pointers(entries))
    wrapped[-30] ^= 0x40  # a bit flip inside an entry's header
    with pytest.raises(pointer.CorruptEntry):
        unwrap_pointers(bytes(wrapped))


def test_record_batches_are_not_pointer_answers() -> None:
    batch = make_batch([Record(b"x", timestamp=T0)], base_timestamp=T0)
    assert unwrap_pointers(batch) is None


def _pointers_answer(entries: bytes) -> dict[str, object]:
    return {
        "error_code": 0,
        "kind": "pointers",
        "data": entries,
        "aborted_transactions": [],
        "high_watermark": 200,
        "last_stable_offset": 200,
        "log_start_offset": 0,
    }


def test_fetch_pointers_answers_carry_entries_compactly() -> None:
    """A broker with no replica in its AZ asks the leader for pointer entries (FetchPointers):
    the same entries crossing AZs, so the same compact form, for requesters that read it."""
    from diskless.protocol import internal

    names = [wal_object_key(T0 + k, "az-2", 2) for k in range(3)]
    entries = b"".join(_entry(i, names[i % 3], 100 + 1100 * i) for i in range(20))
    answer = _pointers_answer(entries)
    frame = internal.encode_response(5, answer, compact=True)
    bound = 80 + ENVELOPE_BOUND + 3 * PER_KEY_BOUND + FIRST_ENTRY_BOUND + 19 * PER_ENTRY_BOUND
    assert len(frame) <= bound, f"{len(frame)} bytes > {bound} ({len(internal.encode_response(5, answer))} as maps)"
    assert internal.unpack_response(memoryview(frame)[8:]) == answer
    assert internal.unpack(memoryview(internal.encode_response(5, answer))[8:]) == answer  # older requesters
    body = internal.unpack_request(
        internal.INTERNAL_FETCH_POINTERS, internal.pack_request(internal.INTERNAL_FETCH_POINTERS, {"offset": 1})
    )
    assert body.get(internal.COMPACT_ANSWERS) is True
    records = _pointers_answer(b"")
    records["kind"] = "records"
    assert internal.unpack_response(memoryview(internal.encode_response(5, records, compact=True))[8:]) == records

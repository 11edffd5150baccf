"""CommitBatches and AwaitReplicated on the wire (protocol/commit_wire.py, through
internal.pack_request/unpack_request).

A representative sends one CommitBatches per leader broker per WAL flush, two thirds of them to
another AZ, with an entry per produced batch: its bytes are cross-AZ bytes per batch (issue 10).
An entry must cost little more than the 61-byte batch header it carries, and the leader must get
exactly the body the representative built, in its order.
"""

from __future__ import annotations

import uuid
from typing import Any

from batches import Record, make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from diskless.protocol import internal
from diskless.storage.wal_format import wal_object_key

T0 = 1_763_840_000_000
HEADER = bytes(range(61))  # not a v2 header (magic 16): such a body travels as it is
# A producer's batch header as fields (~25 bytes), partition, position, acks, leader epoch.
PER_ENTRY_BOUND = 40
PER_REQUEST_BOUND = 120  # the WAL object key, its time, the replication wait, a topic name and id


def read(api_key: int, wire: bytes) -> dict[str, Any]:
    """What the leader's handler gets, without the flag that only shapes its answer."""
    body = internal.unpack_request(api_key, wire)
    body.pop(internal.COMPACT_ANSWERS, None)
    return body


def body_of(entries: list[dict[str, Any]], key: str | None = None) -> dict[str, Any]:
    return {
        "key": key or wal_object_key(T0, "az-1", 1),
        "created_ms": T0,
        "replication_wait_ms": 20,
        "entries": entries,
    }


def producer_header(sequence: int) -> bytes:
    """The header of an idempotent producer's one-record batch as it reaches the representative."""
    ts = T0 + 7 * sequence
    records = [Record(b"v" * 1000, timestamp=ts)]
    batch = make_batch(records, base_timestamp=ts, producer_id=4_000_123, producer_epoch=0, base_sequence=sequence)
    return batch[:61]


def entry(
    topic: str,
    topic_id: str,
    partition: int,
    position: int,
    guard: list[int] | None = None,
    header: bytes = HEADER,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "topic": topic,
        "topic_id": topic_id,
        "partition": partition,
        "header": header,
        "position": position,
        "acks": -1,
        "leader_epoch": 4,
    }
    if guard is not None:
        out["txn_guard"] = guard
    return out


def test_a_commit_entry_on_the_wire_is_little_more_than_its_header() -> None:
    topic_id = str(uuid.uuid4())
    for count in (1, 30):
        body = body_of(
            [entry("bench-diskless", topic_id, i % 3, 1200 * i, header=producer_header(i)) for i in range(count)]
        )
        wire = internal.pack_request(internal.INTERNAL_COMMIT_BATCHES, body)
        bound = PER_REQUEST_BOUND + count * PER_ENTRY_BOUND
        assert len(wire) <= bound, (
            f"{count} entries: {len(wire)} bytes > {bound} (dict form {len(internal.pack(body))})"
        )
        assert read(internal.INTERNAL_COMMIT_BATCHES, wire) == body


_topics = st.sampled_from([("a", str(uuid.UUID(int=1))), ("bench", str(uuid.UUID(int=2))), ("c", "")])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            _topics,
            st.integers(0, 2**31 - 1),
            st.integers(0, 2**62),
            st.sampled_from([-1, 0, 1]),
            st.integers(-1, 2**31 - 1),
            st.one_of(st.none(), st.lists(st.integers(-(2**63), 2**63 - 1), min_size=3, max_size=3)),
            st.one_of(st.just(HEADER), st.integers(0, 2**31 - 1).map(producer_header)),
        ),
        max_size=10,
    ),
    st.one_of(st.just(None), st.text(max_size=40)),
)
def test_the_leader_gets_the_representatives_body_in_its_order(items: list[tuple], key: str | None) -> None:
    entries = []
    for (topic, topic_id), partition, position, acks, epoch, guard, header in items:
        e = entry(topic, topic_id, partition, position, guard, header)
        e.update(acks=acks, leader_epoch=epoch)
        entries.append(e)
    body = body_of(entries, key)
    wire = internal.pack_request(internal.INTERNAL_COMMIT_BATCHES, body)
    assert read(internal.INTERNAL_COMMIT_BATCHES, wire) == body


def test_bodies_it_cannot_shorten_travel_as_they_are() -> None:
    odd = body_of([{**entry("t", "", 0, 0), "extra": 1}])
    wire = internal.pack_request(internal.INTERNAL_COMMIT_BATCHES, odd)
    assert wire == internal.pack({**odd, internal.COMPACT_ANSWERS: True})
    assert read(internal.INTERNAL_COMMIT_BATCHES, wire) == odd


def test_a_dict_form_body_from_an_older_representative_is_read_as_is() -> None:
    body = body_of([entry("t", str(uuid.uuid4()), 1, 10)])
    assert read(internal.INTERNAL_COMMIT_BATCHES, internal.pack(body)) == body


def await_body(items: list[tuple[str, str, int, int, int]], max_wait_ms: int = 5000) -> dict[str, Any]:
    """An AwaitReplicated body as the representative builds it: (topic, id, partition, offset, epoch)."""
    entries = [{"topic": t, "topic_id": i, "partition": p, "offset": o, "leader_epoch": e} for t, i, p, o, e in items]
    return {"max_wait_ms": max_wait_ms, "entries": entries}


def test_an_await_replicated_entry_on_the_wire_is_a_few_bytes() -> None:
    """Every acks=all batch whose CommitBatches answer came before its replication is asked about
    again: at 1,000 partitions these requests were 13% of the bytes crossing AZs, ~100 bytes an
    entry as maps."""
    topic_id = str(uuid.uuid4())
    for count in (1, 30):
        body = await_body([("bench-diskless", topic_id, i * 37 % 1000, 123_456 + i, 7) for i in range(count)])
        wire = internal.pack_request(internal.INTERNAL_AWAIT_REPLICATED, body)
        bound = 50 + count * 12  # a topic name and id, the wait; three integers an entry
        assert len(wire) <= bound, f"{count} entries: {len(wire)} bytes > {bound} (maps {len(internal.pack(body))})"
        assert read(internal.INTERNAL_AWAIT_REPLICATED, wire) == body


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(_topics, st.integers(0, 2**31 - 1), st.integers(-1, 2**63 - 1), st.integers(-1, 2**31 - 1)),
        max_size=10,
    ),
    st.integers(0, 2**31 - 1),
)
def test_the_leader_gets_the_await_replicated_body_in_its_order(items: list[tuple], wait: int) -> None:
    body = await_body([(t, i, p, o, e) for (t, i), p, o, e in items], wait)
    wire = internal.pack_request(internal.INTERNAL_AWAIT_REPLICATED, body)
    assert read(internal.INTERNAL_AWAIT_REPLICATED, wire) == body


def test_await_replicated_bodies_it_cannot_shorten_or_older_ones_are_read_as_they_are() -> None:
    odd = {"entries": [{"topic": "t", "partition": 0, "offset": 3, "leader_epoch": 1}], "max_wait_ms": 5}
    wire = internal.pack_request(internal.INTERNAL_AWAIT_REPLICATED, odd)  # no topic id: as it is
    assert internal.unpack(wire) == {**odd, internal.COMPACT_ANSWERS: True}
    assert read(internal.INTERNAL_AWAIT_REPLICATED, wire) == odd
    plain = await_body([("t", str(uuid.uuid4()), 1, 10, 2)])
    assert read(internal.INTERNAL_AWAIT_REPLICATED, internal.pack(plain)) == plain  # an older representative


def test_a_malformed_await_replicated_row_is_refused() -> None:
    wire = internal.pack({"w": 5, "runs": [["t", b"x" * 16, [[0, 1]]]]})
    try:
        internal.unpack_request(internal.INTERNAL_AWAIT_REPLICATED, wire)
    except ValueError as exc:
        assert "AwaitReplicated" in str(exc)
    else:
        raise AssertionError("a two-field row was accepted")


def success(offset: int) -> dict[str, Any]:
    return {
        "error_code": 0,
        "base_offset": offset,
        "last_offset": offset,
        "leader_epoch": 4,
        "committed": False,
        "log_append_time": -1,
        "log_start_offset": 0,
    }


def test_a_commit_answer_on_the_wire_is_a_few_bytes_per_result() -> None:
    for count in (1, 30):
        answer = {"results": [success(1_000_000 + i) for i in range(count)]}
        frame = internal.encode_response(7, answer, compact=True)
        assert len(frame) <= 16 + count * 20, f"{count} results: {len(frame)} bytes"
        assert internal.unpack_response(memoryview(frame)[8:]) == answer
        # A requester that did not ask for compact answers (an older broker) gets maps.
        assert internal.unpack(memoryview(internal.encode_response(7, answer))[8:]) == answer


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(success, st.integers(0, 2**63 - 1)),
            st.builds(lambda c: {"error_code": c}, st.integers(-1, 120)),
            st.builds(lambda d: {"error_code": 0, "done": d}, st.booleans()),
            st.builds(lambda c: {"error_code": c, "message": "x"}, st.integers(0, 5)),  # unknown: as it is
        ),
        max_size=8,
    )
)
def test_answers_read_back_exactly(results: list[dict[str, Any]]) -> None:
    for answer in ({"results": results}, {"results": results, "guard": [1, 2, 3]}, {"error_code": 35}):
        assert internal.unpack_response(memoryview(internal.encode_response(1, answer, compact=True))[8:]) == answer

"""The Spark data source's batch decoding (``diskless/spark/batches.py``): records of every codec
into Arrow columns of Spark's Kafka schema, offset ranges cut inside batches, and Kafka's
read_committed filtering of aborted transactions and control batches. Batches are built by the
independent test encoder (``batches.py`` beside this file)."""

from __future__ import annotations

import json
import struct

from batches import CODECS, Record, make_batch
from hypothesis import given
from hypothesis import strategies as st

from diskless.protocol.records import parse_header
from diskless.spark.batches import AbortedFilter, Columns, control_type, iter_batches
from diskless.spark.source import arrow_schema

SCHEMA = arrow_schema()

records = st.lists(
    st.builds(
        Record,
        value=st.one_of(st.none(), st.binary(max_size=200)),  # two-byte lengths too
        key=st.one_of(st.none(), st.binary(max_size=100)),  # lengths past one varint byte too
        timestamp=st.one_of(st.none(), st.integers(1_700_000_000_000 - 10**6, 1_700_000_000_000 + 10**6)),
        headers=st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))), max_size=3).map(
            tuple
        ),
    ),
    min_size=1,
    max_size=80,  # offset deltas past one varint byte too
)


def rows(batch) -> list[tuple]:  # type: ignore[no-untyped-def]
    d = batch.to_pydict()
    return [
        (d["offset"][i], d["key"][i], d["value"][i], tuple((h["key"], h["value"]) for h in d["headers"][i] or ()))
        for i in range(batch.num_rows)
    ]


@given(
    recs=records,
    codec=st.sampled_from(CODECS),
    base=st.integers(0, 1000),
    cut=st.tuples(st.integers(0, 85), st.integers(0, 85)),
)
def test_records_of_every_codec_become_arrow_rows_within_the_range(recs, codec, base, cut) -> None:  # type: ignore[no-untyped-def]
    batch = make_batch(recs, base_offset=base, compression=codec)
    start, end = base + min(cut), base + max(cut)
    columns = Columns("t", 3, SCHEMA)
    (whole,) = iter_batches(batch + batch[:30])  # a partial batch after it is left out
    added = columns.add_batch(whole, start, end)
    out = columns.take()
    assert out.schema == SCHEMA
    expected = [(base + i, r.key, r.value, r.headers) for i, r in enumerate(recs) if start <= base + i < end]
    assert added == len(expected) == out.num_rows
    assert rows(out) == expected
    default_ts = 1_700_000_000_000  # make_batch's for records without one
    stamps = [default_ts if r.timestamp is None else r.timestamp for i, r in enumerate(recs) if start <= base + i < end]
    assert [round(t.timestamp() * 1000) for t in out.column("timestamp").to_pylist()] == stamps
    assert set(out.column("topic").to_pylist()) <= {"t"} and set(out.column("partition").to_pylist()) <= {3}
    assert len(columns) == 0  # take() starts afresh


def test_timestamps_and_their_type() -> None:
    create = make_batch([Record(b"a", timestamp=1_000), Record(b"b", timestamp=1_005)], base_offset=7)
    append = make_batch([Record(b"c"), Record(b"d")], base_offset=9, base_timestamp=5, log_append_time=True)
    columns = Columns("t", 0, SCHEMA)
    columns.add_batch(memoryview(create), 0, 100)
    columns.add_batch(memoryview(append), 0, 100)
    out = columns.take().to_pydict()
    assert [round(ts.timestamp() * 1000) for ts in out["timestamp"]] == [1_000, 1_005, 5, 5]
    assert out["timestampType"] == [0, 0, 1, 1]
    assert out["headers"] == [None] * 4  # no headers is null, as Spark's Kafka source shows it


def _marker(pid: int, offset: int, commit: bool) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    return make_batch(
        [Record(b"\x00\x00\x00\x00\x00\x00", key=key)],
        base_offset=offset,
        producer_id=pid,
        control=True,
        transactional=True,
    )


def test_read_committed_drops_aborted_transactions_and_control_batches_as_kafka_does() -> None:
    # pid 1 aborts [0, 2), pid 2 commits [2, 4) interleaved, pid 1 then commits a later transaction.
    log = [
        make_batch([b"a1", b"a2"], base_offset=0, producer_id=1, transactional=True),
        make_batch([b"c1", b"c2"], base_offset=2, producer_id=2, transactional=True),
        make_batch([b"plain"], base_offset=4),
        _marker(1, 5, commit=False),
        _marker(2, 6, commit=True),
        make_batch([b"a3"], base_offset=7, producer_id=1, transactional=True),
        _marker(1, 8, commit=True),
    ]
    filt = AbortedFilter.of([(1, 0)])
    columns = Columns("t", 0, SCHEMA)
    for raw in log:
        view = memoryview(raw)
        header = parse_header(view)
        kind = control_type(view, header) if header.is_control else None
        if not filt.skip(header, kind):
            columns.add_batch(view, 0, 100)
    assert columns.take().column("value").to_pylist() == [b"c1", b"c2", b"plain", b"a3"]


def test_dev_dir_gives_brokers_object_storage_and_the_cluster_secret(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from diskless.spark.cluster import settings_from_options

    described = {
        "s3": {"endpoint": "http://127.0.0.1:8333", "bucket": "b", "access_key": "ak", "secret_key": "S3-SECRET"},
        "etcd": {"endpoint": "127.0.0.1:2379"},
        "cluster_secret": "c0ffee",
        "brokers": {"1": {"address": "127.0.1.1:9092"}, "2": {"address": "127.0.2.1:9093"}},
    }
    (tmp_path / "cluster.json").write_text(json.dumps(described))
    settings = settings_from_options({"dev.dir": str(tmp_path), "timeout.ms": "2000"})
    config = settings.broker_config()
    assert settings.bootstrap == (("127.0.1.1", 9092), ("127.0.2.1", 9093))
    assert (config.diskless_s3_endpoint, config.diskless_s3_bucket) == ("http://127.0.0.1:8333", "b")
    assert (config.diskless_s3_access_key, config.diskless_s3_secret_key) == ("ak", "S3-SECRET")
    assert config.diskless_cluster_secret == "c0ffee" and config.metadata_etcd_endpoints == "127.0.0.1:2379"
    assert "c0ffee" not in repr(settings) and "S3-SECRET" not in repr(settings)
    assert settings.timeout_s == 2.0 and settings.read_committed


class _FakeClient:
    """FetchPointers answers in order: pointers into a WAL object, then (asked again) the batches."""

    def __init__(self, answers: list[dict]) -> None:  # type: ignore[type-arg]
        from diskless.spark.cluster import Settings

        self.settings = Settings(bootstrap=(("127.0.0.1", 1),), timeout_s=1.0)
        self.config = self.settings.broker_config()
        self.answers = answers
        self.asked: list[int] = []

    async def fetch_pointers(self, part, offset, max_bytes):  # type: ignore[no-untyped-def]
        self.asked.append(offset)
        return self.answers.pop(0)


class _GoneStore:
    endpoint_url = "http://s3"
    bucket = "b"

    async def get_ranges(self, key, ranges):  # type: ignore[no-untyped-def]
        from diskless.storage.object_store import NoSuchKey

        raise NoSuchKey(key)

    async def close(self) -> None:
        pass


async def test_pointers_into_a_deleted_wal_object_are_asked_for_again() -> None:
    """A range tiered (and its WAL object deleted) after the reader got its pointers: the reader
    asks the leader again from the same offset and reads what it answers now."""
    from diskless.spark.cluster import PartitionInfo, PartitionReader
    from diskless.storage.pointer import encode_pointer_entry

    batch = make_batch([b"a", b"b", b"c"], base_offset=0)
    entry = encode_pointer_entry(batch[:61], "wal/gone.wal", 0, len(batch))
    common = {"error_code": 0, "high_watermark": 3, "last_stable_offset": 3, "log_start_offset": 0}
    client = _FakeClient(
        [
            {**common, "kind": "pointers", "data": entry, "aborted_transactions": []},
            {**common, "kind": "records", "data": batch, "aborted_transactions": []},
        ]
    )
    reader = PartitionReader(client, PartitionInfo("t", "id", 0, 1, (1,)), 0, 3, SCHEMA)  # type: ignore[arg-type]
    reader._store = _GoneStore()  # type: ignore[assignment]
    out = await reader.next_batch()
    assert out is not None and out.column("value").to_pylist() == [b"a", b"b", b"c"]
    assert client.asked == [0, 0]
    assert await reader.next_batch() is None


async def test_wal_objects_gone_at_several_steps_of_a_long_read_do_not_fail_it() -> None:
    """Only consecutive refreshes that find their WAL object gone fail a read: each step of this
    one (a record per FetchPointers) first gets pointers into an object tiered away meanwhile,
    then the records. The count was never reset, so the fourth such step failed the read with
    "WAL object ... is gone ... although the leader still points into it"."""
    from diskless.spark.cluster import MAX_POINTER_REFRESHES, PartitionInfo, PartitionReader
    from diskless.storage.pointer import encode_pointer_entry

    steps = MAX_POINTER_REFRESHES + 3
    common = {"error_code": 0, "high_watermark": steps, "last_stable_offset": steps, "log_start_offset": 0}
    answers = []
    for offset in range(steps):
        batch = make_batch([f"v{offset}".encode()], base_offset=offset)
        entry = encode_pointer_entry(batch[:61], f"wal/gone-{offset}.wal", 0, len(batch))
        answers.append({**common, "kind": "pointers", "data": entry, "aborted_transactions": []})
        answers.append({**common, "kind": "records", "data": batch, "aborted_transactions": []})
    client = _FakeClient(answers)
    reader = PartitionReader(client, PartitionInfo("t", "id", 0, 1, (1,)), 0, steps, SCHEMA)  # type: ignore[arg-type]
    reader._store = _GoneStore()  # type: ignore[assignment]
    values = []
    while (out := await reader.next_batch()) is not None:
        values += out.column("value").to_pylist()
    assert values == [f"v{offset}".encode() for offset in range(steps)]
    assert client.asked == [offset for offset in range(steps) for _ in (0, 1)]


async def test_a_wal_object_gone_at_every_refresh_fails_the_read() -> None:
    """Consecutive refreshes that keep finding the object gone still fail, naming it."""
    import pytest

    from diskless.spark.cluster import MAX_POINTER_REFRESHES, DisklessSourceError, PartitionInfo, PartitionReader
    from diskless.storage.pointer import encode_pointer_entry

    batch = make_batch([b"a"], base_offset=0)
    entry = encode_pointer_entry(batch[:61], "wal/gone.wal", 0, len(batch))
    common = {"error_code": 0, "high_watermark": 1, "last_stable_offset": 1, "log_start_offset": 0}
    client = _FakeClient(
        [{**common, "kind": "pointers", "data": entry, "aborted_transactions": []}] * (MAX_POINTER_REFRESHES + 1)
    )
    reader = PartitionReader(client, PartitionInfo("t", "id", 0, 1, (1,)), 0, 1, SCHEMA)  # type: ignore[arg-type]
    reader._store = _GoneStore()  # type: ignore[assignment]
    with pytest.raises(DisklessSourceError, match=r"WAL object wal/gone\.wal is gone"):
        await reader.next_batch()
    assert client.asked == [0] * (MAX_POINTER_REFRESHES + 1)


async def test_a_range_starting_between_an_aborted_transaction_and_its_marker_keeps_the_next_transaction() -> None:
    """A read starting after an aborted transaction's records but before its ABORT marker (a range
    split by maxRecordsPerPartition, or a FetchPointers slice cut there): the leader lists that
    transaction (it overlaps the read), the marker is the first batch seen. Kafka's consumer takes
    in the aborted transactions up to every batch with a producer id, markers included, before the
    marker ends the dropping; done only at data batches, the transaction was taken in after its
    marker and the same producer's next, committed, transaction was hidden."""
    from diskless.spark.cluster import PartitionInfo, PartitionReader

    log = [
        make_batch([b"aborted"], base_offset=0, producer_id=1, transactional=True),
        _marker(1, 1, commit=False),
        make_batch([b"committed"], base_offset=2, producer_id=1, transactional=True),
        _marker(1, 3, commit=True),
    ]
    common = {"error_code": 0, "high_watermark": 4, "last_stable_offset": 4, "log_start_offset": 0}
    # FetchPointers at offset 1: the batches from the marker on, and the aborted transaction of
    # pid 1 that began at 0 (aborted_between(1, 4) lists it: its marker is at 1).
    client = _FakeClient([{**common, "kind": "records", "data": b"".join(log[1:]), "aborted_transactions": [[1, 0]]}])
    reader = PartitionReader(client, PartitionInfo("t", "id", 0, 1, (1,)), 1, 4, SCHEMA)  # type: ignore[arg-type]
    out = await reader.next_batch()
    assert out is not None and out.column("value").to_pylist() == [b"committed"]
    assert out.column("offset").to_pylist() == [2]
    assert await reader.next_batch() is None


async def test_a_range_ending_in_offsets_compaction_removed_ends_without_waiting() -> None:
    """A compacted classic log: records 1..2 are an emptied batch (an idempotent producer's last,
    kept without records) and 3..4 were removed, up to the last stable offset 5 (an open
    transaction's first batch, or the first record after the gap, sits at 5). FetchPointers at 3
    answers no data while the log is readable up to 5: nothing is left in [3, 5). The reader took
    that for a leader whose high watermark lags and asked again until timeout.ms, then failed
    ("requested but the log is readable only up to 5"), as Spark's batch and streaming reads of
    such a topic with read_committed (or a range ending at such a gap) did."""
    from diskless.log.compaction import _empty_batch
    from diskless.spark.cluster import PartitionInfo, PartitionReader

    emptied = _empty_batch(parse_header(make_batch([b"x", b"y"], base_offset=1, producer_id=7)))
    common = {"error_code": 0, "high_watermark": 6, "last_stable_offset": 5, "log_start_offset": 0}
    client = _FakeClient(
        [
            {**common, "kind": "records", "data": make_batch([b"a"], base_offset=0) + emptied},
        ]
        + [{**common, "kind": "records", "data": b"", "aborted_transactions": []}] * 20
    )
    reader = PartitionReader(client, PartitionInfo("t", "id", 0, 1, (1,)), 0, 5, SCHEMA)  # type: ignore[arg-type]
    out = await reader.next_batch()
    assert out is not None and out.column("offset").to_pylist() == [0]
    assert await reader.next_batch() is None
    assert client.asked == [0, 3]

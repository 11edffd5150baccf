"""The ``diskless`` Spark source when records it was to read are gone (``failOnDataLoss``, as in
Spark's Kafka source): a topic deleted and re-created between micro-batches (told by its topic id,
kept in the streaming offsets), deleted, re-created with fewer partitions, its log truncated, or
records deleted below the query's position. Pure logic (``diskless/spark/offsets.py``), the
stream reader over a fake cluster, and an executor's partition reader over a fake leader."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from diskless.spark import source
from diskless.spark.cluster import (
    EARLIEST,
    ClusterView,
    DataLossError,
    DataLossPolicy,
    DisklessSourceError,
    PartitionInfo,
    PartitionReader,
    Settings,
)
from diskless.spark.offsets import (
    TOPIC_IDS,
    Bounds,
    Next,
    Range,
    StreamOffset,
    batch_ranges,
    next_batch,
    parse_fail_on_data_loss,
)

OLD, NEW = "old-id", "new-id"


def offset(positions: dict[tuple[str, int], int], ids: dict[str, str] | None = None) -> StreamOffset:
    return StreamOffset(dict(positions), dict(ids or {}))


def bounds(topic: str, index: int, topic_id: str, earliest: int | None, latest: int | None) -> Bounds:
    return Bounds(topic, index, topic_id, earliest, latest)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# --- offsets ---------------------------------------------------------------------------------


def test_offsets_carry_topic_ids_under_a_key_no_topic_can_have_and_read_old_checkpoints() -> None:
    written = offset({("t", 1): 7, ("t", 0): 5, ("a", 0): 1}, {"t": NEW, "a": "a-id", "gone": "x"}).to_json()
    # Sorted (Spark compares offsets by their JSON text), ids of the topics read only.
    assert list(written) == ["a", "t", TOPIC_IDS]
    assert written == {"a": {"0": 1}, "t": {"0": 5, "1": 7}, TOPIC_IDS: {"a": "a-id", "t": NEW}}
    assert StreamOffset.parse(written) == offset({("a", 0): 1, ("t", 0): 5, ("t", 1): 7}, {"a": "a-id", "t": NEW})
    # A checkpoint from before ids were kept: Spark's Kafka source's format.
    assert StreamOffset.parse({"t": {"0": 5}}) == offset({("t", 0): 5})
    assert offset({("t", 0): 5}).to_json() == {"t": {"0": 5}}


@pytest.mark.parametrize(("raw", "fail"), [(None, True), ("true", True), ("FALSE", False), (" False ", False)])
def test_fail_on_data_loss_is_true_by_default_and_read_in_any_case(raw: str | None, fail: bool) -> None:
    options = {} if raw is None else {"failondataloss": raw}
    assert parse_fail_on_data_loss(options) is fail


def test_fail_on_data_loss_other_values_are_refused_with_the_option_named() -> None:
    with pytest.raises(DisklessSourceError, match="failOnDataLoss must be true or false, not 'no'"):
        source._Plan({"bootstrap.servers": "127.0.0.1:1", "topic": "t", "failOnDataLoss": "no"}, streaming=True)


# --- next_batch: a topic re-created between triggers -----------------------------------------


def test_same_topic_reads_on_from_where_it_was() -> None:
    start = offset({("t", 0): 5, ("t", 1): 3}, {"t": OLD})
    now = [bounds("t", 0, OLD, 0, 9), bounds("t", 1, OLD, 0, 3)]
    plans, ids = next_batch(start, now, set(), DataLossPolicy(fail=True))
    assert plans == [Next("t", 0, 5, 9), Next("t", 1, 3, 3)]
    assert ids == {"t": OLD}


def test_a_recreated_topic_fails_the_query_naming_topic_ids_offsets_and_the_option() -> None:
    """The new topic has grown past the old offsets (5 and 3): offsets alone would not notice, and
    read it from 5 and 3 on, skipping its first records."""
    start = offset({("t", 0): 5, ("t", 1): 3}, {"t": OLD})
    now = [bounds("t", 0, NEW, 0, 40), bounds("t", 1, NEW, 0, 40)]
    with pytest.raises(DataLossError) as caught:
        next_batch(start, now, set(), DataLossPolicy(fail=True))
    message = str(caught.value)
    assert "topic 't' was deleted and re-created (topic id old-id is now new-id)" in message
    assert "{0: 5, 1: 3}" in message and "start again ({0: 0, 1: 0})" in message
    assert '"failOnDataLoss" to "false"' in message


def test_a_recreated_topic_is_read_from_its_earliest_offsets_without_failing_on_data_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    start = offset({("t", 0): 5, ("t", 1): 3}, {"t": OLD})
    # The new topic has a third partition: it is new, its first batch only records where it starts.
    now = [bounds("t", 0, NEW, 0, 2), bounds("t", 1, NEW, 0, 40), bounds("t", 2, NEW, 0, 4)]
    loss = DataLossPolicy(fail=False)
    with caplog.at_level(logging.WARNING, "diskless.spark"):
        plans, ids = next_batch(start, now, set(), loss)
        assert plans == [Next("t", 0, 0, 2), Next("t", 1, 0, 40), Next("t", 2, 0, 4, first_seen=True)]
        assert ids == {"t": NEW}
        next_batch(start, now, set(), loss)  # planned again (partitions, a retried trigger): warned once
    (warning,) = warnings_of(caplog)
    assert "re-created (topic id old-id is now new-id)" in warning and "read from its earliest offsets" in warning


def test_a_recreated_topic_waits_for_every_partition_before_moving_to_the_new_id() -> None:
    """One id per topic in the end offset: a partition left at an offset of the old topic (its
    leader does not answer yet) must not be labelled with the new topic's id."""
    start = offset({("t", 0): 5, ("t", 1): 3}, {"t": OLD})
    now = [bounds("t", 0, NEW, 0, 2), bounds("t", 1, NEW, None, None)]
    plans, ids = next_batch(start, now, set(), DataLossPolicy(fail=False))
    assert plans == [Next("t", 0, 5, 5), Next("t", 1, 3, 3)]
    assert ids == {"t": OLD}


def test_a_deleted_topic_keeps_its_offsets_and_id_until_it_comes_back() -> None:
    start = offset({("t", 0): 5, ("u", 0): 1}, {"t": OLD, "u": "u-id"})
    with pytest.raises(DataLossError, match=r"t-0: topic 't' \(topic id old-id\) is gone \(deleted\)"):
        next_batch(start, [bounds("u", 0, "u-id", 0, 1)], set(), DataLossPolicy(fail=True))
    plans, ids = next_batch(start, [bounds("u", 0, "u-id", 0, 1)], set(), DataLossPolicy(fail=False))
    assert plans == [Next("t", 0, 5, 5), Next("u", 0, 1, 1)]
    assert ids == {"t": OLD, "u": "u-id"}
    kept = offset({(n.topic, n.index): n.begin for n in plans}, ids)
    u = bounds("u", 0, "u-id", 0, 1)
    # Back under the same id (a broker that did not list it for a moment): read on, nothing twice.
    plans, _ = next_batch(kept, [bounds("t", 0, OLD, 0, 8), u], set(), DataLossPolicy(fail=True))
    assert plans[0] == Next("t", 0, 5, 8)
    # A new topic of that name: a re-creation.
    plans, ids = next_batch(kept, [bounds("t", 0, NEW, 0, 2), u], set(), DataLossPolicy(fail=False))
    assert plans[0] == Next("t", 0, 0, 2) and ids["t"] == NEW


def test_a_topic_recreated_with_fewer_partitions_drops_the_others() -> None:
    start = offset({("t", 0): 5, ("t", 1): 3}, {"t": OLD})
    with pytest.raises(DataLossError):
        next_batch(start, [bounds("t", 0, NEW, 0, 1)], set(), DataLossPolicy(fail=True))
    plans, ids = next_batch(start, [bounds("t", 0, NEW, 0, 1)], set(), DataLossPolicy(fail=False))
    assert plans == [Next("t", 0, 0, 1)] and ids == {"t": NEW}


def test_a_topic_in_error_or_a_partition_without_leader_stays_where_it_is() -> None:
    start = offset({("t", 0): 5, ("t", 1): 3, ("u", 0): 2}, {"t": OLD, "u": "u-id"})
    now = [bounds("t", 0, OLD, 0, 9), bounds("t", 1, OLD, None, None)]
    plans, ids = next_batch(start, now, {"u"}, DataLossPolicy(fail=True))
    assert plans == [Next("t", 0, 5, 9), Next("t", 1, 3, 3), Next("u", 0, 2, 2)]
    assert ids == {"t": OLD, "u": "u-id"}


# --- next_batch: offsets that went backwards, records deleted --------------------------------


def test_a_log_that_went_back_under_the_same_id_is_read_on_from_its_end() -> None:
    """Truncated (an unclean election): what was read up to 9 is not read again."""
    start = offset({("t", 0): 9}, {"t": OLD})
    with pytest.raises(DataLossError, match="went back from offset 9 to 4 under the same topic id old-id"):
        next_batch(start, [bounds("t", 0, OLD, 0, 4)], set(), DataLossPolicy(fail=True))
    plans, _ = next_batch(start, [bounds("t", 0, OLD, 0, 4)], set(), DataLossPolicy(fail=False))
    assert plans == [Next("t", 0, 4, 4)]


def test_a_checkpoint_without_topic_ids_notices_offsets_that_went_back() -> None:
    start = offset({("t", 0): 9})
    with pytest.raises(DataLossError, match="the checkpoint has none to compare"):
        next_batch(start, [bounds("t", 0, NEW, 0, 4)], set(), DataLossPolicy(fail=True))
    plans, ids = next_batch(start, [bounds("t", 0, NEW, 0, 12)], set(), DataLossPolicy(fail=True))
    assert plans == [Next("t", 0, 9, 12)] and ids == {"t": NEW}  # from now on, the id is kept


def test_records_deleted_below_the_position_fail_or_are_skipped() -> None:
    start = offset({("t", 0): 3}, {"t": OLD})
    with pytest.raises(DataLossError, match=r"t-0: offsets \[3, 10\) were deleted before they were read"):
        next_batch(start, [bounds("t", 0, OLD, 10, 20)], set(), DataLossPolicy(fail=True))
    plans, _ = next_batch(start, [bounds("t", 0, OLD, 10, 20)], set(), DataLossPolicy(fail=False))
    assert plans == [Next("t", 0, 10, 20)]


# --- batch_ranges ----------------------------------------------------------------------------


def test_batch_ranges_read_from_start_to_end() -> None:
    start = offset({("t", 0): 5, ("t", 1): 3}, {"t": OLD})
    end = offset({("t", 0): 9, ("t", 1): 3, ("t", 2): 0}, {"t": OLD})
    current = {("t", 0): OLD, ("t", 1): OLD, ("t", 2): OLD}
    assert batch_ranges(start, end, current, DataLossPolicy(fail=True)) == [Range("t", 0, 5, 9)]


def test_a_batch_that_crosses_a_recreation_reads_the_new_topic_from_its_earliest_offset() -> None:
    """Planned without a look at the start (an end offset from another start), or planned with
    failOnDataLoss=false: the end's offsets are the new topic's."""
    start = offset({("t", 0): 5}, {"t": OLD})
    end = offset({("t", 0): 12}, {"t": NEW})
    assert batch_ranges(start, end, {("t", 0): NEW}, DataLossPolicy(fail=False)) == [Range("t", 0, None, 12)]
    with pytest.raises(DataLossError, match="topic id old-id is now new-id"):
        batch_ranges(start, end, {("t", 0): NEW}, DataLossPolicy(fail=True))


def test_a_batch_whose_topic_went_away_after_planning_is_skipped_or_fails() -> None:
    start = offset({("t", 0): 5, ("t", 1): 5}, {"t": OLD})
    end = offset({("t", 0): 9, ("t", 1): 9}, {"t": OLD})
    with pytest.raises(DataLossError, match=r"topic id old-id is now new-id\) since this batch was planned"):
        batch_ranges(start, end, {("t", 0): NEW, ("t", 1): NEW}, DataLossPolicy(fail=True))
    with pytest.raises(DataLossError, match=r"t-1: partition 1 of topic 't' is gone"):
        batch_ranges(start, end, {("t", 0): OLD}, DataLossPolicy(fail=True))
    assert batch_ranges(start, end, {("t", 0): OLD}, DataLossPolicy(fail=False)) == [Range("t", 0, 5, 9)]
    # A topic gone whose offsets were kept (nothing to read) is no news.
    assert batch_ranges(start, start, {}, DataLossPolicy(fail=True)) == []


def test_a_batch_whose_end_is_below_its_start_reads_nothing() -> None:
    start = offset({("t", 0): 9}, {"t": OLD})
    end = offset({("t", 0): 4}, {"t": OLD})
    with pytest.raises(DataLossError, match="went back from offset 9 to 4"):
        batch_ranges(start, end, {("t", 0): OLD}, DataLossPolicy(fail=True))
    assert batch_ranges(start, end, {("t", 0): OLD}, DataLossPolicy(fail=False)) == []


# --- the stream reader over a fake cluster ---------------------------------------------------


class _Cluster:
    """Metadata and ListOffsets of topic "t" (2 partitions) as ``state`` says; shared by the
    ClusterClients the reader opens."""

    state: dict[str, Any] = {}

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.view = ClusterView(brokers={1: ("127.0.0.1", 1)})

    def _parts(self) -> list[PartitionInfo]:
        topic_id = self.state["id"]
        return [] if topic_id is None else [PartitionInfo("t", topic_id, i, 1, (1,)) for i in range(2)]

    async def metadata(self, topics: list[str] | None, strict: bool = True) -> ClusterView:
        parts = self._parts()
        if parts:
            self.view.topics = {"t": parts}
        elif strict:
            raise DisklessSourceError("topic 't': UNKNOWN_TOPIC_OR_PARTITION (does it exist?)")
        else:
            self.view.errors = {"t": ErrorCode.unknown_topic_or_partition}
        return self.view

    async def try_list_offsets(self, queries: list[tuple[PartitionInfo, int]]) -> list[int | None]:
        out: list[int | None] = []
        for part, ts in queries:
            assert part.topic_id == self.state["id"]
            if ts == EARLIEST:
                out.append(self.state["earliest"])
            else:  # a list: one answer per question, in order
                latest = self.state["latest"]
                out.append(latest.pop(0) if isinstance(latest, list) else latest)
        return out

    async def list_offsets(self, queries: list[tuple[PartitionInfo, int]]) -> list[int]:
        return [x for x in await self.try_list_offsets(queries) if x is not None]

    async def with_secret(self) -> Any:
        return self.settings

    async def close(self) -> None:
        pass


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> type[_Cluster]:
    monkeypatch.setattr(source, "ClusterClient", _Cluster)
    monkeypatch.setattr(source, "BACKWARDS_RETRY_S", 0.0)
    _Cluster.state = {"id": OLD, "earliest": 0, "latest": 5}
    return _Cluster


def stream(**options: str) -> source.DisklessStreamReader:
    return source.DisklessStreamReader(
        {"bootstrap.servers": "127.0.0.1:1", "topic": "t", "startingOffsets": "earliest", **options}
    )


def ranges(reader: source.DisklessStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[tuple]:
    return [(r.part.index, r.part.topic_id, r.start, r.end) for r in reader.partitions(start, end)]  # type: ignore[attr-defined]


def test_stream_reader_reads_a_recreated_topic_from_its_start_without_failing_on_data_loss(
    cluster: type[_Cluster],
) -> None:
    reader = stream(failOnDataLoss="false")
    start = reader.initialOffset()
    assert start == {"t": {"0": 0, "1": 0}, TOPIC_IDS: {"t": OLD}}
    first = reader.latestOffset(start, source.ReadAllAvailable())
    assert first == {"t": {"0": 5, "1": 5}, TOPIC_IDS: {"t": OLD}}
    assert ranges(reader, start, first) == [(0, OLD, 0, 5), (1, OLD, 0, 5)]
    # Deleted: the offsets stay.
    cluster.state = {"id": None}
    assert reader.latestOffset(first, source.ReadAllAvailable()) == first
    # Re-created, and grown past the old offsets.
    cluster.state = {"id": NEW, "earliest": 0, "latest": 8}
    second = reader.latestOffset(first, source.ReadAllAvailable())
    assert second == {"t": {"0": 8, "1": 8}, TOPIC_IDS: {"t": NEW}}
    assert ranges(reader, first, second) == [(0, NEW, 0, 8), (1, NEW, 0, 8)]


def test_stream_reader_fails_on_a_recreated_topic_by_default(cluster: type[_Cluster]) -> None:
    reader = stream(maxOffsetsPerTrigger="4")
    first = reader.latestOffset(reader.initialOffset(), source.ReadMaxRows(4))
    assert first == {"t": {"0": 2, "1": 2}, TOPIC_IDS: {"t": OLD}}
    cluster.state = {"id": NEW, "earliest": 0, "latest": 8}
    with pytest.raises(DataLossError, match="topic id old-id is now new-id"):
        reader.latestOffset(first, source.ReadMaxRows(4))
    # A batch planned before the re-creation and planned again after it (a restarted query).
    with pytest.raises(DataLossError, match="since this batch was planned"):
        stream().partitions({"t": {"0": 0, "1": 0}, TOPIC_IDS: {"t": OLD}}, first)


def test_stream_reader_asks_again_for_a_latest_offset_that_lags_under_the_same_id(
    cluster: type[_Cluster],
) -> None:
    """A new leader's high watermark may lag the old one's for a moment: not data loss."""
    reader = stream()
    start = {"t": {"0": 5, "1": 5}, TOPIC_IDS: {"t": OLD}}
    cluster.state["latest"] = [3, 3, 5, 6]  # both partitions behind, then caught up
    assert reader.latestOffset(start, source.ReadAllAvailable()) == {"t": {"0": 5, "1": 6}, TOPIC_IDS: {"t": OLD}}
    cluster.state["latest"] = [3, 3] * (source.BACKWARDS_RETRIES + 1)
    with pytest.raises(DataLossError, match="went back from offset 5 to 3"):
        reader.latestOffset(start, source.ReadAllAvailable())


def test_batch_read_from_below_the_log_start_offset_fails_or_starts_at_it() -> None:
    part = PartitionInfo("t", OLD, 0, 1, (1,))
    with pytest.raises(DataLossError, match="starting offset 2 is before the log start offset 10"):
        source._check_range(part, 2, 20, 10, 20)
    assert source._check_range(part, 2, 20, 10, 20, DataLossPolicy(fail=False)) == 10


# --- an executor's partition reader ----------------------------------------------------------


class _Leader:
    """FetchPointers answers in order, then empty reads at the end of the log."""

    def __init__(self, answers: list[dict[str, Any]], timeout_s: float = 5.0) -> None:
        self.settings = Settings(bootstrap=(("127.0.0.1", 1),), secret=b"s", timeout_s=timeout_s)
        self.answers = answers
        self.asked: list[int] = []

    async def fetch_pointers(self, part: PartitionInfo, offset: int, max_bytes: int) -> dict[str, Any]:
        self.asked.append(offset)
        return self.answers.pop(0)


def read_range(leader: _Leader, start: int, end: int, fail: bool) -> list[Any]:
    part = PartitionInfo("t", OLD, 0, 1, (1,))
    reader = PartitionReader(leader, part, start, end, source.arrow_schema(), DataLossPolicy(fail))  # type: ignore[arg-type]

    async def run() -> list[Any]:
        out = []
        while (batch := await reader.next_batch()) is not None:
            out.append(batch)
        return out

    return asyncio.run(run())


def test_an_executor_meeting_records_deleted_under_its_range_fails_or_skips_them() -> None:
    gone = {"error_code": ErrorCode.offset_out_of_range, "log_start_offset": 10, "high_watermark": 20}
    with pytest.raises(DataLossError, match=r"t-0: offsets \[3, 8\) were deleted before they were read"):
        read_range(_Leader([gone]), 3, 8, fail=True)
    leader = _Leader([gone])
    assert read_range(leader, 3, 8, fail=False) == [] and leader.asked == [3]
    # Part of the range is left: read on from the log start offset.
    from batches import make_batch

    left = {
        "error_code": 0,
        "data": make_batch([b"v10", b"v11", b"v12"], base_offset=10),
        "high_watermark": 20,
        "last_stable_offset": 20,
        "log_start_offset": 10,
    }
    leader = _Leader([gone, left], timeout_s=0.0)
    (batch,) = read_range(leader, 3, 12, fail=False)
    assert batch.column("offset").to_pylist() == [10, 11]
    assert leader.asked == [3, 10]


def test_an_executor_whose_topic_was_recreated_under_it_fails_or_skips_the_range() -> None:
    """UNKNOWN_TOPIC_ID may only be a leader that has not applied the topic's creation yet: asked
    again until timeout.ms, then the incarnation read is gone."""
    stale = {"error_code": ErrorCode.unknown_topic_id}
    with pytest.raises(DataLossError, match="topic 't' with topic id old-id is gone"):
        read_range(_Leader([stale] * 3, timeout_s=0.3), 0, 5, fail=True)
    leader = _Leader([stale] * 3, timeout_s=0.3)
    assert read_range(leader, 0, 5, fail=False) == []
    assert len(leader.asked) >= 2

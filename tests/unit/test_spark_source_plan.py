"""The ``diskless`` data source's driver-side planning (``diskless/spark/source.py``), without a
SparkSession or a cluster: a fake ``ClusterClient`` answers Metadata and ListOffsets."""

from __future__ import annotations

from typing import Any

import pytest

from diskless.spark import source
from diskless.spark.cluster import EARLIEST, LATEST, ClusterView, PartitionInfo

PART = PartitionInfo("t", "tid", 0, 1, (1,))


class _GrowingCluster:
    """One partition [0, latest) whose latest offset grows by 5 at every ListOffsets LATEST: records
    produced while the query is planned."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.view = ClusterView(brokers={1: ("127.0.0.1", 1)}, topics={"t": [PART]})
        self.latest = 10

    async def metadata(self, topics: list[str] | None) -> ClusterView:
        return self.view

    async def list_offsets(self, queries: list[tuple[PartitionInfo, int]]) -> list[int]:
        out = []
        for _, ts in queries:
            if ts == LATEST:
                out.append(self.latest)
                self.latest += 5
            else:
                assert ts == EARLIEST
                out.append(0)
        return out

    async def with_secret(self) -> Any:
        return self.settings

    async def close(self) -> None:
        pass


def test_a_batch_query_planned_while_records_are_produced_reads_up_to_the_latest_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """endingOffsets=latest (the default) was resolved by a later ListOffsets than the one it was
    checked against: with records produced in between, the end was "past the latest readable
    offset" and the query failed."""
    monkeypatch.setattr(source, "ClusterClient", _GrowingCluster)
    reader = source.DisklessReader({"bootstrap.servers": "127.0.0.1:1", "topic": "t"})
    ranges = reader.partitions()
    assert [(r.start, r.end) for r in ranges] == [(0, 15)]  # type: ignore[attr-defined]


class _Topics:
    """Metadata of several topics, one partition each."""

    def __init__(self, names: list[str]) -> None:
        self.view = ClusterView(
            brokers={1: ("127.0.0.1", 1)}, topics={n: [PartitionInfo(n, f"id-{n}", 0, 1, (1,))] for n in names}
        )

    async def metadata(self, topics: list[str] | None) -> ClusterView:
        return self.view


def test_subscribe_pattern_matches_whole_topic_names_as_kafka_does() -> None:
    """Spark's Kafka source (and Kafka's consumer) subscribe to the topics whose whole name matches
    the pattern (Java's ``String.matches``); a search anywhere in the name also read "orders-dlq"
    and "old-orders" for subscribePattern=orders."""
    import asyncio

    plan = source._Plan({"bootstrap.servers": "127.0.0.1:1", "subscribePattern": "orders"}, streaming=False)
    client = _Topics(["old-orders", "orders", "orders-dlq"])
    assert [p.topic for p in asyncio.run(plan.partitions(client))] == ["orders"]  # type: ignore[arg-type]
    plan = source._Plan({"bootstrap.servers": "127.0.0.1:1", "subscribePattern": "orders.*"}, streaming=False)
    assert [p.topic for p in asyncio.run(plan.partitions(client))] == ["orders", "orders-dlq"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"t": {"x": 1}}', "startingOffsets"),  # not a partition number
        ('{"t": {"0": "12"}}', "startingOffsets"),  # an offset that is a string
        ('{"t": {"0": 1.5}}', "startingOffsets"),  # or not a whole number
        ('{"t": {"0": true}}', "startingOffsets"),
    ],
)
def test_offsets_json_that_is_not_partition_numbers_to_offsets_is_refused_with_the_option_named(
    text: str, message: str
) -> None:
    """Partition keys were checked only when the partitions were known (a bare ValueError from
    int() for "x"), and offsets were cast (1.5 read from 1, true from 1, "12" from 12)."""
    with pytest.raises(source.DisklessSourceError, match=message):
        source._Plan({"bootstrap.servers": "127.0.0.1:1", "topic": "t", "startingOffsets": text}, streaming=False)


def test_offsets_json_names_partitions_by_number() -> None:
    """A partition written "00" passed the check against the topic's partitions (int("00") is 0)
    but was looked up as "0": the offset given was ignored and the default (earliest) read."""
    plan = source._Plan(
        {"bootstrap.servers": "127.0.0.1:1", "topic": "t", "startingOffsets": '{"t": {"00": 7}}'}, streaming=False
    )
    assert plan._resolve_spec("startingOffsets", plan.starting, [PART], EARLIEST) == [7]


@pytest.mark.parametrize(("text", "expected"), [("LATEST", "latest"), (" Earliest ", "earliest")])
def test_offsets_keywords_are_case_insensitive_as_in_sparks_kafka_source(text: str, expected: str) -> None:
    """KafkaSourceProvider.getKafkaOffsetRangeLimit lower-cases (after trimming) the value of
    startingOffsets/endingOffsets before comparing it with latest/earliest; "LATEST" was refused
    as JSON that does not parse."""
    plan = source._Plan({"bootstrap.servers": "127.0.0.1:1", "topic": "t", "startingOffsets": text}, streaming=True)
    assert plan.starting == expected
    plan = source._Plan({"bootstrap.servers": "127.0.0.1:1", "topic": "t", "endingOffsets": "Latest"}, streaming=False)
    assert (plan.starting, plan.ending) == ("earliest", "latest")
    # Still refused for a batch query, as "latest".
    with pytest.raises(source.DisklessSourceError, match="not allowed for a batch query"):
        source._Plan({"bootstrap.servers": "127.0.0.1:1", "topic": "t", "startingOffsets": "LATEST"}, streaming=False)


def _metadata_answer() -> Any:
    """An all-topics Metadata answer: "orders" readable, "staging" in error (a leader being elected)."""
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    part = SimpleNamespace(partition_index=0, leader_id=1, replica_nodes=(1,))
    return SimpleNamespace(
        brokers=[SimpleNamespace(node_id=1, host="127.0.0.1", port=1)],
        topics=[
            SimpleNamespace(name="staging", topic_id="id-s", error_code=ErrorCode.leader_not_available,
                            is_internal=False, partitions=()),
            SimpleNamespace(name="orders", topic_id="id-o", error_code=ErrorCode.none, is_internal=False,
                            partitions=(part,)),
        ],
    )  # fmt: skip


def test_subscribe_pattern_fails_only_for_a_topic_in_error_that_it_reads() -> None:
    """ClusterClient.metadata(None) raised on the first topic of the cluster in error, whether
    or not the pattern picks it: subscribePattern=orders failed on "staging"."""
    import asyncio

    from diskless.spark.cluster import ClusterClient, Settings

    client = ClusterClient(Settings(bootstrap=(("127.0.0.1", 1),), secret=b"s"))

    async def any_request(api_key: int, version: int, body: dict[str, Any]) -> Any:
        assert body["topics"] is None
        return _metadata_answer()

    client._any_request = any_request  # type: ignore[method-assign]
    plan = source._Plan({"bootstrap.servers": "127.0.0.1:1", "subscribePattern": "orders"}, streaming=False)
    assert [(p.topic, p.index, p.topic_id) for p in asyncio.run(plan.partitions(client))] == [("orders", 0, "id-o")]
    plan = source._Plan({"bootstrap.servers": "127.0.0.1:1", "subscribePattern": "sta.*|orders"}, streaming=False)
    with pytest.raises(source.DisklessSourceError, match="topic 'staging': LEADER_NOT_AVAILABLE"):
        asyncio.run(plan.partitions(client))

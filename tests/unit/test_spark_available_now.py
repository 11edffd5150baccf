"""``Trigger.AvailableNow`` in the ``diskless`` Spark source (``SupportsTriggerAvailableNow``): a
run reads what the topics held when it started, in as many micro-batches as
``maxOffsetsPerTrigger`` asks, never what arrives later, and ends. The stream reader over the fake
cluster of ``test_spark_data_loss``."""

from __future__ import annotations

import pytest
from test_spark_data_loss import NEW, OLD, _Cluster, stream

from diskless.spark import source
from diskless.spark.offsets import TOPIC_IDS


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> type[_Cluster]:
    monkeypatch.setattr(source, "ClusterClient", _Cluster)
    monkeypatch.setattr(source, "BACKWARDS_RETRY_S", 0.0)
    _Cluster.state = {"id": OLD, "earliest": 0, "latest": 5}
    return _Cluster


def test_a_run_reads_up_to_the_ends_it_started_with_in_limited_batches_then_ends(cluster: type[_Cluster]) -> None:
    reader = stream(maxOffsetsPerTrigger="4")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()  # both partitions end at 5
    cluster.state["latest"] = 50  # written after the run began: not for this run
    limit = reader.getDefaultReadLimit()
    seen = [start]
    while True:
        end = reader.latestOffset(seen[-1], limit)
        if end == seen[-1]:
            break  # Spark ends an AvailableNow run when the source offers nothing new
        seen.append(end)
        assert len(seen) < 10, "the run never ended"
    assert seen[1:] == [
        {"t": {"0": 2, "1": 2}, TOPIC_IDS: {"t": OLD}},
        {"t": {"0": 4, "1": 4}, TOPIC_IDS: {"t": OLD}},
        {"t": {"0": 5, "1": 5}, TOPIC_IDS: {"t": OLD}},
    ]
    # Without AvailableNow the same reader goes on to what arrived.
    assert stream().latestOffset(seen[-1], source.ReadAllAvailable()) == {
        "t": {"0": 50, "1": 50},
        TOPIC_IDS: {"t": OLD},
    }


def test_a_restarted_run_reads_from_its_checkpoint_to_the_new_ends(cluster: type[_Cluster]) -> None:
    checkpoint = {"t": {"0": 5, "1": 5}, TOPIC_IDS: {"t": OLD}}
    cluster.state["latest"] = 9
    reader = stream()
    reader.prepareForTriggerAvailableNow()
    end = reader.latestOffset(checkpoint, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 9, "1": 9}, TOPIC_IDS: {"t": OLD}}
    assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end


def test_a_topic_recreated_during_a_run_is_left_to_the_next_run(cluster: type[_Cluster]) -> None:
    reader = stream(failOnDataLoss="false")
    start = {"t": {"0": 5, "1": 5}, TOPIC_IDS: {"t": OLD}}
    reader.prepareForTriggerAvailableNow()
    cluster.state = {"id": NEW, "earliest": 0, "latest": 8}
    moved = reader.latestOffset(start, reader.getDefaultReadLimit())
    # The new topic is taken up at its start (failOnDataLoss=false), but none of it is read: it
    # was not there when the run began.
    assert moved == {"t": {"0": 0, "1": 0}, TOPIC_IDS: {"t": NEW}}
    assert reader.latestOffset(moved, reader.getDefaultReadLimit()) == moved


def test_a_partition_without_a_leader_at_the_start_is_asked_again(cluster: type[_Cluster]) -> None:
    cluster.state["latest"] = [5, None, None, 6]  # partition 1 has a leader at the second retry
    reader = stream()
    start = {"t": {"0": 0, "1": 0}, TOPIC_IDS: {"t": OLD}}
    reader.prepareForTriggerAvailableNow()
    cluster.state["latest"] = 7
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == {"t": {"0": 5, "1": 6}, TOPIC_IDS: {"t": OLD}}


def test_a_partition_that_could_not_say_where_it_ends_is_not_read_in_the_run(cluster: type[_Cluster]) -> None:
    cluster.state["latest"] = [5] + [None] * (source.BACKWARDS_RETRIES + 1)  # partition 1: no leader throughout
    reader = stream()
    start = {"t": {"0": 0, "1": 0}, TOPIC_IDS: {"t": OLD}}
    reader.prepareForTriggerAvailableNow()
    cluster.state["latest"] = 7
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 5, "1": 0}, TOPIC_IDS: {"t": OLD}}

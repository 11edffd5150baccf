"""Where a diskless produce's time goes: the representative reports each stage of every batch.

``diskless_produce_stage_seconds{stage=...}`` (diskless/metrics.py) has one sample per batch and
stage, and the stages follow one another, so per batch the total is at least the sum of linger,
upload, order, commit and replication. ``diskless bench`` reads these to say which stage a
latency figure is made of (issue 10). One real broker with S3, a real client (confluent-kafka).
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from diskless.metrics import PRODUCE_STAGES
from diskless.produce.wal_buffer import DEFAULT_GATHER_MS

pytestmark = pytest.mark.integration

LINGER_MS = 60
BATCHES = 4


def _stage(samples: dict[str, float], stage: str, suffix: str) -> float:
    return samples.get(f'diskless_produce_stage_seconds_{suffix}{{stage="{stage}"}}', 0.0)


def test_each_batch_reports_every_stage_and_they_add_up(cluster_factory: Any) -> None:
    cluster = cluster_factory(brokers=1, azs=1, s3=True, overrides={"diskless.wal.linger.ms": str(LINGER_MS)})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = NewTopic("staged", num_partitions=1, replication_factor=1, config={"diskless.enabled": "true"})
    for future in admin.create_topics([topic]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
    delivered: list[Any] = []
    for i in range(BATCHES):
        # One record per request, each after the previous answer: one batch per flush.
        producer.produce("staged", value=b"v%d" % i, on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(30) == 0
    assert delivered == [None] * BATCHES

    samples = cluster.brokers[0].metrics()
    for stage in PRODUCE_STAGES:
        assert _stage(samples, stage, "count") == BATCHES, f"stage {stage} not reported once per batch"
    sums = {stage: _stage(samples, stage, "sum") for stage in PRODUCE_STAGES}
    # A lone batch waits at least the gather (wal_buffer.py) before its flush.
    assert sums["linger"] >= BATCHES * min(DEFAULT_GATHER_MS, LINGER_MS) / 1000 * 0.9
    parts = sum(sums[s] for s in ("admission", "linger", "upload", "order", "commit", "replication"))
    assert sums["total"] >= parts - 0.001 * BATCHES
    assert sums["upload"] > 0 and sums["commit"] >= 0
    # Each upload's PUT is also timed inside its pool thread, which the upload stage contains.
    put_count = samples.get('diskless_object_store_seconds_count{operation="put"}', 0.0)
    put_sum = samples.get('diskless_object_store_seconds_sum{operation="put"}', 0.0)
    assert put_count >= BATCHES
    assert 0 < put_sum <= sums["upload"] * put_count / BATCHES + 0.001

"""A consumer Fetch hands out its response's space in request order, whether a partition is read
here or through its leader (a diskless partition with no replica here), as Kafka's
ReplicaManager.readFromLog does: the first partition with data gets at least one batch however
big (KIP-74), each later one what is left of max_bytes within its partition_max_bytes, down to no
batch at all. Clients rotate their partitions' order between fetches so that none starves; a
broker serving its local partitions first would starve the others whatever the order.

The real Fetch handler of broker 1 (AZ b) serves partitions it leads (a diskless and a classic
topic) and a diskless partition led by broker 0 (AZ a) with no replica on broker 1, whose pointer
answers come from broker 0's real handler (in process, see test_follower_reads)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from batches import decode_all, split, values_batch
from kio.schema.errors import ErrorCode
from test_follower_reads import FakeBroker, ns

from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, PartitionState, TopicMetadata
from diskless.log.config import LogConfig
from diskless.protocol import messages as m

THERE, HERE = 0, 1
EPOCH = 3
FAR, NEAR, CLASSIC = "far", "near", "classic"  # read through broker 0; diskless led here; classic here
BATCHES = 4  # per partition, of 5 records each
# One batch, as every partition's batches are (same tag length, same record count).
BATCH = len(values_batch(5, tag="x", start_ts=0))


class Broker(FakeBroker):
    def is_diskless(self, meta: TopicMetadata) -> bool:
        return meta.configs.get("diskless.enabled") == "true"


class Cluster:
    def __init__(self, root: Path) -> None:
        self.metadata = ClusterMetadata("fetch-order")
        self.metadata.brokers[THERE] = BrokerInfo(THERE, "127.0.1.1", 9092, "az-a")
        self.metadata.brokers[HERE] = BrokerInfo(HERE, "127.0.2.1", 9092, "az-b")
        cluster: dict[int, Any] = {}
        self.there = cluster[THERE] = Broker(THERE, "az-a", self.metadata, cluster, root / "there")
        self.here = cluster[HERE] = Broker(HERE, "az-b", self.metadata, cluster, root / "here")
        for topic, leader, diskless in ((FAR, THERE, True), (NEAR, HERE, True), (CLASSIC, HERE, False)):
            state = PartitionState([leader], leader, EPOCH, [leader])
            configs = {"diskless.enabled": "true"} if diskless else {}
            meta = TopicMetadata(topic, str(uuid.uuid4()), [state], configs)
            self.metadata.topics[topic] = meta
            broker = cluster[leader]
            part = broker.replicas.apply(meta, 0, LogConfig(diskless_enabled=diskless), broker.clock_ms)
            assert part is not None
            log = part.log
            for _ in range(BATCHES):
                log.append_as_leader([memoryview(values_batch(5, tag="x", start_ts=broker.clock_ms))], EPOCH, 0)
            log.high_watermark = log.log_end_offset

    async def fetch(
        self,
        order: list[str],
        max_bytes: int,
        partition_max_bytes: int = 1 << 20,
        offsets: dict[str, int] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """A consumer's Fetch (v12) to broker 1 naming the topics in ``order`` (each from its offset in
        ``offsets``, default 0): each partition's answer."""
        request = ns(
            {
                "replica_id": -1,
                "max_wait": 0,
                "min_bytes": 1,
                "max_bytes": max_bytes,
                "isolation_level": 0,
                "session_id": 0,
                "session_epoch": -1,
                "rack_id": "",
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [
                            {
                                "partition": 0,
                                "current_leader_epoch": EPOCH,
                                "fetch_offset": (offsets or {}).get(topic, 0),
                                "partition_max_bytes": partition_max_bytes,
                            }
                        ],
                    }
                    for topic in order
                ],
            }
        )
        response = await self.here.fetch_apis.fetch(m.RequestHeader(m.API_FETCH, 12, 1, "consumer"), request)
        assert [t["topic"] for t in response["responses"]] == order  # answered in request order
        return {t["topic"]: t["partitions"][0] for t in response["responses"]}

    async def close(self) -> None:
        for broker in (self.there, self.here):
            await broker.replicas.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    await made.close()


def batches(answer: dict[str, Any]) -> int:
    assert answer["error_code"] == ErrorCode.none
    return len(split(answer["records"])) if answer["records"] else 0


def answered_offsets(answer: dict[str, Any]) -> None:
    """An answer without records still tells the partition's offsets, as Kafka's does."""
    assert (answer["high_watermark"], answer["last_stable_offset"], answer["log_start_offset"]) == (
        5 * BATCHES,
        5 * BATCHES,
        0,
    )


async def test_every_partition_is_read_through_broker_1(cluster: Cluster) -> None:
    # The setting: FAR is read through its leader (broker 1 has no replica), NEAR and CLASSIC here.
    assert cluster.here.replicas.topic_id_of(FAR, 0) is None
    answers = await cluster.fetch([NEAR, FAR, CLASSIC], max_bytes=1 << 20)
    assert [batches(answers[t]) for t in (NEAR, FAR, CLASSIC)] == [BATCHES] * 3
    assert [r.offset for r in decode_all(answers[FAR]["records"])] == list(range(5 * BATCHES))


@pytest.mark.parametrize("local", [NEAR, CLASSIC])
async def test_a_partition_read_through_its_leader_first_in_the_request_gets_the_space(
    cluster: Cluster, local: str
) -> None:
    # Room for one batch: the partition named first gets it, local or not.
    answers = await cluster.fetch([FAR, local], max_bytes=BATCH)
    assert (batches(answers[FAR]), batches(answers[local])) == (1, 0)
    answered_offsets(answers[local])
    answers = await cluster.fetch([local, FAR], max_bytes=BATCH)
    assert (batches(answers[local]), batches(answers[FAR])) == (1, 0)
    answered_offsets(answers[FAR])


async def test_rotating_the_request_order_serves_every_partition(cluster: Cluster) -> None:
    # A consumer rotating its partitions (as Java's and librdkafka's do) hears from each in turn.
    order = [NEAR, CLASSIC, FAR]
    served = set()
    for _ in range(3):
        answers = await cluster.fetch(order, max_bytes=BATCH)
        served |= {topic for topic, answer in answers.items() if batches(answer)}
        assert sum(batches(a) for a in answers.values()) == 1
        order = order[1:] + order[:1]
    assert served == {NEAR, CLASSIC, FAR}


def kafka_batches(order: list[str], max_bytes: int, partition_max_bytes: int) -> dict[str, int]:
    """Kafka's readFromLog over partitions of BATCHES equal batches each: the batches each serves."""
    left, min_one, out = max_bytes, True, {}
    for topic in order:
        room = min(partition_max_bytes, left)
        count = min(BATCHES, room // BATCH)
        if count == 0 and min_one:
            count = 1  # KIP-74: the first partition with data returns its first batch, however big
        out[topic] = count
        if count:
            min_one = False
        left = max(0, left - count * BATCH)
    return out


ORDERS = [[FAR, NEAR, CLASSIC], [NEAR, FAR, CLASSIC], [NEAR, CLASSIC, FAR], [CLASSIC, FAR, NEAR]]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(
    ("max_bytes", "partition_max_bytes"),
    [
        (1, 1 << 20),  # KIP-74: one batch, from the first partition, over the response's limit
        (1 << 20, 1),  # KIP-74: one batch from the first partition, over its own limit; none after
        (1, 1),
        (BATCH * 5 // 2, 1 << 20),  # two and a half batches: the first two, then nothing fits
        (BATCH * 6, BATCH * 5 // 2),  # two per partition: the third has what is left
        (BATCH * 7 + 3, BATCH * 3),
        (BATCH * 3 - 1, BATCH),
    ],
)
async def test_limits_are_kept_in_request_order_as_kafka_keeps_them(
    cluster: Cluster, order: list[str], max_bytes: int, partition_max_bytes: int
) -> None:
    answers = await cluster.fetch(order, max_bytes=max_bytes, partition_max_bytes=partition_max_bytes)
    got = {topic: batches(answer) for topic, answer in answers.items()}
    assert got == kafka_batches(order, max_bytes, partition_max_bytes)
    sizes = [len(answers[topic]["records"]) for topic in order]
    if sum(sizes) > max_bytes or max(sizes) > partition_max_bytes:
        # Only the first partition's first batch may break the limits (KIP-74).
        assert sizes[0] == BATCH and sum(sizes[1:]) == 0, sizes
    for answer in answers.values():
        answered_offsets(answer)


@pytest.mark.parametrize(("idle", "busy"), [(FAR, NEAR), (NEAR, FAR), (CLASSIC, FAR), (FAR, CLASSIC)])
async def test_a_partition_with_nothing_to_read_takes_no_room(cluster: Cluster, idle: str, busy: str) -> None:
    # The partition named first is at its end: the next one is the first with data (KIP-74).
    answers = await cluster.fetch([idle, busy], max_bytes=1, offsets={idle: 5 * BATCHES})
    assert (batches(answers[idle]), batches(answers[busy])) == (0, 1)
    answered_offsets(answers[idle])

"""The ``diskless`` Spark data source against a real cluster, a real S3 server and a local Spark.

What is produced (confluent-kafka and aiokafka, every codec, committed and aborted transactions,
tiered (the tiering job's segment objects), diskless and classic ranges of one topic) is
recorded from the producers' acknowledgements; the
data source must return exactly the committed records: same count and same checksum of
(partition, offset, key, value, headers).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from pyspark.errors import StreamingQueryException
from rawclient import Session
from support import wait_until

from diskless.spark import DisklessDataSource, DisklessSourceError, tier_job

OVERRIDES = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}
PARTITIONS = 2

Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


def create_topic(bootstrap: str, topic: str, partitions: int, configs: dict[str, str], rf: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, rf, config=configs)])[topic].result(30)


def set_diskless(bootstrap: str, topic: str, enabled: bool) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    value = "true" if enabled else "false"
    entry = ConfigEntry("diskless.enabled", value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)


def produce_confluent(
    bootstrap: str, topic: str, codec: str, count: int, tag: str, partitions: int = PARTITIONS
) -> list[Row]:
    acked: list[Row] = []
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20})

    def done(err: Any, msg: Any, headers: tuple[tuple[str, bytes], ...]) -> None:
        assert err is None, err  # delivery reports do not carry headers: the produced ones are kept
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value(), headers))

    for i in range(count):
        headers = [("codec", codec.encode()), ("i", str(i).encode())] if i % 3 else None
        key = None if i % 7 == 0 else f"{tag}-{i}".encode()
        producer.produce(
            topic,
            f"{tag}-{codec}-{i}".encode() * 3,
            key,
            partition=i % partitions,
            headers=headers,
            on_delivery=lambda err, msg, h=tuple(headers or ()): done(err, msg, h),
        )
    assert producer.flush(30) == 0
    assert len(acked) == count
    return acked


async def produce_aiokafka(bootstrap: str, topic: str, codec: str, count: int) -> list[Row]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=20)
    await producer.start()
    acked: list[Row] = []
    try:
        sent = []
        for i in range(count):
            headers = [("aio", codec.encode())] if i % 2 else []
            value = None if i == 5 else f"aio-{codec}-{i}".encode()
            key = f"aio-{i}".encode()
            future = await producer.send(topic, value, key=key, partition=i % PARTITIONS, headers=headers)
            sent.append((key, value, tuple(headers), future))
        for key, value, headers, future in sent:
            meta = await future
            acked.append((meta.partition, meta.offset, key, value, headers))
    finally:
        await producer.stop()
    return acked


def produce_transactions(bootstrap: str, topic: str, tid: str, plan: list[bool]) -> list[Row]:
    """One transaction per entry of ``plan`` (True commit, False abort); the committed rows."""
    committed: list[Row] = []
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(30)
    for n, commit in enumerate(plan):
        acked: list[Row] = []

        def done(err: Any, msg: Any, acked: list[Row] = acked) -> None:
            assert err is None, err
            acked.append((msg.partition(), msg.offset(), msg.key(), msg.value(), ()))

        producer.begin_transaction()
        for i in range(10):
            value = f"{tid}-{n}-{'commit' if commit else 'abort'}-{i}".encode()
            producer.produce(topic, value, f"t{i}".encode(), partition=i % PARTITIONS, on_delivery=done)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
            committed.extend(acked)
        else:
            producer.abort_transaction(30)
    return committed


def tier_settings(cluster: Any) -> tier_job.TierSettings:
    overrides = {"diskless.s3.endpoint": cluster.s3.endpoint, "metadata.etcd.endpoints": cluster.etcd.endpoint}
    return tier_job.settings_from_args(cluster.bootstrap, None, overrides, None)


def spark_rows(df: Any) -> list[Row]:
    out = []
    for r in df.collect():
        headers = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"] or [])
        key = None if r["key"] is None else bytes(r["key"])
        value = None if r["value"] is None else bytes(r["value"])
        out.append((r["partition"], r["offset"], key, value, headers))
    return out


def checksum(rows: list[Row]) -> str:
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda r: (r[0], r[1])):
        digest.update(repr(row).encode())
    return digest.hexdigest()


def reader(spark: Any, cluster: Any, topic: str, **options: str) -> Any:
    spark.dataSource.register(DisklessDataSource)
    read = spark.read.format("diskless").option("bootstrap.servers", cluster.bootstrap).option("topic", topic)
    read = read.option("diskless.s3.endpoint", cluster.s3.endpoint).option("timeout.ms", "15000")
    read = read.option("metadata.etcd.endpoints", cluster.etcd.endpoint)  # where the cluster secret is
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


async def test_batch_read_equals_committed_records_of_every_client_codec_and_range(cluster_factory, spark) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic = "mixed"
    configs = {"diskless.enabled": "true", "segment.bytes": "20000"}
    create_topic(cluster.bootstrap, topic, PARTITIONS, configs)
    expected: list[Row] = []
    # Diskless range: every codec from both clients, committed and aborted transactions between.
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        expected += produce_confluent(cluster.bootstrap, topic, codec, 40, "diskless")
    expected += produce_transactions(cluster.bootstrap, topic, "diskless-txn", [False, True, False, True])
    # Tiered range: what is committed so far goes to segment objects (the tiering job).
    report = await asyncio.to_thread(tier_job.run_once, spark, tier_settings(cluster))  # it runs its own loops
    assert report.committed > 0 and not report.refused, report.line()
    # Untiered diskless range after it.
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        expected += await produce_aiokafka(cluster.bootstrap, topic, codec, 25)
    # Classic range: the topic switched back; plain and gzip records, a committed and an aborted transaction.
    set_diskless(cluster.bootstrap, topic, False)
    expected += produce_confluent(cluster.bootstrap, topic, "none", 30, "classic")
    expected += produce_confluent(cluster.bootstrap, topic, "gzip", 30, "classic")
    expected += produce_transactions(cluster.bootstrap, topic, "classic-txn", [True, False])
    assert len({(p, o) for p, o, *_ in expected}) == len(expected)

    rows = spark_rows(reader(spark, cluster, topic))
    assert len(rows) == len(expected)
    assert checksum(rows) == checksum(expected)

    # Split into many Spark partitions by offset range: same records.
    split = reader(spark, cluster, topic, maxRecordsPerPartition="37")
    assert split.rdd.getNumPartitions() > PARTITIONS * 5
    assert checksum(spark_rows(split)) == checksum(expected)

    # read_uncommitted shows the aborted records too (20 classic + 20 diskless, none committed).
    uncommitted = spark_rows(reader(spark, cluster, topic, **{"isolation.level": "read_uncommitted"}))
    assert len(uncommitted) == len(expected) + 30
    assert sum(1 for r in uncommitted if r[3] is not None and b"-abort-" in r[3]) == 30

    # An explicit per-partition range reads exactly that range.
    ranged = spark_rows(
        reader(
            spark,
            cluster,
            topic,
            startingOffsets='{"mixed": {"0": 10, "1": -2}}',
            endingOffsets='{"mixed": {"0": 50, "1": 5}}',
        )
    )
    want = [r for r in expected if (r[0] == 0 and 10 <= r[1] < 50) or (r[0] == 1 and r[1] < 5)]
    assert checksum(ranged) == checksum(want)


async def test_partition_reader_reads_diskless_data_from_object_storage(cluster_factory) -> None:
    """Executors read diskless record bytes from S3 themselves (the WAL ranges they fetch add up)."""
    from diskless.spark.cluster import ClusterClient, PartitionReader, settings_from_options
    from diskless.spark.source import arrow_schema

    cluster = cluster_factory(s3=True)
    topic = "direct"
    create_topic(cluster.bootstrap, topic, PARTITIONS, {"diskless.enabled": "true"})
    expected = produce_confluent(cluster.bootstrap, topic, "lz4", 200, "direct")
    settings = settings_from_options(
        {
            "bootstrap.servers": cluster.bootstrap,
            "diskless.s3.endpoint": cluster.s3.endpoint,
            "metadata.etcd.endpoints": cluster.etcd.endpoint,
        }
    )
    client = ClusterClient(settings)
    got = 0
    wal_bytes = 0
    try:
        view = await client.metadata([topic])
        for part in view.topics[topic]:
            (end,) = await client.list_offsets([(part, -1)])
            for start in range(0, end, 37):  # ranges starting and ending inside batches too
                partition_reader = PartitionReader(client, part, start, min(start + 37, end), arrow_schema())
                while (batch := await partition_reader.next_batch()) is not None:
                    got += batch.num_rows
                wal_bytes += partition_reader.bytes_read
                await partition_reader.close()
    finally:
        await client.close()
    assert got == len(expected)
    assert wal_bytes > 0


def test_bad_input_names_what_is_wrong(cluster_factory, spark) -> None:
    cluster = cluster_factory(brokers=1, azs=1, s3=True)
    create_topic(cluster.bootstrap, "small", 1, {"diskless.enabled": "true"}, rf=1)
    produce_confluent(cluster.bootstrap, "small", "none", 10, "small", partitions=1)

    def failure(**options: str) -> str:
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            reader(spark, cluster, options.pop("topic", "small"), **options).collect()
        assert time.monotonic() - started < 60, "an error must come within bounded timeouts"
        return str(caught.value)

    unknown = failure(topic="nope")
    assert "'nope'" in unknown and "UNKNOWN_TOPIC_OR_PARTITION" in unknown
    assert "partition 3 of topic 'small'" in failure(startingOffsets='{"small": {"3": 0}}')
    assert "past the latest readable offset 10" in failure(endingOffsets='{"small": {"0": 500}}')
    assert "starting offset 8 is after ending offset 4" in failure(
        startingOffsets='{"small": {"0": 8}}', endingOffsets='{"small": {"0": 4}}'
    )
    dead = f"127.0.0.1:{_free_port()}"
    assert "cannot read WAL object" in failure(**{"diskless.s3.endpoint": f"http://{dead}", "timeout.ms": "3000"})
    spark.dataSource.register(DisklessDataSource)
    with pytest.raises(Exception, match="no broker answered") as caught:
        spark.read.format("diskless").option("bootstrap.servers", dead).option("topic", "small").option(
            "timeout.ms", "3000"
        ).load().collect()
    assert dead in str(caught.value)
    with pytest.raises(DisklessSourceError, match="exactly one of"):
        from diskless.spark.source import _topics_option

        _topics_option({})


def _free_port() -> int:
    from support import free_port

    return free_port()


def test_streaming_query_sees_every_record_once_across_a_restart(cluster_factory, spark, tmp_path) -> None:
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    topic = "stream"
    create_topic(cluster.bootstrap, topic, PARTITIONS, {"diskless.enabled": "true"})
    spark.dataSource.register(DisklessDataSource)
    checkpoint = str(tmp_path / "checkpoint")
    table = "stream_out"

    def start() -> Any:
        stream = (
            spark.readStream.format("diskless")
            .option("bootstrap.servers", cluster.bootstrap)
            .option("topic", topic)
            .option("diskless.s3.endpoint", cluster.s3.endpoint)
            .option("metadata.etcd.endpoints", cluster.etcd.endpoint)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "60")
            .load()
        )
        return (
            stream.selectExpr("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(tmp_path / table))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def written() -> list[tuple[int, int, bytes]]:
        try:
            df = spark.read.parquet(str(tmp_path / table))
        except Exception:
            return []
        return [(r["partition"], r["offset"], bytes(r["value"])) for r in df.collect()]

    # Spark waits a fixed 10 s for the Python process that runs a streaming source to connect
    # back; on a loaded machine (it imports PySpark from a zip) it can miss that, failing the
    # query at its start. Such a start is retried (from the checkpoint, which is what this test
    # is about); any other failure fails the test at once.
    unborn = "Python worker failed to connect back"
    query: Any = None

    def streamed(count: int) -> bool:
        nonlocal query
        error = query.exception()
        if error is not None and unborn in str(error) and starts[0] < 3:
            query.stop()
            starts[0] += 1
            query = start()
            return False
        if error is not None:
            raise AssertionError(f"streaming query failed: {error}")
        return len(written()) >= count

    starts = [1]
    first = produce_confluent(cluster.bootstrap, topic, "zstd", 100, "first")
    query = start()
    try:
        wait_until(lambda: streamed(100), timeout=90, interval=1.0, message="first records streamed")
        more = produce_transactions(cluster.bootstrap, topic, "stream-txn", [True, False])
        wait_until(lambda: streamed(110), timeout=60, interval=1.0, message="committed transaction streamed")
    finally:
        query.stop()
    later = produce_confluent(cluster.bootstrap, topic, "snappy", 80, "later")
    starts = [1]
    query = start()
    try:
        wait_until(lambda: streamed(190), timeout=90, interval=1.0, message="records after the restart streamed")
    finally:
        query.stop()
    got = written()
    expected = {(p, o, v) for p, o, _, v, _ in first + more + later}
    assert len(got) == len(expected), "a record was read twice or skipped"
    assert set(got) == expected


def topic_shown(bootstrap: str, topic: str) -> str | None:
    """The topic id one broker's metadata shows with a leader for every partition, else None."""
    request = MetadataRequest(  # v12: with topic ids
        topics=(MetadataRequestTopic(topic_id=None, name=topic),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    with Session(bootstrap, timeout=10) as session:
        (answer,) = session.request(request).topics
    ready = answer.error_code == 0 and answer.partitions and all(p.leader_id >= 0 for p in answer.partitions)
    return str(answer.topic_id) if ready else None


def recreate(cluster: Any, topic: str, partitions: int) -> tuple[str, str]:
    """Delete ``topic`` and create it again; returns (old id, new id) once every broker shows the new one."""
    brokers = [b.bootstrap for b in cluster.brokers]
    old_id = topic_shown(brokers[0], topic)
    assert old_id is not None
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # kept: its futures die with it
    admin.delete_topics([topic])[topic].result(30)
    wait_until(lambda: all(topic_shown(b, topic) is None for b in brokers), 30, 0.05, f"{topic} still shown")
    create_topic(cluster.bootstrap, topic, partitions, {"diskless.enabled": "true"})

    def new_everywhere() -> str | None:
        ids = {topic_shown(b, topic) for b in brokers}
        return ids.pop() if len(ids) == 1 and None not in ids and old_id not in ids else None

    return old_id, wait_until(new_everywhere, 30, 0.05, f"{topic} not shown re-created by every broker")


class StreamToParquet:
    """A streaming query of one topic into parquet files, restartable from its checkpoint."""

    # Spark waits a fixed 10 s for the Python process of a streaming source to connect back; on a
    # loaded machine it can miss that, failing the query at its start: such a start is retried.
    UNBORN = "Python worker failed to connect back"

    def __init__(self, spark: Any, cluster: Any, topic: str, root: Any, max_per_trigger: int | None = None) -> None:
        self.spark, self.cluster, self.topic = spark, cluster, topic
        self.path, self.checkpoint = str(root / f"{topic}-out"), str(root / f"{topic}-checkpoint")
        self.max_per_trigger = max_per_trigger

    def start(self, fail_on_data_loss: bool, available_now: bool) -> Any:
        spark = self.spark
        spark.dataSource.register(DisklessDataSource)
        stream = (
            spark.readStream.format("diskless")
            .option("bootstrap.servers", self.cluster.bootstrap)
            .option("topic", self.topic)
            .option("diskless.s3.endpoint", self.cluster.s3.endpoint)
            .option("metadata.etcd.endpoints", self.cluster.etcd.endpoint)
            .option("startingOffsets", "earliest")
            .option("timeout.ms", "15000")
            .option("failOnDataLoss", str(fail_on_data_loss).lower())
        )
        if self.max_per_trigger is not None:
            stream = stream.option("maxOffsetsPerTrigger", str(self.max_per_trigger))
        stream = stream.load()
        writer = (
            stream.selectExpr("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", self.path)
            .option("checkpointLocation", self.checkpoint)
        )
        if available_now:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime="200 milliseconds").start()

    def run_available_now(self, fail_on_data_loss: bool) -> Any:
        """One Trigger.AvailableNow run, from the checkpoint; the query, ended."""
        for attempt in range(3):
            query = self.start(fail_on_data_loss, available_now=True)
            try:
                assert query.awaitTermination(120), "the AvailableNow run did not end"
                return query
            except StreamingQueryException as exc:
                if self.UNBORN not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def started(self, fail_on_data_loss: bool) -> Any:
        """A running query, once it has processed what is available."""
        for attempt in range(3):
            query = self.start(fail_on_data_loss, available_now=False)
            try:
                query.processAllAvailable()
                return query
            except StreamingQueryException as exc:
                query.stop()
                if self.UNBORN not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def written(self) -> list[tuple[int, int, bytes]]:
        try:
            df = self.spark.read.parquet(self.path)
        except Exception:
            return []
        return [(r["partition"], r["offset"], bytes(r["value"])) for r in df.collect()]


def as_written(rows: list[Row]) -> list[tuple[int, int, bytes]]:
    return sorted((p, o, v) for p, o, _, v, _ in rows if v is not None)


@pytest.mark.parametrize("fail_on_data_loss", [True, False], ids=["failOnDataLoss=true", "failOnDataLoss=false"])
def test_streaming_query_and_a_topic_recreated_between_micro_batches(
    cluster_factory, spark, tmp_path, fail_on_data_loss: bool
) -> None:
    """The topic is deleted and re-created under the same name between two micro-batches, and
    the new topic grows past the offsets the query had reached (5 per partition). Spark's Kafka
    source rule: fail naming failOnDataLoss (the default), or go on, here from the new topic's
    earliest offsets; never, silently, read the new topic from the old offsets on (its first
    records skipped) nor wait for it to reach them."""
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)

    # A query restarted from its checkpoint (Trigger.AvailableNow: one micro-batch per run).
    create_topic(cluster.bootstrap, "reborn", PARTITIONS, {"diskless.enabled": "true"})
    old = produce_confluent(cluster.bootstrap, "reborn", "lz4", 10, "old")
    query = StreamToParquet(spark, cluster, "reborn", tmp_path)
    query.run_available_now(fail_on_data_loss)
    assert sorted(query.written()) == as_written(old)
    old_id, new_id = recreate(cluster, "reborn", PARTITIONS)
    new = produce_confluent(cluster.bootstrap, "reborn", "zstd", 30, "new")
    if fail_on_data_loss:
        with pytest.raises(StreamingQueryException) as caught:
            query.run_available_now(True)
        message = str(caught.value)
        assert f"topic 'reborn' was deleted and re-created (topic id {old_id} is now {new_id})" in message
        assert "read up to offsets {0: 5, 1: 5}" in message and "start again ({0: 0, 1: 0})" in message
        assert 'set the source option "failOnDataLoss" to "false"' in message
        assert sorted(query.written()) == as_written(old)  # nothing of the new topic, read or skipped
    # Going on (failOnDataLoss=false, also the way past the failure: same checkpoint, option set).
    query.run_available_now(False)
    assert sorted(query.written()) == as_written(old + new), "a record was skipped or read twice"
    later = produce_confluent(cluster.bootstrap, "reborn", "none", 6, "later")
    query.run_available_now(False)
    assert sorted(query.written()) == as_written(old + new + later)

    # A running query: the topic re-created under it, whatever state its triggers see meanwhile
    # (the topic still listed, absent, without leaders, re-created).
    create_topic(cluster.bootstrap, "live", PARTITIONS, {"diskless.enabled": "true"})
    old = produce_confluent(cluster.bootstrap, "live", "lz4", 10, "old")
    live = StreamToParquet(spark, cluster, "live", tmp_path)
    running = live.started(fail_on_data_loss)
    try:
        assert sorted(live.written()) == as_written(old)
        recreate(cluster, "live", PARTITIONS)
        new = produce_confluent(cluster.bootstrap, "live", "zstd", 30, "new")
        if fail_on_data_loss:
            wait_until(lambda: running.exception() is not None, 60, 0.2, "the query did not fail")
            message = str(running.exception())
            assert "DataLossError" in message and "topic 'live'" in message, message
            assert 'set the source option "failOnDataLoss" to "false"' in message
            assert sorted(live.written()) == as_written(old)
        else:

            def streamed() -> bool:
                assert running.exception() is None, running.exception()
                return len(live.written()) >= len(old + new)

            wait_until(streamed, 60, 0.5, "the re-created topic's records were not all streamed")
            running.processAllAvailable()
            assert sorted(live.written()) == as_written(old + new), "a record was skipped or read twice"
    finally:
        running.stop()


def test_available_now_reads_what_was_there_in_batches_of_max_offsets_per_trigger(
    cluster_factory, spark, tmp_path
) -> None:
    """Trigger.AvailableNow with maxOffsetsPerTrigger: several micro-batches of at most that many
    records, then the run ends, as Spark's Kafka source (SupportsTriggerAvailableNow). Spark runs a
    source without it as a single batch of everything, the limit ignored."""
    cluster = cluster_factory(s3=True, overrides=OVERRIDES)
    create_topic(cluster.bootstrap, "paced", PARTITIONS, {"diskless.enabled": "true"})
    rows = produce_confluent(cluster.bootstrap, "paced", "lz4", 30, "paced")
    paced = StreamToParquet(spark, cluster, "paced", tmp_path, max_per_trigger=8)
    query = paced.run_available_now(False)
    sizes = [int(progress["numInputRows"]) for progress in query.recentProgress]
    assert sum(sizes) == 30 and max(sizes) <= 8 and len([n for n in sizes if n]) >= 4, sizes
    assert sorted(paced.written()) == as_written(rows)
    later = produce_confluent(cluster.bootstrap, "paced", "none", 5, "later")
    paced.run_available_now(False)
    assert sorted(paced.written()) == as_written(rows + later)


def test_writer_rows_read_back_by_a_consumer(cluster_factory, spark) -> None:
    cluster = cluster_factory(s3=True)
    topic = "written"
    create_topic(cluster.bootstrap, topic, 3, {"diskless.enabled": "true"})
    spark.dataSource.register(DisklessDataSource)
    rows = [(f"k{i}".encode(), f"v{i}".encode(), i % 3, [(f"h{i}", b"x")]) for i in range(300)]
    df = spark.createDataFrame(
        rows, "key binary, value binary, partition int, headers array<struct<key: string, value: binary>>"
    ).repartition(3)
    df.write.format("diskless").option("bootstrap.servers", cluster.bootstrap).option("topic", topic).mode(
        "append"
    ).save()

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "check", "enable.auto.commit": False})
    got = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        deadline = time.monotonic() + 60
        while len(got) < len(rows) and time.monotonic() < deadline:
            for msg in consumer.consume(500, 1.0):
                assert msg.error() is None, msg.error()
                got.add((msg.key(), msg.value(), msg.partition(), tuple(msg.headers() or [])))
    finally:
        consumer.close()
    assert got == {(k, v, p, tuple(h)) for k, v, p, h in rows}

    with pytest.raises(Exception, match="'absent'"):
        df.write.format("diskless").option("bootstrap.servers", cluster.bootstrap).option("topic", "absent").mode(
            "append"
        ).save()

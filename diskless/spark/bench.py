"""Benchmark of the ``diskless`` Spark data source against a Kafka consumer on the same topic.

``python -m diskless.spark.bench`` starts etcd, the embedded S3 server and three brokers in three
AZs (or uses a running ``diskless dev`` cluster with ``--dev-dir``), fills a diskless topic with
``--records`` records of ``--value-size`` bytes, then reads the whole topic

* with confluent-kafka (librdkafka), assigned every partition from the beginning, and
* with ``spark.read.format("diskless")`` (a local Spark session, ``--master``), summing value
  lengths so every record is decoded and reaches Spark,

and reports for each the wall time, MB/s (key + value bytes) and records/s. The Spark figure
includes planning (Metadata, ListOffsets) and task start-up; ``--runs`` repeats the Spark read
and the best run is reported beside the first (a warm JVM and warm Python workers).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


class _Cluster:
    """etcd, S3 and brokers in AZs on loopback networks, as the integration tests start them."""

    def __init__(self, root: Path, brokers: int, azs: int) -> None:
        from diskless.local.servers import BrokerServer, EtcdServer, S3Server

        self.etcd = EtcdServer(root / "etcd")
        self.s3 = S3Server(root / "s3")
        self.brokers = [
            BrokerServer(i, root / f"broker-{i}", f"127.0.{i % azs + 1}.{i // azs + 1}", f"az-{i % azs + 1}", None, {})
            for i in range(brokers)
        ]

    def start(self) -> _Cluster:
        self.etcd.start()
        self.s3.start()
        for broker in self.brokers:
            broker.etcd = self.etcd.endpoint
            broker.overrides["diskless.s3.endpoint"] = self.s3.endpoint
            broker.start()
        return self

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        self.etcd.stop()
        self.s3.stop()

    def options(self) -> dict[str, str]:
        return {
            "bootstrap.servers": ",".join(b.bootstrap for b in self.brokers),
            "diskless.s3.endpoint": self.s3.endpoint,
            "metadata.etcd.endpoints": self.etcd.endpoint,
        }


def fill(bootstrap: str, topic: str, partitions: int, records: int, value_size: int) -> int:
    """Create the diskless topic and produce ``records``; returns key + value bytes produced."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 3, config={"diskless.enabled": "true"})])[topic].result(60)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4"}
    )
    payload = os.urandom(value_size // 2).hex().encode()[:value_size]
    total = 0
    failed: list[str] = []
    for i in range(records):
        key = f"key-{i}".encode()
        value = payload[: value_size - 8] + f"{i:08d}".encode()
        total += len(key) + len(value)
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=lambda err, _m: err and failed.append(str(err)))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) or failed:
        raise RuntimeError(f"producing failed: {failed[:3]}")
    return total


def consume_all(bootstrap: str, topic: str, partitions: int, records: int) -> dict[str, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    size = 0
    started = time.monotonic()
    deadline = started + 600
    try:
        while seen < records and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is None:
                    seen += 1
                    size += len(msg.key() or b"") + len(msg.value() or b"")
    finally:
        consumer.close()
    elapsed = time.monotonic() - started
    return _figures(seen, size, elapsed)


def spark_read(spark: Any, options: dict[str, str], topic: str) -> dict[str, float]:
    reader = spark.read.format("diskless").option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    started = time.monotonic()
    row = reader.load().selectExpr("count(*) AS n", "sum(length(key) + length(value)) AS bytes").collect()[0]
    elapsed = time.monotonic() - started
    return _figures(int(row["n"]), int(row["bytes"] or 0), elapsed)


def _figures(records: int, size: int, elapsed: float) -> dict[str, float]:
    return {
        "records": records,
        "bytes": size,
        "seconds": round(elapsed, 3),
        "mb_per_s": round(size / elapsed / 1e6, 2),
        "records_per_s": round(records / elapsed),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--value-size", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2, help="Spark reads of the topic (best and first reported)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dev-dir", help="use this running `diskless dev` cluster instead of starting one")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)

    from diskless.spark import diskless_session

    cluster = None
    workdir = None
    if args.dev_dir:
        options = {"dev.dir": args.dev_dir}
        described = json.loads((Path(args.dev_dir) / "cluster.json").read_text())
        bootstrap = ",".join(b["address"] for b in described["brokers"].values())
    else:
        workdir = tempfile.TemporaryDirectory(prefix="diskless-spark-bench-")
        cluster = _Cluster(Path(workdir.name), 3, 3).start()
        options = cluster.options()
        bootstrap = options["bootstrap.servers"]
    topic = f"spark-bench-{int(time.time())}"
    try:
        produced = fill(bootstrap, topic, args.partitions, args.records, args.value_size)
        print(f"produced {args.records} records ({produced / 1e6:.1f} MB) to diskless topic {topic}", flush=True)
        kafka = consume_all(bootstrap, topic, args.partitions, args.records)
        print(f"kafka consumer (confluent-kafka): {kafka}", flush=True)
        spark = diskless_session(args.master)
        runs = []
        for _ in range(max(1, args.runs)):
            runs.append(spark_read(spark, options, topic))
            print(f"spark diskless source: {runs[-1]}", flush=True)
        spark.stop()
        best = max(runs, key=lambda r: r["records_per_s"])
        for run in runs:
            if run["records"] != args.records:
                raise RuntimeError(f"the Spark read saw {run['records']} records, {args.records} were produced")
        report = {
            "records": args.records,
            "value_size": args.value_size,
            "partitions": args.partitions,
            "master": args.master,
            "load_average": os.getloadavg(),
            "kafka_consumer": kafka,
            "spark_first": runs[0],
            "spark_best": best,
        }
        print(json.dumps(report, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    finally:
        if cluster is not None:
            cluster.stop()
        if workdir is not None:
            workdir.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tiering at full size (issue 12): job throughput, pointer bytes, and GETs per MB of a lagging consumer.

Usage: python bench/tier.py [--records 1000000] [--partitions 24] [--value-bytes 100] [--keep]
Starts etcd, the S3 server and three brokers in three AZs (``diskless.local.servers``; broker WAL
caches kept small so that a consumer reading old data goes to S3), creates a diskless topic
(replication factor 3), produces ``--records`` records over ``--partitions`` partitions with
confluent-kafka (several WAL flushes per second), then:
1. a lagging consumer reads the whole topic from the beginning: brokers' object-store GETs per MB;
2. the tier job runs once on a local Spark session: seconds and MB/s of segment bytes tiered;
3. pointer segment bytes on every broker, before and after;
4. a lagging consumer reads everything again, now from segment objects: GETs per MB.
Prints one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from diskless.bench.collect import metric_sum
from diskless.local.servers import BrokerServer, EtcdServer, S3Server
from diskless.spark.session import build_session
from diskless.spark.tier_job import run_once, settings_from_args


def pointer_bytes(brokers: list[BrokerServer], topic: str) -> dict[int, int]:
    return {
        b.node_id: sum(p.stat().st_size for p in Path(b.data_dir).rglob("*.plog") if p.parent.name.startswith(topic))
        for b in brokers
    }


def gets(brokers: list[BrokerServer]) -> float:
    return sum(metric_sum(b.metrics(), "diskless_object_store_requests_total", operation="get") for b in brokers)


def lagging_read(bootstrap: str, topic: str, partitions: int, records: int) -> tuple[int, int, float]:
    """(records, bytes of keys and values, seconds) read from offset 0 of every partition."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"lagging-{time.time()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    count = size = 0
    started = time.monotonic()
    idle_since = time.monotonic()
    while count < records and time.monotonic() - idle_since < 30:
        messages = consumer.consume(10_000, 1.0)
        if messages:
            idle_since = time.monotonic()
        for m in messages:
            if m.error() is None:
                count += 1
                size += len(m.value() or b"") + len(m.key() or b"")
    consumer.close()
    return count, size, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=24)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tier-bench-"))
    etcd, s3 = EtcdServer(root / "etcd"), S3Server(root / "s3")
    overrides = {
        "metrics.port": "0",
        # As before the cache had shares: 4 MiB for WAL objects, 4 MiB for segment blocks.
        "diskless.cache.max.bytes": str(8 * 1024 * 1024),
        "diskless.cache.lagging.max.bytes": str(4 * 1024 * 1024),
        "broker.session.timeout.ms": "9000",
    }
    brokers = [
        BrokerServer(i, root / f"broker-{i}", f"127.0.{i + 1}.1", f"az-{i + 1}", None, dict(overrides))
        for i in range(3)
    ]
    result: dict[str, object] = {
        "records": args.records,
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
    }
    try:
        etcd.start()
        s3.start()
        for b in brokers:
            b.etcd = etcd.endpoint
            b.overrides["diskless.s3.endpoint"] = s3.endpoint
            b.start()
        bootstrap = ",".join(b.bootstrap for b in brokers)
        topic = "tiered"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        configs = {"diskless.enabled": "true", "segment.bytes": str(4 * 1024 * 1024)}
        admin.create_topics([NewTopic(topic, args.partitions, 3, config=configs)])[topic].result(60)

        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
        value = b"v" * args.value_bytes
        started = time.monotonic()
        for i in range(args.records):
            while True:
                try:
                    producer.produce(topic, value, f"k{i}".encode(), partition=i % args.partitions)
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 10_000 == 0:
                producer.poll(0)
            if i % 100_000 == 0:
                print(f"produced {i} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        assert producer.flush(300) == 0, "records not delivered"
        result["produce_s"] = round(time.monotonic() - started, 1)

        before = gets(brokers)
        count, size, seconds = lagging_read(bootstrap, topic, args.partitions, args.records)
        result["before"] = {
            "read_records": count,
            "read_mb": round(size / 1e6, 2),
            "read_s": round(seconds, 1),
            "gets": gets(brokers) - before,
            "gets_per_mb": round((gets(brokers) - before) / (size / 1e6), 2),
        }
        pointers_before = pointer_bytes(brokers, topic)

        spark = build_session("local[*]", "diskless-tier-bench")
        settings = settings_from_args(
            bootstrap, None, {"diskless.s3.endpoint": s3.endpoint, "metadata.etcd.endpoints": etcd.endpoint}, None
        )
        report = run_once(spark, settings)
        result["tier"] = {
            "segments": report.committed,
            "refused": report.refused,
            "mb": round(report.bytes / 1e6, 2),
            "seconds": round(report.seconds, 1),
            "mb_per_s": round(report.mb_per_s, 2),
        }
        spark.stop()
        time.sleep(2)  # followers learn the high watermark past the tier entries
        pointers_after = pointer_bytes(brokers, topic)
        result["pointer_bytes"] = {
            str(b): {"before": pointers_before[b], "after": pointers_after[b]} for b in pointers_before
        }
        result["pointer_drop_pct"] = round(
            100 * (1 - sum(pointers_after.values()) / max(1, sum(pointers_before.values()))), 1
        )

        before = gets(brokers)
        count, size, seconds = lagging_read(bootstrap, topic, args.partitions, args.records)
        result["after"] = {
            "read_records": count,
            "read_mb": round(size / 1e6, 2),
            "read_s": round(seconds, 1),
            "gets": gets(brokers) - before,
            "gets_per_mb": round((gets(brokers) - before) / (size / 1e6), 2),
        }
        print(json.dumps(result, indent=2))
    finally:
        for b in brokers:
            b.kill()
        s3.kill()
        etcd.kill()
        if args.keep:
            print(f"work directory: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

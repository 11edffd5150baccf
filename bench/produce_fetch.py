"""Produce and fetch throughput of one broker process, driven by confluent-kafka (librdkafka).

Usage: python bench/produce_fetch.py [--records N] [--size BYTES] [--codec none|lz4|zstd|...]
Prints records/s and MB/s for produce (acks=all) and for a consumer reading from the start,
plus the broker's resident memory afterwards. Starts and stops its own broker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from standalone_broker import standalone_broker


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()

    with standalone_broker() as (bootstrap, broker_pid):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("bench", args.partitions, 1)])["bench"].result(30)

        payload = os.urandom(args.size)
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "batch.size": 262144,
                "compression.type": args.codec,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        start = time.monotonic()
        for i in range(args.records):
            while True:
                try:
                    producer.produce("bench", value=payload, key=str(i).encode(), partition=i % args.partitions)
                    break
                except BufferError:
                    producer.poll(0.01)
        remaining = producer.flush(120)
        produce_s = time.monotonic() - start
        if remaining:
            raise RuntimeError(f"{remaining} records not acknowledged")

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "bench",
                "enable.auto.commit": False,
                "fetch.max.bytes": 52428800,
            }
        )
        consumer.assign([TopicPartition("bench", p, 0) for p in range(args.partitions)])
        seen = 0
        start = time.monotonic()
        deadline = start + 120
        while seen < args.records and time.monotonic() < deadline:
            for message in consumer.consume(10000, 1.0):
                if message.error() is None:
                    seen += 1
        fetch_s = time.monotonic() - start
        consumer.close()
        del producer, admin
        mb = args.records * args.size / 1e6
        print(f"records={args.records} size={args.size}B codec={args.codec} partitions={args.partitions}")
        print(f"produce acks=all: {args.records / produce_s:,.0f} records/s  {mb / produce_s:.1f} MB/s")
        print(f"fetch:            {seen / fetch_s:,.0f} records/s  {mb / fetch_s:.1f} MB/s  (read {seen})")
        print(f"broker RSS after: {rss_mb(broker_pid):.0f} MB")
        return 0 if seen == args.records else 1


if __name__ == "__main__":
    sys.exit(main())

"""CPU a broker spends per request: small produce requests and tail-consumer fetches at a fixed rate.

Usage: python bench/request_cost.py [--rate N] [--seconds S] [--partitions P] [--profile OUT.prof]

At low rates a broker's CPU goes to requests, not bytes (diskless bench: ~1,100 CPU s/GB at
0.9 MB/s against ~25 at its maximum), so this is the figure that decides latency tails on a busy
machine. One standalone broker, a classic topic, a confluent-kafka producer sending every record
on its own (linger.ms 0, so one ProduceRequest per record) and a consumer at the tail; the
broker's CPU over the steady window divided by the requests librdkafka counted. ``--profile``
runs the broker under cProfile and writes its stats on shutdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from standalone_broker import standalone_broker

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class RequestCounts:
    """Requests librdkafka sent, by API, from its statistics callback."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_api: dict[str, int] = {}

    def on_stats(self, raw: str) -> None:
        counts: dict[str, int] = {}
        for broker in json.loads(raw).get("brokers", {}).values():
            for api, n in broker.get("req", {}).items():
                counts[api] = counts.get(api, 0) + int(n)
        with self.lock:
            self.by_api = counts

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.by_api)


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=600, help="records/s, each in its own ProduceRequest")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--profile", default=None, help="cProfile the broker into this file")
    args = parser.parse_args()

    stop = threading.Event()
    with standalone_broker(args.profile) as (bootstrap, broker_pid):
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic("cost", args.partitions, 1)])["cost"].result(30)
            producer_counts, consumer_counts = RequestCounts(), RequestCounts()
            common = {"bootstrap.servers": bootstrap, "statistics.interval.ms": 500}
            producer = Producer({**common, "acks": "all", "linger.ms": 0, "stats_cb": producer_counts.on_stats})
            consumer = Consumer(
                {**common, "group.id": "cost", "enable.auto.commit": False, "stats_cb": consumer_counts.on_stats}
            )
            consumer.assign([TopicPartition("cost", p, 0) for p in range(args.partitions)])
            payload = os.urandom(args.size)
            consumed = 0

            def produce() -> None:
                interval, sent = 1.0 / args.rate, 0
                start = time.monotonic()
                while not stop.is_set():
                    due = start + sent * interval
                    while (delay := due - time.monotonic()) > 0:
                        producer.poll(delay)
                    producer.produce("cost", value=payload, partition=sent % args.partitions)
                    sent += 1
                producer.flush(10)

            def consume() -> None:
                nonlocal consumed
                while not stop.is_set():
                    consumed += sum(1 for m in consumer.consume(1000, 0.2) if m.error() is None)

            threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
            for thread in threads:
                thread.start()
            time.sleep(3)  # warm-up: connections, metadata, the consumer reaching the tail (not a sync)
            counts0 = {**producer_counts.snapshot(), **{"Fetch": consumer_counts.snapshot().get("Fetch", 0)}}
            cpu0, t0 = cpu_seconds(broker_pid), time.monotonic()
            time.sleep(args.seconds)
            cpu1, t1 = cpu_seconds(broker_pid), time.monotonic()
            counts1 = {**producer_counts.snapshot(), **{"Fetch": consumer_counts.snapshot().get("Fetch", 0)}}
            stop.set()
            for thread in threads:
                thread.join(30)
            consumer.close()
            window = t1 - t0
            produce_rps = (counts1.get("Produce", 0) - counts0.get("Produce", 0)) / window
            fetch_rps = (counts1.get("Fetch", 0) - counts0.get("Fetch", 0)) / window
            cpu = (cpu1 - cpu0) / window
            shape = f"{args.partitions} partitions, {args.size} B records"
            print(f"rate {args.rate} records/s, {shape}, {window:.1f} s window")
            print(f"requests/s: Produce {produce_rps:.0f}, Fetch {fetch_rps:.0f}; consumed {consumed}")
            print(f"broker CPU: {cpu * 100:.1f}% of a core, {cpu * 1e6 / (produce_rps + fetch_rps):.0f} us per request")
            return 0
        finally:
            stop.set()


if __name__ == "__main__":
    sys.exit(main())

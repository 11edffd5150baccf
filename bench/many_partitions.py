"""Many partitions on a 3-broker cluster: how long creation takes and whether every partition
takes writes right after.

Usage: python bench/many_partitions.py [--partitions 10000] [--topics 1] [--rf 3] [--keep] [--profile]
Starts etcd and three brokers in three AZs (``diskless.local.servers``), creates ``--topics``
topics holding ``--partitions`` partitions in total through confluent-kafka's AdminClient, then
produces one record to every partition (acks=all) and reads a sample back. Prints seconds for
each step and the brokers' resident memory. ``--keep`` keeps the work directory (broker logs);
``--profile`` samples broker 0 with py-spy (the ``dev`` extra; ``--nonblocking``, so the broker
is never paused, which under load made it miss its lease) during creation and the first writes,
and prints the functions where it spent most time.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from diskless.local.servers import BrokerServer, EtcdServer


def rss_mb(pid: int | None) -> float:
    if pid is None:
        return -1.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def last_role_change(log_path: Path, topics: set[str]) -> float:
    """When a broker last logged a replica of ``topics`` taking its first role (epoch 0): the
    "partition roles" summary line of each batch of metadata changes."""
    last = 0.0
    for line in log_path.read_text(errors="replace").splitlines():
        if '"partition roles"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if topics.intersection(event.get("first_role_topics", ())):
            stamp = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
            last = max(last, stamp.timestamp())
    return last


def print_profile(path: Path, top: int = 25) -> None:
    """Functions by samples in which they were on the stack (inclusive) and on top (self)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    print(f"py-spy samples: {total}")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"-- top {title}")
        for frame, count in counter.most_common(top):
            print(f"{100 * count / total:5.1f}%  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--topics", type=int, default=1)
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--profile", action="store_true", help="sample broker 0 with py-spy")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="diskless-many-partitions-"))
    etcd = EtcdServer(workdir / "etcd")
    brokers = [BrokerServer(i, workdir / f"broker-{i}", f"127.0.{i + 1}.1", f"az-{i + 1}", None, {}) for i in range(3)]
    try:
        etcd.start()
        for broker in brokers:
            broker.etcd = etcd.endpoint
            broker.spawn()
        for broker in brokers:
            broker.wait_ready(120)
        bootstrap = ",".join(b.bootstrap for b in brokers)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        per_topic = [
            args.partitions // args.topics + (1 if t < args.partitions % args.topics else 0) for t in range(args.topics)
        ]
        names = [f"wide-{t}" for t in range(args.topics)]

        spy = None
        if args.profile:
            py_spy = str(Path(sys.executable).parent / "py-spy")
            cmd = [py_spy, "record", "--pid", str(brokers[0].pid), "--format", "raw", "--rate", "200", "--nonblocking"]
            spy = subprocess.Popen([*cmd, "--output", str(workdir / "broker-0.profile")], stdout=subprocess.DEVNULL)
            time.sleep(1)  # let py-spy attach before the measured steps
        start = time.monotonic()
        started_wall = time.time()
        futures = admin.create_topics(
            [NewTopic(name, count, args.rf) for name, count in zip(names, per_topic, strict=True)],
            request_timeout=600,
        )
        for future in futures.values():
            future.result(600)
        created = time.monotonic() - start
        print(f"create {args.partitions} partitions in {args.topics} topic(s), RF {args.rf}: {created:.2f} s")

        start = time.monotonic()
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
        errors: list[str] = []
        for name, count in zip(names, per_topic, strict=True):
            for p in range(count):
                producer.produce(
                    name,
                    value=f"v-{p}".encode(),
                    partition=p,
                    on_delivery=lambda err, msg: errors.append(str(err)) if err else None,
                )
                producer.poll(0)
        left = producer.flush(600)
        produced = time.monotonic() - start
        print(f"first record to every partition (acks=all): {produced:.2f} s, undelivered {left}, errors {len(errors)}")

        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
            print_profile(workdir / "broker-0.profile")

        applied = [last_role_change(b.log_path, set(names)) for b in brokers]
        print("replicas applied (last role change after creation), s:", [round(t - started_wall, 2) for t in applied])

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
        sample = [TopicPartition(names[-1], p, 0) for p in range(0, per_topic[-1], max(1, per_topic[-1] // 50))]
        consumer.assign(sample)
        start = time.monotonic()
        seen: set[int] = set()
        while len(seen) < len(sample) and time.monotonic() - start < 120:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    seen.add(message.partition())
        consumer.close()
        print(f"read back {len(seen)}/{len(sample)} sampled partitions: {time.monotonic() - start:.2f} s")
        print("broker RSS MB:", [round(rss_mb(b.pid)) for b in brokers])
        return 0 if left == 0 and not errors and len(seen) == len(sample) else 1
    finally:
        for broker in brokers:
            broker.stop()
        etcd.stop()
        if args.keep:
            print("work directory:", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""Scale-out benchmark (issue 15): reassign every partition of a topic holding N MB onto a newly
added fourth broker while a producer and a consumer keep running, for a diskless and a classic
topic, and check that nothing acknowledged is lost and nothing is duplicated.

    python -m diskless.bench.reassign --mb 1024            # the issue's figure (1 GB per topic)
    python -m diskless.bench.reassign --mb 8 --json r.json  # what the test suite runs

Per topic kind: a 3-broker, 3-AZ cluster (etcd, embedded S3), a topic of ``--partitions``
partitions with 2 replicas, filled with ``--mb`` MB of numbered records; then a producer
(idempotent, acks=all) and a consumer start, broker 3 joins in az-1, and every partition's
preferred replica is replaced by broker 3 (so every partition gets a new replica and its
leadership moves). Measured: from AlterPartitionReassignments to no reassignment in progress,
and the bytes the new broker had to copy (DescribeLogDirs: a diskless partition's pointer log,
a classic partition's records). Finally the whole topic is read back: every acknowledged record
exactly once.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from diskless.local.servers import BrokerServer, EtcdServer, S3Server

RECORD = struct.Struct(">q")  # a record's value starts with its sequence number


@dataclass
class KindResult:
    kind: str
    filled_mb: float
    partitions: int
    reassign_seconds: float
    copied_bytes: int
    produced_during: int
    acked_total: int
    read_back: int
    lost: int
    duplicated: int
    consumer_read_during: int
    producer_errors: list[str]


def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


class Cluster:
    def __init__(self, root: Path, overrides: dict[str, str]) -> None:
        self.root = root
        self.etcd = EtcdServer(root / "etcd")
        self.s3 = S3Server(root / "s3")
        self.overrides = overrides
        self.brokers: list[BrokerServer] = []

    def start(self, brokers: int) -> None:
        self.etcd.start()
        self.s3.start()
        for _ in range(brokers):
            self.add_broker()

    def add_broker(self) -> BrokerServer:
        node_id = len(self.brokers)
        az = node_id % 3
        broker = BrokerServer(
            node_id,
            self.root / f"broker-{node_id}",
            f"127.0.{az + 1}.{node_id // 3 + 1}",
            f"az-{az + 1}",
            self.etcd.endpoint,
            {"diskless.s3.endpoint": self.s3.endpoint, **self.overrides},
        )
        self.brokers.append(broker)
        broker.start(timeout=120)  # a loaded machine (CI, other clusters) starts processes slowly
        return broker

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.alive())

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        self.etcd.stop()
        self.s3.stop()


def _value(seq: int, size: int) -> bytes:
    return RECORD.pack(seq) + b"x" * (size - RECORD.size)


def run_kind(
    root: Path, diskless: bool, mb: float, partitions: int, record_size: int, rate_mbps: float, out: Any
) -> KindResult:
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka import TopicPartition as TP
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    from kafka.admin import NewTopic

    kind = "diskless" if diskless else "classic"
    cluster = Cluster(root / kind, {"broker.session.timeout.ms": "6000"})
    cluster.start(3)
    try:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=120000)
        topic = f"bench-{kind}"
        configs = {"diskless.enabled": "true" if diskless else "false"}
        admin.create_topics([NewTopic(topic, partitions, 2, topic_configs=configs)])
        acked: set[int] = set()
        lock = threading.Lock()

        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                with lock:
                    acked.add(RECORD.unpack_from(msg.value())[0])

        producer_conf = {
            "bootstrap.servers": cluster.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 512 * 1024,
            "queue.buffering.max.kbytes": 256 * 1024,
        }
        fill = Producer(producer_conf)
        count = int(mb * 1024 * 1024 / record_size)
        started = time.monotonic()
        for seq in range(count):
            while True:
                try:
                    fill.produce(topic, _value(seq, record_size), key=str(seq).encode(), on_delivery=on_delivery)
                    break
                except BufferError:
                    fill.poll(0.05)
            fill.poll(0)
        fill.flush(600)
        print(
            f"{kind}: filled {mb:.0f} MB ({count} records) in {time.monotonic() - started:.1f} s", file=out, flush=True
        )

        # Load during the move: a producer and a consumer at the log end.
        stop = threading.Event()
        next_seq = [count]
        read_during = [0]

        producer_errors: list[str] = []

        def keep_producing() -> None:
            producer = Producer(producer_conf)
            interval = record_size / (rate_mbps * 1024 * 1024)
            due = time.monotonic()
            try:
                while not stop.is_set():
                    producer.produce(topic, _value(next_seq[0], record_size), on_delivery=on_delivery)
                    next_seq[0] += 1
                    due += interval
                    producer.poll(max(0.0, due - time.monotonic()))  # paces the load at rate_mbps
                producer.flush(120)
            except KafkaException as exc:  # e.g. a fatal idempotence error: reported, not hidden
                producer_errors.append(str(exc))

        consumer = Consumer(
            {"bootstrap.servers": cluster.bootstrap, "group.id": f"bench-{kind}", "enable.auto.commit": False}
        )
        consumer.assign([TP(topic, p, -1) for p in range(partitions)])  # -1: the log end

        def keep_consuming() -> None:
            while not stop.is_set():
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    read_during[0] += 1

        threads = [threading.Thread(target=keep_producing), threading.Thread(target=keep_consuming)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # load running before the new broker arrives (not a synchronisation)
        cluster.add_broker()
        _wait(lambda: len(admin.describe_cluster()["brokers"]) == 4, 60, "broker 3 registered")
        described = admin.describe_topic_partitions([topic])["topics"][0]["partitions"]
        targets = {KTP(topic, p["partition_index"]): [3, *p["replica_nodes"][1:]] for p in described}
        started = time.monotonic()
        answer = admin.alter_partition_reassignments(targets)
        if any(error is not None for error in answer.values()):
            raise RuntimeError(f"reassignment refused: {answer}")
        _wait(lambda: not admin.list_partition_reassignments(), 3600, "reassignment done")
        seconds = time.monotonic() - started
        print(f"{kind}: reassigned {partitions} partitions onto broker 3 in {seconds:.2f} s", file=out, flush=True)
        time.sleep(1.0)  # producing on after the move
        stop.set()
        for t in threads:
            t.join(180)
        consumer.close()
        admin.close()
        # A new client: kafka-python's cached cluster metadata predates broker 3.
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=120000)
        copied = 0
        for broker in admin.describe_log_dirs(brokers=[3]):
            for log_dir in broker["log_dirs"]:
                if log_dir["log_dir"].startswith("s3://"):
                    continue
                copied += sum(p["partition_size"] for t in log_dir["topics"] for p in t["partitions"])
        admin.close()

        # Read everything back.
        reader = Consumer(
            {"bootstrap.servers": cluster.bootstrap, "group.id": f"check-{kind}", "enable.auto.commit": False}
        )
        reader.assign([TP(topic, p, 0) for p in range(partitions)])
        seen: dict[int, int] = {}
        with lock:
            wanted = set(acked)
        deadline = time.monotonic() + 600
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = reader.consume(10000, 0.5)
            for msg in batch:
                if msg.error() is None:
                    seq = RECORD.unpack_from(msg.value())[0]
                    seen[seq] = seen.get(seq, 0) + 1
            if batch:
                idle_since = time.monotonic()
            elif wanted <= seen.keys() and time.monotonic() - idle_since > 2:
                break
        reader.close()
        return KindResult(
            kind=kind,
            filled_mb=mb,
            partitions=partitions,
            reassign_seconds=round(seconds, 3),
            copied_bytes=copied,
            produced_during=next_seq[0] - count,
            acked_total=len(wanted),
            read_back=len(seen),
            lost=len(wanted - seen.keys()),
            duplicated=sum(1 for n in seen.values() if n > 1),
            consumer_read_during=read_during[0],
            producer_errors=producer_errors,
        )
    finally:
        cluster.stop()


def run(
    mb: float,
    partitions: int,
    record_size: int,
    kinds: list[str],
    root: Path | None,
    out: Any,
    rate_mbps: float = 2.0,
) -> list[KindResult]:
    workdir = root or Path(tempfile.mkdtemp(prefix="diskless-reassign-bench-"))
    try:
        return [run_kind(workdir, kind == "diskless", mb, partitions, record_size, rate_mbps, out) for kind in kinds]
    finally:
        if root is None:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diskless.bench.reassign", description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=1024, help="data in the topic before the move (default 1024)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--record-size", type=int, default=16384)
    parser.add_argument("--kinds", default="diskless,classic")
    parser.add_argument("--rate-mbps", type=float, default=2.0, help="the producer's rate during the move")
    parser.add_argument("--data-dir", help="keep clusters and logs here (default: a temporary directory)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = run(
        args.mb,
        args.partitions,
        args.record_size,
        args.kinds.split(","),
        Path(args.data_dir) if args.data_dir else None,
        sys.stdout,
        args.rate_mbps,
    )
    print("| topic | data | partitions | reassignment | bytes copied to the new broker | lost | duplicated |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.kind} | {r.filled_mb:.0f} MB | {r.partitions} | {r.reassign_seconds:.2f} s |"
            f" {r.copied_bytes / 1e6:.2f} MB | {r.lost} | {r.duplicated} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    for r in results:
        for error in r.producer_errors:
            print(f"{r.kind}: producer failed: {error}")
    return 0 if all(r.lost == 0 and r.duplicated == 0 and not r.producer_errors for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

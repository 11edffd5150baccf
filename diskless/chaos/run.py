"""``diskless chaos``: prove that acknowledged records survive sustained faults, and say how long
the cluster takes to heal.

A local cluster (the embedded S3 server behind the fault-injecting proxy, etcd, N brokers in
AZs, an active and a standby WAL manager with short timings so orphans really are collected)
serves idempotent acks=all producers and read_committed consumers on a classic and a diskless
topic (replication factor 3, min.insync.replicas 2) while a seeded schedule, one fault at a time:

- SIGKILLs a broker and restarts it a moment later;
- SIGSTOPs a partition leader for longer than the broker session timeout, then resumes it
  (a zombie leader coming back after the controller moved its partitions);
- SIGSTOPs the S3 server (every request hangs), then resumes it;
- opens a window of S3 faults through the proxy (500, 503, 500 after the write happened,
  connection resets, slow answers);
- SIGKILLs and restarts etcd;
- SIGKILLs the active WAL manager (the standby takes over) and restarts it.

Then the faults stop, every partition must get its full ISR back (timed), the producers flush,
and the consumers read to the end. Checked and printed: records acknowledged and read; lost
(acknowledged, never read), duplicated (read more than once), offset gaps (missing offsets in a
partition that has no transactions), acknowledged offsets that hold another record, and WAL
objects that some replica's pointer log references but that no longer exist in the bucket
(deleted while referenced), beside how many the WAL manager deleted. The schedule, victims,
payloads and the proxy's decisions all follow from ``--seed``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from diskless.chaos.s3proxy import FaultRates, S3FaultProxy
from diskless.local.servers import BrokerServer, EtcdServer, S3Server, WalManagerServer

BUCKET = "diskless"
SESSION_TIMEOUT_MS = 3000
WAL_TIMINGS = {
    "diskless.wal.commit.timeout.ms": "2000",
    "wal.manager.clock.skew.ms": "1000",
    "wal.manager.grace.ms": "5000",
    "wal.manager.confirm.ms": "500",
    "wal.manager.check.interval.ms": "300",
    "wal.manager.scan.interval.ms": "1000",
}
S3_FAULTS = FaultRates(error_500=0.05, error_503=0.05, ambiguous=0.03, reset=0.03, slow=0.1, slow_s=0.8)
FAULT_KINDS = ("broker_kill", "zombie_leader", "s3_pause", "s3_faults", "etcd_restart", "wal_manager_kill")


@dataclass
class Options:
    seed: int = 1
    duration_s: float = 45.0  # of the fault phase
    brokers: int = 3
    azs: int = 3
    partitions: int = 3
    rate: int = 100  # records per second per topic
    data_dir: str | None = None  # kept after the run when given
    json_path: str | None = None
    quiet: bool = False
    quick: bool = False  # every kind of fault once, short pauses between them (make test)


@dataclass
class Result:
    seed: int
    faults: dict[str, int] = field(default_factory=dict)
    s3_requests_faulted: dict[str, int] = field(default_factory=dict)
    acknowledged: int = 0
    not_acknowledged: int = 0
    read: int = 0
    lost: int = 0
    duplicated: int = 0
    offset_gaps: int = 0
    offset_mismatches: int = 0
    deleted_while_referenced: int = 0
    wal_objects_deleted: int = 0
    referenced_wal_objects: int = 0
    seconds_to_full_isr: float = -1.0
    # Partition changes the brokers found by their once-a-second comparison instead of a watch
    # (diskless_unwatched_changes_total, replication/partition.py): a bug if not 0.
    unwatched_changes: int = 0
    producer_fatal_errors: int = 0
    fault_seconds: float = 0.0
    total_seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.offset_gaps == 0
            and self.offset_mismatches == 0
            and self.deleted_while_referenced == 0
            and self.seconds_to_full_isr >= 0
            and self.unwatched_changes == 0
            and self.acknowledged > 0
        )


def schedule(seed: int, duration_s: float, quick: bool = False) -> list[tuple[str, float]]:
    """The faults in order with the seconds each lasts; every kind at least once, broker kills most.

    Sequences of shuffled rounds (each round: every kind once and two more broker kills) are
    cut when the expected time is used up, but the first round is always whole. ``quick``: one
    round of every kind once."""
    rng = random.Random(seed)
    if quick:
        kinds = list(FAULT_KINDS)
        rng.shuffle(kinds)
        quick_lasts = {"zombie_leader": SESSION_TIMEOUT_MS / 1000 + 1.5, "s3_faults": 4.0, "s3_pause": 2.0}
        return [(kind, quick_lasts.get(kind, 1.0)) for kind in kinds]
    lasts = {
        "broker_kill": lambda: rng.uniform(1.0, 4.0),
        "zombie_leader": lambda: SESSION_TIMEOUT_MS / 1000 + rng.uniform(1.5, 3.0),
        "s3_pause": lambda: rng.uniform(2.0, 4.0),
        "s3_faults": lambda: rng.uniform(5.0, 8.0),
        "etcd_restart": lambda: rng.uniform(0.5, 2.0),
        "wal_manager_kill": lambda: rng.uniform(0.5, 2.0),
    }
    out: list[tuple[str, float]] = []
    spent = 0.0
    first = True
    while first or spent < duration_s:
        round_kinds = [*FAULT_KINDS, "broker_kill", "broker_kill"]
        rng.shuffle(round_kinds)
        for kind in round_kinds:
            if not first and spent >= duration_s:
                break
            length = lasts[kind]()
            out.append((kind, round(length, 2)))
            spent += length + 3.0  # each fault is followed by recovery time
        first = False
    return out


# --- the cluster -----------------------------------------------------------------------------------


class ChaosCluster:
    """S3 behind the proxy, etcd, brokers (127.0.<az>.x), two WAL managers."""

    def __init__(self, root: Path, options: Options, say: Callable[[str], None]) -> None:
        self.root = root
        self.options = options
        self.say = say
        self.s3 = S3Server(root / "s3")
        self.etcd = EtcdServer(root / "etcd")
        self.proxy: S3FaultProxy | None = None
        self.brokers: list[BrokerServer] = []
        self.managers: list[WalManagerServer] = []

    def start(self) -> None:
        # Detached (own session, SIGTERM if this process dies): a killed run leaves nothing behind.
        self.s3.detached = self.etcd.detached = True
        self.s3.start()
        self.s3.create_bucket(BUCKET)
        self.proxy = S3FaultProxy(self.s3.endpoint, seed=self.options.seed).start()
        self.etcd.start()
        overrides = {
            "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "replica.lag.time.max.ms": "5000",
            "controlled.shutdown.timeout.ms": "3000",
            "default.replication.factor": str(min(3, self.options.brokers)),
            "diskless.s3.endpoint": self.proxy.endpoint,
            "diskless.s3.bucket": BUCKET,
            "diskless.s3.access.key": self.s3.access_key,
            "diskless.s3.secret.key": self.s3.secret_key,
            "metrics.port": "0",
            **WAL_TIMINGS,
        }
        for i in range(self.options.brokers):
            az = i % self.options.azs + 1
            host = f"127.0.{az}.{i // self.options.azs + 1}"
            broker = BrokerServer(i + 1, self.root / f"broker-{i + 1}", host, f"az-{az}", self.etcd.endpoint, overrides)
            broker.detached = True
            self.brokers.append(broker)
            broker.spawn()
        for broker in self.brokers:
            broker.wait_ready(60)
        manager_overrides = {k: v for k, v in overrides.items() if k.startswith(("diskless.", "wal.", "broker.sess"))}
        for i in range(2):
            manager = WalManagerServer(f"wal-manager-{i}", self.root, self.etcd.endpoint, self.proxy.endpoint)
            manager.overrides.update({**manager_overrides, "metrics.port": "0"})
            manager.detached = True
            self.managers.append(manager)
            manager.start()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def stop(self) -> None:
        for process in [*self.managers, *self.brokers]:
            if process.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    process.proc.send_signal(signal.SIGCONT)
            process.kill()
        self.etcd.kill()
        with contextlib.suppress(ProcessLookupError, AttributeError):
            assert self.s3.proc is not None
            self.s3.proc.send_signal(signal.SIGCONT)
        self.s3.kill()
        if self.proxy is not None:
            self.proxy.stop()

    def active_manager(self) -> WalManagerServer | None:
        for manager in self.managers:
            if not manager.alive():
                continue
            ready = (manager.data_dir / f"{manager.name}.ready").read_text().split()
            metrics_port = int(ready[1]) if len(ready) > 1 else -1
            url = f"http://{manager.host}:{metrics_port}/metrics"
            with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=2) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith("diskless_wal_manager_active ") and float(line.split()[1]) == 1.0:
                        return manager
        return None

    def unwatched_changes(self) -> int:
        """``diskless_unwatched_changes_total`` summed over the brokers now running (a broker
        killed and restarted by a fault counts from its restart)."""
        total = 0.0
        for broker in self.brokers:
            with contextlib.suppress(OSError):
                samples = broker.metrics(["diskless_unwatched_changes_total"])
                total += sum(v for k, v in samples.items() if k.startswith("diskless_unwatched_changes_total"))
        return int(total)

    def manager_deletions(self) -> int:
        deleted = 0
        for manager in self.managers:
            for line in manager.tail(50_000_000).splitlines():
                if "deleted unreferenced WAL objects" in line:
                    with contextlib.suppress(ValueError, KeyError):
                        deleted += int(json.loads(line)["count"])
        return deleted


# --- the workload ----------------------------------------------------------------------------------


class Producer:
    """One idempotent acks=all producer per topic; remembers what was acknowledged where."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.acked: dict[int, dict[int, bytes]] = defaultdict(dict)  # partition -> offset -> value
        self.failed: list[str] = []
        self.fatal = 0
        self.sent = 0
        self._stop = threading.Event()
        self._fatal_seen = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"producer-{topic}", daemon=True)

    def _client(self) -> Any:
        from confluent_kafka import Producer as KafkaProducer

        return KafkaProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120000,
                "request.timeout.ms": 10000,
                "topic.metadata.refresh.interval.ms": 2000,
                "log_level": 0,
                "error_cb": self._on_error,
            }
        )

    def _on_error(self, err: Any) -> None:
        if err.fatal():
            self._fatal_seen = True

    def start(self) -> None:
        self._thread.start()

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self._lock:
            if err is None:
                self.acked[msg.partition()][msg.offset()] = msg.value()
            else:
                self.failed.append(f"{msg.value()!r}: {err}")
                if err.fatal():
                    self.fatal += 1

    def _run(self) -> None:
        producer = self._client()
        began = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - began) * self.rate)
            while self.sent < due and not self._stop.is_set():
                value = f"{self.topic}:{self.sent}".encode()
                try:
                    producer.produce(
                        self.topic, value=value, partition=self.sent % self.partitions, on_delivery=self._on_delivery
                    )
                except BufferError:
                    break
                self.sent += 1
            producer.poll(0.01)
            if self._fatal_seen:
                self._fatal_seen = False
                # A fatal idempotence error ends this producer instance (as for any Kafka client):
                # what it had in flight is reported through the callbacks; a new one carries on.
                self.fatal += 1
                producer.flush(10)
                producer = self._client()
        remaining = producer.flush(150)
        if remaining:
            self.failed.append(f"{remaining} records still unacknowledged at the end")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(200)


class Reader:
    """A read_committed consumer of every partition of a topic from the start, running throughout."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.records: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.errors: list[str] = []
        self.until: dict[int, int] | None = None  # set at the end: read up to these offsets, then stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reader-{topic}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"chaos-reader-{self.topic}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 2000,
                "log_level": 0,
            }
        )
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(num_messages=500, timeout=0.2):
                    if msg.error() is not None:
                        if len(self.errors) < 20:
                            self.errors.append(str(msg.error()))
                        continue
                    self.records[msg.partition()].append((msg.offset(), msg.value()))
                if self.until is not None and self.caught_up():
                    return
        finally:
            consumer.close()

    def caught_up(self) -> bool:
        assert self.until is not None
        for partition, end in self.until.items():
            got = self.records.get(partition)
            if end > 0 and (not got or got[-1][0] < end - 1):
                return False
        return True

    def finish(self, ends: dict[int, int], timeout: float) -> bool:
        self.until = ends
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(10)
        return self.caught_up()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "chaos-ends", "isolation.level": "read_committed", "log_level": 0}
    )
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


# --- checks ----------------------------------------------------------------------------------------


def check_topic(producer: Producer, reader: Reader, result: Result) -> None:
    read_values: Counter[bytes] = Counter()
    for partition, rows in reader.records.items():
        offsets = [offset for offset, _ in rows]
        # Offsets a reader saw twice (it re-read after a leader change) are not duplicates in the log.
        by_offset: dict[int, bytes] = {}
        for offset, value in rows:
            previous = by_offset.setdefault(offset, value)
            if previous != value:
                result.offset_mismatches += 1
                _example(result, f"{reader.topic}-{partition}@{offset} read as {previous!r} and {value!r}")
        distinct = sorted(by_offset)
        if distinct:
            expected = distinct[-1] + 1  # no transactions, no retention: offsets 0..last all hold records
            gaps = expected - len(distinct)
            if gaps:
                missing = sorted(set(range(expected)) - set(distinct))[:5]
                _example(result, f"{reader.topic}-{partition}: {gaps} offsets missing, e.g. {missing}")
            result.offset_gaps += gaps
        del offsets
        read_values.update(by_offset.values())
        result.read += len(by_offset)
        for offset, value in producer.acked.get(partition, {}).items():
            if by_offset.get(offset, value) != value:
                result.offset_mismatches += 1
                _example(
                    result, f"{reader.topic}-{partition}@{offset} acknowledged {value!r}, holds {by_offset[offset]!r}"
                )
    for value, count in read_values.items():
        if count > 1:
            result.duplicated += count - 1
            _example(result, f"{value!r} read {count} times")
    acked_values = {v for offsets in producer.acked.values() for v in offsets.values()}
    result.acknowledged += len(acked_values)
    lost = acked_values - set(read_values)
    result.lost += len(lost)
    for value in sorted(lost)[:3]:
        _example(result, f"acknowledged {value!r} never read")
    result.not_acknowledged += producer.sent - len(acked_values)
    result.producer_fatal_errors += producer.fatal


def _example(result: Result, text: str) -> None:
    if len(result.examples) < 12:
        result.examples.append(text)


def referenced_wal_keys(cluster: ChaosCluster) -> set[str]:
    """Every WAL object a pointer log of any broker names (entries that decode; a torn tail ends a file)."""
    from diskless.storage.pointer import CorruptEntry, PointerEntry, decode_entry

    keys: set[str] = set()
    for broker in cluster.brokers:
        for path in broker.data_dir.rglob("*.plog"):
            with contextlib.suppress(OSError):
                data = path.read_bytes()
            pos = 0
            while pos < len(data):
                try:
                    entry, pos = decode_entry(data, pos)
                except (CorruptEntry, ValueError, IndexError):
                    break
                if isinstance(entry, PointerEntry):
                    keys.add(entry.key)
    return keys


def bucket_keys(s3: S3Server) -> set[str]:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        keys.update(o["Key"] for o in page.get("Contents", []))
    return keys


def full_isr(bootstrap: str, topics: list[str]) -> bool:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=5)
    for topic in topics:
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            return False
        for partition in info.partitions.values():
            if partition.leader < 0 or sorted(partition.isrs) != sorted(partition.replicas):
                return False
    return True


# --- faults ----------------------------------------------------------------------------------------


class Faults:
    def __init__(
        self, cluster: ChaosCluster, rng: random.Random, topics: list[str], partitions: int, say: Callable[[str], None]
    ) -> None:
        self.cluster = cluster
        self.partitions = partitions
        self.rng = rng
        self.topics = topics
        self.say = say
        self.count: Counter[str] = Counter()

    def run(self, kind: str, length: float) -> None:
        getattr(self, kind)(length)
        self.count[kind] += 1

    def broker_kill(self, length: float) -> None:
        broker = self.rng.choice(self.cluster.brokers)
        self.say(f"  SIGKILL broker {broker.node_id}, restart after {length:.1f}s")
        broker.kill()
        time.sleep(length)
        _restart_broker(broker)

    def zombie_leader(self, length: float) -> None:
        from confluent_kafka.admin import AdminClient

        topic = self.rng.choice(self.topics)
        partition = self.rng.randrange(self.partitions)
        metadata = AdminClient({"bootstrap.servers": self.cluster.bootstrap, "log_level": 0}).list_topics(timeout=10)
        leader = metadata.topics[topic].partitions[partition].leader
        broker = next((b for b in self.cluster.brokers if b.node_id == leader), self.rng.choice(self.cluster.brokers))
        assert broker.proc is not None
        self.say(f"  SIGSTOP broker {broker.node_id} (leader of {topic}-{partition}) for {length:.1f}s")
        broker.proc.send_signal(signal.SIGSTOP)
        time.sleep(length)
        broker.proc.send_signal(signal.SIGCONT)

    def s3_pause(self, length: float) -> None:
        s3 = self.cluster.s3
        assert s3.proc is not None
        self.say(f"  SIGSTOP the S3 server for {length:.1f}s")
        s3.proc.send_signal(signal.SIGSTOP)
        time.sleep(length)
        s3.proc.send_signal(signal.SIGCONT)

    def s3_faults(self, length: float) -> None:
        proxy = self.cluster.proxy
        assert proxy is not None
        self.say(f"  S3 faults for {length:.1f}s ({_rates_text(S3_FAULTS)})")
        proxy.set_rates(S3_FAULTS)
        time.sleep(length)
        proxy.set_rates(FaultRates())

    def etcd_restart(self, length: float) -> None:
        self.say(f"  SIGKILL etcd, restart after {length:.1f}s")
        self.cluster.etcd.kill()
        time.sleep(length)
        self.cluster.etcd.start()

    def wal_manager_kill(self, length: float) -> None:
        # After an etcd restart or an earlier kill the standby may still be campaigning.
        active = _quietly_wait(self.cluster.active_manager, 15)
        victim = active or self.rng.choice(self.cluster.managers)
        which = "active" if active else "unknown-state"
        self.say(f"  SIGKILL the {which} WAL manager ({victim.name}), restart after {length:.1f}s")
        victim.kill()
        time.sleep(length)
        victim.start()


def _restart_broker(broker: BrokerServer) -> None:
    for attempt in range(3):
        try:
            broker.start(60)
            return
        except (RuntimeError, TimeoutError):
            broker.kill()
            if attempt == 2:
                raise


def _rates_text(rates: FaultRates) -> str:
    parts = [f"{k} {getattr(rates, k):.0%}" for k in ("error_500", "error_503", "ambiguous", "reset", "slow")]
    return ", ".join(parts) + f", slow = {rates.slow_s}s"


# --- the run ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _root(options: Options) -> Iterator[Path]:
    if options.data_dir:
        path = Path(options.data_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="diskless-chaos-") as tmp:
        yield Path(tmp)


def run_chaos(options: Options, out: TextIO = sys.stdout) -> Result:
    def say(line: str) -> None:
        if not options.quiet:
            print(line, file=out, flush=True)

    began = time.monotonic()
    result = Result(seed=options.seed)
    rng = random.Random(options.seed)
    plan = schedule(options.seed, options.duration_s, options.quick)
    pause = (1.0, 2.0) if options.quick else (2.0, 4.0)
    with _root(options) as root:
        cluster = ChaosCluster(root, options, say)
        try:
            say(f"diskless chaos: seed {options.seed}, {options.brokers} brokers in {options.azs} AZs, data in {root}")
            cluster.start()
            topics = _create_topics(cluster.bootstrap, options.partitions)
            producers = [Producer(cluster.bootstrap, t, options.partitions, options.rate) for t in topics]
            readers = [Reader(cluster.bootstrap, t, options.partitions) for t in topics]
            for worker in [*producers, *readers]:
                worker.start()
            _wait(lambda: all(sum(len(v) for v in p.acked.values()) > 0 for p in producers), 30, "no acknowledgement")
            say(f"faults ({len(plan)}): {', '.join(kind for kind, _ in plan)}")
            faults = Faults(cluster, rng, topics, options.partitions, say)
            fault_began = time.monotonic()
            for index, (kind, length) in enumerate(plan):
                faults.run(kind, length)
                if index < len(plan) - 1:
                    time.sleep(rng.uniform(*pause))
            result.fault_seconds = round(time.monotonic() - fault_began, 1)
            healed = time.monotonic()
            _wait(lambda: _quietly(full_isr, cluster.bootstrap, topics), 120, "partitions without a full ISR")
            result.seconds_to_full_isr = round(time.monotonic() - healed, 1)
            say(f"full ISR {result.seconds_to_full_isr}s after the last fault")
            for producer in producers:
                producer.stop()
            for producer, reader in zip(producers, readers, strict=True):
                ends = end_offsets(cluster.bootstrap, producer.topic, options.partitions)
                if not reader.finish(ends, 90):
                    say(f"  reader of {reader.topic} did not reach {ends}; errors: {reader.errors[:3]}")
                check_topic(producer, reader, result)
            # The WAL managers keep collecting meanwhile; give a pass or two after the last commit.
            time.sleep(3)
            referenced = referenced_wal_keys(cluster)
            present = bucket_keys(cluster.s3)
            missing = referenced - present
            result.referenced_wal_objects = len(referenced)
            result.deleted_while_referenced = len(missing)
            for key in sorted(missing)[:3]:
                _example(result, f"referenced WAL object {key} is gone")
            result.wal_objects_deleted = cluster.manager_deletions()
            result.unwatched_changes = cluster.unwatched_changes()
            result.faults = dict(faults.count)
            assert cluster.proxy is not None
            result.s3_requests_faulted = {
                k: cluster.proxy.stats[k] for k in ("error_500", "error_503", "ambiguous", "reset", "slow")
            }
        finally:
            cluster.stop()
    result.total_seconds = round(time.monotonic() - began, 1)
    report(result, say if not options.quiet else lambda line: print(line, file=out))
    if options.json_path:
        Path(options.json_path).write_text(json.dumps({**asdict(result), "ok": result.ok}, indent=2) + "\n")
    return result


def report(result: Result, say: Callable[[str], None]) -> None:
    faults = ", ".join(f"{kind.replace('_', ' ')} x{n}" for kind, n in sorted(result.faults.items()))
    s3 = ", ".join(f"{kind} {n}" for kind, n in result.s3_requests_faulted.items())
    say(f"chaos run, seed {result.seed}: {result.fault_seconds}s of faults, {result.total_seconds}s in all")
    say(f"  faults: {faults}")
    say(f"  S3 requests faulted by the proxy: {s3}")
    say(f"  records acknowledged: {result.acknowledged}  (not acknowledged: {result.not_acknowledged})")
    say(f"  records read: {result.read}")
    say(f"  lost = {result.lost}")
    say(f"  duplicated = {result.duplicated}")
    say(f"  offset gaps = {result.offset_gaps}")
    say(f"  acknowledged offsets holding another record = {result.offset_mismatches}")
    say(
        f"  WAL objects deleted while referenced = {result.deleted_while_referenced}"
        f"  (referenced {result.referenced_wal_objects}, deleted by the WAL manager {result.wal_objects_deleted})"
    )
    say(f"  seconds to full ISR after faults stop: {result.seconds_to_full_isr}")
    say(f"  partition changes found without their watch = {result.unwatched_changes}")
    say(f"  producer fatal errors (producer replaced): {result.producer_fatal_errors}")
    for example in result.examples:
        say(f"  ! {example}")
    say("  OK" if result.ok else "  FAILED")


def _create_topics(bootstrap: str, partitions: int) -> list[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    topics = {
        "chaos-classic": {"min.insync.replicas": "2"},
        "chaos-diskless": {"min.insync.replicas": "2", "diskless.enabled": "true"},
    }
    futures = admin.create_topics([NewTopic(name, partitions, 3, config=config) for name, config in topics.items()])
    for future in futures.values():
        future.result(30)
    _wait(lambda: _quietly(full_isr, bootstrap, list(topics)), 30, "topics without leaders")
    return list(topics)


def _quietly(check: Callable[..., bool], *args: Any) -> bool:
    try:
        return check(*args)
    except Exception:
        return False


def _quietly_wait(condition: Callable[[], Any], timeout: float) -> Any:
    try:
        return _wait(condition, timeout, "")
    except TimeoutError:
        return None


def _wait(condition: Callable[[], Any], timeout: float, message: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.2)


def main_chaos(options: Options) -> int:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = run_chaos(options)
    return 0 if result.ok else 1

"""Load-generator processes (``python -m diskless.bench.loadgen``): one producer or one consumer in one AZ.

Each runs in its own process so that librdkafka's threads and the Python callbacks of one client
do not share a GIL with the others or with the runner. The runner talks to them through files in a
control directory, so nothing here needs a socket of its own:

- a producer writes ``ready`` once its connections are up, then waits for ``go-<n>.json`` (a start
  time and a list of phases: a fixed rate in records/s, or ``null`` for as fast as the cluster takes
  them), runs them back to back, writes ``out-<n>.npz`` (for each acknowledged record its send time
  and produce latency; failures are counted) and ``done-<n>``, and waits for the next ``go`` or
  ``stop``;
- a consumer assigns every partition at its current end (or, ``--from-beginning``, at its start: the
  lagging reader of the ``lagging`` phase), writes ``ready``, and until ``stop``
  records for each record the send time carried in its first 8 bytes and the time it arrived, then
  writes ``out.npz``.

Both write ``status.json`` about once a second (counts so far) for the runner's progress display.
Times are ``time.time()`` wall clock: producers and consumers compare them across processes of one
machine. Records carry no key, so librdkafka's sticky partitioner spreads them as a user's would.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import struct
import sys
import time
from array import array
from pathlib import Path
from typing import Any

SEND_TIME = struct.Struct("<d")
POLL_S = 0.05
STATS_INTERVAL_MS = 1000
# A producer's librdkafka statistics, one row per broker per interval (``ProducerRun.on_stats``).
CLIENT_STATS_COLUMNS = ("at", "queue_avg_ms", "queue_p99_ms", "rtt_avg_ms", "rtt_p99_ms", "in_flight", "requests")


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)  # readers never see half a file


def _wait_for(control: Path, names: list[str], timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in names:
            if (control / name).exists():
                return name
        time.sleep(POLL_S)
    return None


class ProducerRun:
    """Sends records on a schedule and keeps, per acknowledged record, its send time and latency."""

    def __init__(self, args: argparse.Namespace) -> None:
        from confluent_kafka import Producer

        self.args = args
        self.control = Path(args.control)
        self.producer = Producer(
            {
                "bootstrap.servers": args.bootstrap,
                "client.id": f"bench-producer-{args.az} diskless_az={args.az}",
                "client.rack": args.az,
                "acks": "all",
                "linger.ms": args.linger_ms,
                "queue.buffering.max.kbytes": args.queue_kbytes,
                "queue.buffering.max.messages": 1_000_000,
                "compression.type": "none",
                # librdkafka's own view of each request (see ``on_stats``).
                "statistics.interval.ms": STATS_INTERVAL_MS,
                "stats_cb": self.on_stats,
                **json.loads(args.config),
            }
        )
        # Random bytes after the send time: nothing in the path compresses or deduplicates them.
        self.padding = os.urandom(max(0, args.record_size - SEND_TIME.size))
        self.sent_at = array("d")
        self.latency = array("d")
        self.client_stats = array("d")  # rows of CLIENT_STATS_COLUMNS
        self.errors = 0
        self.first_error = ""
        self.produced = 0
        self.last_status = 0.0

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
            return
        latency = msg.latency()
        now = time.time()
        self.sent_at.append(now - latency)
        self.latency.append(latency)

    def on_stats(self, text: str) -> None:
        """One row per broker that answered requests in the last interval: where a record's time
        goes before and after its request is sent. ``int_latency`` is the time records wait in
        librdkafka's queue (its linger, and any wait for a free in-flight slot: an idempotent
        producer sends at most 5 requests per broker before an answer), ``rtt`` the request's
        round trip, ``waitresp_cnt`` the requests sent and not yet answered. Microseconds in
        librdkafka, milliseconds here."""
        now = time.time()
        for broker in json.loads(text).get("brokers", {}).values():
            rtt = broker.get("rtt", {})
            if broker.get("nodeid", -1) < 0 or not rtt.get("cnt"):
                continue
            queued = broker.get("int_latency", {})
            self.client_stats.extend(
                (
                    now,
                    queued.get("avg", 0) / 1000,
                    queued.get("p99", 0) / 1000,
                    rtt.get("avg", 0) / 1000,
                    rtt.get("p99", 0) / 1000,
                    float(broker.get("waitresp_cnt", 0)),
                    float(rtt["cnt"]),
                )
            )

    def status(self, phase: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_status >= 1.0:
            self.last_status = now
            status = {"phase": phase, "produced": self.produced, "acked": len(self.latency), "errors": self.errors}
            _write_json(self.control / "status.json", status)

    def send_one(self) -> bool:
        value = SEND_TIME.pack(time.time()) + self.padding
        try:
            self.producer.produce(self.args.topic, value=value, on_delivery=self.on_delivery)
        except BufferError:
            return False
        self.produced += 1
        return True

    def run_phase(self, phase: dict[str, Any], start: float) -> None:
        end = start + float(phase["duration"])
        rate = phase["rate"]
        name = str(phase["name"])
        if rate is None:
            while (now := time.time()) < end:
                for _ in range(200):
                    if not self.send_one():
                        self.producer.poll(0.002)
                        break
                self.producer.poll(0)
                self.status(name)
            return
        sent = 0
        while (now := time.time()) < end:
            due = int((now - start) * float(rate)) - sent
            for _ in range(min(due, 1000)):
                if not self.send_one():
                    break
                sent += 1
            self.status(name)
            next_due = start + (sent + 1) / float(rate)
            self.producer.poll(max(0.0, min(next_due - time.time(), POLL_S)))

    def warm_up(self, partitions: list[int]) -> None:
        """One acknowledged record per partition before ``ready``: the first sends of a fresh
        producer also open its connections and learn its leaders, and timing them as phase records
        put up to a second of start-up into the first phase's p99 (a 20 s phase's first second
        is 5% of its records). Consumers see these records too; they fall outside every phase."""
        acked: list[Any] = []
        for partition in partitions:
            self.producer.produce(
                self.args.topic,
                value=SEND_TIME.pack(time.time()) + self.padding,
                partition=partition,
                on_delivery=lambda err, _msg: acked.append(err),
            )
        left = self.producer.flush(60)
        failed = [err for err in acked if err is not None]
        if left or failed:
            raise RuntimeError(f"warm-up: {left} records unacknowledged, errors {failed[:3]}")

    def run(self) -> int:
        meta = self.producer.list_topics(self.args.topic, timeout=30)
        topic = meta.topics[self.args.topic]
        if topic.error is not None:
            raise RuntimeError(f"topic {self.args.topic}: {topic.error}")
        self.warm_up(sorted(topic.partitions))
        (self.control / "ready").write_text("ok\n")
        round_ = 1
        while True:
            got = _wait_for(self.control, [f"go-{round_}.json", "stop"], timeout=3600)
            if got is None or got == "stop":
                break
            order = json.loads((self.control / got).read_text())
            start = float(order["start_at"])
            while time.time() < start:
                self.producer.poll(min(POLL_S, max(0.0, start - time.time())))
            for phase in order["phases"]:
                self.run_phase(phase, start)
                start += float(phase["duration"])
            left = self.producer.flush(float(order.get("flush_timeout", 60)))
            self.status("flushed", force=True)
            self._save(round_, unflushed=left)
            (self.control / f"done-{round_}").write_text("ok\n")
            round_ += 1
        return 0

    def _save(self, round_: int, unflushed: int) -> None:
        import numpy as np

        np.savez(
            self.control / f"out-{round_}.npz",
            sent_at=np.frombuffer(self.sent_at, dtype=np.float64),
            latency=np.frombuffer(self.latency, dtype=np.float64),
            errors=np.array([self.errors, unflushed]),
            client_stats=np.frombuffer(self.client_stats, dtype=np.float64).reshape(-1, len(CLIENT_STATS_COLUMNS)),
        )
        if self.first_error:
            (self.control / f"error-{round_}.txt").write_text(self.first_error + "\n")
        self.sent_at = array("d")
        self.latency = array("d")
        self.client_stats = array("d")
        self.errors = 0


def run_consumer(args: argparse.Namespace) -> int:
    import numpy as np
    from confluent_kafka import Consumer, TopicPartition

    control = Path(args.control)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "client.id": f"bench-consumer-{args.az} diskless_az={args.az}",
            "client.rack": args.az,
            "group.id": f"bench-{args.topic}-{args.az}{args.group_suffix}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.max.bytes": 8 * 1024 * 1024,
        }
    )
    try:
        meta = consumer.list_topics(args.topic, timeout=30).topics[args.topic]
        partitions = sorted(meta.partitions)
        # Explicit end offsets, read before ``ready``: a record produced after ``ready`` is always seen.
        # A lagging consumer starts at the log start instead (index 0 of the watermarks).
        side = 0 if args.from_beginning else 1
        starts = [consumer.get_watermark_offsets(TopicPartition(args.topic, p), timeout=30)[side] for p in partitions]
        consumer.assign([TopicPartition(args.topic, p, o) for p, o in zip(partitions, starts, strict=True)])
        (control / "ready").write_text("ok\n")
        sent_at = array("d")
        received_at = array("d")
        last_status = 0.0
        unpack = SEND_TIME.unpack_from
        while not (control / "stop").exists():
            batch = consumer.consume(num_messages=10000, timeout=0)
            if not batch:
                one = consumer.poll(POLL_S)
                batch = [one] if one is not None else []
            now = time.time()
            for msg in batch:
                if msg.error() is not None:
                    continue
                value = msg.value()
                if value is not None and len(value) >= SEND_TIME.size:
                    sent_at.append(unpack(value)[0])
                    received_at.append(now)
            if time.monotonic() - last_status >= 1.0:
                last_status = time.monotonic()
                _write_json(control / "status.json", {"received": len(received_at)})
        np.savez(
            control / "out.npz",
            sent_at=np.frombuffer(sent_at, dtype=np.float64),
            received_at=np.frombuffer(received_at, dtype=np.float64),
        )
    finally:
        consumer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diskless.bench.loadgen")
    parser.add_argument("role", choices=["producer", "consumer"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--az", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--control", required=True, help="directory shared with the runner")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--queue-kbytes", type=int, default=4096)
    parser.add_argument("--config", default="{}", help="producer: more librdkafka settings, a JSON object")
    parser.add_argument("--from-beginning", action="store_true", help="consumer: read the topic from its start")
    parser.add_argument("--group-suffix", default="", help="consumer: distinguishes a second consumer in one AZ")
    args = parser.parse_args(argv)
    Path(args.control).mkdir(parents=True, exist_ok=True)
    # No cyclic garbage collection in a load generator: its full collections held consumers for up
    # to 435 ms (producers 149 ms) in a two-minute run, and every record received meanwhile was
    # timed that much later. What it allocates per record (messages, floats in arrays) has no
    # cycles and is freed by reference counting.
    gc.disable()
    try:
        return ProducerRun(args).run() if args.role == "producer" else run_consumer(args)
    except Exception as exc:
        (Path(args.control) / "failed.txt").write_text(f"{type(exc).__name__}: {exc}\n")
        raise


if __name__ == "__main__":
    sys.exit(main())

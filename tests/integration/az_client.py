"""One client of the client-AZ tests (test_client_az.py), run as its own process.

Each process plays a client in one AZ: the test starts it with ``LD_PRELOAD`` of
``diskless/bench/bind_source.c`` so its connections leave from its AZ's loopback network. Client ids are the
libraries' own defaults: nothing here tells a broker which AZ the client is in, except, where
asked, the consumer's ``client.rack`` (KIP-392).

    python az_client.py produce LIB BOOTSTRAP TOPIC PREFIX COUNT SIZE
    python az_client.py consume LIB BOOTSTRAP TOPIC PARTITIONS EXPECTED RACK

Prints one JSON line: producers ``{"acked": n}``, consumers ``{"count": n, "digest": sha256 of the
sorted values}``. LIB is confluent-kafka, aiokafka or kafka-python (kcat is run by the test).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time

DEADLINE_S = 90


def value(prefix: str, i: int, size: int) -> bytes:
    return f"{prefix}-{i:08d}-".encode().ljust(size, b"x")


def digest(values: list[bytes]) -> str:
    h = hashlib.sha256()
    for v in sorted(values):
        h.update(v + b"\n")
    return h.hexdigest()


def produce(lib: str, bootstrap: str, topic: str, prefix: str, count: int, size: int) -> int:
    if lib == "confluent-kafka":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50})
        acked = 0

        def on_delivery(err: object, msg: object) -> None:
            nonlocal acked
            if err is None:
                acked += 1

        for i in range(count):
            while True:
                try:
                    producer.produce(topic, value(prefix, i, size), on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        producer.flush(DEADLINE_S)
        return acked
    if lib == "kafka-python":
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=50, batch_size=256 * 1024)
        futures = [producer.send(topic, value(prefix, i, size)) for i in range(count)]
        producer.flush(DEADLINE_S)
        acked = sum(1 for f in futures if f.succeeded())
        producer.close(5)
        return acked
    if lib == "aiokafka":
        from aiokafka import AIOKafkaProducer

        async def run() -> int:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, acks="all", linger_ms=50, max_batch_size=256 * 1024
            )
            await producer.start()
            try:
                futures = [await producer.send(topic, value(prefix, i, size)) for i in range(count)]
                results = await asyncio.gather(*futures, return_exceptions=True)
                return sum(1 for r in results if not isinstance(r, BaseException))
            finally:
                await producer.stop()

        return asyncio.run(run())
    raise SystemExit(f"unknown client {lib}")


def consume(lib: str, bootstrap: str, topic: str, partitions: int, expected: int, rack: str) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    if lib == "confluent-kafka":
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        settings = {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
        if rack:
            settings["client.rack"] = rack
        consumer = Consumer(settings)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while len(got) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10000, timeout=0.5):
                if msg.error() is None:
                    got.append(msg.value())
        consumer.close()
        return got
    if lib == "kafka-python":
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, client_rack=rack)
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        while len(got) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500, max_records=10000).values():
                got.extend(r.value for r in records)
        consumer.close()
        return got
    if lib == "aiokafka":
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def run() -> None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, client_rack=rack or None
            )
            await consumer.start()
            try:
                consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
                await consumer.seek_to_beginning()
                while len(got) < expected and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=500, max_records=10000)).values():
                        got.extend(r.value for r in records)
            finally:
                await consumer.stop()

        asyncio.run(run())
        return got
    raise SystemExit(f"unknown client {lib}")


def main(argv: list[str]) -> None:
    role, lib, bootstrap, topic = argv[:4]
    if role == "produce":
        prefix, count, size = argv[4], int(argv[5]), int(argv[6])
        print(json.dumps({"acked": produce(lib, bootstrap, topic, prefix, count, size)}))
    else:
        partitions, expected, rack = int(argv[4]), int(argv[5]), argv[6]
        values = consume(lib, bootstrap, topic, partitions, expected, rack)
        print(json.dumps({"count": len(values), "digest": digest(values)}))


if __name__ == "__main__":
    main(sys.argv[1:])

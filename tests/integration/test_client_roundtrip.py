"""Every supported client library round-trips 10,000 keyed records with headers, under every codec.

For each client (aiokafka, kafka-python, confluent-kafka, kcat) and each compression codec (none,
gzip, snappy, lz4, zstd) a fresh single-partition topic receives 10,000 records with distinct keys,
values and headers; the same client then reads the partition from offset 0 and every record must
come back exactly as written, in order, at offsets 0..9999, with the timestamps it was given.

kcat cannot set per-message timestamps or per-message headers, so its records share fixed headers
and carry producer-assigned timestamps, which must lie within the produce window.

A client may silently fall back to sending uncompressed batches (librdkafka does when it decides
the broker lacks a codec), which would make a round trip pass without testing the codec at all;
so each case also reads the partition's segment files and checks the batches' compression bits.

One broker serves the whole module (topics are fresh per case) to keep the 20 cases fast.

Diskless topics get the same matrix with fewer records (``DISKLESS_COUNT``) on a one-broker
cluster with etcd and S3 whose WAL objects are kept small, so that every case spans several WAL
objects; there the codec is read from the pointer segments, which keep each producer batch's
header, and the pointers must name several distinct WAL objects.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import BrokerProcess, LocalCluster

from diskless.protocol import records
from diskless.storage import pointer

pytestmark = pytest.mark.integration

COUNT = 10_000
DISKLESS_COUNT = 2_000
# Small WAL objects (a flush as soon as this many bytes are buffered) so a case spans several.
DISKLESS_OVERRIDES = {
    "diskless.wal.max.bytes": "4096",
    "diskless.wal.linger.ms": "20",
    "metrics.port": "0",
    "broker.session.timeout.ms": "3000",
}
MIN_WAL_OBJECTS = 3
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CLIENTS = ["aiokafka", "kafka-python", "confluent-kafka", "kcat"]
CREATE_TIME = 0
DEADLINE_S = 60.0
# An hour in the past, on a whole second: clearly a client-chosen CreateTime, not a broker clock.
BASE_TS = (int(time.time()) - 3600) * 1000


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_type: int | None = CREATE_TIME  # None: the client does not report it


def expected(i: int) -> Rec:
    # Values are compressible (a repeated run) yet distinct; no tabs or newlines, for kcat's line format.
    return Rec(
        offset=i,
        timestamp=BASE_TS + i,
        key=f"key-{i:05d}".encode(),
        value=f"value-{i:05d}-".encode() + b"abcdefghij" * (i % 7 + 1),
        headers=(("index", str(i).encode()), ("kind", b"roundtrip")),
    )


EXPECTED = [expected(i) for i in range(COUNT)]


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("roundtrip") / "broker")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def diskless_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("roundtrip-diskless"), 1, 1, DISKLESS_OVERRIDES, s3=True)
    try:
        yield cluster.start()
    finally:
        cluster.kill_all()


def create_topic(bootstrap: str, name: str, configs: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(name, num_partitions=1, replication_factor=1, config=configs or {})
    futures = admin.create_topics([new], request_timeout=15)
    futures[name].result(timeout=20)


def assert_roundtrip(got: list[Rec], want: list[Rec] = EXPECTED) -> None:
    assert len(got) == len(want)
    assert [r.offset for r in got] == list(range(len(want)))
    for expect, rec in zip(want, got, strict=True):
        assert rec == expect, rec


class CodecNotUsed(AssertionError):
    """The records round-tripped, but the client did not send them with the requested codec."""


def assert_stored_codec(partition_dir: Path, codec: str, count: int = COUNT) -> None:
    """The batches on disk carry the codec asked for (records per codec id, from batch headers)."""
    per_codec: dict[int, int] = {}
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos < len(data):
            header = records.parse_header(data, pos)
            per_codec[header.compression] = per_codec.get(header.compression, 0) + header.record_count
            pos += header.size
    check_codec_counts(per_codec, codec, count)


def assert_pointed_codec(partition_dir: Path, codec: str, count: int) -> set[str]:
    """The same check on a diskless partition: the pointer entries keep each producer batch's
    header, compression bits included. Returns the WAL object keys the pointers name."""
    per_codec: dict[int, int] = {}
    keys: set[str] = set()
    assert not list(partition_dir.glob("*.log")) or all(f.stat().st_size == 0 for f in partition_dir.glob("*.log")), (
        "a diskless topic wrote records to a records segment"
    )
    for segment in sorted(partition_dir.glob("*.plog")):
        for entry in pointer.iter_entries(segment.read_bytes()):
            assert isinstance(entry, pointer.PointerEntry), "a producer batch was stored inline"
            keys.add(entry.key)
            header = entry.header
            per_codec[header.compression] = per_codec.get(header.compression, 0) + header.record_count
    check_codec_counts(per_codec, codec, count)
    return keys


def check_codec_counts(per_codec: dict[int, int], codec: str, count: int) -> None:
    assert sum(per_codec.values()) == count, per_codec
    want = CODEC_IDS[codec]
    # A client may leave a batch uncompressed when compressing would grow it (a tiny first batch),
    # but nearly every record must travel under the requested codec and no other codec may appear.
    if not (set(per_codec) <= {0, want} and per_codec.get(want, 0) >= count * 9 // 10):
        raise CodecNotUsed(f"asked for {codec} ({want}); records stored per codec id: {per_codec}")


# --- aiokafka ---------------------------------------------------------------------------------


async def aiokafka_roundtrip(bootstrap: str, topic: str, codec: str, want: list[Rec] = EXPECTED) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=5
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, r.value, key=r.key, partition=0, timestamp_ms=r.timestamp, headers=list(r.headers)
            )
            for r in want
        ]
        metadata = await asyncio.wait_for(asyncio.gather(*futures), DEADLINE_S)
    finally:
        await producer.stop()
    assert [md.offset for md in metadata] == list(range(len(want)))

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    got: list[Rec] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < len(want) and time.monotonic() < deadline:
            batches = await consumer.getmany(tp, timeout_ms=1000)
            for msg in batches.get(tp, []):
                got.append(Rec(msg.offset, msg.timestamp, msg.key, msg.value, tuple(msg.headers), msg.timestamp_type))
    finally:
        await consumer.stop()
    return got


# --- kafka-python -----------------------------------------------------------------------------


def kafka_python_roundtrip(bootstrap: str, topic: str, codec: str, want: list[Rec] = EXPECTED) -> list[Rec]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=5
    )
    try:
        futures = [
            producer.send(
                topic, value=r.value, key=r.key, partition=0, timestamp_ms=r.timestamp, headers=list(r.headers)
            )
            for r in want
        ]
        producer.flush(timeout=DEADLINE_S)
        offsets = [f.get(timeout=DEADLINE_S).offset for f in futures]
    finally:
        producer.close(timeout=10)
    assert offsets == list(range(len(want)))

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    got: list[Rec] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < len(want) and time.monotonic() < deadline:
            for msg in consumer.poll(timeout_ms=1000).get(tp, []):
                got.append(Rec(msg.offset, msg.timestamp, msg.key, msg.value, tuple(msg.headers), msg.timestamp_type))
    finally:
        consumer.close()
    return got


# --- confluent-kafka --------------------------------------------------------------------------


def confluent_roundtrip(
    bootstrap: str, topic: str, codec: str, want: list[Rec] = EXPECTED, batch_messages: int | None = None
) -> list[Rec]:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    config: dict[str, object] = {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5}
    if batch_messages is not None:
        config["batch.num.messages"] = batch_messages
    producer = Producer(config)
    delivered: list[tuple[int, int]] = []
    errors: list[object] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((int(msg.key()[4:]), msg.offset()))  # type: ignore[attr-defined]

    for r in want:
        producer.produce(
            topic,
            value=r.value,
            key=r.key,
            partition=0,
            timestamp=r.timestamp,
            headers=list(r.headers),
            on_delivery=on_delivery,
        )
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0, "messages still in flight after the deadline"
    assert errors == []
    assert sorted(delivered) == [(i, i) for i in range(len(want))]

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"roundtrip-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    got: list[Rec] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < len(want) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                ts_type, ts = msg.timestamp()
                # confluent-kafka numbers timestamp types 1 (create) and 2 (log append); 0 is "none".
                got.append(Rec(msg.offset(), ts, msg.key(), msg.value(), tuple(msg.headers() or ()), ts_type - 1))
    finally:
        consumer.close()
    return got


# --- kcat -------------------------------------------------------------------------------------


def kcat_roundtrip(
    bootstrap: str, topic: str, codec: str, work: Path, want: list[Rec] = EXPECTED, batch_messages: int | None = None
) -> tuple[list[Rec], int, int]:
    headers = (("codec", codec.encode()), ("kind", b"roundtrip"))
    lines = b"".join(r.key + b"\t" + r.value + b"\n" for r in want)
    produce = ["kcat", "-b", bootstrap, "-P", "-t", topic, "-p", "0", "-K", "\t", "-X", "linger.ms=5"]
    for name, value in headers:
        produce += ["-H", f"{name}={value.decode()}"]
    if codec != "none":
        produce += ["-z", codec]
    if batch_messages is not None:
        produce += ["-X", f"batch.num.messages={batch_messages}"]
    before = time.time_ns() // 1_000_000
    done = subprocess.run(produce, input=lines, capture_output=True, timeout=DEADLINE_S)
    after = time.time_ns() // 1_000_000
    assert done.returncode == 0, done.stderr.decode()

    consume = ["kcat", "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e"]
    consume += ["-c", str(len(want)), "-f", "%o\t%T\t%k\t%s\t%h\n"]
    out_path = work / f"{topic}.out"
    with open(out_path, "wb") as out:
        done = subprocess.run(consume, stdout=out, stderr=subprocess.PIPE, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr.decode()

    got = []
    for line in out_path.read_bytes().splitlines():
        offset, ts, key, value, hdrs = line.split(b"\t")
        parsed = tuple((n.decode(), v) for n, _, v in (h.partition(b"=") for h in hdrs.split(b",")))
        got.append(Rec(int(offset), int(ts), key, value, parsed, None))
    return got, before, after


# --- the matrix -------------------------------------------------------------------------------


def matrix() -> list[object]:
    cases = []
    for client in CLIENTS:
        for codec in CODECS:
            cases.append(pytest.param(client, codec, id=f"{client}-{codec}"))
    return cases


async def roundtrip(
    bootstrap: str, work: Path, topic: str, client: str, codec: str, want: list[Rec], **batching: int
) -> None:
    """Produce ``want`` with ``client`` and read it back with the same client; fails on any difference."""
    if client == "aiokafka":
        assert_roundtrip(await aiokafka_roundtrip(bootstrap, topic, codec, want), want)
    elif client == "kafka-python":
        assert_roundtrip(await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, codec, want), want)
    elif client == "confluent-kafka":
        assert_roundtrip(await asyncio.to_thread(confluent_roundtrip, bootstrap, topic, codec, want, **batching), want)
    else:
        got, before, after = await asyncio.to_thread(kcat_roundtrip, bootstrap, topic, codec, work, want, **batching)
        want_headers = (("codec", codec.encode()), ("kind", b"roundtrip"))
        assert len(got) == len(want)
        assert [r.offset for r in got] == list(range(len(want)))
        for expect, rec in zip(want, got, strict=True):
            assert (rec.key, rec.value, rec.headers) == (expect.key, expect.value, want_headers), rec
            # kcat cannot set timestamps: the producer stamps CreateTime, inside the produce window.
            assert before - 1000 <= rec.timestamp <= after + 1000, (rec, before, after)


@pytest.mark.parametrize(("client", "codec"), matrix())
async def test_client_roundtrip(shared_broker: BrokerProcess, tmp_path: Path, client: str, codec: str) -> None:
    topic = f"roundtrip-{client}-{codec}-{uuid.uuid4().hex[:8]}"
    bootstrap = shared_broker.bootstrap
    await asyncio.to_thread(create_topic, bootstrap, topic)
    await roundtrip(bootstrap, tmp_path, topic, client, codec, EXPECTED)
    assert shared_broker.alive()
    assert_stored_codec(shared_broker.data_dir / f"{topic}-0", codec)


@pytest.mark.parametrize(("client", "codec"), matrix())
async def test_diskless_client_roundtrip(
    diskless_cluster: LocalCluster, tmp_path: Path, client: str, codec: str
) -> None:
    """The matrix on a diskless topic: batches go through WAL objects in S3 and come back with
    their offsets patched, byte for byte otherwise (the CRC the clients check covers the rest)."""
    topic = f"diskless-{client}-{codec}-{uuid.uuid4().hex[:8]}"
    bootstrap = diskless_cluster.bootstrap
    await asyncio.to_thread(create_topic, bootstrap, topic, {"diskless.enabled": "true"})
    # librdkafka would otherwise send all the records in one or two batches (one WAL object).
    batching = {"batch_messages": 100} if client in ("kcat", "confluent-kafka") else {}
    await roundtrip(bootstrap, tmp_path, topic, client, codec, EXPECTED[:DISKLESS_COUNT], **batching)
    broker = diskless_cluster.brokers[0]
    assert broker.alive()
    keys = assert_pointed_codec(broker.data_dir / f"{topic}-0", codec, DISKLESS_COUNT)
    assert len(keys) >= MIN_WAL_OBJECTS, f"the records span only {len(keys)} WAL objects"


# A topic's compression.type differs from what each client sends: the broker stores and serves
# the topic's codec, and the client decodes it (Kafka's LogValidator re-encodes such batches).
TOPIC_CODEC_CASES = [
    pytest.param("aiokafka", "gzip", "lz4", id="aiokafka-gzip-to-lz4"),
    pytest.param("kafka-python", "lz4", "snappy", id="kafka-python-lz4-to-snappy"),
    pytest.param("confluent-kafka", "snappy", "zstd", id="confluent-kafka-snappy-to-zstd"),
    pytest.param("kcat", "zstd", "gzip", id="kcat-zstd-to-gzip"),
    pytest.param("confluent-kafka", "zstd", "uncompressed", id="confluent-kafka-zstd-to-uncompressed"),
]


@pytest.mark.parametrize("kind", ["classic", "diskless"])
@pytest.mark.parametrize(("client", "sent", "topic_codec"), TOPIC_CODEC_CASES)
async def test_topic_compression_type_is_stored_and_read(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, client: str, sent: str, topic_codec: str
) -> None:
    """Classic partitions re-encode at the leader's append; diskless ones at the representative,
    before upload, so the WAL objects hold the topic's codec."""
    diskless = kind == "diskless"
    server = request.getfixturevalue("diskless_cluster") if diskless else request.getfixturevalue("shared_broker")
    topic = f"topic-codec-{kind}-{client}-{uuid.uuid4().hex[:8]}"
    configs = {"compression.type": topic_codec} | ({"diskless.enabled": "true"} if diskless else {})
    await asyncio.to_thread(create_topic, server.bootstrap, topic, configs)
    batching = {"batch_messages": 100} if diskless and client in ("kcat", "confluent-kafka") else {}
    await roundtrip(server.bootstrap, tmp_path, topic, client, sent, EXPECTED[:DISKLESS_COUNT], **batching)
    stored = "none" if topic_codec == "uncompressed" else topic_codec
    if diskless:
        assert_pointed_codec(server.brokers[0].data_dir / f"{topic}-0", stored, DISKLESS_COUNT)
    else:
        assert_stored_codec(server.data_dir / f"{topic}-0", stored, DISKLESS_COUNT)

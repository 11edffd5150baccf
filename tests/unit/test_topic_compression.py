"""A topic's ``compression.type`` decides the codec its batches are stored in (Kafka's LogValidator).

The topic configuration was accepted and shown by DescribeConfigs but nothing read it: a topic set
to zstd stored whatever the producer sent. Driven through the real ProduceApis handler
(``test_produce_refusals_as_kafka``'s broker: classic topic "t" appended here, diskless topic "d"
handed to a stand-in representative), and the stored bodies are decoded with kafka-python's
codecs, a decoder independent of ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from batches import CODEC_NAMES, CODECS, GZIP, LZ4, NONE, SNAPPY, ZSTD, Record, crc_ok, decode_batch, make_batch
from kafka import codec as kafka_codec
from kio.schema.errors import ErrorCode
from test_produce_refusals_as_kafka import TOPICS, make_apis, produce

from diskless.broker.produce_apis import ProduceApis
from diskless.log.config import TOPIC_CONFIGS, ConfigError
from diskless.protocol import compression

TOPIC_CODECS = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
THIRD_PARTY_DECODERS = {
    GZIP: kafka_codec.gzip_decode,
    SNAPPY: kafka_codec.snappy_decode,
    LZ4: kafka_codec.lz4_decode,
    ZSTD: kafka_codec.zstd_decode,
}

RECORDS = [
    Record(b"value-%d" % i * 40, key=b"key-%d" % i, timestamp=1_700_000_000_000 + i, headers=(("h", b"x"),))
    for i in range(300)
]


def stored(apis: ProduceApis, topic: str) -> list[bytes]:
    """The batches the topic holds: the classic log's bytes, or what the representative was handed."""
    broker: Any = apis.broker
    if topic == "d":
        return list(broker.representative.submitted)
    meta = broker.metadata.topics["t"]
    replica = broker.replicas.hosted("t", 0, meta.topic_id)
    data = replica.log.read(0, 1 << 24, max_offset=replica.log.log_end_offset).records
    out = []
    pos = 0
    while pos < len(data):
        size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
        out.append(bytes(data[pos : pos + size]))
        pos += size
    return out


@pytest.mark.parametrize("topic", TOPICS)
@pytest.mark.parametrize("target", sorted(TOPIC_CODECS))
@pytest.mark.parametrize("source", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_batches_are_stored_in_the_topics_codec(tmp_path: Path, topic: str, target: str, source: int) -> None:
    apis = make_apis(tmp_path, compression_type=target)
    sent = make_batch(RECORDS, compression=source, producer_id=5, producer_epoch=0, base_sequence=0)
    assert produce(apis, sent, topic) == (ErrorCode.none, 0)
    (batch,) = stored(apis, topic)
    decoded, original = decode_batch(batch), decode_batch(sent)
    assert decoded.attributes & 0x07 == TOPIC_CODECS[target]
    assert crc_ok(batch)
    assert decoded.records == original.records  # keys, values, headers, offset and timestamp deltas
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (5, 0, 0)
    assert decoded.max_timestamp == original.max_timestamp
    decoder = THIRD_PARTY_DECODERS.get(TOPIC_CODECS[target])
    if decoder is not None:
        assert decoder(batch[61:]) == make_batch(RECORDS)[61:]


@pytest.mark.parametrize("topic", TOPICS)
def test_producer_keeps_the_producers_bytes(tmp_path: Path, topic: str) -> None:
    """compression.type=producer (the default) and a topic codec the producer already used (at
    another level) store the batch as sent."""
    for target in ("producer", "lz4"):
        apis = make_apis(tmp_path / target, compression_type=target, compression_lz4_level=1)
        sent = make_batch(RECORDS, compression=LZ4)
        assert produce(apis, sent, topic)[0] == ErrorCode.none
        (batch,) = stored(apis, topic)
        assert bytes(batch[61:]) == sent[61:]


@pytest.mark.parametrize("topic", TOPICS)
def test_a_batch_grown_past_max_message_bytes_is_message_too_large(tmp_path: Path, topic: str) -> None:
    """UnifiedLog.append: a batch re-encoded by the broker is checked against max.message.bytes
    again (RecordTooLargeException, MESSAGE_TOO_LARGE), and nothing is stored."""
    apis = make_apis(tmp_path, compression_type="uncompressed", max_message_bytes=4000)
    sent = make_batch([b"z" * 20_000], compression=ZSTD)
    assert len(sent) < 4000
    assert produce(apis, sent, topic)[0] == ErrorCode.message_too_large
    assert stored(apis, topic) == []


def test_a_retry_of_a_recompressed_batch_is_a_duplicate(tmp_path: Path) -> None:
    """The re-encoding is deterministic, and idempotence reads the header only: a producer's retry
    is answered with the first append's offset and stored once."""
    apis = make_apis(tmp_path, compression_type="gzip")
    sent = make_batch(RECORDS, compression=SNAPPY, producer_id=9, producer_epoch=0, base_sequence=0)
    assert produce(apis, sent) == (ErrorCode.none, 0)
    assert produce(apis, sent) == (ErrorCode.none, 0)
    assert len(stored(apis, "t")) == 1


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("compression.gzip.level", ["-1", "1", "9"], ["0", "10", "-2"]),
        ("compression.lz4.level", ["1", "17"], ["0", "18"]),
        ("compression.zstd.level", ["-131072", "0", "22"], ["-131073", "23"]),
    ],
)
def test_compression_levels_are_checked_as_kafka_checks_them(name: str, good: list[str], bad: list[str]) -> None:
    """KIP-390's ranges: gzip 1-9 or -1 (zlib's default), lz4 1-17, zstd -131072-22."""
    definition = TOPIC_CONFIGS[name]
    for value in good:
        assert definition.parse(value) == int(value)
    for value in bad:
        with pytest.raises(ConfigError):
            definition.parse(value)


def test_lz4_frames_have_independent_blocks() -> None:
    """Java's KafkaLZ4BlockInputStream reads independent blocks only: the frame's FLG byte says so,
    and a body of several 64 KiB blocks decodes with a third-party decoder."""
    body = bytes(range(256)) * 2000
    frame = compression.compress_body(LZ4, body, 9)
    assert frame[4] & 0x20, f"FLG {frame[4]:#x} has no block-independence bit"
    assert kafka_codec.lz4_decode(frame) == body


def test_lz4_at_the_default_level_uses_the_fast_compressor() -> None:
    """Kafka keeps the fast LZ4 compressor at compression.lz4.level's default (9) and uses LZ4HC
    for any other level: the default costs what producers' LZ4 always cost, a set level compresses
    harder. The fast and the high-compression encoders give different bodies for the same input."""
    body = b"".join(b"record %d of a topic whose values repeat a little " % i for i in range(20_000))
    default = compression.compress_body(LZ4, body, compression.LZ4_DEFAULT_LEVEL)
    harder = compression.compress_body(LZ4, body, 8)  # LZ4HC at a lower level still beats the fast one
    assert len(harder) < len(default)
    assert kafka_codec.lz4_decode(default) == kafka_codec.lz4_decode(harder) == body

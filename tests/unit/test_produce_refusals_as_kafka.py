"""Produce validation against Kafka's (ProduceRequest.validateRecords, LogValidator.validateBatch,
UnifiedLog.analyzeAndValidateRecords, KafkaApis.handleProduceRequest).

Driven like tests/unit/test_fenced_produce.py: the real ProduceApis handler over a real
ReplicaManager in a temporary directory (classic topic), plus a diskless topic whose representative
is a stand-in that records what it was handed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import crc32c
import pytest
from batches import ZSTD, make_batch
from fenced_broker import NODE, FencedBroker, now_ms
from kio.schema.errors import ErrorCode

from diskless.broker.produce_apis import ProduceApis
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.log.config import LogConfig
from diskless.protocol import messages as m
from diskless.replication.partition import Partition


class Representative:
    def __init__(self) -> None:
        self.submitted: list[bytes] = []

    def submit(
        self, topic: str, topic_id: str, partition: int, batch: bytes, acks: int, txn: Any, timeout_s: float = 30
    ) -> Any:
        self.submitted.append(batch)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_event_loop().create_future()
        future.set_result({"error_code": 0, "base_offset": len(self.submitted) - 1})
        return future


class Broker(FencedBroker):
    """Topic "t" is classic (led here), topic "d" is diskless."""

    def __init__(self, log_dir: Path, **config: Any) -> None:
        super().__init__(log_dir)
        self.representative = Representative()
        self.topic_config = config  # LogConfig fields both topics have

    def is_diskless(self, meta: TopicMetadata) -> bool:
        return meta.name == "d"

    def log_config(self, meta: TopicMetadata) -> LogConfig:
        return LogConfig(diskless_enabled=meta.name == "d", **self.topic_config)

    def host(self, name: str) -> Partition | None:
        state = PartitionState(replicas=[NODE], leader=NODE, leader_epoch=0, isr=[NODE])
        meta = TopicMetadata(name, str(uuid.uuid4()), [state], {})
        self.metadata.topics[name] = meta
        if name == "d":
            return None
        return self.replicas.apply(meta, 0, LogConfig(**self.topic_config), now_ms())


def make_apis(tmp_path: Path, **config: Any) -> ProduceApis:
    broker = Broker(tmp_path / "logs", **config)
    broker.host("t")
    broker.host("d")
    return ProduceApis(broker)  # type: ignore[arg-type]


@pytest.fixture
def apis(tmp_path: Path) -> ProduceApis:
    return make_apis(tmp_path)


def produce(
    apis: ProduceApis, batch: bytes, topic: str = "t", version: int = 9, transactional_id: str | None = None
) -> tuple[ErrorCode, int]:
    async def run() -> Any:
        request = SimpleNamespace(
            acks=1,
            timeout=5000,
            transactional_id=transactional_id,
            topic_data=[SimpleNamespace(name=topic, partition_data=[SimpleNamespace(index=0, records=batch)])],
        )
        body = apis.produce(m.RequestHeader(m.API_PRODUCE, version, 1, "c"), request)
        return body if isinstance(body, dict) else await body

    body = asyncio.run(run())
    part = body["responses"][0]["partition_responses"][0]
    return ErrorCode(part["error_code"]), part["base_offset"]


def recrc(batch: bytes) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def with_attributes(batch: bytes, attributes: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">h", out, 21, attributes)
    return recrc(bytes(out))


TOPICS = ["t", "d"]


# --- 1. producer id set, base sequence < 0 -------------------------------------------------------


@pytest.mark.parametrize("topic", TOPICS)
def test_producer_id_without_sequence_is_invalid_record(apis: ProduceApis, topic: str) -> None:
    """LogValidator.validateBatch: ``batch.hasProducerId() && batch.baseSequence() < 0`` ->
    InvalidRecordException (INVALID_RECORD)."""
    batch = make_batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=-1)
    code, _ = produce(apis, batch, topic)
    assert code == ErrorCode.invalid_record


def test_producer_id_without_sequence_loses_later_batches(apis: ProduceApis) -> None:
    """What accepting such batches does on a classic partition: the second, different batch of
    the same producer (sequence -1 again) is taken for a retry of the first: answered success
    with the first batch's offset, never appended. Kafka refuses both (INVALID_RECORD)."""
    first = make_batch([b"first"], producer_id=7, producer_epoch=0, base_sequence=-1)
    second = make_batch([b"second"], producer_id=7, producer_epoch=0, base_sequence=-1)
    a = produce(apis, first)
    b = produce(apis, second)
    acknowledged_but_not_appended = b[0] == ErrorCode.none and a[0] == ErrorCode.none and a[1] == b[1]
    assert not acknowledged_but_not_appended, (a, b)


# --- 2. unknown compression codec -----------------------------------------------------------------


@pytest.mark.parametrize("codec", [5, 6, 7])
@pytest.mark.parametrize("topic", TOPICS)
def test_unknown_compression_codec_is_refused(apis: ProduceApis, topic: str, codec: int) -> None:
    """Kafka: UnifiedLog.analyzeAndValidateRecords calls CompressionType.forId(batch.compressionType.id),
    which throws for ids 5-7 (IllegalArgumentException -> UNKNOWN_SERVER_ERROR for the partition):
    the batch is never stored. Here it is stored, and no consumer can decode it."""
    batch = with_attributes(make_batch([b"a"]), codec)
    code, _ = produce(apis, batch, topic)
    assert code != ErrorCode.none


# --- 3. zstd on produce v3-v6 ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 6])
@pytest.mark.parametrize("topic", TOPICS)
def test_zstd_before_produce_v7_is_unsupported_compression_type(apis: ProduceApis, topic: str, version: int) -> None:
    """ProduceRequest.validateRecords: ``version < 7 && entry.compressionType() == ZSTD`` ->
    UNSUPPORTED_COMPRESSION_TYPE."""
    batch = make_batch([b"a"], compression=ZSTD)
    code, _ = produce(apis, batch, topic, version=version)
    assert code == ErrorCode.unsupported_compression_type


# --- 4. magic other than 2 -------------------------------------------------------------------------


@pytest.mark.parametrize("topic", TOPICS)
def test_magic_not_2_is_invalid_record(apis: ProduceApis, topic: str) -> None:
    """ProduceRequest.validateRecords (v3+): ``entry.magic() != MAGIC_VALUE_V2`` -> INVALID_RECORD
    (diskless answers UNSUPPORTED_FOR_MESSAGE_FORMAT)."""
    batch = make_batch([b"a"], magic=1)
    code, _ = produce(apis, batch, topic)
    assert code == ErrorCode.invalid_record


# --- 5. transactional records without a transactional id -------------------------------------------


@pytest.mark.parametrize("topic", TOPICS)
def test_transactional_records_without_transactional_id(apis: ProduceApis, topic: str) -> None:
    """KafkaApis.handleProduceRequest: if the request has transactional records,
    ``produceRequest.transactionalId != null && authorize(WRITE, TRANSACTIONAL_ID)`` must hold, else
    the whole request is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED (authorizer or not). The
    classic path checks nothing (and the diskless path only with verification enabled): the batch
    opens a transaction no coordinator knows, holding the partition's LSO."""
    apis.broker.config = dataclasses.replace(  # type: ignore[misc]
        apis.broker.config, transaction_partition_verification_enable=False
    )
    batch = make_batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=0, transactional=True)
    code, _ = produce(apis, batch, topic, transactional_id=None)
    assert code == ErrorCode.transactional_id_authorization_failed


# --- 6. non-zero base offset -------------------------------------------------------------------------


@pytest.mark.parametrize("topic", TOPICS)
def test_nonzero_base_offset_is_invalid_record(apis: ProduceApis, topic: str) -> None:
    """UnifiedLog.analyzeAndValidateRecords: a v2 client batch whose baseOffset != 0 ->
    INVALID_RECORD ("The baseOffset of the record batch in the append ... should be 0")."""
    batch = make_batch([b"a"], base_offset=5)
    code, _ = produce(apis, batch, topic)
    assert code == ErrorCode.invalid_record


# --- 7. a batch larger than segment.bytes -------------------------------------------------------------


@pytest.mark.parametrize("topic", TOPICS)
def test_batch_larger_than_segment_is_record_list_too_large(tmp_path: Path, topic: str) -> None:
    """UnifiedLog.append: ``validRecords.sizeInBytes > config.segmentSize`` ->
    RecordBatchTooLargeException (RECORD_LIST_TOO_LARGE), checked after analyzeAndValidateRecords'
    ``batchSize > config.maxMessageSize`` (MESSAGE_TOO_LARGE). A classic partition stored the
    batch in a segment of its own, larger than segment.bytes. A diskless partition's segments hold
    a pointer entry per batch whatever its size (the batch goes to a WAL object): it takes it."""
    apis = make_apis(tmp_path, segment_bytes=300, max_message_bytes=600)
    fits = make_batch([b"a" * 100])
    over_segment = make_batch([b"b" * 400])
    over_both = make_batch([b"c" * 700])
    assert len(fits) <= 300 < len(over_segment) <= 600 < len(over_both)
    assert produce(apis, over_both, topic)[0] == ErrorCode.message_too_large
    if topic == "t":
        assert produce(apis, over_segment, topic) == (ErrorCode.record_list_too_large, -1)
        assert produce(apis, fits, topic) == (ErrorCode.none, 0)
    else:
        assert produce(apis, over_segment, topic)[0] == ErrorCode.none
        assert apis.broker.representative.submitted == [over_segment]  # type: ignore[attr-defined]

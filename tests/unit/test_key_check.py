"""Compacted topics refuse records without a key (Kafka's LogValidator.validateKey).

``key_check`` alone on real v2 batches (every codec), then through the real ProduceApis handler
over a real ReplicaManager (as tests/unit/test_produce_refusals_as_kafka.py): INVALID_RECORD,
Kafka's messages, each keyless record's index in ``record_errors`` (on the wire from Produce v8),
nothing appended; keyed batches of the same topic appended; topics that are not compacted never
look at keys.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from batches import CODECS, GZIP, ZSTD, Record, make_batch
from fenced_broker import NODE, FencedBroker, now_ms
from kio.schema.errors import ErrorCode

from diskless.broker.produce_apis import ProduceApis
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.log.config import LogConfig
from diskless.log.key_check import KeylessRecords, check_keys, keyless_indexes
from diskless.protocol import messages as m
from diskless.protocol import records
from diskless.protocol.produce_response import encode_produce_response

COMPACT = LogConfig(cleanup_policy="compact")
MESSAGE = "Compacted topic cannot accept message without key in topic partition t-0"


def view(batch: bytes) -> memoryview:
    return memoryview(batch)


def keyed(*keys: bytes | None) -> list[Record]:
    return [Record(b"v", key=k) for k in keys]


# --- key_check alone ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_keyless_indexes_in_every_codec(codec: int) -> None:
    batch = make_batch(keyed(b"a", None, b"", None, b"k" * 300), compression=codec)
    header = records.parse_header(batch)
    # An empty key is a key (Record.hasKey: key != null); only null keys count.
    assert keyless_indexes(batch, header, records.DEFAULT_MAX_DECOMPRESSED_BYTES) == [1, 3]


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_check_keys_refuses_keyless_records_of_compacted_logs(policy: str) -> None:
    config = LogConfig(cleanup_policy=policy)
    with pytest.raises(KeylessRecords) as info:
        check_keys([view(make_batch(keyed(None, b"a", None, None, None)))], config, "t", 0)
    exc = info.value
    assert exc.error == "invalid_record"
    assert exc.record_errors == [(0, MESSAGE), (2, MESSAGE), (3, MESSAGE), (4, MESSAGE)]
    # LogValidator.processRecordErrors: the count and the first three.
    assert str(exc) == (
        "One or more records have been rejected due to 4 record errors in total, and only showing the first "
        f"three errors at most: [RecordError(batchIndex=0, message='{MESSAGE}'), "
        f"RecordError(batchIndex=2, message='{MESSAGE}'), RecordError(batchIndex=3, message='{MESSAGE}')]"
    )
    check_keys([view(make_batch(keyed(b"a", b"b")))], config, "t", 0)  # all keyed: nothing raised


@pytest.mark.parametrize("policy", ["delete", ""])
def test_logs_not_compacted_parse_nothing(policy: str) -> None:
    """Not even the header: a batch that is not one at all goes through untouched."""
    check_keys([view(b"not a batch")], LogConfig(cleanup_policy=policy), "t", 0)
    check_keys([view(make_batch([None]))], LogConfig(cleanup_policy=policy), "t", 0)


def test_damaged_batches_get_the_error_any_topic_gives() -> None:
    """The batch checks come first (Kafka: analyzeAndValidateRecords before LogValidator)."""
    batch = bytearray(make_batch(keyed(None)))
    batch[-1] ^= 0xFF  # the CRC no longer matches
    with pytest.raises(records.InvalidBatch) as info:
        check_keys([view(bytes(batch))], COMPACT, "t", 0)
    assert info.value.error == "corrupt_message" and not isinstance(info.value, KeylessRecords)
    # A CRC-correct batch whose records run past the body: CORRUPT_MESSAGE.
    good = make_batch(keyed(b"a", b"b"))
    short = bytearray(good[:-3])
    struct.pack_into(">i", short, 8, len(short) - records.LOG_OVERHEAD)
    struct.pack_into(">I", short, 17, records.compute_crc(short))
    with pytest.raises(records.InvalidBatch) as info:
        check_keys([view(bytes(short))], COMPACT, "t", 0)
    assert info.value.error == "corrupt_message"


def test_decompression_is_bounded() -> None:
    """A small zstd body that inflates past the bound is refused, not decompressed whole."""
    bomb = make_batch([Record(b"\x00" * (8 << 20), key=None)], compression=ZSTD)
    config = LogConfig(cleanup_policy="compact", max_message_bytes=64 * 1024)
    assert len(bomb) < config.max_message_bytes
    with pytest.raises(records.InvalidBatch) as info:
        check_keys([view(bomb)], config, "t", 0)
    assert info.value.error == "corrupt_message"


# --- through the produce handler ----------------------------------------------------------------------


class Broker(FencedBroker):
    """Topic "t", classic and led here, with the given LogConfig fields."""

    def __init__(self, log_dir: Path, **config: Any) -> None:
        super().__init__(log_dir)
        self.topic_config = config

    def is_diskless(self, meta: TopicMetadata) -> bool:
        return False

    def log_config(self, meta: TopicMetadata) -> LogConfig:
        return LogConfig(**self.topic_config)

    def host(self, name: str) -> Any:
        state = PartitionState(replicas=[NODE], leader=NODE, leader_epoch=0, isr=[NODE])
        meta = TopicMetadata(name, str(uuid.uuid4()), [state], {})
        self.metadata.topics[name] = meta
        return self.replicas.apply(meta, 0, LogConfig(**self.topic_config), now_ms())


def make_apis(tmp_path: Path, **config: Any) -> tuple[ProduceApis, Any]:
    broker = Broker(tmp_path / "logs", **config)
    replica = broker.host("t")
    return ProduceApis(broker), replica  # type: ignore[arg-type]


def produce(apis: ProduceApis, batch: bytes, version: int = 9, acks: int = 1) -> dict[str, Any]:
    async def run() -> Any:
        request = SimpleNamespace(
            acks=acks,
            timeout=5000,
            transactional_id=None,
            topic_data=[SimpleNamespace(name="t", partition_data=[SimpleNamespace(index=0, records=batch)])],
        )
        body = apis.produce(m.RequestHeader(m.API_PRODUCE, version, 1, "c"), request)
        return body if isinstance(body, dict) else await body

    return asyncio.run(run())


def partition_answer(body: dict[str, Any]) -> dict[str, Any]:
    return body["responses"][0]["partition_responses"][0]


@pytest.mark.parametrize("codec", [0, GZIP, ZSTD])
def test_compacted_topic_refuses_keyless_and_takes_keyed(tmp_path: Path, codec: int) -> None:
    apis, replica = make_apis(tmp_path, cleanup_policy="compact")
    first = partition_answer(produce(apis, make_batch(keyed(b"a", b"b"), compression=codec)))
    assert (first["error_code"], first["base_offset"]) == (ErrorCode.none, 0)
    refused = partition_answer(produce(apis, make_batch(keyed(b"c", None, b"d"), compression=codec)))
    assert refused["error_code"] == ErrorCode.invalid_record
    assert refused["base_offset"] == -1
    assert refused["record_errors"] == [{"batch_index": 1, "batch_index_error_message": MESSAGE}]
    assert refused["error_message"].startswith("One or more records have been rejected due to 1 record errors")
    assert replica.log.log_end_offset == 2  # nothing of the refused batch appended
    after = partition_answer(produce(apis, make_batch(keyed(b"c", b"d"), compression=codec)))
    assert (after["error_code"], after["base_offset"]) == (ErrorCode.none, 2)


def test_record_errors_on_the_wire_from_produce_v8(tmp_path: Path) -> None:
    apis, _ = make_apis(tmp_path, cleanup_policy="compact,delete")
    for version in (3, 7, 8, 9):
        body = produce(apis, make_batch(keyed(None)), version=version)
        frame = encode_produce_response(version, 1, body)
        assert (MESSAGE.encode() in frame) == (version >= 8), version
        assert partition_answer(body)["error_code"] == ErrorCode.invalid_record


def test_acks_0_keyless_produce_closes_the_connection(tmp_path: Path) -> None:
    """As for any refused acks=0 produce (the client's only signal)."""
    from diskless.broker.api_base import CloseConnection

    apis, replica = make_apis(tmp_path, cleanup_policy="compact")
    with pytest.raises(CloseConnection):
        produce(apis, make_batch(keyed(None)), acks=0)
    assert replica.log.log_end_offset == 0


def test_delete_topic_takes_keyless_records(tmp_path: Path) -> None:
    apis, replica = make_apis(tmp_path)
    answer = partition_answer(produce(apis, make_batch(keyed(None, None))))
    assert answer["error_code"] == ErrorCode.none and replica.log.log_end_offset == 2


def test_idempotent_keyless_batch_refused_before_its_sequence_is_taken(tmp_path: Path) -> None:
    """The refusal comes before the producer state sees the batch (Kafka validates records before
    analyzeAndValidateProducerState): the producer's next batch at the same sequence is appended."""
    apis, replica = make_apis(tmp_path, cleanup_policy="compact")
    pid = {"producer_id": 7, "producer_epoch": 0}
    assert partition_answer(produce(apis, make_batch(keyed(b"a"), base_sequence=0, **pid)))["error_code"] == 0
    keyless = make_batch(keyed(None), base_sequence=1, **pid)
    assert partition_answer(produce(apis, keyless))["error_code"] == ErrorCode.invalid_record
    again = partition_answer(produce(apis, make_batch(keyed(b"b"), base_sequence=1, **pid)))
    assert (again["error_code"], again["base_offset"]) == (ErrorCode.none, 1)
    assert replica.log.log_end_offset == 2

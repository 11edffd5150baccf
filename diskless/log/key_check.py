"""Records without a key are refused by compacted topics (Kafka's LogValidator.validateKey).

The log cleaner keeps the latest record of each key; a record without one could never be
cleaned, so a leader refuses the whole batch with INVALID_RECORD, naming every keyless record's
index in the batch (Produce v8+ ``record_errors``), and appends nothing of it.

This is the only record-level parsing on the produce path, and it runs for compacted topics only
(``LogConfig.compact``): other topics are still checked at the batch header level alone. A
compressed batch is decompressed for it, bounded like every decompression of a produced body
(``records.max_decompressed_bytes``). Diskless topics are never compacted (log/config.py), so
only classic partitions' leaders call it (``broker/produce_apis.py``, before ``append_as_leader``).
"""

from __future__ import annotations

from collections.abc import Sequence

from diskless import metrics
from diskless.protocol import records

from .compaction import parse_records
from .config import LogConfig


class KeylessRecords(records.InvalidBatch):
    """A compacted topic's batch with records without a key: INVALID_RECORD, with one record error
    (index in the batch, message) per such record."""

    def __init__(self, topic: str, partition: int, indexes: Sequence[int]) -> None:
        # Kafka's wording (TopicPartition prints as "topic-partition") and, for the partition's
        # error_message, LogValidator.processRecordErrors' summary of the first three.
        message = f"Compacted topic cannot accept message without key in topic partition {topic}-{partition}"
        self.record_errors = [(index, message) for index in indexes]
        shown = ", ".join(f"RecordError(batchIndex={index}, message='{message}')" for index in indexes[:3])
        super().__init__(
            "invalid_record",
            f"One or more records have been rejected due to {len(indexes)} record errors in total, and only "
            f"showing the first three errors at most: [{shown}]",
        )


def keyless_indexes(
    batch: bytes | bytearray | memoryview, header: records.BatchHeader, max_decompressed: int
) -> list[int]:
    """Indexes (0-based, in batch order) of the batch's records whose key is null.

    Raises records.InvalidBatch (corrupt_message) when the body does not decode, decompresses
    past ``max_decompressed`` bytes, or a record runs past its end, as Kafka's record iteration
    throws for a batch whose CRC was right but whose records are not."""
    body = records.decompress_body(header.compression, bytes(batch[records.HEADER_SIZE :]), max_decompressed)
    # The cleaner's record parser: one reader of record fields, as strict as Kafka's iteration.
    return [index for index, record in enumerate(parse_records(header, body)) if record.key is None]


def check_keys(batches: Sequence[memoryview], config: LogConfig, topic: str, partition: int) -> None:
    """Raise KeylessRecords if the log is compacted and a batch has a record without a key.

    Nothing is parsed for a log that is not compacted. A batch is first checked as the append
    would check it (``records.validate_batch``: magic, size, CRC...) so that a damaged batch gets
    the same error as on any other topic, before its records are read: Kafka's order too
    (analyzeAndValidateRecords, then LogValidator)."""
    if not config.compact:
        return
    max_decompressed = records.max_decompressed_bytes(config.max_message_bytes)
    for batch in batches:
        header = records.validate_batch(batch, config.max_message_bytes)
        indexes = keyless_indexes(batch, header, max_decompressed)
        if indexes:
            metrics.NO_KEY_COMPACTED_RECORDS.inc(len(indexes))
            raise KeylessRecords(topic, partition, indexes)

"""A produced batch in its topic's codec: ``compression.type`` applied as Kafka's LogValidator does.

With ``producer`` (the default) or the codec the producer already used, the batch is kept as it
came, byte for byte. Otherwise its records body is re-encoded in the topic's codec at the topic's
KIP-390 level, and the result must still fit ``max.message.bytes`` (Kafka refuses a batch that
grew past it with MESSAGE_TOO_LARGE, as it does when the producer's batch is too large).
"""

from __future__ import annotations

from diskless.protocol import compression, records

from .config import LogConfig


def in_topic_codec(
    batch: memoryview, header: records.BatchHeader, config: LogConfig
) -> tuple[memoryview | bytearray, records.BatchHeader]:
    """The batch (and its header) as the topic stores it; raises records.InvalidBatch."""
    if config.compression_type == "producer":
        return batch, header
    codec = compression.CODEC_IDS[config.compression_type]
    if codec == header.compression:
        return batch, header
    levels = {1: config.compression_gzip_level, 3: config.compression_lz4_level, 4: config.compression_zstd_level}
    converted = compression.with_codec(
        batch, header, codec, levels.get(codec, 0), records.max_decompressed_bytes(config.max_message_bytes)
    )
    if len(converted) > config.max_message_bytes:
        raise records.InvalidBatch(
            "message_too_large",
            f"batch of {len(converted)} bytes in {config.compression_type} exceeds max.message.bytes "
            f"{config.max_message_bytes}",
        )
    return converted, records.parse_header(converted)

"""A produced decompression bomb cannot make a broker allocate what its compression ratio says.

The broker checks produced batches at the header level only, so a 17 KB zstd batch carrying 512 MiB
of zeros is accepted. ListOffsets by timestamp is where the broker decodes records: there the bomb
must be skipped (its body inflates past 64 x max.message.bytes) while the broker's peak RSS stays
near that bound, and the lookup still finds the next batch. Unit level: test_decompression_bombs.py.
"""

from __future__ import annotations

import struct
from pathlib import Path

import cramjam
import crc32c
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from rawclient import Session, build_batch

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000
ZSTD = 4
FRAME_BYTES = 16 * 1024 * 1024
FRAMES = 32  # 512 MiB once inflated: eight times the 64 MiB bound of the default max.message.bytes


def _zigzag(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zstd_bomb() -> bytes:
    """One record whose value is FRAMES x FRAME_BYTES zeros, as concatenated zstd frames (a valid
    zstd stream) so the test itself never holds the inflated bytes."""
    size = FRAMES * FRAME_BYTES
    fields = b"\x00" + _zigzag(0) + _zigzag(0) + _zigzag(-1) + _zigzag(size)
    prefix = _zigzag(len(fields) + size + 1) + fields
    zeros = bytes(cramjam.zstd.compress(bytes(FRAME_BYTES)))
    payload = bytes(cramjam.zstd.compress(prefix)) + zeros * FRAMES + bytes(cramjam.zstd.compress(_zigzag(0)))
    header = struct.pack(">qiibIhiqqqhii", 0, 49 + len(payload), -1, 2, 0, ZSTD, 0, T0, T0, -1, -1, -1, 1)
    batch = bytearray(header + payload)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def offset_for(session: Session, topic: str, timestamp: int) -> tuple[int, int]:
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=(
            ListOffsetsTopic(
                name=topic,
                partitions=(ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp),),
            ),
        ),
    )
    part = session.request(request).topics[0].partitions[0]
    return int(part.error_code), int(part.offset)


def test_list_offsets_skips_a_zstd_bomb_with_bounded_memory(broker) -> None:
    topic = "bomb"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(20)
    bomb = zstd_bomb()
    assert len(bomb) < 64 * 1024
    with Session(broker.bootstrap, timeout=60) as session:
        assert int(session.produce(topic, 0, bomb).error_code) == 0
        after = build_batch([(None, b"after")], base_timestamp=T0 + 10)
        assert int(session.produce(topic, 0, after).error_code) == 0
        before_kib = peak_rss_kib(broker.proc.pid)
        at_t0 = offset_for(session, topic, T0)
        past_all = offset_for(session, topic, T0 + 11)
        growth_kib = peak_rss_kib(broker.proc.pid) - before_kib
    print(f"broker peak RSS growth over the bomb lookups: {growth_kib // 1024} MiB")
    assert broker.alive()
    # A buffer up to the 64 MiB bound plus one copy of it, with slack; the bomb is 512 MiB.
    assert growth_kib < 192 * 1024, growth_kib
    assert at_t0 == (0, 1)  # the bomb (offset 0) is skipped
    assert past_all == (0, -1)

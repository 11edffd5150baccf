"""Idle producers' idempotence state expires (Kafka's producer.id.expiration.ms, default a day).

Every idempotent producer session is a new producer id. Without expiry, each partition kept every
id it ever saw in memory and in every snapshot, for good. As Kafka's
ProducerStateManager.removeExpiredProducers, a producer idle for the expiration (by the newest
timestamp of its batches and markers) is forgotten, periodically and when the log is loaded,
unless it has a transaction open.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
from batches import values_batch
from loghelpers import T0, open_log

from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.log.producer_state import ProducerStateManager
from diskless.protocol import records

DAY_MS = 86_400_000
IDLE, BUSY, IN_TXN = 4000, 4001, 4002


def _append(log: PartitionLog, pid: int, seq: int, ts: int, transactional: bool = False) -> None:
    batch = values_batch(
        1, tag=str(pid), producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=transactional, start_ts=ts
    )
    log.append_as_leader([memoryview(batch)], 0, ts)
    log.high_watermark = log.log_end_offset


def test_idle_producers_expire_but_not_active_ones_or_open_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _append(log, IDLE, 0, T0)
    _append(log, IN_TXN, 0, T0, transactional=True)  # open, never ended
    _append(log, BUSY, 0, T0)
    _append(log, BUSY, 1, T0 + DAY_MS - 1000)
    log.apply_retention(T0 + DAY_MS)
    assert set(log.producer_state.producers) == {IN_TXN, BUSY}
    # A forgotten producer is new again: its next batch is taken at any sequence.
    _append(log, IDLE, 7, T0 + DAY_MS)
    assert log.producer_state.producers[IDLE].last_seq == 7


def test_idle_producers_expire_when_the_log_is_loaded(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _append(log, IDLE, 0, T0)
    _append(log, BUSY, 0, T0 + 2 * DAY_MS - 1000)
    log.roll(T0 + 2 * DAY_MS)  # a snapshot with both
    log.close()
    reopened = PartitionLog(str(tmp_path), LogConfig(), T0 + 2 * DAY_MS)
    assert set(reopened.producer_state.producers) == {BUSY}


def test_snapshots_keep_the_last_timestamp_and_older_ones_derive_it() -> None:
    state = ProducerStateManager()
    header = values_batch(1, producer_id=IDLE, producer_epoch=0, base_sequence=0)
    state.record(records.parse_header(header), 0, T0 + 5)
    assert ProducerStateManager.from_bytes(state.to_bytes()).producers[IDLE].last_timestamp == T0 + 5
    old_format = {IDLE: [0, [[0, 0, 0, 0, T0 + 5]], -1]}  # three fields: no last timestamp
    restored = ProducerStateManager.from_bytes(msgpack.packb(old_format))
    assert restored.producers[IDLE].last_timestamp == T0 + 5

"""Record format of ``__transaction_state`` and the transactional id -> partition mapping.

One record per state change of a transactional id, key/value, each starting with a format
version byte followed by msgpack:

=========  ================================  =====================================================
record     key                               value
=========  ================================  =====================================================
metadata   ``0x01`` + msgpack [txn_id]       ``0x01`` + msgpack [producer_id, last_producer_id,
                                             producer_epoch, last_producer_epoch, timeout_ms,
                                             state name, [[topic, partition], ...],
                                             txn_start_ms, last_update_ms]
removal    same key                          None (tombstone)
=========  ================================  =====================================================

The value is the full metadata, so the last record of a key is the state (compaction-friendly).
Unknown versions are refused rather than skipped; fields appended to a version-1 value by a later
revision are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from diskless.cluster.coordinator_records import Record, RecordFormatError, pack, unpack
from diskless.groups.records import java_string_hash

from .coordinator import TransactionCoordinatorCore, TransactionMetadata, TxnState

KEY_VERSION = 1
VALUE_VERSION = 1


@dataclass(frozen=True, slots=True)
class TxnTombstone:
    transactional_id: str


def txn_key(transactional_id: str) -> bytes:
    return pack(KEY_VERSION, [transactional_id])


def encode(meta: TransactionMetadata) -> Record:
    partitions = [[topic, partition] for topic, partition in sorted(meta.partitions)]
    value = [
        meta.producer_id,
        meta.last_producer_id,
        meta.producer_epoch,
        meta.last_producer_epoch,
        meta.timeout_ms,
        meta.state.value,
        partitions,
        meta.txn_start_ms,
        meta.last_update_ms,
    ]
    return txn_key(meta.transactional_id), pack(VALUE_VERSION, value)


def encode_tombstone(transactional_id: str) -> Record:
    return txn_key(transactional_id), None


def decode(key: bytes, value: bytes | None) -> TransactionMetadata | TxnTombstone:
    """Decode one record; raises RecordFormatError for anything this version cannot read."""
    version, items = unpack(key, "key")
    if version != KEY_VERSION:
        raise RecordFormatError(f"unsupported key version {version}")
    if len(items) != 1 or not isinstance(items[0], str):
        raise RecordFormatError("key needs [transactional_id]")
    txn_id = items[0]
    if value is None:
        return TxnTombstone(txn_id)
    value_version, fields = unpack(value, "value")
    if value_version != VALUE_VERSION or len(fields) < 9:
        raise RecordFormatError(f"unsupported value version {value_version}")
    pid, last_pid, epoch, last_epoch, timeout_ms, state, partitions, start_ms, update_ms = fields[:9]
    ints = (pid, last_pid, epoch, last_epoch, timeout_ms, start_ms, update_ms)
    if not all(isinstance(i, int) for i in ints) or not isinstance(partitions, list):
        raise RecordFormatError("value has wrong field types")
    try:
        txn_state = TxnState(state)
    except ValueError as exc:
        raise RecordFormatError(f"unknown state {state!r}") from exc
    tps = set()
    for tp in partitions:
        if not (isinstance(tp, list) and len(tp) == 2 and isinstance(tp[0], str) and isinstance(tp[1], int)):
            raise RecordFormatError("partition is not [topic, partition]")
        tps.add((tp[0], tp[1]))
    return TransactionMetadata(
        txn_id, pid, last_pid, epoch, last_epoch, timeout_ms, txn_state, frozenset(tps), start_ms, update_ms
    )


def replay(core: TransactionCoordinatorCore, records: Iterable[Record]) -> int:
    """Rebuild ``core`` from a partition's records, in log order; returns how many. Transactions
    left in a Prepare state then appear in ``core.pending_completions()``."""
    count = 0
    for key, value in records:
        record = decode(key, value)
        if isinstance(record, TxnTombstone):
            core.remove(record.transactional_id)
        else:
            core.load(record)
        count += 1
    return count


def partition_for(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition of a transactional id, as Kafka computes it:
    ``Utils.abs(transactionalId.hashCode) % transactionTopicPartitionCount``."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions

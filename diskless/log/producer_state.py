"""Idempotent-producer state of one partition, following Kafka's ProducerStateManager rules.

For every producer id the partition remembers its epoch, the metadata of its last five batches
(sequence range and assigned offsets) and the highest coordinator epoch of its transaction
markers. Before a leader append, ``check`` says whether a
batch is new, a duplicate of a recent batch (answer with the original offsets, append nothing)
or invalid (fenced epoch, sequence gap); ``check_epoch`` and ``check_marker`` are the same
guard for what a coordinator writes for a producer (transactional offsets, end-of-transaction
markers), which carry no sequence. After the append, ``record`` stores it. State survives
restarts through snapshots taken at clean shutdown and segment roll, then replay of the log tail.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Container
from dataclasses import dataclass, field

import msgpack

from diskless.protocol.records import NO_PRODUCER_ID, BatchHeader, InvalidBatch

MAX_CACHED_BATCHES = 5
INT32_MAX = 2**31 - 1
NO_EPOCH = -1
SNAPSHOT_SUFFIX = ".snapshot"


@dataclass(slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int = NO_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))
    # The newest transaction coordinator that wrote a marker here: an older one has been deposed.
    coordinator_epoch: int = NO_EPOCH
    # The newest timestamp of its batches and markers: when it was last active (expiry).
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


def _last_seq(header: BatchHeader) -> int:
    return (header.base_sequence + header.last_offset_delta) % (INT32_MAX + 1)


def _in_sequence(last: int, first: int) -> bool:
    return first == last + 1 or (first == 0 and last == INT32_MAX)


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> (epoch, base sequence, error) of the next batch, refused without being
        # appended by a leader that may accept the next one (note_refused). In memory only.
        self._refused: dict[int, tuple[int, int, str]] = {}

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Validate an incoming idempotent batch; returns the original metadata for a duplicate."""
        if header.producer_id == NO_PRODUCER_ID:
            return None
        entry = self.producers.get(header.producer_id)
        if entry is None or entry.epoch == NO_EPOCH:
            # Unknown producer (new, or its state was removed with old data): accept any sequence.
            return None
        if header.producer_epoch < entry.epoch:
            raise InvalidBatch(
                "invalid_producer_epoch",
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than {entry.epoch}",
            )
        if header.producer_epoch > entry.epoch:
            if header.base_sequence != 0:
                self._refuse_gap_we_made(header)
                raise InvalidBatch(
                    "out_of_order_sequence_number",
                    f"new epoch {header.producer_epoch} must start at sequence 0, got {header.base_sequence}",
                )
            return None
        last_seq = _last_seq(header)
        for cached in entry.batches:
            if cached.first_seq == header.base_sequence and cached.last_seq == last_seq:
                return cached
        if not _in_sequence(entry.last_seq, header.base_sequence):
            self._refuse_gap_we_made(header)
            raise InvalidBatch(
                "out_of_order_sequence_number",
                f"producer {header.producer_id}: expected sequence {entry.last_seq + 1}, got {header.base_sequence}",
            )
        return None

    def check_epoch(self, header: BatchHeader) -> None:
        """A batch a coordinator writes on a producer's behalf (TxnOffsetCommit): no sequence to
        check, but a fenced producer epoch is refused, as Kafka checks coordinator-origin appends."""
        entry = self.producers.get(header.producer_id)
        if entry is not None and header.producer_epoch < entry.epoch:
            raise InvalidBatch(
                "invalid_producer_epoch",
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than {entry.epoch}",
            )

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """A transaction coordinator's end-of-transaction marker (Kafka's appendEndTxnMarker rules).

        A marker at an older producer epoch than this partition has seen ends a transaction that
        is over: appended, it would end the producer's current one instead (INVALID_PRODUCER_EPOCH).
        A marker from an older coordinator epoch comes from a deposed coordinator, late: a COMMIT
        would expose the producer's next transaction before it ends (TRANSACTION_COORDINATOR_FENCED).
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise InvalidBatch(
                "invalid_producer_epoch",
                f"marker of producer {producer_id} at epoch {producer_epoch}, older than {entry.epoch}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise InvalidBatch(
                "transaction_coordinator_fenced",
                f"marker of producer {producer_id} from coordinator epoch {coordinator_epoch}, "
                f"older than {entry.coordinator_epoch}",
            )

    def note_refused(self, header: BatchHeader, error: str) -> None:
        """A leader refused this batch with the retriable ``error`` without appending it, for a
        passing reason: NOT_LEADER_OR_FOLLOWER while fenced (its etcd lease may have lapsed,
        cluster/lease.py; it may lead again at the same epoch), NOT_ENOUGH_REPLICAS.

        The batches the producer pipelined behind it then arrive with a gap of the leader's own
        making. Answered OUT_OF_ORDER_SEQUENCE_NUMBER, librdkafka bumps its epoch and resends all
        it has unacknowledged under new sequences, so a batch another (deposed) leader appended but
        answered NOT_LEADER for is written twice. ``check`` refuses them with the same error,
        until a batch of the producer is appended (tests/unit/test_fenced_produce.py)."""
        if header.producer_id == NO_PRODUCER_ID or header.is_control:
            return
        entry = self.producers.get(header.producer_id)
        if entry is None or entry.epoch == NO_EPOCH or header.producer_id in self._refused:
            return  # an unknown producer may start anywhere; an earlier refusal opened the gap
        next_in_epoch = header.producer_epoch == entry.epoch and _in_sequence(entry.last_seq, header.base_sequence)
        first_of_new_epoch = header.producer_epoch > entry.epoch and header.base_sequence == 0
        if next_in_epoch or first_of_new_epoch:
            self._refused[header.producer_id] = (header.producer_epoch, header.base_sequence, error)

    def _refuse_gap_we_made(self, header: BatchHeader) -> None:
        refused = self._refused.get(header.producer_id)
        # Only batches after the refused one: an older retry that left the cache stays out of order.
        ahead = refused is not None and 0 < (header.base_sequence - refused[1]) % (INT32_MAX + 1) < 2**30
        if refused is not None and refused[0] == header.producer_epoch and ahead:
            raise InvalidBatch(
                refused[2],
                f"producer {header.producer_id}: sequence {refused[1]} was refused ({refused[2]}); "
                f"resend from it (got {header.base_sequence})",
            )

    def record(
        self, header: BatchHeader, first_offset: int, max_timestamp: int, coordinator_epoch: int = NO_EPOCH
    ) -> None:
        """Remember an appended batch (leader or follower, or replay during recovery);
        ``coordinator_epoch`` is a marker's."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        self._refused.pop(header.producer_id, None)  # the gap is closed (or another leader's)
        entry = self.producers.setdefault(header.producer_id, ProducerEntry())
        entry.last_timestamp = max(entry.last_timestamp, max_timestamp)
        if header.is_control:
            # Transaction markers carry no sequence; a newer epoch still fences older producers.
            # (A marker the leader writes itself has coordinator epoch -1: max keeps the fence.)
            entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
            if header.producer_epoch > entry.epoch:
                entry.epoch = header.producer_epoch
                entry.batches.clear()
            return
        if header.producer_epoch != entry.epoch:
            entry.epoch = header.producer_epoch
            entry.batches.clear()
        entry.batches.append(
            BatchMetadata(
                header.base_sequence,
                _last_seq(header),
                first_offset,
                first_offset + header.last_offset_delta,
                max_timestamp,
            )
        )

    # --- snapshots ---------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            {
                pid: [
                    e.epoch,
                    [[b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.max_timestamp] for b in e.batches],
                    e.coordinator_epoch,
                    e.last_timestamp,
                ]
                for pid, e in self.producers.items()
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ProducerStateManager:
        state = cls()
        for pid, (epoch, batches, *rest) in msgpack.unpackb(data, strict_map_key=False).items():
            # Snapshots written before coordinator epochs (last timestamps) were kept: two (three) fields.
            entry = ProducerEntry(epoch, coordinator_epoch=rest[0] if rest else NO_EPOCH)
            entry.batches.extend(BatchMetadata(*b) for b in batches)
            newest = max((b.max_timestamp for b in entry.batches), default=-1)
            entry.last_timestamp = rest[1] if len(rest) > 1 else newest
            state.producers[int(pid)] = entry
        return state

    def expire(self, now_ms: int, expiration_ms: int, open_transactions: Container[int]) -> int:
        """Forget producers idle for ``expiration_ms`` (Kafka's producer.id.expiration.ms), except
        those with an open transaction; returns how many. Without this every producer session
        (each a new producer id) stayed in memory and in every snapshot for good. A forgotten
        producer is new again: its next batch is taken at any sequence, as after its data expired."""
        idle = [
            pid
            for pid, entry in self.producers.items()
            if now_ms - entry.last_timestamp >= expiration_ms and pid not in open_transactions
        ]
        for pid in idle:
            del self.producers[pid]
        return len(idle)


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def write_snapshot(directory: str, offset: int, state: ProducerStateManager) -> None:
    path = snapshot_path(directory, offset)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(state.to_bytes())
    os.replace(tmp, path)
    # Keep only the two most recent snapshots.
    for old in list_snapshots(directory)[:-2]:
        os.unlink(snapshot_path(directory, old))


def list_snapshots(directory: str) -> list[int]:
    return sorted(int(n[: -len(SNAPSHOT_SUFFIX)]) for n in os.listdir(directory) if n.endswith(SNAPSHOT_SUFFIX))


def delete_snapshots(directory: str) -> None:
    """Remove every snapshot: the log they describe is gone (Kafka's truncateFullyAndStartAt)."""
    for offset in list_snapshots(directory):
        os.unlink(snapshot_path(directory, offset))


def load_latest_snapshot(directory: str, max_offset: int, min_offset: int = 0) -> tuple[int, ProducerStateManager]:
    """The newest snapshot in [``min_offset``, ``max_offset``]; those outside are deleted.

    Newer ones are stale after truncation. Older ones than ``min_offset`` (the log start) are
    incomplete: the state is rebuilt by replaying the log from there, and the batches between
    such a snapshot and the log start (deleted by DeleteRecords or retention) would be missing,
    leaving their producers at an old sequence that their next batch is refused against
    (OUT_OF_ORDER_SEQUENCE_NUMBER). As Kafka's truncateAndReload, they are dropped: a producer
    known only from deleted batches is then unknown and may continue at any sequence. (Kafka also
    drops one exactly at the log start, which is complete; it is kept.)"""
    for offset in reversed(list_snapshots(directory)):
        if offset > max_offset or offset < min_offset:
            os.unlink(snapshot_path(directory, offset))
            continue
        try:
            with open(snapshot_path(directory, offset), "rb") as f:
                return offset, ProducerStateManager.from_bytes(f.read())
        except (OSError, ValueError, msgpack.UnpackException):
            continue
    return 0, ProducerStateManager()

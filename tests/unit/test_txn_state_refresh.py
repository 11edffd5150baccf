"""A Prepare* transaction state is written again before time retention takes its record.

``__transaction_state`` is deleted by time here (Kafka compacts it). A transaction whose markers
could not be written for longer than the topic's retention.ms (a partition offline for days) lost
its PrepareCommit record: a coordinator loaded after a failover never finished it, and the
partitions still lacking the marker kept their last stable offset stuck for good. The coordinator
now writes a Prepare* state again, unchanged but for its time, every half retention
(``TxnConfig.refresh_after_ms``), never while its markers are in flight.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from loghelpers import T0, open_log

from diskless.broker.txn_shell import TxnShell
from diskless.config import BrokerConfig
from diskless.log.partition_log import PartitionLog
from diskless.protocol import records as wire
from diskless.transactions import records
from diskless.transactions.coordinator import TransactionCoordinatorCore, TransactionMetadata, TxnConfig, TxnState

DAY_MS = 86_400_000
RETENTION_MS = 7 * DAY_MS  # the topic's retention.ms (the broker default)
PARTITIONS = frozenset({("t", 0), ("t", 1)})


def _prepare(at_ms: int) -> TransactionMetadata:
    return TransactionMetadata("txn", 7, -1, 0, -1, 60_000, TxnState.PREPARE_COMMIT, PARTITIONS, at_ms - 1000, at_ms)


def _append(log: PartitionLog, meta: TransactionMetadata, at_ms: int) -> None:
    log.append_as_leader([memoryview(wire.build_batch([records.encode(meta)], at_ms))], 0, at_ms)
    log.high_watermark = log.log_end_offset
    log.roll(at_ms)  # a busy partition: other ids' records fill segments


def test_a_stuck_prepare_state_is_written_again_at_half_the_retention() -> None:
    core = TransactionCoordinatorCore(TxnConfig(refresh_after_ms=RETENTION_MS // 2), partition=0, coordinator_epoch=3)
    core.load(_prepare(T0))
    due = T0 + RETENTION_MS // 2 + 1
    assert core.tick(due - 1) == []
    work = core.begin_markers("txn")
    assert work is not None
    assert core.tick(due) == [], "written again while its markers are in flight"
    core.release_markers(work, due)  # the markers failed: a partition is offline
    (refresh,) = core.tick(due + 200)
    assert refresh.target == replace(_prepare(T0), last_update_ms=due + 200)  # the same state, newer
    core.complete_transit(refresh, ErrorCode.none, due + 200)
    assert core.get("txn").state is TxnState.PREPARE_COMMIT  # type: ignore[union-attr]
    assert core.pending_completions(due + 300) == ["txn"]  # the marker work goes on
    assert core.tick(due + 300) == []  # the next refresh is half a retention away
    assert core.next_deadline_ms() is not None


def test_a_prepare_state_stuck_for_longer_than_the_retention_survives_a_failover(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    shell = TxnShell(SimpleNamespace(config=BrokerConfig()))
    core = shell.load(SimpleNamespace(index=0, leader_epoch=3, log=log))
    assert core.config.refresh_after_ms == RETENTION_MS // 2  # from the topic's retention
    core.load(_prepare(T0))
    _append(log, _prepare(T0), T0)
    now = T0
    while now < T0 + 8 * DAY_MS:  # the shell's timer, persisting what tick returns
        now += DAY_MS
        for transit in core.tick(now):
            _append(log, transit.target, now)
            core.complete_transit(transit, ErrorCode.none, now)
    log.apply_retention(now)
    assert log.log_start_offset > 0, "retention deleted the first PrepareCommit record"

    reloaded = shell.load(SimpleNamespace(index=0, leader_epoch=4, log=log))
    assert reloaded.pending_completions() == ["txn"]


def test_an_idle_transactional_id_is_forgotten_after_the_expiration() -> None:
    """transactional.id.expiration.ms (Kafka's removeExpiredTransactionalIds): an id Complete or
    Empty for that long leaves the live core, as its records leave the log with retention; it
    used to stay in memory for good, and only a coordinator loaded after a failover forgot it."""
    expiration = 7 * DAY_MS
    core = TransactionCoordinatorCore(
        TxnConfig(refresh_after_ms=RETENTION_MS // 2, transactional_id_expiration_ms=expiration)
    )
    done = replace(_prepare(T0), state=TxnState.COMPLETE_COMMIT, partitions=frozenset())
    core.load(done)
    core.load(replace(_prepare(T0), transactional_id="stuck"))  # Prepare*: never expires
    assert core.next_deadline_ms() is not None and core.next_deadline_ms() <= T0 + expiration  # type: ignore[operator]
    core.tick(T0 + expiration - 1)
    assert core.get("txn") is not None
    core.tick(T0 + expiration)
    assert core.get("txn") is None
    assert core.get("stuck") is not None

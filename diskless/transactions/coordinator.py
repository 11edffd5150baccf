"""Sans-IO transaction coordinator: Kafka's TransactionCoordinator and TransactionStateManager.

``TransactionCoordinatorCore`` holds the transactional ids that map to one ``__transaction_state``
partition and follows Kafka's semantics (KIP-98, with KIP-360 epoch bumps and KIP-588 fencing;
not KIP-890 "transactions v2"):

- States Empty -> Ongoing -> PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort -> Ongoing
  (next transaction) ... ``Dead`` and ``PrepareEpochFence`` exist for the record format but this
  core never persists them (expiration of transactional ids is not implemented; the epoch fence
  is folded into the PrepareAbort transition, as Kafka does when it writes it).
- Every change goes through a *transit*: a request returns a ``Transit`` carrying the metadata to
  persist and marks the transactional id "pending"; the shell writes ``transit.target`` to the log
  and hands the outcome to ``complete_transit``, which makes it current (or drops it). While a
  transit is pending, other requests for the id get CONCURRENT_TRANSACTIONS, exactly like Kafka's
  ``pendingState``.
- InitProducerId bumps the epoch of a complete transaction (a new producer id once the epoch is
  exhausted); on an Ongoing transaction it fences the producer (epoch bump, in memory at once),
  aborts the transaction and answers CONCURRENT_TRANSACTIONS so the client retries, and the retry
  then bumps the epoch again.
- InitProducerId right after a transaction the client itself aborted first aborts that
  transaction's partitions again, with the bumped epoch (a FENCE transit: CONCURRENT_TRANSACTIONS,
  markers, then the retry gets the epoch). A diskless produce request the client gave up on can be
  committed after the first ABORT marker; the second marker closes the transaction it opened and
  makes the partition refuse the old epoch. Kafka has no such step (KIP-890 verifies partitions).
- EndTxn persists PrepareCommit/PrepareAbort; the client is answered then. Markers are written
  afterwards: ``begin_markers`` hands out the work (partitions still lacking their marker),
  ``markers_written`` takes the per-partition results, and once every partition has its marker it
  returns the transit to CompleteCommit/CompleteAbort. Partitions that failed are retried after
  ``marker_retry_backoff_ms`` (see ``pending_completions``/``next_deadline_ms``).
- ``verify_partitions`` answers a partition leader's question "is this partition in the producer's
  ongoing transaction?" (AddPartitionsToTxn verifyOnly, KIP-890 part 1). Leaders of diskless
  partitions ask it before taking a transactional batch whose commit may come late
  (``diskless/log/txn_verification.py``); it changes nothing.
- ``tick(now_ms)`` fences and aborts transactions Ongoing for longer than their timeout (Kafka's
  abortTimedOutTransactions) and returns the transits to persist.

Nothing here does I/O or keeps time: ``now_ms`` is passed in. After a coordinator failover the
shell replays ``__transaction_state`` into a fresh core (``records.replay``); transactions found in
a Prepare state show up in ``pending_completions`` and must have their markers (re)sent.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

TopicPartition = tuple[str, int]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_PRODUCER_EPOCH = 32767  # Short.MaxValue


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"


PREPARE_STATES = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})
COMPLETE_STATES = frozenset({TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
_EXPIRABLE_STATES = COMPLETE_STATES | {TxnState.EMPTY}
_ADDABLE_STATES = COMPLETE_STATES | {TxnState.EMPTY, TxnState.ONGOING}


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps the last epoch for fencing: a producer at Short.MaxValue - 1 needs a new id."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnConfig:
    """Kafka's transaction.* broker settings, with Kafka's defaults."""

    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    # How long to wait before resending markers (or the Complete record) after a failure.
    marker_retry_backoff_ms: int = 100
    # A Prepare* state whose record is older than this is written again, unchanged but for its
    # time (-1: never). ``__transaction_state`` is not compacted here but deleted by time, so a
    # transaction whose markers cannot be written for longer than the topic's retention (a
    # partition offline for days) would leave the log, and a coordinator loaded after a failover
    # would never finish it. The shell sets half the topic's retention.ms.
    refresh_after_ms: int = -1
    # transactional.id.expiration.ms: an id idle (Complete or Empty) for this long is forgotten, as
    # Kafka's removeExpiredTransactionalIds; its records leave the log with retention meanwhile, so
    # a coordinator loaded after a failover has forgotten it too. -1: never.
    transactional_id_expiration_ms: int = 604_800_000


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    """The persisted state of one transactional id (one ``__transaction_state`` record)."""

    transactional_id: str
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1
    last_update_ms: int = -1


class TransitKind(enum.Enum):
    INIT = "init"  # InitProducerId on a complete transaction: answer with the new producer id/epoch
    ADD = "add"  # AddPartitionsToTxn / AddOffsetsToTxn
    END = "end"  # EndTxn from the client: Ongoing -> Prepare*
    FENCE = "fence"  # epoch bump + PrepareAbort (InitProducerId on an Ongoing txn, or a timeout)
    COMPLETE = "complete"  # Prepare* -> Complete* once every marker is written
    REFRESH = "refresh"  # a Prepare* state written again before retention takes its record


@dataclass(frozen=True, slots=True, eq=False)
class Transit:
    """A pending change: persist ``target``, then pass the outcome to ``complete_transit``."""

    target: TransactionMetadata
    kind: TransitKind

    @property
    def transactional_id(self) -> str:
        return self.target.transactional_id


@dataclass(frozen=True, slots=True, eq=False)
class MarkerWork:
    """Markers to write for a transaction in a Prepare state."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    partitions: tuple[TopicPartition, ...]
    metadata: TransactionMetadata
    coordinator_epoch: int  # sent with the markers: partition leaders refuse older ones


class NeedProducerId(enum.Enum):
    """InitProducerId needs a fresh producer id: allocate one and call again with it."""

    NEED = "need"


NEED_PRODUCER_ID = NeedProducerId.NEED

InitOutcome = ErrorCode | Transit | NeedProducerId

# Marker results after which a partition needs no more marker: written, or the partition is gone.
_MARKER_DONE = frozenset({ErrorCode.none, ErrorCode.unknown_topic_or_partition})
# Marker results saying this coordinator is deposed: a newer one (or a newer producer epoch) has
# been at the partition.
_MARKER_FENCED = frozenset({ErrorCode.transaction_coordinator_fenced, ErrorCode.invalid_producer_epoch})


@dataclass(slots=True, eq=False)
class _Entry:
    meta: TransactionMetadata
    pending: Transit | None = None
    # The in-memory epoch bump of a fence whose write failed: do not bump again (Kafka's
    # hasFailedEpochFence), the bumped epoch was never handed to anyone.
    failed_epoch_fence: bool = False
    # Prepare* only: partitions still lacking their marker, whether a driver holds the work,
    # and when a driver may take it next.
    unmarked: set[TopicPartition] = field(default_factory=set)
    claimed: bool = False
    retry_at_ms: int = 0
    # The partitions of the last transaction if the client aborted it (PrepareAbort by EndTxn,
    # markers at the producer's own epoch): resealed at the next epoch bump (see init_producer_id).
    client_aborted: frozenset[TopicPartition] = frozenset()
    reseal: frozenset[TopicPartition] = frozenset()


class TransactionCoordinatorCore:
    """The transactional ids of one ``__transaction_state`` partition."""

    def __init__(self, config: TxnConfig | None = None, partition: int = 0, coordinator_epoch: int = 0) -> None:
        self.config = config or TxnConfig()
        self.partition = partition
        # The leader epoch of the transaction-state partition this core was loaded at (Kafka's
        # coordinator epoch): partition leaders fence markers of a deposed coordinator by it.
        self.coordinator_epoch = coordinator_epoch
        self._txns: dict[str, _Entry] = {}
        self._unloaded = False

    # --- inspection ------------------------------------------------------------------------------

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        entry = self._txns.get(transactional_id)
        return entry.meta if entry is not None else None

    def transactional_ids(self) -> list[str]:
        return list(self._txns)

    def is_pending(self, transactional_id: str) -> bool:
        entry = self._txns.get(transactional_id)
        return entry is not None and entry.pending is not None

    def listing(
        self,
        now_ms: int,
        producer_ids: Collection[int] = (),
        states: Collection[TxnState] | None = None,
        longer_than_ms: int = -1,
    ) -> list[TransactionMetadata]:
        """The transactional ids ListTransactions shows, with Kafka's filters (listTransactionStates):
        of these producer ids (empty: any), in these states (None: any), and, with
        ``longer_than_ms`` >= 0, whose transaction started more than that long ago. A Dead id is
        never shown: it is on its way out."""
        shown = []
        for entry in self._txns.values():
            meta = entry.meta
            if meta.state is TxnState.DEAD:
                continue
            if producer_ids and meta.producer_id not in producer_ids:
                continue
            if states is not None and meta.state not in states:
                continue
            if longer_than_ms >= 0 and now_ms - meta.txn_start_ms <= longer_than_ms:
                continue
            shown.append(meta)
        return shown

    def shutdown(self) -> None:
        """The partition moved away: later outcomes of transits and markers are ignored."""
        self._unloaded = True

    # --- replay ----------------------------------------------------------------------------------

    def load(self, meta: TransactionMetadata) -> None:
        """Install a replayed record (later records of an id replace earlier ones)."""
        entry = _Entry(meta)
        if meta.state in PREPARE_STATES:
            entry.unmarked = set(meta.partitions)
        previous = self._txns.get(meta.transactional_id)
        if (
            meta.state is TxnState.COMPLETE_ABORT
            and previous is not None
            and previous.meta.state is TxnState.PREPARE_ABORT
            and previous.meta.producer_id == meta.producer_id
        ):
            # The log does not say whether the client or a fence aborted: reseal either way (one
            # needless round of markers at most, after a failover).
            entry.reseal = previous.meta.partitions
        self._txns[meta.transactional_id] = entry

    def remove(self, transactional_id: str) -> None:
        self._txns.pop(transactional_id, None)

    # --- InitProducerId --------------------------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected: tuple[int, int] | None,
        now_ms: int,
        new_producer_id: int | None = None,
    ) -> InitOutcome:
        """InitProducerId of a transactional producer; ``expected`` is the (producer id, epoch) the
        request carried (v3+), None when it carried none. Returns an error, NEED_PRODUCER_ID (call
        again with ``new_producer_id``), or a transit: INIT (answer with its target's producer id
        and epoch once persisted) or FENCE (answer CONCURRENT_TRANSACTIONS once persisted, and
        complete the abort)."""
        if timeout_ms <= 0 or timeout_ms > self.config.max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout
        entry = self._txns.get(transactional_id)
        if entry is None:
            if new_producer_id is None:
                return NEED_PRODUCER_ID
            # In memory only until the INIT transit is persisted, as Kafka does.
            entry = _Entry(
                TransactionMetadata(
                    transactional_id,
                    new_producer_id,
                    NO_PRODUCER_ID,
                    NO_PRODUCER_EPOCH,
                    NO_PRODUCER_EPOCH,
                    timeout_ms,
                    TxnState.EMPTY,
                    last_update_ms=now_ms,
                )
            )
            self._txns[transactional_id] = entry
            new_producer_id = None
        meta = entry.meta
        if entry.pending is not None:
            return ErrorCode.concurrent_transactions
        if expected is not None and not _valid_expected(meta, expected):
            return ErrorCode.producer_fenced
        state = meta.state
        if state in PREPARE_STATES:
            return ErrorCode.concurrent_transactions
        if state is TxnState.ONGOING:
            return self._fence(entry, now_ms)
        if state not in COMPLETE_STATES and state is not TxnState.EMPTY:
            return ErrorCode.unknown_server_error  # Dead / PrepareEpochFence are never current here
        current = expected is None or expected[1] == meta.producer_epoch
        if entry.reseal and current and not is_epoch_exhausted(meta.producer_epoch):
            return self._reseal(entry, expected is not None, now_ms)
        if is_epoch_exhausted(meta.producer_epoch) and (expected is None or expected[1] == meta.producer_epoch):
            if new_producer_id is None:
                return NEED_PRODUCER_ID
            target = replace(
                meta,
                producer_id=new_producer_id,
                last_producer_id=meta.producer_id,
                producer_epoch=0,
                last_producer_epoch=meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH,
                timeout_ms=timeout_ms,
                state=TxnState.EMPTY,
                partitions=frozenset(),
                txn_start_ms=-1,
                last_update_ms=now_ms,
            )
        else:
            if expected is None:
                epochs = (meta.producer_epoch + 1, NO_PRODUCER_EPOCH)
            elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == meta.producer_epoch:
                epochs = (meta.producer_epoch + 1, meta.producer_epoch)
            elif expected[1] == meta.last_producer_epoch:
                # A retry of a bump whose answer the producer never got: answer the same epoch.
                epochs = (meta.producer_epoch, meta.last_producer_epoch)
            else:
                return ErrorCode.producer_fenced
            target = replace(
                meta,
                producer_epoch=epochs[0],
                last_producer_epoch=epochs[1],
                timeout_ms=timeout_ms,
                state=TxnState.EMPTY,
                partitions=frozenset(),
                txn_start_ms=-1,
                last_update_ms=now_ms,
            )
        return self._begin(entry, target, TransitKind.INIT)

    # --- AddPartitionsToTxn / AddOffsetsToTxn ----------------------------------------------------

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[TopicPartition] | frozenset[TopicPartition],
        now_ms: int,
    ) -> ErrorCode | Transit:
        """NONE when nothing needs persisting (all already in the Ongoing transaction)."""
        entry = self._txns.get(transactional_id)
        error = _check_producer(entry, producer_id, producer_epoch)
        if error is not None:
            return error
        assert entry is not None
        meta = entry.meta
        if entry.pending is not None or meta.state in PREPARE_STATES:
            return ErrorCode.concurrent_transactions
        if meta.state is TxnState.ONGOING and set(partitions) <= meta.partitions:
            return ErrorCode.none
        if meta.state not in _ADDABLE_STATES:
            return ErrorCode.invalid_txn_state
        start = meta.txn_start_ms if meta.state is TxnState.ONGOING else now_ms
        target = replace(
            meta,
            state=TxnState.ONGOING,
            partitions=meta.partitions | frozenset(partitions),
            txn_start_ms=start,
            last_update_ms=now_ms,
        )
        return self._begin(entry, target, TransitKind.ADD)

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn with verifyOnly (KIP-890 part 1), asked by a partition leader before
        it takes a transactional batch: NONE for each partition in the producer's Ongoing
        transaction, INVALID_TXN_STATE for the others. A transaction being ended (EndTxn, a fence,
        markers in flight) answers CONCURRENT_TRANSACTIONS; an ADD being persisted does not count
        (the producer may write to partitions added earlier while it adds more)."""
        entry = self._txns.get(transactional_id)
        error = _check_producer(entry, producer_id, producer_epoch)
        if error is None:
            assert entry is not None
            meta = entry.meta
            if (
                entry.pending is not None and entry.pending.kind is not TransitKind.ADD
            ) or meta.state in PREPARE_STATES:
                error = ErrorCode.concurrent_transactions
            elif meta.state is not TxnState.ONGOING:
                error = ErrorCode.invalid_txn_state
        if error is not None:
            return dict.fromkeys(partitions, error)
        assert entry is not None
        return {tp: ErrorCode.none if tp in entry.meta.partitions else ErrorCode.invalid_txn_state for tp in partitions}

    # --- EndTxn ----------------------------------------------------------------------------------

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool, now_ms: int
    ) -> ErrorCode | Transit:
        """An error (NONE for a retry of a completed EndTxn) or the END transit to Prepare*."""
        entry = self._txns.get(transactional_id)
        error = _check_producer(entry, producer_id, producer_epoch)
        if error is not None:
            return error
        assert entry is not None
        if entry.pending is not None:
            return ErrorCode.concurrent_transactions
        meta = entry.meta
        match meta.state:
            case TxnState.ONGOING:
                state = TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT
                return self._begin(entry, replace(meta, state=state, last_update_ms=now_ms), TransitKind.END)
            case TxnState.COMPLETE_COMMIT:
                return ErrorCode.none if committed else ErrorCode.invalid_txn_state
            case TxnState.COMPLETE_ABORT:
                return ErrorCode.none if not committed else ErrorCode.invalid_txn_state
            case TxnState.PREPARE_COMMIT:
                return ErrorCode.concurrent_transactions if committed else ErrorCode.invalid_txn_state
            case TxnState.PREPARE_ABORT:
                return ErrorCode.concurrent_transactions if not committed else ErrorCode.invalid_txn_state
            case _:
                return ErrorCode.invalid_txn_state

    # --- transits --------------------------------------------------------------------------------

    def _begin(self, entry: _Entry, target: TransactionMetadata, kind: TransitKind) -> Transit:
        transit = Transit(target, kind)
        entry.pending = transit
        return transit

    def _fence(self, entry: _Entry, now_ms: int) -> Transit:
        """Bump the epoch now (the producer is fenced at once) and abort: Kafka's
        prepareFenceProducerEpoch followed by endTransaction(ABORT, isFromClient=false)."""
        meta = entry.meta
        epoch = meta.producer_epoch
        if not entry.failed_epoch_fence and epoch < MAX_PRODUCER_EPOCH:
            epoch += 1
        entry.meta = replace(meta, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH)
        target = replace(entry.meta, state=TxnState.PREPARE_ABORT, last_update_ms=now_ms)
        return self._begin(entry, target, TransitKind.FENCE)

    def _reseal(self, entry: _Entry, from_producer: bool, now_ms: int) -> Transit:
        """Abort the client-aborted last transaction's partitions again, with the next epoch,
        before that epoch is handed out (the caller answers CONCURRENT_TRANSACTIONS and the
        producer retries, as after a fence).

        The client aborts after a produce request timed out, and KIP-360 clients then bump their
        epoch here. That request may still reach a partition after the first ABORT marker (a
        diskless commit from a late flush) and open a transaction nobody will end. An ABORT
        marker at the new epoch closes it, and the partition then refuses the old epoch; since
        it is written before the producer learns the new epoch, it cannot abort the producer's
        next transaction. ``last_producer_epoch`` lets the producer's retry get this epoch.
        """
        meta = entry.meta
        target = replace(
            meta,
            producer_epoch=meta.producer_epoch + 1,
            last_producer_epoch=meta.producer_epoch if from_producer else NO_PRODUCER_EPOCH,
            state=TxnState.PREPARE_ABORT,
            partitions=entry.reseal,
            last_update_ms=now_ms,
        )
        return self._begin(entry, target, TransitKind.FENCE)

    def complete_transit(self, transit: Transit, error: ErrorCode, now_ms: int) -> None:
        """The outcome of persisting ``transit`` (NONE: durable). Stale transits are ignored."""
        entry = self._txns.get(transit.transactional_id)
        if self._unloaded or entry is None or entry.pending is not transit:
            return
        entry.pending = None
        target = transit.target
        if transit.kind is TransitKind.REFRESH:
            if error is ErrorCode.none:
                entry.meta = target  # the same state, written again: the marker work goes on as it was
            return
        if error is ErrorCode.none:
            entry.meta = target
            entry.failed_epoch_fence = False
            if target.state is TxnState.PREPARE_ABORT:
                entry.client_aborted = target.partitions if transit.kind is TransitKind.END else frozenset()
            entry.reseal = entry.client_aborted if target.state is TxnState.COMPLETE_ABORT else frozenset()
            if target.state in PREPARE_STATES:
                entry.unmarked = set(target.partitions)
                entry.claimed = False
                entry.retry_at_ms = now_ms
            elif target.state in COMPLETE_STATES:
                entry.unmarked = set()
                entry.claimed = False
            return
        if transit.kind is TransitKind.FENCE:
            entry.failed_epoch_fence = True
        elif transit.kind is TransitKind.COMPLETE:
            entry.claimed = False
            entry.retry_at_ms = now_ms + self.config.marker_retry_backoff_ms

    # --- markers ---------------------------------------------------------------------------------

    def pending_completions(self, now_ms: int | None = None) -> list[str]:
        """Transactions in a Prepare state whose markers (or Complete record) nobody is writing
        and whose retry time has come (any time if ``now_ms`` is None)."""
        return [
            txn_id
            for txn_id, entry in self._txns.items()
            if entry.meta.state in PREPARE_STATES
            and entry.pending is None
            and not entry.claimed
            and (now_ms is None or entry.retry_at_ms <= now_ms)
        ]

    def begin_markers(self, transactional_id: str) -> MarkerWork | None:
        """Claim the marker work of a Prepare* transaction (None: nothing to do or already claimed).
        ``partitions`` may be empty: then only the Complete record is missing."""
        entry = self._txns.get(transactional_id)
        if self._unloaded or entry is None or entry.pending is not None or entry.claimed:
            return None
        meta = entry.meta
        if meta.state not in PREPARE_STATES:
            return None
        entry.claimed = True
        return MarkerWork(
            transactional_id,
            meta.producer_id,
            meta.producer_epoch,
            meta.state is TxnState.PREPARE_COMMIT,
            tuple(sorted(entry.unmarked)),
            meta,
            self.coordinator_epoch,
        )

    def markers_written(
        self, work: MarkerWork, results: dict[TopicPartition, ErrorCode], now_ms: int
    ) -> Transit | None:
        """Results of writing ``work``'s markers (partitions missing from ``results`` failed).
        Returns the COMPLETE transit once every partition has its marker; otherwise the work is
        released and offered again by ``pending_completions`` after the retry backoff."""
        entry = self._txns.get(work.transactional_id)
        if self._unloaded or entry is None or not entry.claimed or entry.meta is not work.metadata:
            return None
        for tp, error in results.items():
            if error in _MARKER_DONE:
                entry.unmarked.discard(tp)
        if any(error in _MARKER_FENCED for error in results.values()):
            # Deposed: the newer coordinator finishes this transaction. As Kafka does, stop
            # sending; the work stays claimed until this core is unloaded.
            return None
        if entry.unmarked:
            entry.claimed = False
            entry.retry_at_ms = now_ms + self.config.marker_retry_backoff_ms
            return None
        meta = entry.meta
        state = TxnState.COMPLETE_COMMIT if meta.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        target = replace(meta, state=state, partitions=frozenset(), last_update_ms=now_ms)
        return self._begin(entry, target, TransitKind.COMPLETE)

    def release_markers(self, work: MarkerWork, now_ms: int) -> None:
        """Give the work back without results (the driver failed); retried after the backoff."""
        entry = self._txns.get(work.transactional_id)
        if entry is not None and entry.claimed and entry.meta is work.metadata and entry.pending is None:
            entry.claimed = False
            entry.retry_at_ms = now_ms + self.config.marker_retry_backoff_ms

    # --- timers ----------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[Transit]:
        """Fence and abort every transaction Ongoing for longer than its timeout, and write again
        Prepare* states whose record is about to leave the log (``refresh_after_ms``); returns the
        transits to persist (then ``complete_transit``; drive the markers of FENCE ones)."""
        if self._unloaded:
            return []
        fences = [
            self._fence(entry, now_ms)
            for entry in list(self._txns.values())
            if entry.pending is None
            and entry.meta.state is TxnState.ONGOING
            and entry.meta.txn_start_ms + entry.meta.timeout_ms < now_ms
        ]
        refreshes = []
        for txn_id, entry in list(self._txns.items()):
            due = self._refresh_due(entry)
            if due is not None and due <= now_ms:
                refreshes.append(self._begin(entry, replace(entry.meta, last_update_ms=now_ms), TransitKind.REFRESH))
            expires = self._expiry_due(entry)
            if expires is not None and expires <= now_ms:
                del self._txns[txn_id]
        return fences + refreshes

    def _expiry_due(self, entry: _Entry) -> int | None:
        """When an idle transactional id is forgotten (None: not one that expires)."""
        expiration = self.config.transactional_id_expiration_ms
        if expiration < 0 or entry.pending is not None or entry.meta.state not in _EXPIRABLE_STATES:
            return None
        return entry.meta.last_update_ms + expiration

    def _refresh_due(self, entry: _Entry) -> int | None:
        """When a Prepare* state's record must be written again (None: not one to refresh now;
        not while its markers are in flight, whose Complete record comes next anyway)."""
        meta = entry.meta
        if self.config.refresh_after_ms < 0 or entry.pending is not None or entry.claimed:
            return None
        if meta.state not in PREPARE_STATES:
            return None
        return meta.last_update_ms + self.config.refresh_after_ms + 1

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` may have work (a timeout) or ``pending_completions`` a retry."""
        deadlines = []
        for entry in self._txns.values():
            if entry.pending is not None:
                continue
            meta = entry.meta
            if meta.state is TxnState.ONGOING:
                deadlines.append(meta.txn_start_ms + meta.timeout_ms + 1)
            elif meta.state in PREPARE_STATES and not entry.claimed:
                deadlines.append(entry.retry_at_ms)
                refresh = self._refresh_due(entry)
                if refresh is not None:
                    deadlines.append(refresh)
            expires = self._expiry_due(entry)
            if expires is not None:
                deadlines.append(expires)
        return min(deadlines) if deadlines else None


def _valid_expected(meta: TransactionMetadata, expected: tuple[int, int]) -> bool:
    """Kafka's isValidProducerId: the metadata is fresh, the producer id is current, or it is the
    previous one with an exhausted epoch (a retry of a rotation the producer never heard of)."""
    producer_id, epoch = expected
    return (
        meta.producer_epoch == NO_PRODUCER_EPOCH
        or producer_id == meta.producer_id
        or (producer_id == meta.last_producer_id and is_epoch_exhausted(epoch))
    )


def _check_producer(entry: _Entry | None, producer_id: int, producer_epoch: int) -> ErrorCode | None:
    if entry is None or entry.meta.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if entry.meta.producer_epoch != producer_epoch:
        return ErrorCode.producer_fenced
    return None

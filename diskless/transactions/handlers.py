"""Kafka API handlers of the transaction coordinator, version-agnostic like ``diskless.groups.handlers``.

Each handler takes ``(facade, header, request)``: the broker seen through ``TxnFacade``, the
request header and the kio request entity of the version the client sent. It returns a plain dict
that ``diskless.protocol.messages.build`` fits to the client's response version, except
``init_producer_id``, which returns None for a non-transactional producer (transactional id null):
the broker then answers with its existing idempotent-producer path.

Every change of a transaction's state is a transit of the core (see ``coordinator``): the handler
persists ``transit.target`` through ``facade.persist`` and hands the outcome back to the core with
``complete_transit``. EndTxn (and the fencing abort of InitProducerId) is answered once the
Prepare state is durable; markers are then written in the background by ``complete_transaction``
(spawned here), which persists the Complete state once every partition has its marker. Failed
marker writes are retried from the shell's timer: ``run_timers`` aborts timed-out transactions and
(re)drives every ``pending_completions()`` whose backoff expired, which also finishes the
transactions a replay found in a Prepare state after a coordinator failover.

Versions (KIP-98/360/588, not KIP-890): InitProducerId v0-4, AddPartitionsToTxn v0-3,
AddOffsetsToTxn v0-3, EndTxn v0-3. PRODUCER_FENCED is new in InitProducerId v4 and in v2 of the
others: older versions get INVALID_PRODUCER_EPOCH instead, as Kafka answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster.coordinator_records import INTERNAL_TOPICS
from diskless.protocol.messages import RequestHeader

from . import records
from .coordinator import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NeedProducerId,
    TopicPartition,
    TransactionCoordinatorCore,
    Transit,
    TransitKind,
    TxnState,
)

log = structlog.get_logger(__name__)

API_INIT_PRODUCER_ID = 22
API_ADD_PARTITIONS_TO_TXN = 24
API_ADD_OFFSETS_TO_TXN = 25
API_END_TXN = 26
API_DESCRIBE_TRANSACTIONS = 65
API_LIST_TRANSACTIONS = 66


class TxnFacade(Protocol):
    """What the transaction handlers need from the broker."""

    def coordinator(self, transactional_id: str) -> TransactionCoordinatorCore | ErrorCode:
        """The core of the id's ``__transaction_state`` partition, or the error to answer with
        (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE)."""
        ...

    async def persist(self, transactional_id: str, records: list[tuple[bytes, bytes | None]]) -> ErrorCode:
        """Append records to the id's ``__transaction_state`` partition; NONE once replicated.
        Writes of one partition must complete in log order."""
        ...

    async def allocate_producer_id(self) -> int:
        """A producer id never handed out before (the same allocator as idempotent producers)."""
        ...

    def partition_exists(self, topic: str, partition: int) -> bool: ...

    def offsets_partition_for(self, group_id: str) -> tuple[str, int]:
        """The ``__consumer_offsets`` partition of a group: AddOffsetsToTxn adds it."""
        ...

    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        partitions: list[tuple[str, int]],
        coordinator_epoch: int,
    ) -> dict[tuple[str, int], ErrorCode]:
        """Write a COMMIT/ABORT control marker to each partition (WriteTxnMarkers to each leader).
        NONE (or UNKNOWN_TOPIC_OR_PARTITION: gone) means done; TRANSACTION_COORDINATOR_FENCED or
        INVALID_PRODUCER_EPOCH that this coordinator is deposed; anything else is retried later.
        Missing partitions count as failed."""
        ...

    def now_ms(self) -> int: ...

    def all_cores(self) -> list[TransactionCoordinatorCore]:
        """The cores of every ``__transaction_state`` partition this broker coordinates."""
        ...

    def loading(self) -> bool:
        """Whether a partition this broker now leads has no core loaded yet."""
        ...

    def wake(self) -> None:
        """Deadlines may have moved: re-arm the timer from the cores' ``next_deadline_ms()``."""
        ...


Handler = Callable[[TxnFacade, RequestHeader, Any], Awaitable[dict[str, Any] | None]]

# Kafka's internal topics (Topic.isInternal). A client may not add their partitions to a transaction:
# KafkaApis leaves them out of the topics it authorizes for AddPartitionsToTxn v0-3, so they are
# TOPIC_AUTHORIZATION_FAILED whatever the ACLs (offsets reach a transaction through AddOffsetsToTxn).


def _ms(value: Any) -> int:
    """kio decodes millisecond durations as timedelta; accept ints too."""
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def persist_error(code: ErrorCode) -> ErrorCode:
    """Kafka's translation of ``__transaction_state`` append errors (appendTransactionToLog)."""
    if code in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
    ):
        return ErrorCode.coordinator_not_available
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large):
        return ErrorCode.unknown_server_error
    return code


def _fenced(error: ErrorCode, version: int, since: int) -> ErrorCode:
    """PRODUCER_FENCED exists from version ``since``; older clients get INVALID_PRODUCER_EPOCH."""
    if error is ErrorCode.producer_fenced and version < since:
        return ErrorCode.invalid_producer_epoch
    return error


async def _persist(facade: TxnFacade, core: TransactionCoordinatorCore, transit: Transit) -> ErrorCode:
    """Write ``transit`` and report the outcome to the core; returns the (translated) error.

    Only a core still loaded for its partition writes (Kafka checks the coordinator epoch): a
    transit of one replaced meanwhile (the partition lost and led again at a newer epoch, between
    a timer creating it and this write) must not reach the log the new core was loaded from. The
    check and the append happen in the same loop turn: ``persist`` appends before its first await."""
    try:
        if facade.coordinator(transit.transactional_id) is not core:
            error = ErrorCode.not_coordinator
        else:
            error = persist_error(await facade.persist(transit.transactional_id, [records.encode(transit.target)]))
    except Exception:
        log.exception("could not persist transaction state", transactional_id=transit.transactional_id)
        error = ErrorCode.unknown_server_error
    core.complete_transit(transit, error, facade.now_ms())
    return error


# --- background completion -----------------------------------------------------------------------

_background: set[asyncio.Task[None]] = set()


def _spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


def spawn_completion(facade: TxnFacade, core: TransactionCoordinatorCore, transactional_id: str) -> None:
    """Write the markers of a Prepare* transaction in the background."""
    _spawn(complete_transaction(facade, core, transactional_id))


async def complete_transaction(facade: TxnFacade, core: TransactionCoordinatorCore, transactional_id: str) -> None:
    """One attempt to finish a Prepare* transaction: write its missing markers, then persist the
    Complete state. Whatever fails is left to ``run_timers`` after the core's retry backoff."""
    work = core.begin_markers(transactional_id)
    if work is None:
        return
    results: dict[TopicPartition, ErrorCode] = {}
    if work.partitions:
        try:
            results = await facade.write_markers(
                work.producer_id, work.producer_epoch, work.committed, list(work.partitions), work.coordinator_epoch
            )
        except Exception:
            log.exception("could not write transaction markers", transactional_id=transactional_id)
            core.release_markers(work, facade.now_ms())
            facade.wake()
            return
    transit = core.markers_written(work, results, facade.now_ms())
    if transit is not None:
        await _persist(facade, core, transit)
    facade.wake()


async def run_timers(facade: TxnFacade, core: TransactionCoordinatorCore) -> None:
    """The shell's timer: abort timed-out transactions (fencing their producers), write again
    Prepare* states before retention takes their record, and drive every pending completion whose
    retry time has come (including those found by a replay)."""
    fences = core.tick(facade.now_ms())
    if fences:
        await asyncio.gather(*(_persist(facade, core, transit) for transit in fences))
    pending = core.pending_completions(facade.now_ms())
    if pending:
        await asyncio.gather(*(complete_transaction(facade, core, txn_id) for txn_id in pending))
    facade.wake()


# --- InitProducerId ------------------------------------------------------------------------------


def _init_response(error: ErrorCode, producer_id: int = NO_PRODUCER_ID, epoch: int = NO_PRODUCER_EPOCH) -> dict:
    return {"throttle_time": 0, "error_code": error, "producer_id": producer_id, "producer_epoch": epoch}


async def init_producer_id(facade: TxnFacade, header: RequestHeader, request: Any) -> dict[str, Any] | None:
    """InitProducerId v0-4 of a transactional producer; None when ``transactional_id`` is null
    (the caller answers through its idempotent-producer path)."""
    txn_id = request.transactional_id
    if txn_id is None:
        return None
    version = header.api_version
    if txn_id == "":
        return _init_response(ErrorCode.invalid_request)
    pid = getattr(request, "producer_id", NO_PRODUCER_ID)
    epoch = getattr(request, "producer_epoch", NO_PRODUCER_EPOCH)
    if pid == NO_PRODUCER_ID and epoch == NO_PRODUCER_EPOCH:
        expected = None
    elif pid == NO_PRODUCER_ID or epoch == NO_PRODUCER_EPOCH:
        return _init_response(ErrorCode.invalid_request)
    else:
        expected = (int(pid), int(epoch))
    timeout_ms = _ms(request.transaction_timeout)
    new_pid: int | None = None
    for _ in range(5):
        core = facade.coordinator(txn_id)
        if isinstance(core, ErrorCode):
            return _init_response(core)
        outcome = core.init_producer_id(txn_id, timeout_ms, expected, facade.now_ms(), new_pid)
        if not isinstance(outcome, NeedProducerId):
            break
        new_pid = await facade.allocate_producer_id()
    else:
        return _init_response(ErrorCode.concurrent_transactions)
    if isinstance(outcome, ErrorCode):
        return _init_response(_fenced(outcome, version, 4))
    error = await _persist(facade, core, outcome)
    facade.wake()
    if error is not ErrorCode.none:
        return _init_response(_fenced(error, version, 4))
    if outcome.kind is TransitKind.FENCE:
        # The ongoing transaction is being aborted: the client retries, and the retry bumps again.
        spawn_completion(facade, core, txn_id)
        return _init_response(ErrorCode.concurrent_transactions)
    return _init_response(ErrorCode.none, outcome.target.producer_id, outcome.target.producer_epoch)


# --- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------------------------


async def _add(facade: TxnFacade, txn_id: str, pid: int, epoch: int, partitions: set[TopicPartition]) -> ErrorCode:
    if not txn_id:
        return ErrorCode.invalid_request
    core = facade.coordinator(txn_id)
    if isinstance(core, ErrorCode):
        return core
    outcome = core.add_partitions(txn_id, pid, epoch, partitions, facade.now_ms())
    if isinstance(outcome, ErrorCode):
        return outcome
    error = await _persist(facade, core, outcome)
    facade.wake()
    return error


async def add_partitions_to_txn(facade: TxnFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """AddPartitionsToTxn v0-3. Partitions of internal topics get TOPIC_AUTHORIZATION_FAILED (ACLs
    are checked before, in the security layer, but internal topics are refused even with no
    authorizer, as Kafka), those that do not exist UNKNOWN_TOPIC_OR_PARTITION; then the others get
    OPERATION_NOT_ATTEMPTED, without asking the coordinator, as Kafka answers."""
    by_topic: dict[str, list[int]] = {}
    for topic in request.v3_and_below_topics:
        parts = by_topic.setdefault(topic.name, [])
        parts.extend(p for p in topic.partitions if p not in parts)
    wanted = {(name, p) for name, parts in by_topic.items() for p in parts}
    refused: dict[TopicPartition, ErrorCode] = {}
    for tp in wanted:
        if tp[0] in INTERNAL_TOPICS:
            refused[tp] = ErrorCode.topic_authorization_failed
        elif not facade.partition_exists(*tp):
            refused[tp] = ErrorCode.unknown_topic_or_partition
    errors: dict[TopicPartition, ErrorCode]
    if refused:
        errors = {tp: refused.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
    else:
        error = await _add(
            facade,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            wanted,
        )
        errors = dict.fromkeys(wanted, _fenced(error, header.api_version, 2))
    return {
        "throttle_time": 0,
        "results_by_topic_v3_and_below": [
            {
                "name": name,
                "results_by_partition": [
                    {"partition_index": p, "partition_error_code": errors[(name, p)]} for p in parts
                ],
            }
            for name, parts in by_topic.items()
        ],
    }


async def add_offsets_to_txn(facade: TxnFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """AddOffsetsToTxn v0-3: adds the group's ``__consumer_offsets`` partition to the transaction."""
    offsets_tp = facade.offsets_partition_for(request.group_id)
    error = await _add(facade, request.transactional_id, request.producer_id, request.producer_epoch, {offsets_tp})
    return {"throttle_time": 0, "error_code": _fenced(error, header.api_version, 2)}


# --- EndTxn --------------------------------------------------------------------------------------


async def end_txn(facade: TxnFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """EndTxn v0-3: answered once PrepareCommit/PrepareAbort is durable; markers follow."""
    txn_id = request.transactional_id
    if not txn_id:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request}
    core = facade.coordinator(txn_id)
    if isinstance(core, ErrorCode):
        return {"throttle_time": 0, "error_code": core}
    outcome = core.end_txn(txn_id, request.producer_id, request.producer_epoch, request.committed, facade.now_ms())
    if isinstance(outcome, ErrorCode):
        error = outcome
    else:
        error = await _persist(facade, core, outcome)
        if error is ErrorCode.none:
            spawn_completion(facade, core, txn_id)
        facade.wake()
    return {"throttle_time": 0, "error_code": _fenced(error, header.api_version, 2)}


# --- ListTransactions, DescribeTransactions (KIP-664: finding and aborting hanging transactions) ---

_STATES_BY_NAME = {state.value: state for state in TxnState}


async def list_transactions(facade: TxnFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """ListTransactions v0-1: the transactional ids this broker coordinates, filtered by producer id,
    state and (v1) how long the transaction has been running. A state name Kafka does not know is
    echoed in ``unknown_state_filters`` and matches nothing, as in Kafka."""
    if facade.loading():
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_load_in_progress, "transaction_states": []}
    names = list(request.state_filters or ())
    unknown = [name for name in names if name not in _STATES_BY_NAME]
    states = {_STATES_BY_NAME[name] for name in names if name in _STATES_BY_NAME} if names else None
    producer_ids = set(request.producer_id_filters or ())
    longer_than_ms = _ms(getattr(request, "duration_filter", -1))
    now_ms = facade.now_ms()
    shown = [
        {
            "transactional_id": meta.transactional_id,
            "producer_id": meta.producer_id,
            "transaction_state": meta.state.value,
        }
        for core in facade.all_cores()
        for meta in core.listing(now_ms, producer_ids, states, longer_than_ms)
    ]
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "unknown_state_filters": unknown,
        "transaction_states": shown,
    }


async def describe_transactions(facade: TxnFacade, header: RequestHeader, request: Any) -> dict[str, Any]:
    """DescribeTransactions v0, per transactional id as Kafka's handleDescribeTransactions: its
    state, producer, timeout, start time and partitions; NOT_COORDINATOR (and the other coordinator
    errors) where this broker does not hold it, TRANSACTIONAL_ID_NOT_FOUND where it holds none."""
    return {"throttle_time": 0, "transaction_states": [_described(facade, tid) for tid in request.transactional_ids]}


def _described(facade: TxnFacade, transactional_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "transactional_id": transactional_id,
        "error_code": ErrorCode.none,
        "transaction_state": "",
        "transaction_timeout": 0,
        "transaction_start_time": -1,
        "producer_id": NO_PRODUCER_ID,
        "producer_epoch": NO_PRODUCER_EPOCH,
        "topics": [],
    }
    if not transactional_id:
        answer["error_code"] = ErrorCode.invalid_request
        return answer
    core = facade.coordinator(transactional_id)
    meta = None if isinstance(core, ErrorCode) else core.get(transactional_id)
    if isinstance(core, ErrorCode):
        answer["error_code"] = core
    elif meta is None or meta.state is TxnState.DEAD:
        answer["error_code"] = ErrorCode.transactional_id_not_found
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(meta.partitions):
            by_topic.setdefault(topic, []).append(index)
        answer.update(
            transaction_state=meta.state.value,
            transaction_timeout=meta.timeout_ms,
            transaction_start_time=meta.txn_start_ms,
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            topics=[{"topic": topic, "partitions": indexes} for topic, indexes in by_topic.items()],
        )
    return answer


HANDLERS: dict[int, Handler] = {
    API_INIT_PRODUCER_ID: init_producer_id,
    API_ADD_PARTITIONS_TO_TXN: add_partitions_to_txn,
    API_ADD_OFFSETS_TO_TXN: add_offsets_to_txn,
    API_END_TXN: end_txn,
    API_DESCRIBE_TRANSACTIONS: describe_transactions,
    API_LIST_TRANSACTIONS: list_transactions,
}

# Version ranges the handlers serve (each tested at its bounds), for messages.SUPPORTED_VERSIONS.
# AddPartitionsToTxn v4+ (broker-to-broker verification), EndTxn v4+/InitProducerId v5+ (KIP-890)
# and AddOffsetsToTxn v4 (KIP-890 error semantics) are not implemented.
VERSIONS: dict[int, tuple[int, int]] = {
    API_INIT_PRODUCER_ID: (0, 4),
    API_ADD_PARTITIONS_TO_TXN: (0, 3),
    API_ADD_OFFSETS_TO_TXN: (0, 3),
    API_END_TXN: (0, 3),
    API_DESCRIBE_TRANSACTIONS: (0, 0),
    # v2 (KIP-1152, a transactional id pattern) is Kafka 4.1: ApiVersions stays 4.0's.
    API_LIST_TRANSACTIONS: (0, 1),
}

"""Transaction coordinator: the sans-IO core driven through its API handlers and a fake broker.

Every response dict goes through ``messages.build`` and kio's writer at the version the client
asked for, which proves it fits that version's schema.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from diskless.groups.records import partition_for as group_partition_for
from diskless.protocol import messages as m
from diskless.protocol.messages import RequestHeader
from diskless.transactions import handlers as h
from diskless.transactions import records
from diskless.transactions.coordinator import (
    NEED_PRODUCER_ID,
    TransactionCoordinatorCore,
    TransactionMetadata,
    Transit,
    TxnConfig,
    TxnState,
)

E = ErrorCode
TXN = "txn"
OFFSETS = "__consumer_offsets"


class FakeFacade:
    """The broker as the handlers see it: one core, a ``__transaction_state`` log, partitions
    that record the markers written to them, and a clock the test moves."""

    def __init__(self, *, tick_clock: bool = False) -> None:
        self.core: TransactionCoordinatorCore | None = TransactionCoordinatorCore(TxnConfig(max_timeout_ms=60_000))
        self.clock = 1_000
        self.tick_clock = tick_clock  # every now_ms() moves the clock: txn_start_ms are unique
        self.log: list[tuple[bytes, bytes | None]] = []
        self.persist_error = E.none
        self.fail_next_persist = False
        self.markers: list[tuple[int, int, bool, tuple[str, int]]] = []
        self.failing: set[tuple[str, int]] = set()
        self.hold: asyncio.Event | None = None
        self.pids = itertools.count(1_000)
        self.coordinator_error: ErrorCode | None = None

    def coordinator(self, transactional_id: str) -> TransactionCoordinatorCore | ErrorCode:
        if self.coordinator_error is not None:
            return self.coordinator_error
        return self.core if self.core is not None else E.coordinator_load_in_progress

    async def persist(self, transactional_id: str, entries: list[tuple[bytes, bytes | None]]) -> ErrorCode:
        await asyncio.sleep(0)
        if self.fail_next_persist:
            self.fail_next_persist = False
            return E.not_enough_replicas
        if self.persist_error is not E.none:
            return self.persist_error
        self.log.extend(entries)
        return E.none

    async def allocate_producer_id(self) -> int:
        await asyncio.sleep(0)
        return next(self.pids)

    def partition_exists(self, topic: str, partition: int) -> bool:
        return topic != "missing"

    def offsets_partition_for(self, group_id: str) -> tuple[str, int]:
        return OFFSETS, group_partition_for(group_id, 50)

    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        partitions: list[tuple[str, int]],
        coordinator_epoch: int,
    ) -> dict[tuple[str, int], ErrorCode]:
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.sleep(0)
        results = {}
        for tp in partitions:
            if tp in self.failing:
                results[tp] = E.not_leader_or_follower
            else:
                self.markers.append((producer_id, producer_epoch, committed, tp))
                results[tp] = E.none
        return results

    def now_ms(self) -> int:
        if self.tick_clock:
            self.clock += 1
        return self.clock

    def wake(self) -> None:
        pass

    def all_cores(self) -> list[TransactionCoordinatorCore]:
        return [self.core] if self.core is not None else []

    def loading(self) -> bool:
        return self.core is None

    def failover(self) -> TransactionCoordinatorCore:
        """The coordinator moves: the old core is dropped, a new one replays the log."""
        if self.core is not None:
            self.core.shutdown()
        self.core = TransactionCoordinatorCore(TxnConfig(max_timeout_ms=60_000))
        records.replay(self.core, self.log)
        return self.core

    def prepare_records(self) -> list[TransactionMetadata]:
        decoded = [records.decode(k, v) for k, v in self.log]
        return [r for r in decoded if isinstance(r, TransactionMetadata) and r.state.name.startswith("PREPARE")]


async def drain() -> None:
    for _ in range(100):
        await asyncio.sleep(0)
        if h._background:
            await asyncio.gather(*list(h._background))
        else:
            return


def _request(key: int, version: int, **fields: Any) -> Any:
    cls = load_request_schema(key, version)
    return cls(**fields)


def _check_fits(key: int, version: int, response: dict[str, Any]) -> None:
    entity = m.build(load_response_schema(key, version), response)
    entity_writer(type(entity))(io.BytesIO(), entity)


class Client:
    """A producer speaking to the handlers at chosen versions; every answer is fitted to its schema."""

    def __init__(self, facade: FakeFacade, txn_id: str = TXN) -> None:
        self.facade = facade
        self.txn_id = txn_id
        self.pid = -1
        self.epoch = -1

    async def _call(self, handler: Any, key: int, version: int, request: Any) -> dict[str, Any]:
        response = await handler(self.facade, RequestHeader(key, version, 1, "test"), request)
        _check_fits(key, version, response)
        return response

    async def init(self, version: int = 4, timeout_ms: int = 10_000, expected: bool = False) -> ErrorCode:
        fields: dict[str, Any] = {"transactional_id": self.txn_id, "transaction_timeout": timeout_ms}
        if version >= 3:
            fields["producer_id"] = self.pid if expected else -1
            fields["producer_epoch"] = self.epoch if expected else -1
        request = m.build(load_request_schema(h.API_INIT_PRODUCER_ID, version), fields)
        response = await self._call(h.init_producer_id, h.API_INIT_PRODUCER_ID, version, request)
        if response["error_code"] is E.none:
            self.pid, self.epoch = response["producer_id"], response["producer_epoch"]
        return response["error_code"]

    async def add(self, partitions: list[tuple[str, int]], version: int = 3) -> dict[tuple[str, int], ErrorCode]:
        cls = load_request_schema(h.API_ADD_PARTITIONS_TO_TXN, version)
        topic_cls = sys.modules[cls.__module__].AddPartitionsToTxnTopic
        topics: dict[str, list[int]] = {}
        for topic, p in partitions:
            topics.setdefault(topic, []).append(p)
        request = cls(
            v3_and_below_transactional_id=self.txn_id,
            v3_and_below_producer_id=self.pid,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=tuple(topic_cls(name=t, partitions=tuple(ps)) for t, ps in topics.items()),
        )
        response = await self._call(h.add_partitions_to_txn, h.API_ADD_PARTITIONS_TO_TXN, version, request)
        return {
            (t["name"], p["partition_index"]): p["partition_error_code"]
            for t in response["results_by_topic_v3_and_below"]
            for p in t["results_by_partition"]
        }

    async def add_offsets(self, group_id: str, version: int = 3) -> ErrorCode:
        request = _request(
            h.API_ADD_OFFSETS_TO_TXN,
            version,
            transactional_id=self.txn_id,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            group_id=group_id,
        )
        response = await self._call(h.add_offsets_to_txn, h.API_ADD_OFFSETS_TO_TXN, version, request)
        return response["error_code"]

    async def end(self, committed: bool, version: int = 3) -> ErrorCode:
        request = _request(
            h.API_END_TXN,
            version,
            transactional_id=self.txn_id,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            committed=committed,
        )
        response = await self._call(h.end_txn, h.API_END_TXN, version, request)
        return response["error_code"]


TP0, TP1 = ("t", 0), ("t", 1)


def _state(facade: FakeFacade, txn_id: str = TXN) -> TxnState:
    assert facade.core is not None
    meta = facade.core.get(txn_id)
    assert meta is not None
    return meta.state


# --- happy paths, at every bound of every version range -------------------------------------------


@pytest.mark.parametrize("committed", [True, False])
@pytest.mark.parametrize("bound", [0, 1])
async def test_transaction_completes(committed: bool, bound: int) -> None:
    versions = {key: h.VERSIONS[key][bound] for key in h.VERSIONS}
    facade = FakeFacade()
    client = Client(facade)
    assert await client.init(versions[h.API_INIT_PRODUCER_ID]) is E.none
    assert (client.pid, client.epoch) == (1_000, 0)
    assert await client.add([TP0, TP1], versions[h.API_ADD_PARTITIONS_TO_TXN]) == {TP0: E.none, TP1: E.none}
    assert _state(facade) is TxnState.ONGOING
    assert await client.add_offsets("group", versions[h.API_ADD_OFFSETS_TO_TXN]) is E.none
    offsets_tp = facade.offsets_partition_for("group")
    assert await client.end(committed, versions[h.API_END_TXN]) is E.none
    # Answered as soon as Prepare* is durable; markers follow in the background.
    assert _state(facade) is (TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT)
    await drain()
    assert _state(facade) is (TxnState.COMPLETE_COMMIT if committed else TxnState.COMPLETE_ABORT)
    assert sorted(facade.markers) == sorted((1_000, 0, committed, tp) for tp in (TP0, TP1, offsets_tp))
    states = [records.decode(k, v).state for k, v in facade.log]  # type: ignore[union-attr]
    assert states[0] is TxnState.EMPTY and states[-2:] == [
        TxnState.PREPARE_COMMIT if committed else TxnState.PREPARE_ABORT,
        TxnState.COMPLETE_COMMIT if committed else TxnState.COMPLETE_ABORT,
    ]
    # A retry of the same EndTxn is fine, the other outcome is not.
    assert await client.end(committed, versions[h.API_END_TXN]) is E.none
    assert await client.end(not committed, versions[h.API_END_TXN]) is E.invalid_txn_state
    # The next transaction starts from the complete state, same producer id and epoch.
    assert await client.add([TP1]) == {TP1: E.none}
    meta = facade.core.get(TXN)  # type: ignore[union-attr]
    assert meta is not None and meta.partitions == {TP1} and meta.producer_epoch == 0


async def test_reinit_after_complete_bumps_epoch() -> None:
    facade = FakeFacade()
    client = Client(facade)
    assert await client.init() is E.none
    assert await client.init(expected=True) is E.none
    assert (client.pid, client.epoch) == (1_000, 1)
    assert await client.init(version=0) is E.none
    assert (client.pid, client.epoch) == (1_000, 2)


async def test_non_transactional_init_is_deferred() -> None:
    facade = FakeFacade()
    for version in (0, 4):
        request = m.build(
            load_request_schema(h.API_INIT_PRODUCER_ID, version), {"transactional_id": None, "transaction_timeout": 1}
        )
        header = RequestHeader(h.API_INIT_PRODUCER_ID, version, 1, None)
        assert await h.init_producer_id(facade, header, request) is None


async def test_invalid_timeout_and_requests() -> None:
    facade = FakeFacade()
    client = Client(facade)
    assert await client.init(timeout_ms=60_001) is E.invalid_transaction_timeout
    assert await client.init(timeout_ms=0) is E.invalid_transaction_timeout
    client.pid = 5  # producer id without an epoch
    assert await client.init(expected=True) is E.invalid_request
    empty = Client(facade, "")
    assert await empty.init() is E.invalid_request
    assert await empty.end(True) is E.invalid_request


async def test_unknown_producer_and_wrong_state() -> None:
    facade = FakeFacade()
    client = Client(facade)
    client.pid, client.epoch = 7, 0
    assert await client.add([TP0]) == {TP0: E.invalid_producer_id_mapping}
    assert await client.end(True) is E.invalid_producer_id_mapping
    assert await client.init() is E.none
    assert await client.end(True) is E.invalid_txn_state  # Empty: nothing to end
    other = Client(facade)
    other.pid, other.epoch = 999, 0
    assert await other.add([TP0]) == {TP0: E.invalid_producer_id_mapping}


async def test_unknown_partition_fails_the_whole_request() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    result = await client.add([TP0, ("missing", 0)], version=0)
    assert result == {TP0: E.operation_not_attempted, ("missing", 0): E.unknown_topic_or_partition}
    assert _state(facade) is TxnState.EMPTY


async def test_internal_topics_are_refused_and_fail_the_whole_request() -> None:
    """KafkaApis.handleAddPartitionsToTxnRequest (v0-3) leaves internal topics out of the topics it
    authorizes: they are TOPIC_AUTHORIZATION_FAILED whatever the ACLs (no authorizer, super user
    too), and, like any refused partition, fail the whole request. They were added."""
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    result = await client.add([TP0, (OFFSETS, 3), ("__transaction_state", 0), ("missing", 0)], version=3)
    assert result == {
        TP0: E.operation_not_attempted,
        (OFFSETS, 3): E.topic_authorization_failed,
        ("__transaction_state", 0): E.topic_authorization_failed,
        ("missing", 0): E.unknown_topic_or_partition,
    }
    assert await client.add([(OFFSETS, 0)], version=0) == {(OFFSETS, 0): E.topic_authorization_failed}
    assert _state(facade) is TxnState.EMPTY


async def test_coordinator_errors_pass_through() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    facade.coordinator_error = E.not_coordinator
    assert await client.init() is E.not_coordinator
    assert await client.add([TP0]) == {TP0: E.not_coordinator}
    assert await client.add_offsets("g") is E.not_coordinator
    assert await client.end(True) is E.not_coordinator
    facade.coordinator_error = None
    facade.core = None
    assert await client.end(True) is E.coordinator_load_in_progress


async def test_persist_failure_leaves_state_unchanged() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    facade.persist_error = E.not_leader_or_follower
    assert await client.add([TP0]) == {TP0: E.not_coordinator}
    assert _state(facade) is TxnState.EMPTY
    facade.persist_error = E.request_timed_out
    assert await client.init(expected=True) is E.coordinator_not_available
    facade.persist_error = E.none
    assert await client.add([TP0]) == {TP0: E.none}
    facade.persist_error = E.not_enough_replicas
    assert await client.end(True) is E.coordinator_not_available
    assert _state(facade) is TxnState.ONGOING
    assert not facade.core.is_pending(TXN)  # type: ignore[union-attr]


# --- fencing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("init_version", "other_version", "fenced"),
    [
        (4, 3, E.producer_fenced),
        (4, 2, E.producer_fenced),
        (0, 1, E.invalid_producer_epoch),
        (0, 0, E.invalid_producer_epoch),
    ],
)
async def test_second_init_fences_the_ongoing_transaction(
    init_version: int, other_version: int, fenced: ErrorCode
) -> None:
    facade = FakeFacade()
    zombie = Client(facade)
    assert await zombie.init() is E.none
    assert await zombie.add([TP0, TP1]) == {TP0: E.none, TP1: E.none}
    successor = Client(facade)
    # The ongoing transaction is aborted with a bumped epoch; the new producer must retry.
    assert await successor.init(init_version) is E.concurrent_transactions
    meta = facade.core.get(TXN)  # type: ignore[union-attr]
    assert meta is not None and meta.producer_epoch == 1
    assert await zombie.add([("t", 2)], other_version) == {("t", 2): fenced}
    assert await zombie.end(True, other_version) is fenced
    assert await zombie.add_offsets("g", other_version) is fenced
    await drain()
    assert sorted(facade.markers) == [(1_000, 1, False, TP0), (1_000, 1, False, TP1)]
    assert _state(facade) is TxnState.COMPLETE_ABORT
    assert await successor.init(init_version) is E.none
    assert (successor.pid, successor.epoch) == (1_000, 2)
    # The zombie's InitProducerId with its stale epoch is fenced as well (v3+ carries it).
    if init_version >= 3:
        assert await zombie.init(init_version, expected=True) is E.producer_fenced
    v3 = Client(facade)
    v3.pid, v3.epoch = zombie.pid, 0
    assert await v3.init(3, expected=True) is E.invalid_producer_epoch


async def test_init_while_prepare_is_concurrent() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    await client.add([TP0])
    facade.hold = asyncio.Event()
    assert await client.end(True) is E.none
    assert await Client(facade).init() is E.concurrent_transactions
    facade.hold.set()
    await drain()
    assert await Client(facade).init() is E.none


async def test_epoch_exhaustion_rotates_producer_id() -> None:
    facade = FakeFacade()
    core = facade.core
    assert core is not None
    core.load(TransactionMetadata(TXN, 77, -1, 32766, 32765, 10_000, TxnState.COMPLETE_COMMIT))
    client = Client(facade)
    client.pid, client.epoch = 77, 32766
    assert await client.init(expected=True) is E.none
    assert (client.pid, client.epoch) == (1_000, 0)
    meta = core.get(TXN)
    assert meta is not None and meta.last_producer_id == 77 and meta.last_producer_epoch == 32766
    # A retry from the old producer id with the exhausted epoch is recognised (KIP-360).
    retry = Client(facade)
    retry.pid, retry.epoch = 77, 32766
    assert await retry.init(expected=True) is E.none
    assert (retry.pid, retry.epoch) == (1_000, 0)


def test_core_asks_for_a_producer_id() -> None:
    core = TransactionCoordinatorCore()
    assert core.init_producer_id(TXN, 1_000, None, 0) is NEED_PRODUCER_ID
    transit = core.init_producer_id(TXN, 1_000, None, 0, new_producer_id=5)
    assert isinstance(transit, Transit)
    assert core.init_producer_id(TXN, 1_000, None, 0) is E.concurrent_transactions
    core.complete_transit(transit, E.none, 0)
    meta = core.get(TXN)
    assert meta is not None and (meta.producer_id, meta.producer_epoch, meta.state) == (5, 0, TxnState.EMPTY)


# --- timeouts ---------------------------------------------------------------------------------------


async def test_timed_out_transaction_is_aborted_and_fenced() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init(timeout_ms=5_000)
    await client.add([TP0])
    core = facade.core
    assert core is not None
    assert core.next_deadline_ms() == facade.clock + 5_001
    facade.clock += 5_000
    await h.run_timers(facade, core)
    assert _state(facade) is TxnState.ONGOING
    facade.clock += 1
    await h.run_timers(facade, core)
    await drain()
    assert _state(facade) is TxnState.COMPLETE_ABORT
    assert facade.markers == [(1_000, 1, False, TP0)]
    assert await client.end(True, version=2) is E.producer_fenced
    assert await client.end(False, version=1) is E.invalid_producer_epoch
    assert await client.add([TP0], version=1) == {TP0: E.invalid_producer_epoch}
    meta = core.get(TXN)
    assert meta is not None  # nothing left to do but forget the idle id one day
    assert core.next_deadline_ms() == meta.last_update_ms + core.config.transactional_id_expiration_ms
    assert await client.init(expected=True) is E.producer_fenced
    assert await Client(facade).init() is E.none


async def test_failed_fence_write_does_not_bump_twice() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init(timeout_ms=1_000)
    await client.add([TP0])
    core = facade.core
    assert core is not None
    facade.clock += 2_000
    facade.fail_next_persist = True
    await h.run_timers(facade, core)
    meta = core.get(TXN)
    assert meta is not None and meta.state is TxnState.ONGOING and meta.producer_epoch == 1
    await h.run_timers(facade, core)
    await drain()
    meta = core.get(TXN)
    assert meta is not None and meta.state is TxnState.COMPLETE_ABORT and meta.producer_epoch == 1


# --- EndTxn races and marker retries -----------------------------------------------------------------


async def test_concurrent_end_txn() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    await client.add([TP0, TP1])
    facade.hold = asyncio.Event()
    assert await client.end(True) is E.none
    assert await client.end(True) is E.concurrent_transactions
    assert await client.end(False) is E.invalid_txn_state
    assert await client.add([TP0]) == {TP0: E.concurrent_transactions}
    facade.hold.set()
    await drain()
    assert _state(facade) is TxnState.COMPLETE_COMMIT
    assert await client.end(True) is E.none
    assert sorted(facade.markers) == [(1_000, 0, True, TP0), (1_000, 0, True, TP1)]


async def test_failed_markers_are_retried_by_the_timer() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    await client.add([TP0, TP1])
    facade.failing = {TP1}
    assert await client.end(False) is E.none
    await drain()
    core = facade.core
    assert core is not None
    assert _state(facade) is TxnState.PREPARE_ABORT
    assert core.pending_completions(facade.clock) == []
    deadline = core.next_deadline_ms()
    assert deadline == facade.clock + core.config.marker_retry_backoff_ms
    facade.clock = deadline
    facade.failing = set()
    await h.run_timers(facade, core)
    assert _state(facade) is TxnState.COMPLETE_ABORT
    # TP0 got its marker once: only the failed partition is resent.
    assert facade.markers == [(1_000, 0, False, TP0), (1_000, 0, False, TP1)]


async def test_failover_completes_a_prepare_commit() -> None:
    facade = FakeFacade()
    client = Client(facade)
    await client.init()
    await client.add([TP0, TP1])
    facade.failing = {TP0, TP1}
    assert await client.end(True) is E.none
    await drain()
    old = facade.core
    assert old is not None and facade.markers == []
    core = facade.failover()
    assert core.get(TXN) == old.get(TXN)
    assert core.pending_completions() == [TXN]
    # The old coordinator's retries go nowhere.
    facade.failing = set()
    facade.clock += 1_000
    await h.run_timers(facade, old)
    assert facade.markers == []
    await h.run_timers(facade, core)
    assert _state(facade) is TxnState.COMPLETE_COMMIT
    assert sorted(facade.markers) == [(1_000, 0, True, TP0), (1_000, 0, True, TP1)]
    # The client's retry of its EndTxn succeeds against the new coordinator.
    assert await client.end(True) is E.none
    # And after another failover the complete state is what is loaded.
    assert facade.failover().pending_completions() == []
    assert _state(facade) is TxnState.COMPLETE_COMMIT


# --- records ---------------------------------------------------------------------------------------


def test_records_round_trip_and_tombstone() -> None:
    meta = TransactionMetadata(TXN, 5, 4, 3, 2, 60_000, TxnState.ONGOING, frozenset({TP0, ("u", 9)}), 10, 20)
    key, value = records.encode(meta)
    assert records.decode(key, value) == meta
    core = TransactionCoordinatorCore()
    assert records.replay(core, [(key, value), records.encode_tombstone(TXN)]) == 2
    assert core.get(TXN) is None
    with pytest.raises(records.RecordFormatError):
        records.decode(b"\x09" + key[1:], value)
    with pytest.raises(records.RecordFormatError):
        records.decode(key, b"\x01\x90")


def test_partition_for_matches_kafka() -> None:
    # Java: Math.abs("txn".hashCode()) % 50 with "txn".hashCode() == 115306 (116*31^2 + 120*31 + 110)
    assert records.partition_for("txn", 50) == 115306 % 50
    assert records.partition_for("polygenelubricants", 50) == 0  # hashCode == Integer.MIN_VALUE


# --- model-based: random interleavings keep markers consistent ---------------------------------------

PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]
TXN_IDS = ["a", "b"]


class TxnMachine(RuleBasedStateMachine):
    """Two transactional ids, two producers each (a current one and a zombie), random requests,
    timeouts, persist failures, marker failures and coordinator failovers."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.facade = FakeFacade(tick_clock=True)
        self.clients = {(t, slot): Client(self.facade, t) for t in TXN_IDS for slot in (0, 1)}
        self.returned: dict[int, int] = {}  # producer id -> highest epoch InitProducerId returned

    def run(self, coro: Any) -> Any:
        async def with_drain() -> Any:
            result = await coro
            await drain()
            return result

        return self.loop.run_until_complete(with_drain())

    @rule(txn=st.sampled_from(TXN_IDS), slot=st.integers(0, 1), version=st.integers(0, 4), expected=st.booleans())
    def init(self, txn: str, slot: int, version: int, expected: bool) -> None:
        client = self.clients[(txn, slot)]
        error = self.run(client.init(version, timeout_ms=5_000, expected=expected))
        if error is E.none:
            assert client.epoch >= self.returned.get(client.pid, -1)
            self.returned[client.pid] = client.epoch

    @rule(txn=st.sampled_from(TXN_IDS), slot=st.integers(0, 1), parts=st.sets(st.sampled_from(PARTITIONS), min_size=1))
    def add(self, txn: str, slot: int, parts: set[tuple[str, int]]) -> None:
        self.run(self.clients[(txn, slot)].add(sorted(parts)))

    @rule(txn=st.sampled_from(TXN_IDS), slot=st.integers(0, 1))
    def add_offsets(self, txn: str, slot: int) -> None:
        self.run(self.clients[(txn, slot)].add_offsets("group"))

    @rule(txn=st.sampled_from(TXN_IDS), slot=st.integers(0, 1), committed=st.booleans())
    def end(self, txn: str, slot: int, committed: bool) -> None:
        self.run(self.clients[(txn, slot)].end(committed))

    @rule(
        txn=st.sampled_from(TXN_IDS),
        slot=st.integers(0, 1),
        parts=st.sets(st.sampled_from(PARTITIONS), min_size=1),
        committed=st.booleans(),
    )
    def transaction(self, txn: str, slot: int, parts: set[tuple[str, int]], committed: bool) -> None:
        """A whole transaction by one producer (most random requests are refused otherwise)."""
        client = self.clients[(txn, slot)]
        if client.pid < 0:
            self.init(txn, slot, 4, False)
        self.run(client.add(sorted(parts)))
        self.run(client.end(committed))

    @rule(advance=st.sampled_from([0, 10, 100, 2_000, 6_000]))
    def tick(self, advance: int) -> None:
        self.facade.clock += advance
        if self.facade.core is not None:
            self.run(h.run_timers(self.facade, self.facade.core))

    @rule()
    def failover(self) -> None:
        self.facade.failover()

    @rule()
    def fail_next_persist(self) -> None:
        self.facade.fail_next_persist = True

    @rule(parts=st.sets(st.sampled_from(PARTITIONS)))
    def marker_failures(self, parts: set[tuple[str, int]]) -> None:
        self.facade.failing = parts

    @invariant()
    def persisted_epochs_only_increase(self) -> None:
        last: dict[tuple[str, int], int] = {}
        for key, value in self.facade.log:
            meta = records.decode(key, value)
            assert isinstance(meta, TransactionMetadata)
            k = (meta.transactional_id, meta.producer_id)
            assert meta.producer_epoch >= last.get(k, -1)
            last[k] = meta.producer_epoch

    @invariant()
    def one_outcome_per_transaction(self) -> None:
        outcomes: dict[tuple[str, int, int], TxnState] = {}
        for meta in self.facade.prepare_records():
            instance = (meta.transactional_id, meta.producer_id, meta.txn_start_ms)
            assert outcomes.setdefault(instance, meta.state) is meta.state

    def teardown(self) -> None:
        try:
            facade = self.facade
            facade.failing = set()
            facade.fail_next_persist = False
            core = facade.core
            assert core is not None
            for _ in range(5):  # time out whatever is Ongoing, then finish every Prepare*
                facade.clock += 10_000
                self.run(h.run_timers(facade, core))
            for txn in TXN_IDS:
                meta = core.get(txn)
                assert meta is None or meta.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
                assert meta is None or meta.state is not TxnState.ONGOING
            self.check_markers()
        finally:
            self.loop.close()

    def check_markers(self) -> None:
        """Per partition and producer id, the markers written are exactly the outcomes of the
        transactions that included the partition, in order (retries only repeat a marker)."""
        prepared = self.facade.prepare_records()
        all_parts = {tp for meta in prepared for tp in meta.partitions} | {tp for *_, tp in self.facade.markers}
        pids = {meta.producer_id for meta in prepared} | {pid for pid, *_ in self.facade.markers}

        def collapse(seq: list[tuple[int, bool]]) -> list[tuple[int, bool]]:
            return [x for i, x in enumerate(seq) if i == 0 or seq[i - 1] != x]

        for tp in all_parts:
            for pid in pids:
                expected = [
                    (meta.producer_epoch, meta.state is TxnState.PREPARE_COMMIT)
                    for meta in prepared
                    if meta.producer_id == pid and tp in meta.partitions
                ]
                written = [(epoch, c) for p, epoch, c, t in self.facade.markers if p == pid and t == tp]
                assert collapse(written) == collapse(expected), (tp, pid)


TestTxnMachine = TxnMachine.TestCase
TestTxnMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


async def test_a_replaced_cores_timer_write_never_reaches_the_log() -> None:
    """A timer of the core loaded at one leader epoch made a FENCE transit; before it was written
    the partition was led again at a newer epoch and a new core loaded from the log. The old
    core's write must not land after the new core's load (Kafka's coordinator epoch check)."""
    facade = FakeFacade()
    client = Client(facade)
    await client.init(timeout_ms=5_000)
    await client.add([TP0])
    old = facade.core
    assert old is not None
    facade.clock += 5_001
    (fence,) = old.tick(facade.clock)  # made by the timer; written on the next loop pass
    facade.failover()
    logged = list(facade.log)
    assert await h._persist(facade, old, fence) is E.not_coordinator
    assert facade.log == logged, "a replaced core's record reached the log"

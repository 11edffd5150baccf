"""InitProducerId after a transaction the client aborted: the coordinator first aborts that
transaction's partitions again with the bumped epoch, then hands the epoch out.

Why: a client aborts after a produce request timed out (and bumps its epoch, KIP-360); the
request may still be committed on a diskless partition after the ABORT marker, opening a
transaction nobody will end. The second ABORT marker, at the new epoch, closes such a
transaction and makes the partition refuse any later batch of the old epoch
(INVALID_PRODUCER_EPOCH), and it is written before the client can produce with the new epoch,
so it never aborts the client's next transaction. See tests/unit/test_late_txn_commits.py for
the partition's side.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from test_txn_coordinator import Client, FakeFacade, _state, drain

from diskless.transactions import handlers as h
from diskless.transactions.coordinator import TxnState

E = ErrorCode
TP0, TP1 = ("t", 0), ("t", 1)
PID = 1_000


async def aborted_transaction(facade: FakeFacade) -> Client:
    client = Client(facade)
    assert await client.init() is E.none
    assert await client.add([TP0, TP1]) == {TP0: E.none, TP1: E.none}
    assert await client.end(False) is E.none
    await drain()
    assert sorted(facade.markers) == [(PID, 0, False, TP0), (PID, 0, False, TP1)]
    return client


async def test_bump_after_a_client_abort_reseals_its_partitions_first() -> None:
    facade = FakeFacade()
    client = await aborted_transaction(facade)
    # KIP-360: the client bumps its epoch; it is answered once the new-epoch markers are written.
    assert await client.init(expected=True) is E.concurrent_transactions
    await drain()
    assert sorted(facade.markers[2:]) == [(PID, 1, False, TP0), (PID, 1, False, TP1)]
    assert _state(facade) is TxnState.COMPLETE_ABORT
    assert await client.init(expected=True) is E.none
    assert (client.pid, client.epoch) == (PID, 1)
    # Nothing more to reseal: the next transaction runs as usual.
    assert await client.add([TP0]) == {TP0: E.none}
    assert await client.end(True) is E.none
    await drain()
    assert facade.markers[-1] == (PID, 1, True, TP0)


async def test_a_restarted_producer_also_reseals() -> None:
    facade = FakeFacade()
    await aborted_transaction(facade)
    fresh = Client(facade)
    assert await fresh.init() is E.concurrent_transactions
    await drain()
    assert sorted(facade.markers[2:]) == [(PID, 1, False, TP0), (PID, 1, False, TP1)]
    assert await fresh.init() is E.none
    assert (fresh.pid, fresh.epoch) == (PID, 2)


async def test_reseal_is_known_after_a_coordinator_failover() -> None:
    facade = FakeFacade()
    client = await aborted_transaction(facade)
    facade.failover()
    assert await client.init(expected=True) is E.concurrent_transactions
    await drain()
    assert sorted(facade.markers[2:]) == [(PID, 1, False, TP0), (PID, 1, False, TP1)]
    assert await client.init(expected=True) is E.none and client.epoch == 1


async def test_failed_reseal_markers_are_retried_before_the_epoch_is_handed_out() -> None:
    facade = FakeFacade()
    client = await aborted_transaction(facade)
    facade.failing = {TP1}
    assert await client.init(expected=True) is E.concurrent_transactions
    await drain()
    assert _state(facade) is TxnState.PREPARE_ABORT
    assert await client.init(expected=True) is E.concurrent_transactions
    facade.failing = set()
    facade.clock += 1_000
    assert facade.core is not None
    await h.run_timers(facade, facade.core)
    await drain()
    assert (PID, 1, False, TP1) in facade.markers
    assert await client.init(expected=True) is E.none and client.epoch == 1


async def test_no_reseal_after_a_commit_or_a_fencing_abort() -> None:
    facade = FakeFacade()
    client = Client(facade)
    assert await client.init() is E.none
    await client.add([TP0])
    assert await client.end(True) is E.none
    await drain()
    assert await client.init(expected=True) is E.none and client.epoch == 1
    # The coordinator's own timeout abort already wrote its markers with a bumped epoch.
    await client.add([TP1])
    facade.clock += 20_000
    assert facade.core is not None
    await h.run_timers(facade, facade.core)
    await drain()
    assert facade.markers[-1] == (PID, 2, False, TP1)
    count = len(facade.markers)
    assert await Client(facade).init() is E.none
    assert len(facade.markers) == count


async def test_a_zombie_epoch_is_fenced_not_resealed() -> None:
    facade = FakeFacade()
    client = await aborted_transaction(facade)
    zombie = Client(facade)
    zombie.pid, zombie.epoch = client.pid, client.epoch + 5
    assert await zombie.init(expected=True) is E.producer_fenced
    assert len(facade.markers) == 2

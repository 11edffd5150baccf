"""ListTransactions and DescribeTransactions (KIP-664) through the coordinator's handlers: the
filters of Kafka's listTransactionStates and the per-id answers of handleDescribeTransactions,
every answer fitted to its version's schema."""

from __future__ import annotations

from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from test_txn_coordinator import TP0, TP1, Client, FakeFacade, _check_fits, drain

from diskless.protocol import messages as m
from diskless.protocol.messages import RequestHeader
from diskless.transactions import handlers as h

E = ErrorCode


async def _list(facade: FakeFacade, version: int = 1, **fields: Any) -> dict[str, Any]:
    request = m.build(load_request_schema(h.API_LIST_TRANSACTIONS, version), fields)
    header = RequestHeader(h.API_LIST_TRANSACTIONS, version, 1, "admin")
    response = await h.list_transactions(facade, header, request)
    _check_fits(h.API_LIST_TRANSACTIONS, version, response)
    return response


async def _describe(facade: FakeFacade, ids: list[str]) -> dict[str, dict[str, Any]]:
    request = m.build(load_request_schema(h.API_DESCRIBE_TRANSACTIONS, 0), {"transactional_ids": ids})
    header = RequestHeader(h.API_DESCRIBE_TRANSACTIONS, 0, 1, "admin")
    response = await h.describe_transactions(facade, header, request)
    _check_fits(h.API_DESCRIBE_TRANSACTIONS, 0, response)
    return {state["transactional_id"]: state for state in response["transaction_states"]}


async def _three_transactions(facade: FakeFacade) -> tuple[Client, Client, Client]:
    """ "open" is Ongoing (started at 1000), "done" CompleteCommit, "fresh" Empty."""
    opened, done, fresh = Client(facade, "open"), Client(facade, "done"), Client(facade, "fresh")
    for client in (opened, done, fresh):
        assert await client.init() is E.none
    assert await opened.add([TP0, TP1, ("u", 3)]) == {TP0: E.none, TP1: E.none, ("u", 3): E.none}
    assert await done.add([TP0]) == {TP0: E.none}
    assert await done.end(True) is E.none
    await drain()
    return opened, done, fresh


def _listed(response: dict[str, Any]) -> dict[str, tuple[int, str]]:
    assert response["error_code"] is E.none
    return {t["transactional_id"]: (t["producer_id"], t["transaction_state"]) for t in response["transaction_states"]}


async def test_listing_shows_every_id_with_its_producer_and_state() -> None:
    facade = FakeFacade()
    opened, done, fresh = await _three_transactions(facade)
    assert _listed(await _list(facade)) == {
        "open": (opened.pid, "Ongoing"),
        "done": (done.pid, "CompleteCommit"),
        "fresh": (fresh.pid, "Empty"),
    }


async def test_listing_filters_by_state_and_echoes_unknown_state_names() -> None:
    facade = FakeFacade()
    await _three_transactions(facade)
    response = await _list(facade, state_filters=["Ongoing", "Empty", "Hanging"])
    assert set(_listed(response)) == {"open", "fresh"}
    assert response["unknown_state_filters"] == ["Hanging"]
    # Only unknown names: nothing matches (Kafka filters by the names given, known or not).
    assert _listed(await _list(facade, state_filters=["Hanging"])) == {}


async def test_listing_filters_by_producer_id() -> None:
    facade = FakeFacade()
    opened, done, _ = await _three_transactions(facade)
    assert set(_listed(await _list(facade, producer_id_filters=[done.pid, 123_456]))) == {"done"}
    both = _listed(await _list(facade, producer_id_filters=[opened.pid, done.pid], state_filters=["Ongoing"]))
    assert set(both) == {"open"}


async def test_listing_filters_by_duration_from_v1() -> None:
    facade = FakeFacade()
    await _three_transactions(facade)
    facade.clock += 5_000  # "open" started at 1000: it has run 5 s
    assert set(_listed(await _list(facade, duration_filter=4_999, state_filters=["Ongoing"]))) == {"open"}
    # Running exactly that long is not longer than it (Kafka: now - start <= filter is left out).
    assert _listed(await _list(facade, duration_filter=5_000, state_filters=["Ongoing"])) == {}
    # v0 has no duration filter: everything.
    assert len(_listed(await _list(facade, version=0))) == 3


async def test_listing_while_a_partition_loads_is_load_in_progress() -> None:
    facade = FakeFacade()
    await _three_transactions(facade)
    facade.core = None
    response = await _list(facade)
    assert response["error_code"] is E.coordinator_load_in_progress
    assert response["transaction_states"] == []


async def test_describe_shows_state_partitions_timeout_and_start() -> None:
    facade = FakeFacade()
    opened, _, _ = await _three_transactions(facade)
    found = await _describe(facade, ["open", "done", "fresh", "nobody", ""])
    ongoing = found["open"]
    assert ongoing["error_code"] is E.none
    assert (ongoing["producer_id"], ongoing["producer_epoch"]) == (opened.pid, opened.epoch)
    assert ongoing["transaction_state"] == "Ongoing"
    assert ongoing["transaction_timeout"] == 10_000
    assert ongoing["transaction_start_time"] == 1_000
    assert ongoing["topics"] == [{"topic": "t", "partitions": [0, 1]}, {"topic": "u", "partitions": [3]}]
    assert found["done"]["transaction_state"] == "CompleteCommit"
    assert found["done"]["topics"] == []  # a complete transaction's partitions are cleared
    assert found["fresh"]["transaction_state"] == "Empty"
    assert found["nobody"]["error_code"] is E.transactional_id_not_found
    assert found[""]["error_code"] is E.invalid_request


@pytest.mark.parametrize("error", [E.not_coordinator, E.coordinator_load_in_progress, E.coordinator_not_available])
async def test_describe_passes_coordinator_errors_per_id(error: ErrorCode) -> None:
    facade = FakeFacade()
    await _three_transactions(facade)
    facade.coordinator_error = error
    found = await _describe(facade, ["open"])
    assert found["open"]["error_code"] is error
    assert found["open"]["topics"] == []

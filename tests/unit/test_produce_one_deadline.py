"""A Produce request with diskless and classic partitions waits its timeout once, not twice.

The handler waited up to the request's timeout for the diskless batches, then up to the timeout
again for the classic ones' acks=all replication: a producer could be answered after twice its
``request.timeout.ms`` (Kafka's delayed produce has one deadline for the whole request)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from batches import make_batch
from test_produce_waiting_for_room import make

import diskless.broker.produce_apis as produce_apis
from diskless.protocol import messages as m

TIMEOUT_MS = 50


def test_the_classic_wait_gets_what_is_left_of_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[float] = []

    async def never_replicated(waits: list[Any], timeout: float, first: bool) -> list[bool | None]:
        given.append(timeout)
        return [None] * len(waits)

    monkeypatch.setattr(produce_apis, "wait_for_commits", never_replicated)

    async def scenario() -> dict[str, Any]:
        apis, rep, store = make(tmp_path)  # its PUTs wait for a gate never opened: "d" never answers
        apis.broker.host("t")  # type: ignore[attr-defined]  # classic, led here
        try:
            request = SimpleNamespace(
                acks=-1,
                timeout=TIMEOUT_MS,
                transactional_id=None,
                topic_data=[
                    SimpleNamespace(name=name, partition_data=[SimpleNamespace(index=0, records=make_batch([b"v"]))])
                    for name in ("d", "t")
                ],
            )
            answer = apis.produce(m.RequestHeader(m.API_PRODUCE, 9, 1, "c"), request)
            return await answer
        finally:
            store.gate.set()  # lets the representative close without waiting out its PUT
            await rep.close()

    body = asyncio.run(scenario())
    codes = [p["error_code"] for t in body["responses"] for p in t["partition_responses"]]
    assert codes == [produce_apis.ErrorCode.request_timed_out] * 2
    # The diskless wait used the whole timeout: nothing is left for the classic one.
    assert given == [0.0]

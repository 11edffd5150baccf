"""A diskless batch waiting for room in the representative's buffer stays bounded.

``diskless.produce.buffer.max.bytes`` bounds what the representative holds; a batch beyond it
waits in line (``Admission``). That line was bounded only by ``queued.max.request.bytes``: the
produce request holds its frame in the request budget while it is handled, and a connection reads
no more once the budget is spent. But the request stopped being handled while its batch still
waited, in three ways, and then nothing bounded the line (S3 stalled: every acks=0 producer's data,
or every retry of a timed-out producer, piled up in memory):

- acks=0: the handler returned at once (no answer to wait for), giving its frame's bytes back;
- the request timed out (``timeout`` of the Produce request): answered REQUEST_TIMED_OUT, the
  batch still waiting, to be written later anyway;
- the client closed the connection: the handler was cancelled, the batch kept waiting.

Now an acks=0 request is handled until its batch is buffered (Kafka appends an acks=0 batch before
it reads the connection's next request, so the producer is held back by TCP), and a batch still
waiting when its request ends leaves the line: never written, its producer told REQUEST_TIMED_OUT
(where the connection is still open).

Driven without sockets: the real ``ProduceApis`` handler and a real ``Representative`` whose PUTs
wait for the test, and whose only leader is this broker.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from batches import make_batch
from kio.schema.errors import ErrorCode
from loop_turns import turns_until_done
from test_produce_refusals_as_kafka import Broker

from diskless.broker.produce_apis import ProduceApis
from diskless.config import BrokerConfig
from diskless.produce.host import RepresentativeHost
from diskless.produce.representative import Representative
from diskless.protocol import messages as m

BATCH = make_batch([b"x" * 100])


class GatedStore:
    """PUTs wait until ``gate`` opens; what they wrote is kept."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.objects: list[bytes] = []

    async def put(self, key: str, data: bytes, hedge: object = None) -> None:
        await self.gate.wait()
        self.objects.append(data)


class LocalLeader:
    """This broker leads the partition and appends every commit (produce/host.py LocalLeader)."""

    def __init__(self) -> None:
        self.offset = 0

    def commit_batches_now(self, body: dict[str, Any]) -> dict[str, Any]:
        results = []
        for _ in body["entries"]:
            results.append(
                {
                    "error_code": 0,
                    "base_offset": self.offset,
                    "last_offset": self.offset,
                    "leader_epoch": 0,
                    "committed": True,
                    "log_append_time": -1,
                    "log_start_offset": 0,
                }
            )
            self.offset += 1
        return {"results": results}

    async def await_replicated(self, body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("every commit is answered replicated")

    async def verify_txn_partition(self, body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("no transactions here")


def make(tmp_path: Path) -> tuple[ProduceApis, Representative, GatedStore]:
    broker = Broker(tmp_path / "logs")
    broker.host("d")  # diskless, led by this broker
    # Room for one batch: a second one waits until the first has its commit.
    config = BrokerConfig(node_id=0, diskless_wal_linger_ms=1, diskless_produce_buffer_max_bytes=len(BATCH))
    host = RepresentativeHost(config, broker.metadata, None, LocalLeader(), None)  # type: ignore[arg-type]
    store = GatedStore()
    representative = Representative(host, store, lambda key, data: None)  # type: ignore[arg-type]
    broker.representative = representative  # type: ignore[assignment]
    return ProduceApis(broker), representative, store  # type: ignore[arg-type]


def produce(apis: ProduceApis, acks: int, timeout_ms: int = 30_000, tag: bytes = b"x") -> asyncio.Future[Any]:
    """The handler of one Produce request for partition d-0, run as the server runs it (a task)."""
    batch = make_batch([tag * 100])
    request = SimpleNamespace(
        acks=acks,
        timeout=timeout_ms,
        transactional_id=None,
        topic_data=[SimpleNamespace(name="d", partition_data=[SimpleNamespace(index=0, records=batch)])],
    )

    async def handle() -> Any:
        answer = apis.produce(m.RequestHeader(m.API_PRODUCE, 9, 1, "c"), request)
        return answer if answer is None or isinstance(answer, dict) else await answer

    return asyncio.ensure_future(handle())


def code_of(answer: dict[str, Any]) -> ErrorCode:
    return ErrorCode(answer["responses"][0]["partition_responses"][0]["error_code"])


async def until(condition: Any, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


def written(store: GatedStore) -> bytes:
    return b"".join(store.objects)


async def _acks0_is_handled_until_buffered(tmp_path: Path) -> None:
    apis, rep, store = make(tmp_path)
    try:
        first = produce(apis, acks=1)
        await until(lambda: rep.held_bytes == len(BATCH), "the first batch to be held")
        second = produce(apis, acks=0, tag=b"y")
        await turns_until_done(second)
        assert rep.admission.waiting == 1
        # Its batch waits for room: the request is still being handled, so its frame stays counted
        # in queued.max.request.bytes and the connection reads nothing more meanwhile.
        assert not second.done(), "an acks=0 request ended while its batch waited for room"
        store.gate.set()
        assert code_of(await asyncio.wait_for(first, 5)) == ErrorCode.none
        assert await asyncio.wait_for(second, 5) is None  # buffered: its request ends (no answer)
        await until(lambda: b"y" * 100 in written(store), "the acks=0 batch to be written")
    finally:
        await rep.close()


def test_an_acks0_request_is_handled_until_its_batch_is_buffered(tmp_path: Path) -> None:
    asyncio.run(_acks0_is_handled_until_buffered(tmp_path))


async def _timed_out_leaves_the_line(tmp_path: Path) -> None:
    apis, rep, store = make(tmp_path)
    try:
        first = produce(apis, acks=1)
        await until(lambda: rep.held_bytes == len(BATCH), "the first batch to be held")
        late = produce(apis, acks=1, timeout_ms=0, tag=b"y")  # times out while its batch waits
        assert code_of(await asyncio.wait_for(late, 5)) == ErrorCode.request_timed_out
        assert rep.admission.waiting == 0, "a timed-out request's batch still waits for room"
        store.gate.set()
        assert code_of(await asyncio.wait_for(first, 5)) == ErrorCode.none
        third = produce(apis, acks=1, tag=b"z")
        assert code_of(await asyncio.wait_for(third, 5)) == ErrorCode.none
        # Answered REQUEST_TIMED_OUT and never written: the producer's retry is the only copy.
        assert b"y" * 100 not in written(store)
    finally:
        await rep.close()


def test_a_timed_out_requests_batch_leaves_the_line_unwritten(tmp_path: Path) -> None:
    asyncio.run(_timed_out_leaves_the_line(tmp_path))


async def _cancelled_leaves_the_line(tmp_path: Path) -> None:
    apis, rep, store = make(tmp_path)
    try:
        first = produce(apis, acks=-1)
        await until(lambda: rep.held_bytes == len(BATCH), "the first batch to be held")
        gone = produce(apis, acks=-1, tag=b"y")
        await turns_until_done(gone)
        assert rep.admission.waiting == 1
        gone.cancel()  # the client closed its connection (server.py cancels the handler)
        await turns_until_done(gone)
        assert gone.cancelled()
        assert rep.admission.waiting == 0, "a closed connection's batch still waits for room"
        store.gate.set()
        assert code_of(await asyncio.wait_for(first, 5)) == ErrorCode.none
        third = produce(apis, acks=-1, tag=b"z")
        assert code_of(await asyncio.wait_for(third, 5)) == ErrorCode.none
        assert b"y" * 100 not in written(store)
    finally:
        await rep.close()


def test_a_closed_connections_batch_leaves_the_line_unwritten(tmp_path: Path) -> None:
    asyncio.run(_cancelled_leaves_the_line(tmp_path))

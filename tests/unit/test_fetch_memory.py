"""A fetch response stays within the request's max_bytes (fetch.max.bytes) when its diskless
partitions are read through their leaders: the batches it will hold are what the broker fetches
from object storage and holds in memory while building it (issue 10, broker memory)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from types import SimpleNamespace
from typing import Any

import pytest
from batches import Record, make_batch

from diskless.broker.fetch_apis import FetchApis
from diskless.fetch.read_quota import UNLIMITED, ReadQuota
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.storage import pointer

BATCH = make_batch([Record(b"z" * 100_000)], base_timestamp=0)  # ~100 kB served per entry
PARTITION_MAX = 1 << 20
ENTRIES = PARTITION_MAX // len(BATCH)  # what a leader answers for one partition's 1 MiB


def pointers(count: int) -> bytes:
    return b"".join(pointer.encode_pointer_entry(BATCH[:61], "wal/k", i * len(BATCH), len(BATCH)) for i in range(count))


class FakeConn:
    def send_internal(self, api_key: int, body: dict[str, Any]) -> asyncio.Future[Any]:
        assert api_key == internal.INTERNAL_FETCH_POINTERS
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        count = max(1, min(ENTRIES, body["max_bytes"] // len(BATCH)))
        answer = {"error_code": 0, "high_watermark": 10_000, "last_stable_offset": 10_000, "log_start_offset": 0}
        future.set_result({**answer, "kind": pointer_kind(), "data": pointers(count)})
        return future

    async def wait(self, future: asyncio.Future[Any], timeout: float = 30.0) -> Any:
        return await future


def pointer_kind() -> Any:
    from diskless.log.segment import POINTERS

    return POINTERS


class FakeReader:
    def __init__(self) -> None:
        self.fetched = 0  # bytes brought from object storage into memory

    async def batches_of_partitions(self, groups: list[list[Any]], at_tail: Any = ()) -> list[list[bytes]]:
        self.fetched += sum(e.size for entries in groups for e in entries)
        return [[b"x" * e.size for e in entries] for entries in groups]


@pytest.mark.parametrize("max_bytes", [4 << 20, 100_000, 1])
async def test_forwarded_partitions_share_the_fetch_max_bytes(monkeypatch: pytest.MonkeyPatch, max_bytes: int) -> None:
    reader = FakeReader()

    async def get(node: int) -> FakeConn:
        return FakeConn()

    broker = SimpleNamespace(
        peers=SimpleNamespace(get=get),
        metadata=SimpleNamespace(topics={"t": SimpleNamespace(topic_id="tid")}),
        wal_reader=reader,
        lagging_read_quota=ReadQuota(UNLIMITED, 0),
        now_ms=lambda: 0,
        config=SimpleNamespace(fetch_max_bytes=1 << 30),
    )
    apis = FetchApis(broker)  # type: ignore[arg-type]
    entries = [{"partition": p, "error_code": 0, "aborted_transactions": None, "records": None} for p in range(20)]
    # Twenty diskless partitions with no replica here, each read through its leader: the plan gives
    # each the partition's own limit (the response's total was 0 when each was planned).
    forwards = [(entry, "t", entry["partition"], 0, min(PARTITION_MAX, max_bytes), 2, -1) for entry in entries]

    def fetch_once(request: Any, shared_keys: dict[str, int] | None = None) -> Any:
        reads = [(item[0], item[4]) for item in forwards]
        return [{"topic": "t", "partitions": entries}], 0, False, [], forwards, reads

    monkeypatch.setattr(apis, "_fetch_once", fetch_once)
    request = SimpleNamespace(
        session_id=0,
        session_epoch=-1,
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=max_bytes,
        topics=(),
        isolation_level=0,
    )
    answer = await apis.fetch(m.RequestHeader(m.API_FETCH, 12, 1, "c"), request)
    sizes = [len(p["records"] or b"") for t in answer["responses"] for p in t["partitions"]]
    assert sizes[0] > 0  # the first partition with data gets at least one batch, as in Kafka
    assert sum(sizes) <= max(max_bytes, len(BATCH)), sizes
    assert reader.fetched == sum(sizes)
    assert all(p["high_watermark"] == 10_000 for t in answer["responses"] for p in t["partitions"])


@dataclasses.dataclass(frozen=True)
class ConsumerFetch:
    max_bytes: int
    session_id: int = 0
    session_epoch: int = -1
    replica_id: int = -1
    max_wait: datetime.timedelta = datetime.timedelta(0)
    min_bytes: int = 1
    topics: tuple[Any, ...] = ()
    isolation_level: int = 0


async def test_the_broker_caps_a_consumer_fetch_at_fetch_max_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Kafka's broker config fetch.max.bytes: a consumer asking for 50 MiB gets at most this much.
    cap = 2 << 20
    asked: list[int] = []
    broker = SimpleNamespace(config=SimpleNamespace(fetch_max_bytes=cap), now_ms=lambda: 0, wal_reader=None)
    apis = FetchApis(broker)  # type: ignore[arg-type]

    def fetch_once(request: Any, shared_keys: dict[str, int] | None = None) -> Any:
        asked.append(request.max_bytes)
        return [], 0, True, [], [], []

    monkeypatch.setattr(apis, "_fetch_once", fetch_once)
    await apis.fetch(m.RequestHeader(m.API_FETCH, 12, 1, "c"), ConsumerFetch(max_bytes=50 << 20))
    await apis.fetch(m.RequestHeader(m.API_FETCH, 12, 2, "c"), ConsumerFetch(max_bytes=1 << 20))
    assert asked == [cap, 1 << 20]

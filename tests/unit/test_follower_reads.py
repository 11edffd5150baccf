"""Zone-aligned reads on followers (DESIGN.md, "Any broker serves diskless reads").

Metadata presents a follower replica to the clients of its AZ as the leader of a diskless
partition, so whatever that follower answers must be what the leader would answer: never
OFFSET_OUT_OF_RANGE or a lower OffsetForLeaderEpoch end offset for an offset the leader has,
never data below the leader's log start. These tests drive the real Fetch, ListOffsets and
OffsetForLeaderEpoch handlers of two in-memory brokers (a leader and a follower sharing one
metadata view, their peer connections calling each other's handlers directly) over real
partition logs, plus the pure rules (zone alignment, the follower's read decision).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from batches import decode_all, values_batch
from hypothesis import example, given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.broker.diskless_rpcs import DisklessRpcs
from diskless.broker.fetch_apis import FetchApis
from diskless.broker.replica_manager import ReplicaManager
from diskless.cluster.metadata import BrokerInfo, ClusterMetadata, PartitionState, TopicMetadata
from diskless.cluster.zones import zone_aligned_leader
from diskless.config import BrokerConfig
from diskless.log.config import LogConfig
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.replication.follower_reads import FORWARD, OUT_OF_RANGE, SERVE, FollowerView, follower_read
from diskless.replication.partition import Partition

TOPIC = "zoned"
LEADER, FOLLOWER = 0, 1
EPOCH = 3
EARLIEST, LATEST = -2, -1


def ns(value: Any) -> Any:
    """Dicts as attribute objects, the way kio hands requests and responses to handlers."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: ns(v) for k, v in value.items()})
    if isinstance(value, list):
        return [ns(v) for v in value]
    return value


class FakePeer:
    """A peer connection that calls the other broker's handlers in process and records the call."""

    def __init__(self, source: int, target: FakeBroker, calls: list[tuple[int, int]]) -> None:
        self.source = source
        self.target = target
        self.calls = calls

    def send_internal(self, api_key: int, body: dict[str, Any]) -> asyncio.Future[Any]:
        assert api_key == internal.INTERNAL_FETCH_POINTERS
        self.calls.append((self.target.node_id, api_key))
        return asyncio.ensure_future(self.target.rpcs.fetch_pointers_rpc(body))

    async def wait(self, future: asyncio.Future[Any], timeout: float = 30.0) -> Any:
        return await asyncio.wait_for(future, timeout)

    async def request(self, api_key: int, version: int, body: dict[str, Any], timeout: float = 30.0) -> Any:
        self.calls.append((self.target.node_id, api_key))
        header = m.RequestHeader(api_key, version, 0, internal.broker_client_id(self.source, "forward"))
        result = self.target.fetch_apis.handlers()[api_key](header, ns(body))
        if hasattr(result, "__await__"):
            result = await result
        return ns(result)


class FakePeers:
    def __init__(self, owner: FakeBroker) -> None:
        self.owner = owner
        self.calls: list[tuple[int, int]] = []

    async def get(self, node_id: int) -> FakePeer:
        return FakePeer(self.owner.node_id, self.owner.cluster[node_id], self.calls)


class FakeBroker:
    """What the read-side handlers use of a broker."""

    def __init__(
        self, node_id: int, rack: str, metadata: ClusterMetadata, cluster: dict[int, FakeBroker], log_dir: Path
    ) -> None:
        self.node_id = node_id
        self.config = BrokerConfig(node_id=node_id, broker_rack=rack)
        self.metadata = metadata
        self.cluster = cluster
        # No broker is reachable through ``lookup``: the follower's replica fetcher idles and the
        # tests replicate by hand (``Pair.replicate``).
        self.replicas = ReplicaManager(str(log_dir), node_id, lambda node: None)
        self.peers = FakePeers(self)
        self.wal_reader = None
        self.fetch_apis = FetchApis(self)  # type: ignore[arg-type]
        self.rpcs = DisklessRpcs(self)  # type: ignore[arg-type]
        self.clock_ms = time.time_ns() // 1_000_000

    def now_ms(self) -> int:
        return self.clock_ms

    def is_diskless(self, meta: TopicMetadata) -> bool:
        return True


class Pair:
    """A leader (AZ a) and one follower (AZ b) of one diskless partition with ``leader_end`` offsets.

    The logs hold record batches (a diskless topic's classic segments before a switch), so the
    data needs no object storage; every decision under test is about offsets."""

    def __init__(self, root: Path, leader_end: int = 20, follower_end: int = 10, isr: list[int] | None = None) -> None:
        self.metadata = ClusterMetadata("follower-reads")
        self.metadata.brokers[LEADER] = BrokerInfo(LEADER, "127.0.1.1", 9092, "az-a")
        self.metadata.brokers[FOLLOWER] = BrokerInfo(FOLLOWER, "127.0.2.1", 9092, "az-b")
        state = PartitionState([LEADER, FOLLOWER], LEADER, EPOCH, isr if isr is not None else [LEADER, FOLLOWER])
        self.state = state
        self.metadata.topics[TOPIC] = TopicMetadata(TOPIC, str(uuid.uuid4()), [state], {"diskless.enabled": "true"})
        cluster: dict[int, FakeBroker] = {}
        self.leader = cluster[LEADER] = FakeBroker(LEADER, "az-a", self.metadata, cluster, root / "leader")
        self.follower = cluster[FOLLOWER] = FakeBroker(FOLLOWER, "az-b", self.metadata, cluster, root / "follower")
        now = self.leader.clock_ms
        self.leader_part = self._host(self.leader, now)
        self.follower_part = self._host(self.follower, now)
        log = self.leader_part.log
        for _ in range(leader_end // 5):
            log.append_as_leader([memoryview(values_batch(5, tag="r", start_ts=now))], EPOCH, now)
        log.high_watermark = log.log_end_offset
        self.replicate(follower_end)

    def _host(self, broker: FakeBroker, now: int) -> Partition:
        part = broker.replicas.apply(self.metadata.topics[TOPIC], 0, LogConfig(diskless_enabled=True), now)
        assert part is not None
        return part

    async def close(self) -> None:
        for broker in (self.leader, self.follower):
            await broker.replicas.close()

    def replicate(self, upto: int, now_ms: int | None = None, sent_ms: int = -1) -> None:
        """The follower's replica fetcher brings it to ``upto`` (as far as the leader has it), with
        an answer to a request sent at ``sent_ms`` (default: just now)."""
        leader_log = self.leader_part.log
        follower_log = self.follower_part.log
        now = self.follower.clock_ms if now_ms is None else now_ms
        data = b""
        if follower_log.log_end_offset < upto:
            data = leader_log.read(follower_log.log_end_offset, 1 << 20, max_offset=upto).records
        self.follower_part.on_fetched(data, leader_log.high_watermark, leader_log.log_start_offset, now, sent_ms)


def fetch_request(offset: int, max_wait_ms: int = 0) -> Any:
    return ns(
        {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "rack_id": "",
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": EPOCH,
                            "fetch_offset": offset,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
        }
    )


def client_header(api_key: int, version: int) -> m.RequestHeader:
    return m.RequestHeader(api_key, version, 1, "consumer diskless_az=az-b")


async def fetch(broker: FakeBroker, offset: int, max_wait_ms: int = 0) -> dict[str, Any]:
    response = await broker.fetch_apis.fetch(client_header(m.API_FETCH, 12), fetch_request(offset, max_wait_ms))
    return response["responses"][0]["partitions"][0]


def offsets_of(entry: dict[str, Any]) -> list[int]:
    return [r.offset for r in decode_all(entry["records"])] if entry["records"] else []


@pytest.fixture
async def pairs(tmp_path: Path) -> AsyncIterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(**kwargs: Any) -> Pair:
        pair = Pair(tmp_path / f"pair-{len(made)}", **kwargs)
        made.append(pair)
        return pair

    yield make
    for pair in made:
        await pair.close()


# --- item 1: an offset only the leader has -----------------------------------------------------


async def test_a_lagging_follower_serves_an_offset_only_the_leader_has(pairs: Callable[..., Pair]) -> None:
    """A consumer got offset 15 elsewhere (another AZ, a committed offset) while this follower
    has only replicated to 10: it gets the records, not OFFSET_OUT_OF_RANGE."""
    pair = pairs(leader_end=20, follower_end=10)
    assert pair.follower_part.log.log_end_offset == 10
    entry = await fetch(pair.follower, 15)
    assert entry["error_code"] == ErrorCode.none
    assert offsets_of(entry)[0] == 15 and offsets_of(entry)[-1] == 19
    assert entry["high_watermark"] == 20


async def test_a_follower_at_its_own_high_watermark_long_polls_locally(pairs: Callable[..., Pair]) -> None:
    """The steady state (a consumer at the tail) never involves the leader."""
    pair = pairs(leader_end=20, follower_end=20)
    entry = await fetch(pair.follower, 20, max_wait_ms=50)
    assert entry["error_code"] == ErrorCode.none and not entry["records"]
    entry = await fetch(pair.follower, 12)
    assert 12 in offsets_of(entry)
    assert pair.follower.peers.calls == []


async def test_offset_for_leader_epoch_on_a_lagging_follower_is_the_leaders_answer(pairs: Callable[..., Pair]) -> None:
    """A lower end offset for the client's (current) epoch would make it truncate or reset."""
    pair = pairs(leader_end=20, follower_end=10)
    request = ns(
        {
            "replica_id": -1,
            "topics": [
                {"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": EPOCH, "leader_epoch": EPOCH}]}
            ],
        }
    )
    result = pair.follower.fetch_apis.offset_for_leader_epoch(client_header(m.API_OFFSET_FOR_LEADER_EPOCH, 4), request)
    if hasattr(result, "__await__"):
        result = await result
    part = result["topics"][0]["partitions"][0]
    assert part["error_code"] == ErrorCode.none
    assert (part["leader_epoch"], part["end_offset"]) == (EPOCH, 20)


# --- item 2: out of the ISR, or not heard from the leader lately --------------------------------


def brokers(racks: dict[int, str]) -> dict[int, BrokerInfo]:
    return {node: BrokerInfo(node, "127.0.0.1", 9092 + node, rack) for node, rack in racks.items()}


def test_zone_alignment_prefers_an_in_sync_replica() -> None:
    live = brokers({0: "a", 1: "b", 2: "c", 3: "b"})
    state = PartitionState(replicas=[0, 3, 1], leader=0, leader_epoch=1, isr=[0, 1])
    assert zone_aligned_leader(state, "t", 0, "b", live) == 1
    # No in-sync replica in the zone: the out-of-sync one (it forwards until it catches up).
    state = PartitionState(replicas=[0, 3, 1], leader=0, leader_epoch=1, isr=[0])
    assert zone_aligned_leader(state, "t", 0, "b", live) == 3


@given(
    racks=st.dictionaries(st.integers(0, 6), st.sampled_from("abc"), min_size=1, max_size=7),
    data=st.data(),
)
def test_zone_alignment_properties(racks: dict[int, str], data: st.DataObject) -> None:
    live = brokers(racks)
    nodes = sorted(live)
    replicas = data.draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3, unique=True))
    leader = data.draw(st.sampled_from(replicas))
    isr = [leader, *data.draw(st.lists(st.sampled_from(replicas), unique=True))]
    isr = list(dict.fromkeys(isr))
    state = PartitionState(replicas=replicas, leader=leader, leader_epoch=1, isr=isr)
    zone = data.draw(st.sampled_from("abcd"))
    chosen = zone_aligned_leader(state, "t", 0, zone, live)
    in_zone = [n for n in nodes if racks[n] == zone]
    if not in_zone:
        assert chosen == leader
        return
    assert chosen in in_zone
    if any(r in isr for r in replicas if r in in_zone):
        assert chosen in isr, "an in-sync replica in the zone exists but another broker was chosen"
    assert zone_aligned_leader(state, "t", 0, zone, live) == chosen


async def test_an_out_of_sync_follower_reads_through_the_leader(pairs: Callable[..., Pair]) -> None:
    pair = pairs(leader_end=20, follower_end=10, isr=[LEADER])
    entry = await fetch(pair.follower, 5)
    assert entry["error_code"] == ErrorCode.none and offsets_of(entry)[0] == 5
    assert (LEADER, internal.INTERNAL_FETCH_POINTERS) in pair.follower.peers.calls, "served from its own log"


async def test_a_follower_not_heard_from_its_leader_lately_reads_through_the_leader(pairs: Callable[..., Pair]) -> None:
    pair = pairs(leader_end=20, follower_end=20)
    pair.follower.clock_ms += 60_000  # the replica fetcher has had no answer for a minute
    entry = await fetch(pair.follower, 5)
    assert entry["error_code"] == ErrorCode.none and offsets_of(entry)[0] == 5
    assert (LEADER, internal.INTERNAL_FETCH_POINTERS) in pair.follower.peers.calls, "served from its own log"


async def test_an_answer_read_late_is_no_fresher_than_its_request(pairs: Callable[..., Pair]) -> None:
    """The follower's process was paused for a minute with the leader's answer in its socket: the
    answer describes the leader as of the request, a minute ago, so the follower reads through
    the leader until a newer round trip completes."""
    pair = pairs(leader_end=20, follower_end=10)
    pair.follower.clock_ms += 60_000
    pair.replicate(20, sent_ms=pair.follower.clock_ms - 60_000)
    entry = await fetch(pair.follower, 5)
    assert entry["error_code"] == ErrorCode.none and offsets_of(entry)[0] == 5
    assert (LEADER, internal.INTERNAL_FETCH_POINTERS) in pair.follower.peers.calls, "served from its own log"
    pair.replicate(20, sent_ms=pair.follower.clock_ms - 100)
    pair.follower.peers.calls.clear()
    entry = await fetch(pair.follower, 5)
    assert offsets_of(entry)[0] == 5 and pair.follower.peers.calls == []


# --- item 3: never below the leader's log start -----------------------------------------------


async def test_a_follower_behind_on_the_log_start_never_serves_below_the_leaders(pairs: Callable[..., Pair]) -> None:
    """DeleteRecords (or retention) moved the leader's start to 15; the follower, whose fetcher has
    not had an answer since, must not serve offsets whose WAL objects may already be deleted."""
    pair = pairs(leader_end=20, follower_end=20)
    pair.leader_part.log.delete_records_before(15)
    pair.follower.clock_ms += 60_000
    entry = await fetch(pair.follower, 2)
    assert entry["error_code"] == ErrorCode.offset_out_of_range
    assert entry["log_start_offset"] == 15


async def test_a_follower_answers_out_of_range_with_the_leaders_log_start(pairs: Callable[..., Pair]) -> None:
    """The follower heard the new start but its own could move only up to its high watermark."""
    pair = pairs(leader_end=20, follower_end=10)
    pair.leader_part.log.delete_records_before(15)
    pair.replicate(10)  # an answer with no data: HW 20 and log start 15 from the leader
    assert pair.follower_part.log.high_watermark == 10
    entry = await fetch(pair.follower, 12)
    assert entry["error_code"] == ErrorCode.offset_out_of_range
    assert entry["log_start_offset"] == 15
    assert pair.follower.peers.calls == [], "the follower knew the answer"


async def test_list_offsets_earliest_on_a_follower_is_the_leaders_log_start(pairs: Callable[..., Pair]) -> None:
    pair = pairs(leader_end=20, follower_end=20)
    pair.leader_part.log.delete_records_before(15)
    pair.follower.clock_ms += 60_000
    request = ns(
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [{"partition_index": 0, "timestamp": EARLIEST, "current_leader_epoch": -1}],
                }
            ],
        }
    )
    result = await pair.follower.fetch_apis.list_offsets(client_header(m.API_LIST_OFFSETS, 7), request)
    assert result["topics"][0]["partitions"][0]["offset"] == 15


# --- the decision itself -----------------------------------------------------------------------

STALE_MS = 2_000


@st.composite
def leader_and_follower(draw: st.DrawFn) -> tuple[int, int, int, FollowerView, int]:
    """A leader (log start, high watermark, log end) and a follower view consistent with it:
    the follower knows an older (or the current) leader log start, its HW trails the leader's."""
    leader_start = draw(st.integers(0, 50))
    leader_hw = draw(st.integers(leader_start, 100))
    leader_end = draw(st.integers(leader_hw, 120))
    known_start = draw(st.integers(-1, leader_start))
    follower_hw = draw(st.integers(0, leader_hw))
    follower_start = draw(st.integers(0, max(0, min(follower_hw, leader_start))))
    heard_ago = draw(st.integers(0, 2 * STALE_MS))
    view = FollowerView(
        in_isr=draw(st.booleans()),
        heard_from_leader_ms=1_000_000 - heard_ago,
        log_start_offset=follower_start,
        high_watermark=follower_hw,
        leader_log_start_offset=known_start,
    )
    offset = draw(st.integers(0, 130))
    return leader_start, leader_hw, leader_end, view, offset


@given(leader_and_follower())
def test_a_follower_never_answers_what_the_leader_would_not(case: tuple[int, int, int, FollowerView, int]) -> None:
    leader_start, leader_hw, leader_end, view, offset = case
    now = 1_000_000
    decision = follower_read(view, offset, now, STALE_MS)
    if decision.action == OUT_OF_RANGE:
        # The leader would say so too, and the start we report is one the leader had.
        assert offset < leader_start
        assert decision.log_start_offset <= leader_start and offset < decision.log_start_offset
    elif decision.action == SERVE:
        assert view.in_isr and now - view.heard_from_leader_ms <= STALE_MS
        # The data is here and committed; with a fresh view of the leader's start, it is above it.
        assert view.log_start_offset <= offset <= view.high_watermark
        assert offset >= view.leader_log_start_offset
    else:
        assert decision.action == FORWARD
    fresh = FollowerView(True, now, view.log_start_offset, view.high_watermark, leader_start)
    served = follower_read(fresh, offset, now, STALE_MS)
    if served.action == SERVE:
        assert leader_start <= offset <= leader_hw
    if leader_start <= offset <= leader_end:
        assert served.action != OUT_OF_RANGE


# --- the handlers against a model of the leader ------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(1, 3)),  # the leader appends n batches of 5 (sole ISR)
        st.tuples(st.just("replicate"), st.integers(0, 25)),  # one replica fetch round trip, up to +k
        st.tuples(st.just("delete"), st.integers(0, 60)),  # DeleteRecords on the leader
        st.tuples(st.just("fetch"), st.integers(0, 70)),  # a consumer's fetch at the follower
    ),
    max_size=25,
)


def value_at(log: Any, offset: int) -> bytes:
    records = decode_all(log.read(offset, 1 << 20, min_one=True).records)
    return next(r.value for r in records if r.offset == offset)


async def check_follower_against_leader(root: Path, ops: list[tuple[str, int]]) -> None:
    pair = Pair(root, leader_end=10, follower_end=10)
    leader_log = pair.leader_part.log
    known_start = leader_log.log_start_offset  # the leader's start as of the last replica fetch
    try:
        for op, arg in ops:
            if op == "produce":
                for _ in range(arg):
                    batch = values_batch(5, tag=f"b{leader_log.log_end_offset}", start_ts=pair.leader.clock_ms)
                    leader_log.append_as_leader([memoryview(batch)], EPOCH, pair.leader.clock_ms)
                leader_log.high_watermark = leader_log.log_end_offset
            elif op == "delete":
                leader_log.delete_records_before(min(arg, leader_log.high_watermark))
            elif op == "replicate":
                follower_log = pair.follower_part.log
                if follower_log.log_end_offset < leader_log.log_start_offset:
                    # The leader answers OFFSET_OUT_OF_RANGE; the fetcher restarts at its start.
                    follower_log.truncate_fully_and_start_at(leader_log.log_start_offset, pair.follower.clock_ms)
                pair.replicate(follower_log.log_end_offset + arg)
                known_start = leader_log.log_start_offset
            else:
                entry = await fetch(pair.follower, arg)
                start, hw = leader_log.log_start_offset, leader_log.high_watermark
                if start <= arg <= hw:
                    assert entry["error_code"] == ErrorCode.none, f"{entry['error_code']!r} at {arg} in [{start}, {hw}]"
                    got = {r.offset: r.value for r in decode_all(entry["records"])} if entry["records"] else {}
                    if got:
                        assert got[arg] == value_at(leader_log, arg)
                    else:
                        # Only a consumer at the follower's own HW waits there (for replication).
                        assert arg == hw or arg == pair.follower_part.log.high_watermark
                if arg < known_start:
                    assert entry["error_code"] == ErrorCode.offset_out_of_range
                    assert known_start <= entry["log_start_offset"] <= start
                if arg > leader_log.log_end_offset:
                    assert entry["error_code"] == ErrorCode.offset_out_of_range
    finally:
        await pair.close()


@given(OPS)
@example([("produce", 1), ("produce", 1), ("delete", 11), ("replicate", 5), ("fetch", 11)])  # restart inside a batch
def test_a_follower_answers_fetches_as_its_leader_would(ops: list[tuple[str, int]]) -> None:
    """Whatever the follower has replicated, a fetch in the leader's range gets the leader's
    records, and one below the leader's start as last reported gets OFFSET_OUT_OF_RANGE."""
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(check_follower_against_leader(Path(root), ops))

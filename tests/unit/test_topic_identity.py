"""Topic identity on the leader and in hosted replicas: a topic deleted and re-created under the
same name is a different topic. Commits and pointer fetches name the topic id as well as the name
and are refused when it is not the partition's current one; a hosted replica of the old
incarnation is replaced by a fresh log, never reused.

Driven without sockets: a real ``ReplicaManager`` over a temporary directory and the leader-side
RPC handlers (``DisklessRpcs``) over an in-memory broker stand-in.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from batches import values_batch

from diskless.broker.diskless_rpcs import DisklessRpcs
from diskless.broker.fetch_apis import FetchApis
from diskless.broker.replica_manager import PARTITION_METADATA, ReplicaManager
from diskless.cluster.metadata import ClusterMetadata, PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.log.config import LogConfig
from diskless.log.segment import POINTERS
from diskless.protocol import messages as m
from diskless.replication.partition import SHARED_KEYS_FETCHER, Partition

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUEST = 42
NOT_LEADER_OR_FOLLOWER = 6
UNKNOWN_TOPIC_ID = 100
NODE = 0
CONFIG = LogConfig(diskless_enabled=True)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def topic(name: str, partitions: int = 1, topic_id: str | None = None) -> TopicMetadata:
    """A topic led by this broker alone (its own ISR), so a commit is committed on append."""
    states = [PartitionState(replicas=[NODE], leader=NODE, leader_epoch=0, isr=[NODE]) for _ in range(partitions)]
    return TopicMetadata(name, topic_id or str(uuid.uuid4()), states, {"diskless.enabled": "true"})


class FakeBroker:
    """What the leader-side RPC handlers use of a broker: metadata, replicas, config and a clock."""

    def __init__(self, log_dir: Path) -> None:
        self.config = BrokerConfig()
        self.metadata = ClusterMetadata("identity-test")
        self.replicas = ReplicaManager(str(log_dir), NODE, self.metadata.brokers.get)
        self.appended: list[Partition] = []

    @staticmethod
    def now_ms() -> int:
        return now_ms()

    def on_leader_append(self, partition: Partition) -> None:
        partition.on_local_append()
        self.appended.append(partition)

    def prefetch_objects(self, keys: set[str]) -> None:
        pass

    def host(self, meta: TopicMetadata) -> list[Partition]:
        """Put ``meta`` into the metadata and follow it, as ``Broker._on_metadata_change`` does."""
        self.metadata.topics[meta.name] = meta
        hosted = [self.replicas.apply(meta, i, CONFIG, now_ms()) for i in range(len(meta.partitions))]
        assert all(p is not None for p in hosted)
        return [p for p in hosted if p is not None]


@pytest.fixture
def broker(tmp_path: Path) -> FakeBroker:
    return FakeBroker(tmp_path / "logs")


def commit_body(entries: list[dict[str, Any]], key: str = "wal/obj-1.wal") -> dict[str, Any]:
    return {"key": key, "created_ms": now_ms(), "entries": entries}


def entry(name: str, topic_id: str | None, partition: int = 0, tag: str = "v") -> dict[str, Any]:
    body: dict[str, Any] = {
        "topic": name,
        "partition": partition,
        "header": values_batch(2, tag=tag)[:61],
        "position": 0,
        "acks": 1,
    }
    if topic_id is not None:
        body["topic_id"] = topic_id
    return body


async def commit(rpcs: DisklessRpcs, entries: list[dict[str, Any]]) -> list[int]:
    answer = await rpcs.commit_batches_rpc(commit_body(entries))
    return [r["error_code"] for r in answer["results"]]


# --- CommitBatches ------------------------------------------------------------------------------


async def test_commit_naming_the_old_incarnation_is_refused_and_appends_nothing(broker: FakeBroker) -> None:
    old_id = str(uuid.uuid4())
    (replica,) = broker.host(topic("reborn"))
    current_id = broker.metadata.topics["reborn"].topic_id
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    codes = await commit(rpcs, [entry("reborn", old_id, tag="old"), entry("reborn", current_id, tag="new")])

    assert codes == [UNKNOWN_TOPIC_ID, 0]
    assert replica.log.log_end_offset == 2  # only the current incarnation's two records


async def test_commit_without_a_topic_id_is_an_invalid_request(broker: FakeBroker) -> None:
    (replica,) = broker.host(topic("t"))
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    codes = await commit(rpcs, [entry("t", None), {**entry("t", None), "topic_id": 7}])

    assert codes == [INVALID_REQUEST, INVALID_REQUEST]
    assert replica.log.log_end_offset == 0


async def test_commit_while_the_hosted_replica_is_still_the_old_incarnation_is_retriable(broker: FakeBroker) -> None:
    """Metadata already shows the new incarnation but its replica is not applied yet (the change
    handler has not run): the old log must not take the new topic's commit, and the representative
    may retry (the id is current, only this broker lags)."""
    (old_replica,) = broker.host(topic("t"))
    new = topic("t")
    broker.metadata.topics["t"] = new  # metadata updated, replicas not yet
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    codes = await commit(rpcs, [entry("t", new.topic_id)])

    assert codes == [NOT_LEADER_OR_FOLLOWER]
    assert old_replica.log.log_end_offset == 0


# --- FetchPointers ------------------------------------------------------------------------------


async def test_fetch_pointers_checks_the_topic_id(broker: FakeBroker) -> None:
    (replica,) = broker.host(topic("t"))
    current_id = broker.metadata.topics["t"].topic_id
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]
    assert await commit(rpcs, [entry("t", current_id)]) == [0]
    assert replica.log.high_watermark == 2
    base = {"topic": "t", "partition": 0, "offset": 0, "max_bytes": 1 << 20}

    current = await rpcs.fetch_pointers_rpc({**base, "topic_id": current_id})
    stale = await rpcs.fetch_pointers_rpc({**base, "topic_id": str(uuid.uuid4())})
    missing = await rpcs.fetch_pointers_rpc(base)

    assert current["error_code"] == 0 and current["kind"] == POINTERS and current["data"]
    assert stale["error_code"] == UNKNOWN_TOPIC_ID and not stale.get("data")
    assert missing["error_code"] == INVALID_REQUEST and not missing.get("data")


# --- hosted replicas ------------------------------------------------------------------------------


def produce_pointer(replica: Partition, key: str) -> None:
    replica.log.append_pointer_as_leader(values_batch(3)[:61], key, 0, replica.leader_epoch, now_ms())
    replica.on_local_append()


def topic_id_on_disk(replica: Partition) -> str:
    with open(os.path.join(replica.log.directory, PARTITION_METADATA)) as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("topic_id:"))


def test_same_name_with_a_new_id_gets_a_fresh_log(broker: FakeBroker) -> None:
    """What a resync after a lost etcd watch reports: the same name, a new id, no deletion seen."""
    old = topic("t", partitions=2)
    hosted = broker.host(old)
    for replica in hosted:
        produce_pointer(replica, "wal/old.wal")
        assert replica.log.references("wal/old.wal")

    new = topic("t", partitions=1)
    broker.metadata.topics["t"] = new
    broker.replicas.on_topic(new, CONFIG)
    fresh = broker.replicas.apply(new, 0, CONFIG, now_ms())

    assert fresh is not None and fresh is not hosted[0]
    assert fresh.log.log_end_offset == 0 and not fresh.log.references("wal/old.wal")
    assert topic_id_on_disk(fresh) == new.topic_id
    assert broker.replicas.topic_id_of("t", 0) == new.topic_id
    # The old incarnation's second partition is beyond the new topic: dropped, its directory gone.
    assert ("t", 1) not in broker.replicas.partitions
    assert sorted(os.listdir(broker.replicas.log_dir)) == ["t-0"]


def test_apply_alone_replaces_an_old_incarnation(broker: FakeBroker) -> None:
    """Even without the topic-level change first (partition changes only), the old log is not reused."""
    (old,) = broker.host(topic("t"))
    produce_pointer(old, "wal/old.wal")

    new = topic("t")
    broker.metadata.topics["t"] = new
    fresh = broker.replicas.apply(new, 0, CONFIG, now_ms())

    assert fresh is not None and fresh.log.log_end_offset == 0
    assert topic_id_on_disk(fresh) == new.topic_id


def test_same_id_keeps_the_log(broker: FakeBroker) -> None:
    meta = topic("t")
    (replica,) = broker.host(meta)
    produce_pointer(replica, "wal/a.wal")

    broker.replicas.on_topic(meta, CONFIG)
    again = broker.replicas.apply(meta, 0, CONFIG, now_ms())

    assert again is replica and again.log.log_end_offset == 3


def test_reload_after_restart_knows_the_topic_id(broker: FakeBroker, tmp_path: Path) -> None:
    meta = topic("t")
    (replica,) = broker.host(meta)
    produce_pointer(replica, "wal/a.wal")
    replica.log.close(clean=True)

    restarted = ReplicaManager(broker.replicas.log_dir, NODE, broker.metadata.brokers.get)
    restarted.load({"t": meta}, lambda _: CONFIG, now_ms())

    assert restarted.topic_id_of("t", 0) == meta.topic_id
    assert restarted.partitions[("t", 0)].log.log_end_offset == 3


# --- routing by id ------------------------------------------------------------------------------


def test_partition_by_id_forgets_a_deleted_incarnation_even_when_its_name_is_reused() -> None:
    metadata = ClusterMetadata("identity-test")
    old = topic("t", partitions=2)
    metadata.topics["t"] = old
    assert metadata.partition_by_id(old.topic_id, 1) is old.partitions[1]
    assert metadata.partition_by_id(old.topic_id, 2) is None

    new = topic("t", partitions=2)
    metadata.topics["t"] = new  # replaced in place, as the metadata store's writers do

    assert metadata.partition_by_id(old.topic_id, 0) is None
    assert metadata.partition_by_id(new.topic_id, 0) is new.partitions[0]
    assert metadata.topic_by_id(old.topic_id) is None
    del metadata.topics["t"]
    assert metadata.partition_by_id(new.topic_id, 0) is None


async def test_broker_resync_replaces_the_log_of_a_topic_recreated_while_the_watch_was_lost(tmp_path: Path) -> None:
    """The change list an etcd resync reports (every live topic and partition, no deletion for a
    name that still exists) goes through ``Broker._on_metadata_change``: the re-created topic gets
    a fresh log, not the one the old incarnation left."""
    from diskless.broker.broker import Broker

    broker = Broker(BrokerConfig(node_id=NODE, log_dirs=str(tmp_path / "broker")))
    old = topic("t")
    broker.metadata.topics["t"] = old
    await broker._apply_all()
    replica = broker.replicas.partitions[("t", 0)]
    produce_pointer(replica, "wal/old.wal")

    new = topic("t")
    broker.metadata.topics["t"] = new  # what _resync loaded: same name, new id
    await broker._on_metadata_change([("topic", "t"), ("partition", "t", "0")])

    fresh = broker.replicas.partitions[("t", 0)]
    assert fresh is not replica
    assert fresh.log.log_end_offset == 0 and not fresh.log.references("wal/old.wal")
    assert topic_id_on_disk(fresh) == new.topic_id
    await broker.replicas.close()


async def test_a_metadata_change_that_fails_does_not_drop_the_ones_after_it(tmp_path: Path) -> None:
    """One change that cannot be applied (here a topic whose log directory cannot be made) is
    logged and counted; before, its exception ended the whole list and the partitions after it
    were never hosted until some later change named them again."""
    from diskless.broker.broker import Broker

    broker = Broker(BrokerConfig(node_id=NODE, log_dirs=str(tmp_path / "broker")))
    broken, fine = topic("broken"), topic("fine")
    broker.metadata.topics.update(broken=broken, fine=fine)
    applied = broker.replicas.apply

    def apply(meta: TopicMetadata, index: int, config: object, now: int) -> object:
        if meta.name == "broken":
            raise OSError(28, "No space left on device")
        return applied(meta, index, config, now)  # type: ignore[arg-type]

    broker.replicas.apply = apply  # type: ignore[method-assign]
    await broker._on_metadata_change([("partition", "broken", "0"), ("partition", "fine", "0")])

    assert ("fine", 0) in broker.replicas.partitions
    assert ("broken", 0) not in broker.replicas.partitions
    await broker.replicas.close()


# --- the window between a metadata change and its application -------------------------------------


def test_name_lookups_never_return_the_old_incarnations_replica(broker: FakeBroker) -> None:
    """Between the metadata showing the new incarnation and the change handler replacing the hosted
    replica (it awaits other work first, e.g. connecting to brokers after a resync), a request by
    name (Produce, Fetch, ListOffsets ...) must not be served from, or append to, the old log."""
    (old,) = broker.host(topic("t"))
    produce_pointer(old, "wal/old.wal")
    new = topic("t")
    broker.metadata.topics["t"] = new  # metadata updated, replicas not yet
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    code, plog, replica = rpcs._leader_log("t", 0)
    assert (plog, replica) == (None, None) and code == NOT_LEADER_OR_FOLLOWER
    code, plog, replica = rpcs._leader_log("t", 0, any_replica=True)
    assert (plog, replica) == (None, None)


async def test_wal_references_about_the_new_incarnation_are_not_answered_from_the_old_log(
    broker: FakeBroker,
) -> None:
    (old,) = broker.host(topic("t"))
    produce_pointer(old, "wal/shared.wal")
    new = topic("t")
    broker.metadata.topics["t"] = new
    rpcs = DisklessRpcs(broker)  # type: ignore[arg-type]

    answer = await rpcs.wal_references_rpc({"queries": [["wal/shared.wal", new.topic_id, 0]]})

    assert answer["answers"] == [2]  # cannot say: this broker has not applied the new incarnation


# --- replica fetches in flight across a re-creation ---------------------------------------------


def test_a_fetch_response_for_a_replaced_replica_is_not_applied_to_its_successor(tmp_path: Path) -> None:
    """A follower's fetch is in flight (a long poll) when the topic is re-created and the replica
    replaced under the same name: the answer, read from the old incarnation's log, must not land
    in the new replica's fresh log."""
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from diskless.log.partition_log import PartitionLog
    from diskless.replication.fetcher import ReplicaFetcher

    follower, leader = 1, 0
    state = PartitionState(replicas=[leader, follower], leader=leader, leader_epoch=0, isr=[leader, follower])

    def replica(directory: str, topic_id: str) -> Partition:
        plog = PartitionLog(str(tmp_path / directory), LogConfig(), now_ms())
        partition = Partition("t", 0, plog, follower, topic_id)
        partition.apply_state(state, now_ms())
        return partition

    fetcher = ReplicaFetcher(follower, leader, lambda node: None, 500, 1 << 20, lambda: None)
    # Replaced under the same id too (moved away and back while the request was in flight): only
    # the very replica that asked takes the answer.
    topic_id = uuid.uuid4()
    old = replica("old", str(topic_id))
    fetcher.add(old)
    fetcher._request()  # the long poll goes out for the old replica
    fetcher.remove(("t", 0))
    new = replica("new", str(topic_id))
    fetcher.add(new)
    answer = SimpleNamespace(
        partition_index=0,
        error_code=ErrorCode.none,
        diverging_epoch=None,
        records=values_batch(3, tag="old"),
        high_watermark=3,
        log_start_offset=0,
    )

    fetcher._handle(SimpleNamespace(responses=[SimpleNamespace(topic_id=topic_id, partitions=[answer])]))

    assert new.log.log_end_offset == 0
    # The same answer for a replica that is still the one asked for is applied as usual.
    fetcher._request()
    fetcher._handle(SimpleNamespace(responses=[SimpleNamespace(topic_id=topic_id, partitions=[answer])]))
    assert new.log.log_end_offset == 3


# --- replica fetches name the topic by id (Fetch v13, KIP-516) -----------------------------------


class Unthrottled:
    """The operations family as a fetch of a replica no reassignment is adding sees it."""

    def replication_allowance(self, state: object, follower: int) -> None:
        return None

    def replication_served(self, size: int) -> None:
        pass


class FetchingBroker(FakeBroker):
    """A broker stand-in complete enough for the Fetch handler to answer a follower's fetch."""

    def __init__(self, log_dir: Path, node_id: int) -> None:
        self.node_id = node_id
        self.config = BrokerConfig(node_id=node_id)
        self.metadata = ClusterMetadata("identity-test")
        self.replicas = ReplicaManager(str(log_dir), node_id, lambda node: None)  # fetchers idle
        self.appended = []
        self.peers = None
        self.wal_reader = None
        self.fetch_apis = FetchApis(self)  # type: ignore[arg-type]
        self.operations = Unthrottled()

    @staticmethod
    def is_diskless(meta: TopicMetadata) -> bool:
        return True

    def on_follower_fetch(self, partition: Partition, follower: int, fetch_offset: int, log_start_offset: int) -> None:
        partition.on_follower_fetch(follower, fetch_offset, now_ms(), log_start_offset)


def replicated(name: str, leader: int, follower: int) -> TopicMetadata:
    """One partition led by ``leader`` at epoch 0 (every incarnation starts there), ``follower`` in sync."""
    state = PartitionState(replicas=[leader, follower], leader=leader, leader_epoch=0, isr=[leader, follower])
    return TopicMetadata(name, str(uuid.uuid4()), [state], {"diskless.enabled": "true"})


async def replica_fetch_round(
    fetcher: Any, asking: Partition, leader: FetchingBroker, role: str | None = None
) -> tuple[float, list[Any]]:
    """One replica fetch through the real codec: the fetcher's request, the leader's Fetch handler,
    the answer applied by the fetcher. Returns what ``_handle`` returned and the partition answers.
    ``role`` None: the compact form the fetcher sends a leader that serves it (replica_fetch_wire);
    else a Fetch v13 from a fetcher with that client id role (the real one's: SHARED_KEYS_FETCHER)."""
    from diskless.protocol import internal, replica_fetch_wire
    from diskless.replication.fetcher import FETCH_VERSION

    body = dataclasses.replace(fetcher._request(), max_wait=datetime.timedelta(0))
    if role is None:
        # A connection per round: each end's state starts afresh.
        follower_side, leader_side = replica_fetch_wire.ConnectionState(), replica_fetch_wire.ConnectionState()
        request = replica_fetch_wire.decode_request(replica_fetch_wire.encode_request(body, follower_side), leader_side)
        answer = await leader.fetch_apis.replica_fetch(request)
        frame = replica_fetch_wire.encode_answer(7, answer, leader_side)
        response: Any = replica_fetch_wire.decode_answer(memoryview(frame)[8:], follower_side)
    else:
        header = m.RequestHeader(m.API_FETCH, FETCH_VERSION, 7, internal.broker_client_id(asking.node_id, role))
        request_cls = m._request_type(m.API_FETCH, FETCH_VERSION)
        out = io.BytesIO()
        m._writer(request_cls)(out, body)
        request, _ = m._reader(request_cls)(memoryview(out.getvalue()), 0)
        frame = m.encode_response(header, await leader.fetch_apis.fetch(header, request))
        response, _ = m._reader(m._response_type(m.API_FETCH, FETCH_VERSION))(memoryview(frame)[9:], 0)
    answers = [p for t in response.responses for p in t.partitions]
    # As the fetcher's loop: the answer moves its fetch session on (KIP-227) before it is applied.
    assert fetcher.session.handle_response(response.error_code, response.session_id)
    return fetcher._handle(response), answers


@pytest.mark.parametrize("wire", [None, SHARED_KEYS_FETCHER], ids=["compact", "fetch-v13"])
async def test_a_follower_of_the_new_incarnation_never_appends_the_old_ones_batches(
    tmp_path: Path, wire: str | None
) -> None:
    """The leader has not seen the deletion yet: its metadata and log are the old incarnation's, at
    the same leader epoch (0) as the new one's. A follower of the new incarnation fetching from it
    must get UNKNOWN_TOPIC_ID, not the old pointers; once the leader has the new incarnation, the
    same fetch replicates the new log."""
    from kio.schema.errors import ErrorCode

    from diskless.replication.fetcher import ReplicaFetcher

    leader_id, follower_id = 0, 1
    leader = FetchingBroker(tmp_path / "leader", leader_id)
    follower = FetchingBroker(tmp_path / "follower", follower_id)
    try:
        old, new = replicated("t", leader_id, follower_id), replicated("t", leader_id, follower_id)
        leader.metadata.topics["t"] = old
        old_replica = leader.replicas.apply(old, 0, CONFIG, now_ms())
        assert old_replica is not None and old_replica.leader_state is not None
        produce_pointer(old_replica, "wal/old.wal")
        follower.metadata.topics["t"] = new
        new_replica = follower.replicas.apply(new, 0, CONFIG, now_ms())
        assert new_replica is not None and new_replica.leader_epoch == old_replica.leader_epoch == 0
        fetcher = ReplicaFetcher(follower_id, leader_id, lambda node: None, 0, 1 << 20, lambda: None)
        fetcher.add(new_replica)

        backing_off, answers = await replica_fetch_round(fetcher, new_replica, leader, wire)

        assert new_replica.log.log_end_offset == 0 and not new_replica.log.references("wal/old.wal")
        assert [a.error_code for a in answers] == [ErrorCode.unknown_topic_id]
        assert backing_off  # retried after a pause, once the leader's metadata catches up

        # The leader learns of the re-creation; the new incarnation's log is what replicates.
        leader.metadata.topics["t"] = new
        leader.replicas.on_topic(new, CONFIG)
        new_on_leader = leader.replicas.apply(new, 0, CONFIG, now_ms())
        assert new_on_leader is not None
        new_on_leader.log.append_pointer_as_leader(values_batch(5)[:61], "wal/new.wal", 0, 0, now_ms())
        new_on_leader.on_local_append()

        backing_off, answers = await replica_fetch_round(fetcher, new_replica, leader, wire)

        assert [a.error_code for a in answers] == [ErrorCode.none] and not backing_off
        assert new_replica.log.log_end_offset == 5 and new_replica.log.references("wal/new.wal")
        assert not new_replica.log.references("wal/old.wal")
    finally:
        await leader.replicas.close()
        await follower.replicas.close()


@pytest.mark.parametrize("wire", [None, SHARED_KEYS_FETCHER], ids=["compact", "fetch-v13"])
async def test_a_follower_of_the_old_incarnation_gets_nothing_from_a_leader_of_the_new_one(
    tmp_path: Path, wire: str | None
) -> None:
    """The other way round: the follower has not seen the deletion; the leader serves the new
    incarnation. Naming the old id, the follower gets UNKNOWN_TOPIC_ID, not the new batches."""
    from kio.schema.errors import ErrorCode

    from diskless.replication.fetcher import ReplicaFetcher

    leader_id, follower_id = 0, 1
    leader = FetchingBroker(tmp_path / "leader", leader_id)
    follower = FetchingBroker(tmp_path / "follower", follower_id)
    try:
        old, new = replicated("t", leader_id, follower_id), replicated("t", leader_id, follower_id)
        leader.metadata.topics["t"] = new
        new_replica = leader.replicas.apply(new, 0, CONFIG, now_ms())
        assert new_replica is not None
        produce_pointer(new_replica, "wal/new.wal")
        follower.metadata.topics["t"] = old
        old_replica = follower.replicas.apply(old, 0, CONFIG, now_ms())
        assert old_replica is not None
        fetcher = ReplicaFetcher(follower_id, leader_id, lambda node: None, 0, 1 << 20, lambda: None)
        fetcher.add(old_replica)

        backing_off, answers = await replica_fetch_round(fetcher, old_replica, leader, wire)

        assert [a.error_code for a in answers] == [ErrorCode.unknown_topic_id] and backing_off
        assert old_replica.log.log_end_offset == 0
    finally:
        await leader.replicas.close()
        await follower.replicas.close()


def test_fetch_v13_is_served_but_clients_are_offered_v12() -> None:
    """Brokers fetch from each other with v13 (topic ids); ApiVersions keeps offering clients v12
    (see ``apis.ADVERTISED_MAX_VERSIONS`` for why)."""
    from diskless.broker.apis import api_version_entries

    assert m.is_supported(m.API_FETCH, 13)
    (fetch_range,) = [e for e in api_version_entries() if e["api_key"] == m.API_FETCH]
    assert fetch_range["max_version"] == 12

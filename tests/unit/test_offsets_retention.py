"""Committed offsets outlive ``__consumer_offsets``' time retention while they are live, and leave
when Kafka's rules (KIP-211) expire them (see ``diskless/groups/offsets_upkeep.py``).

The partition log here is real, with the topic's retention; "failover" is a fresh shell loading
the same log. Time is the test's.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from loghelpers import T0

from diskless.broker.group_shell import GroupShell
from diskless.config import BrokerConfig
from diskless.groups.consumer_protocol import ConsumerGroup, HeartbeatRequest, HeartbeatResult
from diskless.groups.coordinator import GroupState, OffsetAndMetadata
from diskless.groups.offsets_upkeep import OffsetsUpkeep, check_interval_ms
from diskless.groups.records import encode_consumer, encode_offset, group_deletion_records
from diskless.log import cleaner
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog

DAY = 86_400_000
RETENTION_MS = 7 * DAY  # offsets.retention.minutes' default
SUBSCRIPTION = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\x00\x00\x00\x00"  # consumer protocol v0: ["t"]
T_ID = "00000000-0000-0000-0000-000000000001"  # the fake topic's id (KIP-848 subscription metadata keeps it)


class OffsetsPartition:
    """The one ``__consumer_offsets`` partition, led by this broker; ``gate`` holds replication."""

    def __init__(self, directory: Path, config: LogConfig | None = None) -> None:
        self.index = 0
        self.log = PartitionLog(str(directory), config or LogConfig(retention_ms=RETENTION_MS), T0)
        self.leader_epoch = 0
        self.leader_state: object | None = object()
        self.gate: asyncio.Event | None = None

    async def wait_for_commit(self, offset: int, epoch: int, timeout: float) -> bool:
        if self.gate is not None:
            await self.gate.wait()
        self.log.high_watermark = self.log.log_end_offset
        return True

    def leads_at(self, epoch: int) -> bool:
        return True


class Cluster:
    def __init__(self, tmp_path: Path, config: LogConfig | None = None) -> None:
        self.now = T0
        self.partition = OffsetsPartition(tmp_path / "co-0", config)
        leader = SimpleNamespace(leader=1)
        self.broker = SimpleNamespace(
            node_id=1,
            config=BrokerConfig(offsets_topic_num_partitions=1),
            metadata=SimpleNamespace(topics={}, partition=lambda topic, index: leader),
            replicas=SimpleNamespace(partitions={("__consumer_offsets", 0): self.partition}),
            on_leader_append=lambda replica: None,
        )
        self.shell = self.new_shell()
        self.shell.on_partition(0, self.partition)  # type: ignore[arg-type]
        assert self.shell.topic_configs()["retention.ms"] == str(RETENTION_MS)

    def new_shell(self) -> GroupShell:
        shell = GroupShell(self.broker)
        shell.now_ms = lambda: self.now  # type: ignore[method-assign]
        return shell

    @property
    def core(self):  # type: ignore[no-untyped-def]
        return self.shell.cores[0]

    async def commit(self, group: str, tp: tuple[str, int], offset: int) -> None:
        """OffsetCommit as the handler does it: persist, then apply."""
        value = OffsetAndMetadata(offset, -1, "", self.now)
        assert await self.shell.persist(group, [encode_offset(group, tp[0], tp[1], value)]) is ErrorCode.none
        self.core.apply_offsets(group, {tp: value})

    def advance(self, days: float) -> None:
        """Time passes; the log rolls and applies its retention, as the broker's task does."""
        self.now += int(days * DAY)
        self.partition.log.roll(self.now)
        self.partition.log.apply_retention(self.now)

    def served(self, group: str) -> dict[tuple[str, int], int]:
        return {tp: om.offset for tp, om in self.core.fetch_offsets(group).items()}

    def after_failover(self, group: str) -> dict[tuple[str, int], int]:
        core = self.new_shell().load(self.partition)  # type: ignore[arg-type]
        return {tp: om.offset for tp, om in core.fetch_offsets(group).items()}

    async def stable_group(self, group: str) -> None:
        """A classic consumer group with one member subscribed to "t", Stable (its record stored)."""
        replies: list = []
        self.core.join_group(
            group, "", None, "consumer", [("range", SUBSCRIPTION)], 10_000, 10_000, self.now, replies.append,
            require_known_member_id=False,
        )  # fmt: skip
        self.core.tick(self.now + 3_000)
        member = replies[-1].member_id
        self.core.sync_group(group, 1, member, None, "consumer", "range", {member: b""}, self.now, replies.append)
        assert self.core.group_state(group) is GroupState.COMPLETING_REBALANCE  # until its record is durable
        await self.shell.settle_stores()
        assert self.core.group_state(group) is GroupState.STABLE


def test_an_idle_partitions_offset_of_a_stable_group_survives_failover_after_the_retention(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.stable_group("g")
        await cluster.commit("g", ("t", 0), 42)  # then partition 0 stays idle: no new commit
        for _ in range(30):  # a month, checking every day
            cluster.advance(1)
            await cluster.shell.maintain()
            await cluster.commit("g", ("t", 1), cluster.now // DAY)  # the busy partition
        assert cluster.partition.log.log_start_offset > 0  # retention did delete old records
        assert cluster.served("g")[("t", 0)] == 42
        assert cluster.after_failover("g") == cluster.served("g")

    asyncio.run(scenario())


def test_offsets_of_a_group_without_members_expire_with_tombstones(tmp_path: Path) -> None:
    """KIP-211: a group that never had members (simple consumers) loses each offset the retention
    after its commit: live and after a failover alike."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.commit("simple", ("t", 0), 5)
        cluster.advance(3)
        await cluster.commit("simple", ("t", 1), 6)
        cluster.advance(5)  # day 8: the first offset is over a week old, the second is not
        await cluster.shell.maintain()
        assert cluster.served("simple") == {("t", 1): 6} == cluster.after_failover("simple")
        cluster.advance(3)
        await cluster.shell.maintain()
        assert cluster.served("simple") == {} == cluster.after_failover("simple")
        assert "simple" not in cluster.core.group_ids()  # the empty group is forgotten

    asyncio.run(scenario())


def test_a_commit_in_flight_is_not_overtaken_by_the_older_value_appended_again(tmp_path: Path) -> None:
    """The dangerous interleaving: while the pass waits on one group's append, a newer commit of
    the next group is appended and still replicating; appending that group's core value (the old
    one) after it would leave the log ending with the old value."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.commit("a", ("t", 0), 1)
        await cluster.commit("b", ("t", 0), 1)
        cluster.advance(4)  # past half the retention: both due to be appended again
        cluster.partition.gate = asyncio.Event()
        upkeep = asyncio.create_task(cluster.shell.maintain())
        await asyncio.sleep(0)  # group a's offsets appended again, replicating
        newer = asyncio.create_task(cluster.commit("b", ("t", 0), 2))
        await asyncio.sleep(0)  # appended, replicating
        cluster.partition.gate.set()
        await upkeep
        await newer
        assert cluster.served("b") == {("t", 0): 2} == cluster.after_failover("b")
        cluster.partition.gate = None
        cluster.advance(4)
        await cluster.shell.maintain()  # nothing in flight now: the new value is appended again
        cluster.advance(4)
        assert cluster.after_failover("b") == {("t", 0): 2}

    asyncio.run(scenario())


def test_only_offsets_older_than_half_the_retention_are_due() -> None:
    upkeep = OffsetsUpkeep()
    upkeep.wrote("g", ("t", 0), T0)
    upkeep.wrote("g", ("t", 1), T0 + 3 * DAY)
    offsets = {"g": {("t", 0): OffsetAndMetadata(1), ("t", 1): OffsetAndMetadata(2), ("t", 2): OffsetAndMetadata(3)}}
    due = upkeep.due(offsets, T0 + 4 * DAY, RETENTION_MS, skip=lambda g, tp: False)
    assert set(due["g"]) == {("t", 0), ("t", 2)}  # ("t", 2) was never seen appended: treated as old
    assert upkeep.due(offsets, T0 + 4 * DAY, RETENTION_MS, skip=lambda g, tp: True) == {}
    assert check_interval_ms(600_000, RETENTION_MS) == 600_000
    assert check_interval_ms(600_000, 60_000) == 15_000


def test_a_group_tombstone_costs_its_own_offsets_not_the_partitions() -> None:
    """A replay (or the cleanup) meets a group tombstone for every pruned group: each KIP-848 group
    without offsets gets one (console consumers, one group each). Forgetting the group's offsets
    must not scan every offset of the partition, or a replay of 1000 tombstones next to 100k offsets
    of other groups blocks the broker's event loop for seconds (the load is synchronous)."""
    upkeep = OffsetsUpkeep()
    for i in range(100_000):
        upkeep.wrote(f"busy-{i % 100}", ("t", i), T0)
    started = time.perf_counter()
    for i in range(1_000):
        upkeep.wrote(f"gone-{i}", ("t", 0), T0)
        upkeep.group_removed(f"gone-{i}")
    assert time.perf_counter() - started < 1.0
    offsets = {"busy-0": {("t", 0): OffsetAndMetadata(1)}, "gone-0": {("t", 0): OffsetAndMetadata(1)}}
    due = upkeep.due(offsets, T0 + 4 * DAY, RETENTION_MS, skip=lambda g, tp: False)
    assert due == {"busy-0": {("t", 0): OffsetAndMetadata(1)}, "gone-0": {("t", 0): OffsetAndMetadata(1)}}
    assert upkeep.due(offsets, T0 + DAY, RETENTION_MS, skip=lambda g, tp: False) == {"gone-0": offsets["gone-0"]}


# --- group records -------------------------------------------------------------------------------


def test_a_group_stable_for_longer_than_the_retention_still_loads_after_failover(tmp_path: Path) -> None:
    """The group record is appended again like a live offset: a month without a rebalance, then
    a failover, and the member goes on at its generation."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.stable_group("g")
        (member,) = cluster.core.describe_group("g").members
        for _ in range(30):
            cluster.advance(1)
            await cluster.shell.maintain()
            assert cluster.core.heartbeat("g", 1, member.member_id, None, cluster.now) is ErrorCode.none
        assert cluster.partition.log.log_start_offset > 0  # the first group record is long gone
        core = cluster.new_shell().load(cluster.partition)  # type: ignore[arg-type]
        assert core.group_state("g") is GroupState.STABLE
        assert core.heartbeat("g", 1, member.member_id, None, cluster.now) is ErrorCode.none

    asyncio.run(scenario())


def test_group_records_are_appended_in_the_cores_order(tmp_path: Path) -> None:
    """The record of a group that became Empty is in the log before the call that emptied it
    returns, so a DeleteGroups right after puts its tombstone behind it, never ahead (a replay
    would bring the deleted group back)."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.stable_group("g")
        (member,) = cluster.core.describe_group("g").members
        end = cluster.partition.log.log_end_offset
        cluster.core.leave_group("g", [(member.member_id, None)], cluster.now)
        assert cluster.partition.log.log_end_offset == end + 1  # appended already, not yet reported
        assert cluster.core.prepare_delete_group("g") is ErrorCode.none
        assert await cluster.shell.persist("g", group_deletion_records("g", [])) is ErrorCode.none
        cluster.core.complete_delete_group("g")
        await cluster.shell.settle_stores()
        core = cluster.new_shell().load(cluster.partition)  # type: ignore[arg-type]
        assert core.group_state("g") is None

    asyncio.run(scenario())


def test_a_forgotten_empty_group_gets_a_tombstone(tmp_path: Path) -> None:
    """Kafka's cleanupGroupMetadata: an Empty group without offsets is dropped, and with it its
    group record; otherwise every failover would bring it back (Empty, in ListGroups)."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.stable_group("g")
        (member,) = cluster.core.describe_group("g").members
        cluster.core.leave_group("g", [(member.member_id, None)], cluster.now)
        await cluster.shell.settle_stores()
        assert cluster.new_shell().load(cluster.partition).group_state("g") is GroupState.EMPTY  # type: ignore[arg-type]
        await cluster.shell.maintain()
        assert "g" not in cluster.core.group_ids() and "g" not in cluster.shell.upkeep[0].groups
        assert cluster.new_shell().load(cluster.partition).group_state("g") is None  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_a_group_record_that_cannot_be_appended_fails_the_sync(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        replies: list = []
        cluster.core.join_group(
            "g", "", None, "consumer", [("range", SUBSCRIPTION)], 10_000, 10_000, cluster.now, replies.append,
            require_known_member_id=False,
        )  # fmt: skip
        cluster.core.tick(cluster.now + 3_000)
        member = replies[-1].member_id
        cluster.partition.leader_state = None  # leadership lost under the coordinator
        cluster.core.sync_group("g", 1, member, None, None, None, {member: b"A"}, cluster.now, replies.append)
        await cluster.shell.settle_stores()
        assert replies[-1].error is ErrorCode.not_coordinator
        assert cluster.core.group_state("g") is GroupState.PREPARING_REBALANCE

    asyncio.run(scenario())


def test_a_commit_in_flight_keeps_its_empty_group_from_being_pruned(tmp_path: Path) -> None:
    """An Empty group without offsets yet has a commit on its way (an admin's offset reset): Kafka's
    hasOffsets counts pending commits, so the cleanup leaves it alone. Pruning it would append the
    group tombstone after the commit's record: the live coordinator would then serve the offset
    (the commit recreates the group) while a replay drops it with the group."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.stable_group("g")
        (member,) = cluster.core.describe_group("g").members
        cluster.core.leave_group("g", [(member.member_id, None)], cluster.now)  # Empty at generation 2
        await cluster.shell.settle_stores()
        gate = cluster.partition.gate = asyncio.Event()
        commit = asyncio.create_task(cluster.commit("g", ("t", 0), 7))
        await asyncio.sleep(0)  # appended, replicating
        cluster.partition.gate = None  # what the pass appends is replicated at once
        await cluster.shell.maintain()
        gate.set()
        await commit
        assert cluster.served("g") == {("t", 0): 7} == cluster.after_failover("g")
        assert cluster.new_shell().load(cluster.partition).group_state("g") is GroupState.EMPTY  # type: ignore[arg-type]

    asyncio.run(scenario())


# --- KIP-848 group records -------------------------------------------------------------------------


def consumer_member(member_id: str, epoch: int, owned: set[int]) -> HeartbeatRequest:
    fields: dict = {"owned": {"t": frozenset(owned)} if owned else {}}
    if epoch == 0:
        fields.update(rebalance_timeout_ms=10_000, subscribed_topic_names=("t",), owned={})
    return HeartbeatRequest("cg", member_id, epoch, **fields)


async def consumer_heartbeat(cluster: Cluster, request: HeartbeatRequest) -> HeartbeatResult:
    """ConsumerGroupHeartbeat as the handler does it: answered once the group's records are durable."""
    answers: list[HeartbeatResult] = []
    cluster.core.consumer_group_heartbeat(request, cluster.now, answers.append)
    await cluster.shell.settle_stores()
    (answer,) = answers
    return answer


async def stable_consumer_group(cluster: Cluster, *member_ids: str) -> dict[str, tuple[int, set[int]]]:
    """KIP-848 members of group "cg" on topic "t" (4 partitions) heartbeat until the group is Stable."""
    cluster.broker.metadata.topics["t"] = SimpleNamespace(partitions=[0, 1, 2, 3], internal=False, topic_id=T_ID)
    state = {m: (0, set()) for m in member_ids}
    for _ in range(4):
        for m, (epoch, owned) in state.items():
            answer = await consumer_heartbeat(cluster, consumer_member(m, epoch, owned))
            assert answer.error is ErrorCode.none
            given = set(answer.assignment["t"]) if answer.assignment and "t" in answer.assignment else set()
            state[m] = (answer.member_epoch, given if answer.assignment is not None else owned)
    group = cluster.core.consumer.group("cg")
    assert group is not None and group.state.value == "Stable"
    return state


def test_a_kip848_group_stable_for_longer_than_the_retention_still_loads_after_failover(tmp_path: Path) -> None:
    """A group whose members heartbeat without any change writes nothing: its records are appended
    again like live offsets, and after a month and a failover the members go on at their epochs."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        state = await stable_consumer_group(cluster, "a", "b")
        end = cluster.partition.log.log_end_offset
        for _ in range(30):
            cluster.advance(1)
            await cluster.shell.maintain()
            for m, (epoch, owned) in state.items():
                answer = await consumer_heartbeat(cluster, consumer_member(m, epoch, owned))
                assert (answer.error, answer.member_epoch) == (ErrorCode.none, epoch)
        assert cluster.partition.log.log_start_offset > end  # the group's first records are long gone
        core = cluster.new_shell().load(cluster.partition)  # type: ignore[arg-type]
        loaded = core.consumer.group("cg")
        assert loaded is not None and set(loaded.members) == {"a", "b"}
        for m, (epoch, owned) in state.items():
            assert loaded.members[m].member_epoch == epoch and set(loaded.members[m].assigned["t"]) == owned

    asyncio.run(scenario())


def test_records_of_a_member_that_left_are_not_appended_again(tmp_path: Path) -> None:
    """A member's tombstone drops all its keys from the upkeep: appending its old records again
    would bring it back at the next load. And a group pruned once empty gets a group tombstone."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await stable_consumer_group(cluster, "a", "b")
        assert (await consumer_heartbeat(cluster, consumer_member("a", -1, set()))).error is ErrorCode.none
        assert set(cluster.shell.upkeep[0].consumer["cg"]) >= {("member", "b")}
        assert not {key for key in cluster.shell.upkeep[0].consumer["cg"] if key[1] == "a"}
        cluster.advance(4)
        await cluster.shell.maintain()  # b's and the group's records appended again, none of a's
        cluster.advance(4)
        core = cluster.new_shell().load(cluster.partition)  # type: ignore[arg-type]
        assert set(core.consumer.group("cg").members) == {"b"}  # type: ignore[union-attr]
        # b leaves too; the empty group (no offsets) is pruned with a group tombstone.
        assert (await consumer_heartbeat(cluster, consumer_member("b", -1, set()))).error is ErrorCode.none
        await cluster.shell.maintain()
        assert cluster.core.consumer.group("cg") is None and "cg" not in cluster.shell.upkeep[0].consumer
        assert cluster.new_shell().load(cluster.partition).consumer.group("cg") is None  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_a_kip848_answer_waits_for_replication_and_records_follow_the_cores_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await stable_consumer_group(cluster, "a")
        cluster.partition.gate = asyncio.Event()
        end = cluster.partition.log.log_end_offset
        joining = asyncio.create_task(consumer_heartbeat(cluster, consumer_member("b", 0, set())))
        await asyncio.sleep(0.01)
        assert cluster.partition.log.log_end_offset > end  # appended within the call
        assert not joining.done()  # not replicated: no answer yet
        cluster.partition.gate.set()
        answer = await joining
        assert answer.error is ErrorCode.none and answer.member_epoch == 2

    asyncio.run(scenario())


def test_kip848_records_that_cannot_be_appended_answer_not_coordinator(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await stable_consumer_group(cluster, "a")
        cluster.partition.leader_state = None  # leadership lost under the coordinator
        answer = await consumer_heartbeat(cluster, consumer_member("b", 0, set()))
        assert answer.error is ErrorCode.not_coordinator
        assert set(cluster.core.consumer.group("cg").members) == {"a"}  # type: ignore[union-attr]

    asyncio.run(scenario())


def test_a_commit_in_flight_keeps_its_empty_kip848_group_from_being_pruned(tmp_path: Path) -> None:
    """As for classic groups: an empty KIP-848 group with a commit on its way (an admin's offset
    reset, epoch -1) is not pruned, or its group tombstone would follow the commit's record and a
    replay would drop the offset the live coordinator serves."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await stable_consumer_group(cluster, "a")
        assert (await consumer_heartbeat(cluster, consumer_member("a", -1, set()))).error is ErrorCode.none
        gate = cluster.partition.gate = asyncio.Event()
        commit = asyncio.create_task(cluster.commit("cg", ("t", 0), 7))
        await asyncio.sleep(0)  # appended, replicating
        cluster.partition.gate = None  # what the pass appends is replicated at once
        await cluster.shell.maintain()
        gate.set()
        await commit
        assert cluster.served("cg") == {("t", 0): 7} == cluster.after_failover("cg")

    asyncio.run(scenario())


def test_an_empty_classic_record_does_not_prune_the_kip848_group_that_took_its_id_over(tmp_path: Path) -> None:
    """A classic group left Empty (its record has a generation) and without offsets, then taken over
    by KIP-848 members (an upgrade to group.protocol=consumer): the cleanup of empty groups must not
    write the group tombstone while the KIP-848 group has members, for the tombstone drops that
    group too at the next load (and the upkeep stops appending its records again): its members
    would be told the group does not exist, which librdkafka takes as fatal."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path)
        await cluster.stable_group("g")
        (member,) = cluster.core.describe_group("g").members
        cluster.core.leave_group("g", [(member.member_id, None)], cluster.now)  # Empty at generation 2
        await cluster.shell.settle_stores()
        cluster.broker.metadata.topics["t"] = SimpleNamespace(partitions=[0, 1, 2, 3], internal=False, topic_id=T_ID)
        join = HeartbeatRequest("g", "a", 0, rebalance_timeout_ms=10_000, subscribed_topic_names=("t",), owned={})
        answer = await consumer_heartbeat(cluster, join)
        assert answer.error is ErrorCode.none and answer.member_epoch == 1
        await cluster.shell.maintain()
        assert set(cluster.core.consumer.group("g").members) == {"a"}  # type: ignore[union-attr]
        loaded = cluster.new_shell().load(cluster.partition).consumer.group("g")  # type: ignore[arg-type]
        assert loaded is not None and loaded.members["a"].member_epoch == 1
        # Once the KIP-848 group is empty too, both go with the one tombstone.
        leave = HeartbeatRequest("g", "a", -1)
        assert (await consumer_heartbeat(cluster, leave)).error is ErrorCode.none
        await cluster.shell.maintain()
        assert cluster.core.consumer.group("g") is None and cluster.core.group_state("g") is None
        core = cluster.new_shell().load(cluster.partition)  # type: ignore[arg-type]
        assert core.consumer.group("g") is None and core.group_state("g") is None

    asyncio.run(scenario())


def test_the_tombstones_of_many_pruned_groups_fit_the_topics_batch_limit(tmp_path: Path) -> None:
    """The cleanup wrote the tombstones of every group it pruned in one batch: past the topic's
    max.message.bytes (many short-lived KIP-848 groups, each with its keys' tombstones) the append
    failed, every time: the groups were forgotten here but stayed in the log, their records
    appended again forever, and each failover brought them all back."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path, LogConfig(retention_ms=RETENTION_MS, max_message_bytes=4_096))
        cluster.broker.metadata.topics["t"] = SimpleNamespace(partitions=[0, 1, 2, 3], internal=False, topic_id=T_ID)
        groups = [f"console-consumer-{i:05}" for i in range(60)]
        for group in groups:
            join = HeartbeatRequest(group, "m", 0, rebalance_timeout_ms=10_000, subscribed_topic_names=("t",), owned={})
            assert (await consumer_heartbeat(cluster, join)).error is ErrorCode.none
            assert (await consumer_heartbeat(cluster, HeartbeatRequest(group, "m", -1))).error is ErrorCode.none
        await cluster.shell.maintain()
        assert not cluster.core.consumer.groups and not cluster.shell.upkeep[0].consumer
        loaded = cluster.new_shell().load(cluster.partition)  # type: ignore[arg-type]
        assert not loaded.consumer.groups

    asyncio.run(scenario())


def long_sessions(cluster: Cluster) -> None:
    """KIP-848 sessions outlast the test (days pass without heartbeats): a fresh coordinator."""
    cluster.shell.on_partition(0, None)  # type: ignore[arg-type]
    cluster.broker.config = BrokerConfig(offsets_topic_num_partitions=1, group_consumer_session_timeout_ms=10**13)
    cluster.shell = cluster.new_shell()
    cluster.shell.on_partition(0, cluster.partition)  # type: ignore[arg-type]


def test_a_large_groups_records_and_offsets_are_appended_again_within_the_batch_limit(tmp_path: Path) -> None:
    """A large group's records (and offsets) grow old together, and were appended again in one batch
    per group: past the topic's max.message.bytes that append failed at every pass, and the records
    aged out of the log. After a failover the KIP-848 group was gone (GROUP_ID_NOT_FOUND, fatal to
    librdkafka) and the offsets with it."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path, LogConfig(retention_ms=RETENTION_MS, max_message_bytes=4_096))
        long_sessions(cluster)
        cluster.broker.metadata.topics["t"] = SimpleNamespace(partitions=list(range(8)), internal=False, topic_id=T_ID)
        topics = ("t", *(f"topic-{i:03}" for i in range(40)))  # those offsets do not expire (KIP-211)
        for i in range(40):
            join = HeartbeatRequest("big", f"member-{i:03}", 0, None, None, 10**9, topics, owned={})
            assert (await consumer_heartbeat(cluster, join)).error is ErrorCode.none
        for p in range(8):
            for i in range(40):
                await cluster.commit("big", (f"topic-{i:03}", p), i)  # 320 offsets, one batch each
        live = persisted_state(cluster.core.consumer.group("big"))  # type: ignore[arg-type]
        for _ in range(4):
            cluster.advance(2.5)
            await cluster.shell.maintain()
        assert cluster.partition.log.log_start_offset > 0
        assert persisted_state(cluster.core.consumer.group("big")) == live  # type: ignore[arg-type]
        loaded = cluster.new_shell().load(cluster.partition)  # type: ignore[arg-type]
        assert persisted_state(loaded.consumer.group("big")) == live  # type: ignore[arg-type]
        assert len(loaded.fetch_offsets("big")) == 320

    asyncio.run(scenario())


# --- a compacted __consumer_offsets ------------------------------------------------------------------
# Nothing stops an operator from compacting the topic (Kafka's own default for it is compact, and it
# takes the broker's log.cleanup.policy): every key a deletion must drop needs its own tombstone.

COMPACTED = LogConfig(
    retention_ms=RETENTION_MS, cleanup_policy="compact,delete", min_cleanable_dirty_ratio=0.0, delete_retention_ms=DAY
)


async def compact(cluster: Cluster) -> None:
    """Two cleaning passes a delete.retention.ms apart (another group's commit in between, for the
    second to have something dirty): the second drops the tombstones too."""
    for _ in range(2):
        await cluster.commit("other", ("t", 0), cluster.now)
        cluster.partition.log.roll(cluster.now)
        job = cleaner.prepare(cluster.partition.log, cluster.now)
        assert job is not None
        output = cleaner.run(job, 100_000)
        assert output is not None and cleaner.install(output)
        cluster.now += 2 * DAY


def test_a_compacted_log_does_not_bring_back_a_member_that_left(tmp_path: Path) -> None:
    """One tombstone of a member's metadata key left its target and current assignment records to
    compaction: once the tombstone itself was cleaned away, a load brought the member back with
    its old partitions, which the member that stayed owns now."""

    async def scenario() -> None:
        cluster = Cluster(tmp_path, COMPACTED)
        state = await stable_consumer_group(cluster, "a", "b")
        assert (await consumer_heartbeat(cluster, consumer_member("b", -1, set()))).error is ErrorCode.none
        epoch, owned = state["a"]
        for _ in range(3):
            answer = await consumer_heartbeat(cluster, consumer_member("a", epoch, owned))
            epoch = answer.member_epoch
            owned = set(answer.assignment["t"]) if answer.assignment is not None else owned
        assert owned == {0, 1, 2, 3}
        await compact(cluster)
        loaded = cluster.new_shell().load(cluster.partition).consumer.group("cg")  # type: ignore[arg-type]
        assert loaded is not None and set(loaded.members) == {"a"}

    asyncio.run(scenario())


def test_a_compacted_log_does_not_bring_back_a_pruned_kip848_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        cluster = Cluster(tmp_path, COMPACTED)
        await stable_consumer_group(cluster, "a")
        assert (await consumer_heartbeat(cluster, consumer_member("a", -1, set()))).error is ErrorCode.none
        await cluster.shell.maintain()
        assert cluster.core.consumer.group("cg") is None
        await compact(cluster)
        assert cluster.new_shell().load(cluster.partition).consumer.group("cg") is None  # type: ignore[arg-type]

    asyncio.run(scenario())


# --- random histories ----------------------------------------------------------------------------------


def persisted_state(group: ConsumerGroup) -> object:
    """What the log keeps of a KIP-848 group (no timers)."""
    members = {
        m.member_id: (
            m.instance_id,
            m.subscribed_topics,
            m.rebalance_timeout_ms,
            m.member_epoch,
            m.previous_member_epoch,
            m.state,
            {t: set(p) for t, p in m.assigned.items()},
            {t: set(p) for t, p in m.pending_revocation.items()},
        )
        for m in group.members.values()
    }
    target = {mid: {t: set(p) for t, p in a.items()} for mid, a in group.target.items()}
    epochs = (group.group_epoch, group.assignment_epoch)
    return (epochs, group.subscription_metadata, group.static_members, target, members)


class History:
    """Three KIP-848 clients of group "cg" (the first one static), commits, days passing with the
    upkeep and retention, cleaner passes, failovers, DeleteGroups, and classic members taking the
    emptied group over; after each step a replay of the log equals the live coordinator."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.joined: list[tuple[int, set[int]] | None] = [None] * 3  # (epoch, owned), None: not a member
        self.incarnation = [0] * 3

    def member_id(self, i: int) -> str:
        return f"m{i}-{self.incarnation[i]}"

    async def heartbeat(self, i: int, unchanged: bool = False) -> None:
        joined, instance = self.joined[i], "i0" if i == 0 else None
        if joined is None:
            request = HeartbeatRequest(
                "cg", self.member_id(i), 0, instance, None, 10**9, ("t",), owned={}
            )  # fmt: skip
        else:
            owned: dict | None = None if unchanged else ({"t": frozenset(joined[1])} if joined[1] else {})
            request = HeartbeatRequest("cg", self.member_id(i), joined[0], instance, owned=owned)
        answer = await consumer_heartbeat(self.cluster, request)
        # Sessions outlast the test: nobody that did not leave is ever unknown or fenced.
        assert answer.error is ErrorCode.none, (i, answer)
        owned_now = joined[1] if joined is not None else set()
        if answer.assignment is not None:
            owned_now = set(answer.assignment.get("t", ()))
        self.joined[i] = (answer.member_epoch, owned_now)

    async def leave(self, i: int, epoch: int) -> None:
        request = HeartbeatRequest("cg", self.member_id(i), epoch, "i0" if i == 0 else None)
        answer = await consumer_heartbeat(self.cluster, request)
        assert answer.error is ErrorCode.none
        self.joined[i] = None
        self.incarnation[i] += 1

    async def classic_cycle(self) -> None:
        """A classic member joins the emptied group, syncs and leaves: Empty at a generation."""
        core, cluster, replies = self.cluster.core, self.cluster, []  # type: ignore[var-annotated]
        core.join_group(
            "cg", "", None, "consumer", [("range", SUBSCRIPTION)], 10_000, 10_000, cluster.now, replies.append,
            require_known_member_id=False,
        )  # fmt: skip
        core.tick(cluster.now + 3_000)
        joined = replies[-1]
        assert joined.error is ErrorCode.none
        members = {joined.member_id: b""}
        core.sync_group(
            "cg", joined.generation_id, joined.member_id, None, None, None, members, cluster.now, replies.append
        )
        await cluster.shell.settle_stores()
        assert replies[-1].error is ErrorCode.none
        core.leave_group("cg", [(joined.member_id, None)], cluster.now)
        await cluster.shell.settle_stores()

    async def delete(self) -> None:
        """DeleteGroups as the handler writes it."""
        core = self.cluster.core
        if core.prepare_delete_group("cg") is ErrorCode.none:
            tombstones = [encode_consumer(r) for r in core.consumer_deletion_records("cg")]
            tombstones += group_deletion_records("cg", sorted(core.fetch_offsets("cg")))
            assert await self.cluster.shell.persist("cg", tombstones) is ErrorCode.none
            core.complete_delete_group("cg")

    async def clean(self, hours: int) -> None:
        cluster = self.cluster
        for _ in range(2):
            await cluster.commit("other", ("t", 0), cluster.now)  # something dirty for the pass
            cluster.partition.log.roll(cluster.now)
            job = cleaner.prepare(cluster.partition.log, cluster.now)
            if job is not None:
                output = cleaner.run(job, 100_000)
                assert output is not None and cleaner.install(output)
            cluster.now += hours * 3_600_000
            await cluster.shell.maintain()

    async def step(self, kind: str, arg: int) -> None:
        cluster, i = self.cluster, arg % 3
        joined = self.joined[i]
        if kind == "heartbeat":
            await self.heartbeat(i)
        elif kind == "unchanged" and joined is not None:
            await self.heartbeat(i, unchanged=True)
        elif kind == "leave" and joined is not None:
            await self.leave(i, -1)
        elif kind == "static-leave" and self.joined[0] is not None:
            await self.leave(0, -2)
        elif kind == "expire" and joined is not None:
            group = cluster.core.consumer.group("cg")
            assert group is not None
            group.members[self.member_id(i)].session_deadline_ms = cluster.now
            cluster.core.tick(cluster.now)
            await cluster.shell.settle_stores()
            self.joined[i] = None
            self.incarnation[i] += arg % 2  # the same member id joins again, or a new one
        elif kind == "commit":
            await cluster.commit("cg", ("t", i), arg)
        elif kind == "days":
            cluster.advance((arg + 1) / 2)
            await cluster.shell.maintain()
            for j in range(3):
                if self.joined[j] is not None:
                    await self.heartbeat(j)
        elif kind == "clean":
            await self.clean(6 * (arg + 1))
        elif kind == "maintain":
            await cluster.shell.maintain()
        elif kind == "failover":
            cluster.shell.on_partition(0, None)
            cluster.shell = cluster.new_shell()
            cluster.shell.on_partition(0, cluster.partition)  # type: ignore[arg-type]
        elif kind == "delete":
            await self.delete()
        elif kind == "classic" and self.emptied():
            await self.classic_cycle()
        self.check()

    def emptied(self) -> bool:
        core = self.cluster.core
        return core.consumer.is_empty("cg") and core.group_state("cg") in (None, GroupState.EMPTY)

    def check(self) -> None:
        live = self.cluster.core.consumer.group("cg")
        loaded_core = self.cluster.new_shell().load(self.cluster.partition)  # type: ignore[arg-type]
        loaded = loaded_core.consumer.group("cg")
        if live is None:
            assert loaded is None or not loaded.members, "a group that is gone came back"
        else:
            assert loaded is not None, "a live group was lost"
            assert persisted_state(loaded) == persisted_state(live)
        assert self.cluster.served("cg") == {tp: om.offset for tp, om in loaded_core.fetch_offsets("cg").items()}


HISTORY = st.lists(
    st.tuples(
        st.sampled_from(
            ["heartbeat"] * 3
            + ["unchanged", "leave", "static-leave", "expire", "commit", "days", "clean", "maintain", "failover"]
            + ["delete", "classic"]
        ),
        st.integers(0, 9),
    ),
    min_size=5,
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(HISTORY, st.booleans())
def test_random_histories_replay_into_the_live_groups(steps: list[tuple[str, int]], compacted: bool) -> None:
    """Whatever the upkeep appended again and retention or compaction deleted, a replay of the log
    is the live state: no member or group lost, none brought back, every offset as served."""
    with tempfile.TemporaryDirectory() as directory:

        async def scenario() -> None:
            cluster = Cluster(Path(directory), COMPACTED if compacted else None)
            long_sessions(cluster)
            cluster.broker.metadata.topics["t"] = SimpleNamespace(
                partitions=[0, 1, 2, 3], internal=False, topic_id=T_ID
            )
            history = History(cluster)
            for kind, arg in steps:
                await history.step(kind, arg)

        asyncio.run(scenario())

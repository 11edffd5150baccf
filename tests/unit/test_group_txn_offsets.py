"""Transactional offsets at the group coordinator, as Kafka keeps them (KIP-98, KIP-447).

Driven through ``GroupShell.persist`` on a real ``__consumer_offsets`` partition log, then the
markers as WriteTxnMarkers writes them, and checked against what a new coordinator replays from
the same log: the live state and the log must agree.
- Of the records for one partition of a group, the one appended last counts; a transactional one
  from its COMMIT marker on (a plain commit appended after it wins).
- OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT while a transaction may still
  move the offset.
- Pending offsets go with the partition's leadership: another leader ends those transactions.
- A fenced producer's TxnOffsetCommit is refused (INVALID_PRODUCER_EPOCH), so the next instance's
  COMMIT cannot apply it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from loghelpers import T0

from diskless.broker.group_shell import GroupShell
from diskless.broker.txn_apis import TxnApis
from diskless.config import BrokerConfig
from diskless.groups import handlers
from diskless.groups.consumer_protocol import HeartbeatRequest, HeartbeatResult
from diskless.groups.coordinator import GroupCoordinatorCore, GroupState, JoinResult, OffsetAndMetadata
from diskless.groups.records import encode_offset, encode_offset_tombstone
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.protocol import messages as m

GROUP = "g"
PID = 4000


class OffsetsPartition:
    """The one ``__consumer_offsets`` partition, led by this broker (sole replica)."""

    def __init__(self, directory: Path) -> None:
        self.index = 0
        self.log = PartitionLog(str(directory), LogConfig(), T0)
        self.leader_epoch = 0
        self.leader_state: object | None = object()

    async def wait_for_commit(self, offset: int, epoch: int, timeout: float) -> bool:
        self.log.high_watermark = self.log.log_end_offset
        return True

    def leads_at(self, epoch: int) -> bool:
        return self.leader_state is not None and epoch == self.leader_epoch


def make_shell(tmp_path: Path) -> tuple[GroupShell, OffsetsPartition]:
    partition = OffsetsPartition(tmp_path / "co-0")
    leader = SimpleNamespace(leader=1)
    broker = SimpleNamespace(
        node_id=1,
        config=BrokerConfig(offsets_topic_num_partitions=1),
        metadata=SimpleNamespace(topics={}, partition=lambda topic, index: leader),
        replicas=SimpleNamespace(partitions={("__consumer_offsets", 0): partition}),
        on_leader_append=lambda replica: None,
    )
    shell = GroupShell(broker)
    shell.on_partition(0, partition)  # type: ignore[arg-type]
    return shell, partition


def core_of(shell: GroupShell) -> GroupCoordinatorCore:
    return shell.cores[0]


def commit(shell: GroupShell, tp: tuple[str, int], offset: int) -> None:
    """A plain OffsetCommit, as the handler does it: persist, then apply."""
    om = OffsetAndMetadata(offset, -1, "", T0)
    assert asyncio.run(shell.persist(GROUP, [encode_offset(GROUP, tp[0], tp[1], om)])) is ErrorCode.none
    core_of(shell).apply_offsets(GROUP, {tp: om})


def txn_commit(shell: GroupShell, tp: tuple[str, int], offset: int, epoch: int = 0) -> ErrorCode:
    """TxnOffsetCommit of producer PID."""
    om = OffsetAndMetadata(offset, -1, "", T0)
    return asyncio.run(shell.persist(GROUP, [encode_offset(GROUP, tp[0], tp[1], om)], (PID, epoch)))


def marker(shell: GroupShell, partition: OffsetsPartition, committed: bool, epoch: int = 0) -> None:
    """WriteTxnMarkers on the offsets partition (txn_apis.write_txn_markers' two steps)."""
    partition.log.append_marker_as_leader(PID, epoch, committed, 0, 0, T0)
    partition.log.high_watermark = partition.log.log_end_offset
    shell.on_marker(0, PID, committed)


def offsets(shell: GroupShell) -> dict[tuple[str, int], int]:
    return {tp: om.offset for tp, om in core_of(shell).fetch_offsets(GROUP).items()}


def replayed(shell: GroupShell, partition: OffsetsPartition) -> dict[tuple[str, int], int]:
    """What a new coordinator would serve after loading the same log."""
    fresh = GroupShell(shell.broker)
    return {tp: om.offset for tp, om in fresh.load(partition).fetch_offsets(GROUP).items()}  # type: ignore[arg-type]


def test_a_plain_commit_appended_after_a_transactional_one_wins(tmp_path: Path) -> None:
    shell, partition = make_shell(tmp_path)
    assert txn_commit(shell, ("in", 0), 10) is ErrorCode.none
    commit(shell, ("in", 0), 20)
    marker(shell, partition, committed=True)
    assert offsets(shell) == {("in", 0): 20} == replayed(shell, partition)


def test_an_offset_tombstone_appended_after_a_transactional_commit_wins(tmp_path: Path) -> None:
    shell, partition = make_shell(tmp_path)
    commit(shell, ("in", 0), 5)
    assert txn_commit(shell, ("in", 0), 10) is ErrorCode.none
    asyncio.run(shell.persist(GROUP, [encode_offset_tombstone(GROUP, "in", 0)]))
    core_of(shell).remove_offsets(GROUP, [("in", 0)])
    marker(shell, partition, committed=True)
    assert offsets(shell) == {} == replayed(shell, partition)


def test_committed_and_aborted_transactional_offsets_match_the_replay(tmp_path: Path) -> None:
    shell, partition = make_shell(tmp_path)
    commit(shell, ("in", 0), 5)
    txn_commit(shell, ("in", 0), 10)
    txn_commit(shell, ("in", 1), 11)
    marker(shell, partition, committed=True)
    txn_commit(shell, ("in", 0), 30)
    marker(shell, partition, committed=False)
    assert offsets(shell) == {("in", 0): 10, ("in", 1): 11} == replayed(shell, partition)


def test_pending_offsets_go_with_the_partition(tmp_path: Path) -> None:
    """Transaction 1 is aborted by another leader while this broker does not lead; its offsets must
    not be applied by the producer's next COMMIT once this broker leads again."""
    shell, partition = make_shell(tmp_path)
    commit(shell, ("in", 0), 5)
    txn_commit(shell, ("in", 0), 10)
    partition.leader_state = None
    shell.on_partition(0, partition)  # type: ignore[arg-type]
    partition.log.append_marker_as_leader(PID, 0, False, 0, 1, T0)  # the other leader's ABORT, replicated
    partition.log.high_watermark = partition.log.log_end_offset
    partition.leader_state, partition.leader_epoch = object(), 2
    shell.on_partition(0, partition)  # type: ignore[arg-type]
    assert offsets(shell) == {("in", 0): 5}

    txn_commit(shell, ("in", 1), 3)  # transaction 2 commits another partition
    marker(shell, partition, committed=True)
    assert offsets(shell) == {("in", 0): 5, ("in", 1): 3} == replayed(shell, partition)


def test_a_new_leader_epoch_reloads_the_coordinator(tmp_path: Path) -> None:
    """This broker leads at epoch 0, then (unseen) another broker leads at 1 and ends the
    transaction, then this one at 2: the state is loaded afresh from the log."""
    shell, partition = make_shell(tmp_path)
    txn_commit(shell, ("in", 0), 10)
    partition.log.append_marker_as_leader(PID, 0, False, 0, 1, T0)
    partition.log.high_watermark = partition.log.log_end_offset
    partition.leader_epoch = 2
    shell.on_partition(0, partition)  # type: ignore[arg-type]
    assert shell.pending_partitions(GROUP) == set()
    txn_commit(shell, ("in", 1), 3)
    marker(shell, partition, committed=True)
    assert offsets(shell) == {("in", 1): 3}


def test_a_fenced_producers_offsets_are_refused_and_never_applied(tmp_path: Path) -> None:
    shell, partition = make_shell(tmp_path)
    marker(shell, partition, committed=False, epoch=1)  # InitProducerId of a new instance fenced epoch 0
    assert txn_commit(shell, ("in", 1), 99, epoch=0) is ErrorCode.invalid_producer_epoch  # the zombie
    assert txn_commit(shell, ("in", 0), 10, epoch=1) is ErrorCode.none
    marker(shell, partition, committed=True, epoch=1)
    assert offsets(shell) == {("in", 0): 10} == replayed(shell, partition)


def fetch(shell: GroupShell, require_stable: bool, version: int = 7) -> dict[str, Any]:
    request = m.build(
        load_request_schema(handlers.API_OFFSET_FETCH, version),
        {"group_id": GROUP, "topics": [{"name": "in", "partition_indexes": [0, 1]}], "require_stable": require_stable},
    )
    header = m.RequestHeader(handlers.API_OFFSET_FETCH, version, 1, "c")
    answer = asyncio.run(handlers.offset_fetch(shell, header, request))
    return {p["partition_index"]: (p["error_code"], p["committed_offset"]) for p in answer["topics"][0]["partitions"]}


def test_require_stable_answers_unstable_while_a_transaction_may_move_the_offset(tmp_path: Path) -> None:
    shell, partition = make_shell(tmp_path)
    commit(shell, ("in", 0), 5)
    commit(shell, ("in", 1), 6)
    txn_commit(shell, ("in", 0), 10)

    assert fetch(shell, require_stable=True) == {0: (ErrorCode.unstable_offset_commit, -1), 1: (ErrorCode.none, 6)}
    assert fetch(shell, require_stable=False) == {0: (ErrorCode.none, 5), 1: (ErrorCode.none, 6)}
    marker(shell, partition, committed=True)
    assert fetch(shell, require_stable=True) == {0: (ErrorCode.none, 10), 1: (ErrorCode.none, 6)}


def test_require_stable_also_sees_offsets_a_replay_found_pending(tmp_path: Path) -> None:
    shell, partition = make_shell(tmp_path)
    commit(shell, ("in", 0), 5)
    txn_commit(shell, ("in", 0), 10)
    partition.leader_state = None
    shell.on_partition(0, partition)  # type: ignore[arg-type]
    partition.leader_state, partition.leader_epoch = object(), 1
    shell.on_partition(0, partition)  # type: ignore[arg-type]
    assert fetch(shell, require_stable=True)[0] == (ErrorCode.unstable_offset_commit, -1)
    commit(shell, ("in", 0), 7)
    assert fetch(shell, require_stable=True)[0] == (ErrorCode.unstable_offset_commit, -1)  # as Kafka: until the marker
    marker(shell, partition, committed=True)
    assert fetch(shell, require_stable=True)[0] == (ErrorCode.none, 7)  # appended last
    assert replayed(shell, partition) == {("in", 0): 7}


def test_of_two_transactions_the_one_appended_later_wins_whichever_commits_first(tmp_path: Path) -> None:
    shell, partition = make_shell(tmp_path)
    other = PID + 1
    txn_commit(shell, ("in", 0), 10)  # PID's, appended first
    om = OffsetAndMetadata(20, -1, "", T0)
    assert asyncio.run(shell.persist(GROUP, [encode_offset(GROUP, "in", 0, om)], (other, 0))) is ErrorCode.none
    partition.log.append_marker_as_leader(other, 0, True, 0, 0, T0)
    shell.on_marker(0, other, True)
    marker(shell, partition, committed=True)  # PID's commits last, but its offset was appended first
    assert offsets(shell) == {("in", 0): 20} == replayed(shell, partition)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["plain", "txn", "commit", "abort", "failover"]), st.integers(0, 1), st.integers(0, 1)
        ),
        max_size=25,
    )
)
def test_live_offsets_always_match_a_replay_of_the_log(
    tmp_path_factory: Any, steps: list[tuple[str, int, int]]
) -> None:
    """Any interleaving of plain commits, two producers' transactional commits, their markers and
    coordinator failovers: what the live coordinator serves is what a replay of the log serves,
    and OffsetFetch's pending partitions are those of open transactions."""
    shell, partition = make_shell(tmp_path_factory.mktemp("co"))
    open_txns: dict[int, set[tuple[str, int]]] = {}
    # The model: every record in append order (value, partition, its transaction or None), and the
    # transactions that committed. Of the records that count, the one appended last wins.
    appended: list[tuple[int, tuple[str, int], tuple[int, int] | None]] = []
    committed: set[tuple[int, int]] = set()
    txn_number: dict[int, int] = {}
    for value, (action, producer, index) in enumerate(steps, start=1):
        pid, tp = PID + producer, ("in", index)
        if action == "plain":
            commit(shell, tp, value)
            appended.append((value, tp, None))
        elif action == "txn":
            om = OffsetAndMetadata(value, -1, "", T0)
            code = asyncio.run(shell.persist(GROUP, [encode_offset(GROUP, "in", index, om)], (pid, 0)))
            assert code is ErrorCode.none
            open_txns.setdefault(pid, set()).add(tp)
            appended.append((value, tp, (pid, txn_number.get(pid, 0))))
        elif action in ("commit", "abort") and pid in open_txns:
            partition.log.append_marker_as_leader(pid, 0, action == "commit", 0, 0, T0)
            shell.on_marker(0, pid, action == "commit")
            del open_txns[pid]
            if action == "commit":
                committed.add((pid, txn_number.get(pid, 0)))
            txn_number[pid] = txn_number.get(pid, 0) + 1
        elif action == "failover":
            partition.leader_state = None
            shell.on_partition(0, partition)  # type: ignore[arg-type]
            partition.leader_state, partition.leader_epoch = object(), partition.leader_epoch + 1
            shell.on_partition(0, partition)  # type: ignore[arg-type]
        expected = {tp: v for v, tp, txn in appended if txn is None or txn in committed}
        assert offsets(shell) == expected == replayed(shell, partition)
        assert shell.pending_partitions(GROUP) == set().union(*open_txns.values())


def txn_offset_commit(
    shell: GroupShell, generation: int, member_id: str, instance: str | None = None, group: str = GROUP
) -> ErrorCode:
    """TxnOffsetCommit v3 through the broker's handler; the error of its one partition."""
    version = 3
    request = m.build(
        load_request_schema(m.API_TXN_OFFSET_COMMIT, version),
        {
            "transactional_id": "tx",
            "group_id": group,
            "producer_id": PID,
            "producer_epoch": 0,
            "generation_id": generation,
            "member_id": member_id,
            "group_instance_id": instance,
            "topics": [{"name": "in", "partitions": [{"partition_index": 0, "committed_offset": 7}]}],
        },
    )
    header = m.RequestHeader(m.API_TXN_OFFSET_COMMIT, version, 1, "producer")
    apis = TxnApis(SimpleNamespace(groups=shell, now_ms=lambda: T0))  # type: ignore[arg-type]
    answer = asyncio.run(apis.txn_offset_commit(header, request))
    return answer["topics"][0]["partitions"][0]["error_code"]


def test_txn_offset_commit_follows_kafkas_transactional_validation(tmp_path: Path) -> None:
    """Kafka does not enforce the group state on TxnOffsetCommit (REBALANCE_IN_PROGRESS is fatal
    to the Java producer), and answers a stale KIP-848 member epoch with ILLEGAL_GENERATION (the
    producer's abortable CommitFailedException) rather than STALE_MEMBER_EPOCH (fatal)."""
    shell, _ = make_shell(tmp_path)
    core = core_of(shell)
    joined: list[JoinResult] = []
    core.join_group(GROUP, "", "instance", "consumer", [("range", b"")], 10_000, 10_000, T0, joined.append)
    deadline = core.next_deadline_ms()
    assert deadline is not None
    core.tick(deadline)  # the initial rebalance delay ends: the member has its generation, no assignment yet
    member = joined[0]
    assert core.group_state(GROUP) is GroupState.COMPLETING_REBALANCE
    assert txn_offset_commit(shell, member.generation_id, member.member_id, "instance") is ErrorCode.none
    stale_generation = txn_offset_commit(shell, member.generation_id + 1, member.member_id, "instance")
    assert stale_generation is ErrorCode.illegal_generation
    # A member id is checked even without a generation, as Kafka does for a non-empty group.
    assert txn_offset_commit(shell, -1, "stranger") is ErrorCode.unknown_member_id

    joining = HeartbeatRequest("kip848", "m1", 0, rebalance_timeout_ms=10_000, subscribed_topic_names=("in",), owned={})

    shell.now_ms = lambda: T0  # type: ignore[method-assign]  # the shell's timers run on the test's clock

    async def join() -> int:
        answers: list[HeartbeatResult] = []
        core.consumer_group_heartbeat(joining, T0, answers.append)
        await shell.settle_stores()  # answered once the group's records are replicated
        return answers[0].member_epoch

    epoch = asyncio.run(join())
    assert txn_offset_commit(shell, epoch, "m1", group="kip848") is ErrorCode.none
    assert txn_offset_commit(shell, epoch - 1, "m1", group="kip848") is ErrorCode.illegal_generation

"""``CommitPipeline`` alone, sans-IO, under random interleavings (hypothesis).

A simulated network: each channel is a FIFO that its leader processes in order (as a leader
starts the requests of one connection in order); steps deliver the head of a channel, lose a
channel (its requests may or may not have been applied), finish or fail uploads, move leaders
(away and back too: each move bumps the leader epoch, which every entry carries), and let time
pass. Leaders check each idempotent producer's sequences as Kafka does.

Properties: per partition the leader's log holds batches in arrival order (for the partition
whose producer is not idempotent the leader checks nothing, so only the pipeline keeps it); no
producer is ever answered OUT_OF_ORDER_SEQUENCE; at most one channel
carries a partition's commits at a time; and once the network drains and time passes, every
batch has an outcome and no byte is held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batches import values_batch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from diskless.produce.commit_pipeline import CommitPipeline, NoRoute, Send, State

OOSS = int(ErrorCode.out_of_order_sequence_number)
NOT_LEADER = int(ErrorCode.not_leader_or_follower)
PID = 77
PLAIN = 2  # this partition's producer is not idempotent: only the pipeline keeps its order


@dataclass
class Leaderboard:
    partitions: int
    leader: dict[int, int] = field(default_factory=dict)
    generation: dict[int, int] = field(default_factory=dict)  # bumps when a connection is lost
    next_seq: dict[int, int] = field(default_factory=dict)
    log: dict[int, list[int]] = field(default_factory=dict)  # batch ids in append order
    seq_of: dict[int, int] = field(default_factory=dict)  # batch id -> sequence
    part_of: dict[int, int] = field(default_factory=dict)

    epoch: dict[int, int] = field(default_factory=dict)

    def route(self, key: tuple[str, int]) -> Any:
        leader = self.leader[key[1]]
        if leader < 0:
            return NoRoute.NO_LEADER
        return (leader, self.generation.get(leader, 0), self.epoch.get(key[1], 0))

    def move(self, partition: int, leader: int) -> None:
        if self.leader[partition] != leader:
            self.leader[partition] = leader
            self.epoch[partition] = self.epoch.get(partition, 0) + 1

    def apply(self, channel: tuple[int, int, int], batch_id: int) -> dict[str, Any]:
        """A leader applies one entry stamped with the channel's epoch, as diskless_rpcs does."""
        node, _, stamped = channel
        partition = self.part_of[batch_id]
        if self.leader[partition] != node:
            return {"error_code": NOT_LEADER}
        if stamped != self.epoch.get(partition, 0):
            return {"error_code": int(ErrorCode.fenced_leader_epoch)}
        if partition == PLAIN:  # no idempotence: the leader appends whatever comes, duplicates too
            self.log.setdefault(partition, []).append(batch_id)
            return {"error_code": 0}
        seq = self.seq_of[batch_id]
        expected = self.next_seq.get(partition, 0)
        if seq < expected:
            return {"error_code": 0, "duplicate": True}
        if seq > expected:
            return {"error_code": OOSS}
        self.next_seq[partition] = seq + 1
        self.log.setdefault(partition, []).append(batch_id)
        return {"error_code": 0}


step = st.one_of(
    st.tuples(st.just("produce"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("upload"), st.booleans()),
    st.tuples(st.just("deliver"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("lose"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("move"), st.integers(0, 2), st.integers(-1, 2)),
    st.tuples(st.just("time"), st.integers(1, 3000)),
)


@settings(max_examples=300)
@given(st.lists(step, max_size=80))
# A leader move while a commit is in flight: the next batch must not go to the new leader first.
@example(
    [("produce", 2, 1), ("upload", True), ("move", 2, 1), ("produce", 2, 1), ("upload", True), ("deliver", 0, False)]
)
# A PUT fails while the next flush of the partition uploads first.
@example([("produce", 0, 1), ("produce", 0, 1), ("upload", False), ("upload", True), ("deliver", 0, False)])
# An answer is lost after the leader applied the commit; the batch behind it is in flight.
@example([("produce", 2, 1), ("produce", 2, 1), ("upload", True), ("upload", True), ("deliver", 0, True)])
def test_per_partition_order_and_liveness(steps: list[tuple[Any, ...]]) -> None:
    pipeline = CommitPipeline(retry_timeout_ms=5000, retry_backoff_ms=50)
    board = Leaderboard(3, leader={p: p for p in range(3)})
    queues: dict[tuple[int, int], list[tuple[int, bool]]] = {}  # channel -> [(batch id, applied?)]
    arrivals: dict[int, list[int]] = {p: [] for p in range(3)}
    next_seq = dict.fromkeys(range(3), 0)  # the producer's next sequence per partition
    resend_from: dict[int, int] = {}
    uploading: list[int] = []
    buffered: list[tuple[int, tuple[str, int], bytes]] = []
    outcomes: dict[int, dict[str, Any]] = {}
    ids = iter(range(10_000))
    flushes = iter(range(10_000))
    now = 0

    def pump() -> None:
        for send in pipeline.next_sends(now, board.route):
            assert isinstance(send, Send)
            for batch_id in send.ids:
                queues.setdefault(send.channel, []).append((batch_id, False))
        for batch_id, result in pipeline.take_outcomes():
            assert batch_id not in outcomes
            assert result["error_code"] != OOSS, "a producer was told OUT_OF_ORDER_SEQUENCE"
            outcomes[batch_id] = result
            if result["error_code"] != 0:
                partition = board.part_of[batch_id]
                resend_from[partition] = min(resend_from.get(partition, 1 << 30), board.seq_of[batch_id])
        check_one_channel_per_chain()

    def check_one_channel_per_chain() -> None:
        channels: dict[int, set[Any]] = {}
        for channel, queue in queues.items():
            for batch_id, _ in queue:
                if pipeline.state_of(batch_id) is State.SENT:
                    channels.setdefault(board.part_of[batch_id], set()).add(channel)
        assert all(len(c) <= 1 for c in channels.values()), channels

    def flush() -> None:
        nonlocal buffered
        if buffered:
            sequence = next(flushes)
            pipeline.add_flush(sequence, buffered)
            uploading.append(sequence)
            buffered = []

    for action, *args in steps:
        if action == "produce":
            partition, count = args
            for _ in range(count):
                if partition in resend_from:  # the producer resends from its first failed sequence
                    next_seq[partition] = resend_from.pop(partition)
                batch_id = next(ids)
                seq = next_seq[partition]
                next_seq[partition] += 1
                board.seq_of[batch_id], board.part_of[batch_id] = seq, partition
                arrivals[partition].append(batch_id)
                if partition == PLAIN:
                    data = values_batch(1)
                else:
                    data = values_batch(1, producer_id=PID, producer_epoch=0, base_sequence=seq)
                buffered.append((batch_id, ("topic-id", partition), data))
            flush()
        elif action == "upload" and uploading:
            sequence = uploading.pop(0 if args[0] else -1)  # uploads finish in any order
            if args[0]:
                pipeline.uploaded(sequence, now)
            else:
                pipeline.upload_failed(sequence, now)
        elif action == "deliver":
            live = sorted(c for c, q in queues.items() if q)
            if live:
                channel = live[args[0] % len(live)]
                batch_id, _ = queues[channel].pop(0)
                result = board.apply(channel, batch_id)
                if args[1]:  # the answer is lost after the leader applied it
                    pipeline.lost([batch_id], now)
                else:
                    pipeline.answered(batch_id, result, now)
        elif action == "lose":
            live = sorted(c for c, q in queues.items() if q)
            if live:
                channel = live[args[0] % len(live)]
                lost = queues.pop(channel)
                board.generation[channel[0]] = board.generation.get(channel[0], 0) + 1
                for batch_id, _ in lost[:1] if args[1] else []:  # the first may have been applied
                    board.apply(channel, batch_id)
                pipeline.lost([b for b, _ in lost], now)
        elif action == "move":
            partition, leader = args
            board.move(partition, leader)
            pipeline.leaders_changed()
        elif action == "time":
            now += args[0]
        pump()

    # Drain: finish uploads, bring leaders back, deliver everything, let deadlines pass.
    for partition in range(3):
        board.move(partition, partition)
    while uploading:
        pipeline.uploaded(uploading.pop(), now)
    for _ in range(1000):
        pump()
        live = [c for c, q in queues.items() if q]
        if live:
            channel = live[0]
            batch_id, _ = queues[channel].pop(0)
            pipeline.answered(batch_id, board.apply(channel, batch_id), now)
        elif pipeline.pending:
            now += 1000
        else:
            break
    assert pipeline.pending == 0 and pipeline.in_flight_bytes == 0
    for partition, appended in board.log.items():
        # Never twice: resent only where the leader recognises a duplicate (R6).
        assert len(appended) == len(set(appended)), f"partition {partition} appended a batch twice: {appended}"
        order = {b: i for i, b in enumerate(arrivals[partition])}
        assert appended == sorted(appended, key=order.__getitem__), f"partition {partition}: {appended}"


def idem(seq: int) -> bytes:
    return values_batch(1, producer_id=PID, producer_epoch=0, base_sequence=seq)


def codes(pipeline: CommitPipeline) -> dict[int, int]:
    return {batch_id: result["error_code"] for batch_id, result in pipeline.take_outcomes()}


def test_a_failed_upload_fails_the_partitions_later_batches_with_the_same_code() -> None:
    pipeline = CommitPipeline()
    pipeline.add_flush(0, [(1, ("t", 0), idem(0))])
    pipeline.add_flush(1, [(2, ("t", 0), idem(1)), (3, ("t", 1), values_batch(1))])
    pipeline.uploaded(1, now_ms=0)  # the later flush uploads first: nothing of partition 0 may go
    sends = pipeline.next_sends(0, lambda key: "local")
    assert [s.ids for s in sends] == [[3]]
    pipeline.upload_failed(0, now_ms=1)
    assert codes(pipeline) == {1: int(ErrorCode.kafka_storage_error), 2: int(ErrorCode.kafka_storage_error)}
    assert pipeline.next_sends(1, lambda key: "local") == []


def test_out_of_order_after_a_failure_the_producer_had_not_seen_yet_is_that_failure() -> None:
    pipeline = CommitPipeline()
    pipeline.add_flush(0, [(1, ("t", 0), idem(0))])
    pipeline.upload_failed(0, now_ms=0)
    assert codes(pipeline) == {1: int(ErrorCode.kafka_storage_error)}
    pipeline.add_flush(1, [(2, ("t", 0), idem(1))])  # sent before the producer read the failure
    pipeline.uploaded(1, now_ms=1)
    assert [s.ids for s in pipeline.next_sends(1, lambda key: "local")] == [[2]]
    pipeline.answered(2, {"error_code": OOSS}, now_ms=2)
    assert codes(pipeline) == {2: int(ErrorCode.kafka_storage_error)}
    # The producer resends sequences 0 and 1: appended, the hint is gone; a real gap stays OOSS.
    pipeline.add_flush(2, [(3, ("t", 0), idem(0)), (5, ("t", 0), idem(1))])
    pipeline.uploaded(2, now_ms=3)
    pipeline.next_sends(3, lambda key: "local")
    pipeline.answered(3, {"error_code": 0}, now_ms=4)
    pipeline.answered(5, {"error_code": 0}, now_ms=4)
    pipeline.add_flush(3, [(4, ("t", 0), idem(5))])
    pipeline.uploaded(3, now_ms=5)
    pipeline.next_sends(5, lambda key: "local")
    pipeline.answered(4, {"error_code": OOSS}, now_ms=6)
    assert codes(pipeline) == {3: 0, 5: 0, 4: OOSS}


def test_a_batch_without_a_leader_fails_at_its_deadline_and_takes_later_ones() -> None:
    pipeline = CommitPipeline(retry_timeout_ms=1000)
    pipeline.add_flush(0, [(1, ("t", 0), idem(0)), (2, ("t", 0), idem(1)), (3, ("t", 1), idem(0))])
    pipeline.uploaded(0, now_ms=0)
    route = {("t", 0): NoRoute.NO_LEADER, ("t", 1): "local"}
    assert [s.ids for s in pipeline.next_sends(10, route.__getitem__)] == [[3]]
    pipeline.answered(3, {"error_code": 0}, now_ms=11)
    assert pipeline.next_wakeup_ms() == 1000
    assert pipeline.next_sends(999, route.__getitem__) == [] and codes(pipeline) == {3: 0}
    pipeline.next_sends(1000, route.__getitem__)
    assert codes(pipeline) == {1: NOT_LEADER, 2: NOT_LEADER}
    assert pipeline.pending == 0 and pipeline.in_flight_bytes == 0


def test_a_lost_answer_fails_a_batch_without_idempotence_instead_of_resending_it() -> None:
    """The leader may have appended it and cannot recognise a resend: sent again, one Produce of a
    producer without idempotence (which never retried) was appended twice (R6)."""
    pipeline = CommitPipeline(retry_timeout_ms=10_000, retry_backoff_ms=100)
    pipeline.add_flush(0, [(1, ("t", 0), values_batch(1)), (2, ("t", 1), idem(0))])
    pipeline.uploaded(0, 0)
    sends = pipeline.next_sends(0, lambda key: "remote")
    assert sorted(i for s in sends for i in s.ids) == [1, 2]

    pipeline.lost([1, 2], 10)  # the connection dropped before the answer was read

    assert codes(pipeline) == {1: int(ErrorCode.request_timed_out)}
    resent = pipeline.next_sends(200, lambda key: "remote")
    assert [s.ids for s in resent] == [[2]]  # the idempotent one: the leader dedupes it by sequence


def test_a_batch_whose_send_failed_is_sent_again_even_without_idempotence() -> None:
    """Nothing was written (not connected): the leader cannot have it, so sending again is safe."""
    pipeline = CommitPipeline(retry_timeout_ms=10_000, retry_backoff_ms=100)
    pipeline.add_flush(0, [(1, ("t", 0), values_batch(1))])
    pipeline.uploaded(0, 0)
    assert [s.ids for s in pipeline.next_sends(0, lambda key: "remote")] == [[1]]
    pipeline.lost([1], 10, maybe_applied=False)
    assert codes(pipeline) == {}
    assert [s.ids for s in pipeline.next_sends(200, lambda key: "remote")] == [[1]]


def test_a_restarted_pipeline_ignores_reports_about_the_old_ones_batches() -> None:
    """After the shell's reset the old pipeline's commits may still be answered, lost or failed;
    the fresh pipeline knows none of their ids (the shell never reuses one), so each report is
    ignored and completes nothing of its own, even a batch of the same partition in flight on the
    same channel. It does not wait for the old commits: on one channel the leader applies them
    first, and on another the leader epoch stamped on every entry fences them (see
    test_representative_reset)."""
    old = CommitPipeline()
    old.add_flush(0, [(1, ("t", 0), idem(0))])
    old.uploaded(0, 0)
    assert [s.ids for s in old.next_sends(0, lambda key: "remote")] == [[1]]
    fresh = old.restart()
    fresh.add_flush(1, [(2, ("t", 0), idem(0)), (3, ("t", 0), idem(1))])
    fresh.uploaded(1, 1)
    assert [s.ids for s in fresh.next_sends(1, lambda key: "remote")] == [[2, 3]]

    fresh.answered(1, {"error_code": 0}, 2)
    fresh.lost([1], 2)
    fresh.failed([1], int(ErrorCode.kafka_storage_error), 2)
    assert codes(fresh) == {} and fresh.state_of(2) is State.SENT and fresh.pending == 2

    fresh.answered(2, {"error_code": 0}, 3)
    fresh.answered(3, {"error_code": 0}, 3)
    assert codes(fresh) == {2: 0, 3: 0} and fresh.pending == 0

"""The representative verifies transactional batches with the partition's leader before buffering
them; verification must never reorder a producer's batches (a later batch verified faster would
reach the leader first: OUT_OF_ORDER_SEQUENCE), its guard must travel with the commit, and a
failed verification answers the producer and lets no later batch of it slip through.

The cluster is the in-memory fake of ``test_representative_order`` (leaders applying commits with
Kafka's sequence checks); the leader's verification is a fake whose answers the test releases.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from batches import values_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from test_representative_order import (
    BROKERS,
    PRODUCER_ID,
    TOPIC,
    TOPIC_ID,
    FakeBroker,
    FakeCluster,
    FakeConn,
    FakeStore,
    Faults,
    produce_partition,
)

from diskless.produce.representative import Representative, TxnCheck
from diskless.protocol import internal

NOT_ENOUGH_REPLICAS = int(ErrorCode.not_enough_replicas)


class FakeVerification:
    """The leader's VerifyTxnPartition: answers when the test says so, guard = batch sequence."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Future[int]] = {}
        self.asked: list[int] = []

    async def verify_partition(self, body: dict[str, Any]) -> dict[str, Any]:
        seq = len(self.asked)
        self.asked.append(seq)
        gate = self.gates.setdefault(seq, asyncio.get_running_loop().create_future())
        code = await gate
        return {"error_code": code, "guard": [0, 0, seq]} if code == 0 else {"error_code": code}

    def answer(self, seq: int, code: int = 0) -> None:
        self.gates.setdefault(seq, asyncio.get_running_loop().create_future()).set_result(code)


def txn_batch(seq: int) -> bytes:
    return values_batch(
        1, tag=f"s{seq}", producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=seq, transactional=True
    )


async def setup() -> tuple[FakeCluster, Representative, FakeVerification, list[dict[str, Any]]]:
    cluster = FakeCluster(1, [], [0], Faults())  # partition 0 is led by broker 0: local commits
    broker = FakeBroker(cluster, 32 * 1024 * 1024, 100)
    verification = FakeVerification()
    broker.leader.verification = verification
    commits: list[dict[str, Any]] = []
    original = cluster.commit

    def recording(node: int, body: dict[str, Any]) -> dict[str, Any]:
        commits.extend(body["entries"])
        return original(node, body)

    cluster.commit = recording  # type: ignore[method-assign]
    rep = Representative(broker.host(), FakeStore(set(), [0]), lambda key, data: None)  # type: ignore[arg-type]
    return cluster, rep, verification, commits


def check(seq: int) -> TxnCheck:
    del seq
    return TxnCheck("txn", PRODUCER_ID, 0, 2**62)


async def test_a_slow_first_verification_holds_later_batches_of_the_producer() -> None:
    cluster, rep, verification, commits = await setup()
    try:
        first = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(0), 1, check(0))
        second = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(1), 1, check(1))
        verification.answer(1)  # the later batch is verified first
        await asyncio.sleep(0.05)
        assert not second.done(), "a batch went ahead of an earlier one still being verified"
        verification.answer(0)
        answers = await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert [a["error_code"] for a in answers] == [0, 0]
        assert cluster.logs[0].seqs == [0, 1]
        guards = [e.get("txn_guard") for e in commits]
        assert guards == [[0, 0, 0], [0, 0, 1]], "each commit carries its own verification's guard"
    finally:
        await rep.close()


async def test_a_failed_verification_answers_the_producer_and_later_batches_fail_with_it() -> None:
    cluster, rep, verification, _ = await setup()
    try:
        first = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(0), 1, check(0))
        second = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(1), 1, check(1))
        verification.answer(1)
        verification.answer(0, NOT_ENOUGH_REPLICAS)
        answers = await asyncio.wait_for(asyncio.gather(first, second), 5)
        # The second reached the leader (sequence gap) and reports the first's retriable failure
        # (the hint, CommitPipeline R4), so the producer resends both in order.
        assert [a["error_code"] for a in answers] == [NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS]
        assert cluster.logs[0].seqs == []
    finally:
        await rep.close()


async def test_a_batch_withdrawn_while_verified_is_never_written() -> None:
    """Its request timed out (or its connection closed) during the verification: once verified it
    leaves instead of waiting for room with nothing bounding it (test_produce_waiting_for_room), and
    the producer's next batch, out of order at the leader, reports the same REQUEST_TIMED_OUT."""
    cluster, rep, verification, commits = await setup()
    try:
        first = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(0), 1, check(0))
        second = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(1), 1, check(1))
        rep.withdraw(first)
        verification.answer(0)
        verification.answer(1)
        answers = await asyncio.wait_for(asyncio.gather(first, second), 5)
        timed_out = int(ErrorCode.request_timed_out)
        assert [a["error_code"] for a in answers] == [timed_out, timed_out]
        assert cluster.logs[0].seqs == []
        assert [e["header"] for e in commits] == [txn_batch(1)[:61]], "the withdrawn batch was committed"
    finally:
        await rep.close()


async def test_close_answers_batches_still_being_verified() -> None:
    _, rep, _, _ = await setup()
    waiting = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(0), 1, check(0))
    await rep.close()
    assert (await asyncio.wait_for(waiting, 5))["error_code"] == int(ErrorCode.kafka_storage_error)


# --- verification under the representative's faults, idempotent producers with 5 in flight ----------


class RandomVerification:
    """The leaders' VerifyTxnPartition with varying delays and chosen (retriable) failures."""

    def __init__(self, delays: list[int], failures: set[int]) -> None:
        self.delays = itertools.cycle(delays)
        self.failures = failures
        self.calls = 0

    async def verify_partition(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        call = self.calls
        await asyncio.sleep(next(self.delays) / 1000)  # answers come back out of order
        if call in self.failures:
            return {"error_code": NOT_ENOUGH_REPLICAS}
        return {"error_code": 0, "guard": [0, 0, call]}


class VerifyingConn(FakeConn):
    def __init__(self, cluster: FakeCluster, node: int, verification: RandomVerification) -> None:
        super().__init__(cluster, node)
        self.verification = verification

    def send_internal(self, api_key: int, body: dict[str, Any]) -> asyncio.Future[Any]:
        if api_key == internal.INTERNAL_VERIFY_TXN_PARTITION:
            return asyncio.ensure_future(self.verification.verify_partition(body))
        return super().send_internal(api_key, body)


class TxnProducer:
    """What ``produce_partition`` submits through: every batch transactional."""

    def __init__(self, rep: Representative) -> None:
        self.rep = rep

    def submit(self, topic: str, topic_id: str, partition: int, batch: bytes, acks: int) -> Any:
        return self.rep.submit(topic, topic_id, partition, batch, acks, TxnCheck("txn", PRODUCER_ID, 0, 2**62))


@settings(max_examples=40, deadline=None)
@given(
    partitions=st.integers(1, 3),
    count=st.integers(3, 10),
    verify_delays=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    verify_failures=st.sets(st.integers(1, 40), max_size=6),
    put_failures=st.sets(st.integers(1, 30), max_size=4),
    moves=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 2)), max_size=4),
)
def test_verification_never_makes_a_producer_see_a_gap(
    partitions: int,
    count: int,
    verify_delays: list[int],
    verify_failures: set[int],
    put_failures: set[int],
    moves: list[tuple[int, int]],
) -> None:
    """Verifications answered out of order and failing retriably, PUTs failing, leaders moving:
    the producer never sees OUT_OF_ORDER_SEQUENCE or a gap, and every batch lands once, in order."""

    async def scenario() -> tuple[FakeCluster, list[str], Representative]:
        cluster = FakeCluster(partitions, [(a, p % partitions) for a, p in moves], [0, 1], Faults(put=put_failures))
        broker = FakeBroker(cluster, 32 * 1024 * 1024, 100)
        verification = RandomVerification(verify_delays, verify_failures)
        broker.leader.verification = verification
        broker.peers.conns = {n: VerifyingConn(cluster, n, verification) for n in BROKERS}
        rep = Representative(broker.host(), FakeStore(put_failures, [0, 2]), lambda key, data: None)  # type: ignore[arg-type]
        problems: list[str] = []
        producer = TxnProducer(rep)
        try:
            await asyncio.wait_for(
                asyncio.gather(*(produce_partition(producer, cluster, p, count, problems) for p in range(partitions))),
                20,
            )
        except TimeoutError:
            problems.append("wedged: producers still waiting after 20 s")
        finally:
            await rep.close()
        return cluster, problems, rep

    cluster, problems, rep = asyncio.run(scenario())
    assert problems == []
    for p, log in cluster.logs.items():
        assert log.seqs == list(range(count)), f"partition {p}"
    assert rep.pipeline.pending == 0 and not rep._verifying

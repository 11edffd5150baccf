"""The representative verifies transactional batches with the partition's leader before buffering
them; verification must never reorder a producer's batches (a later batch verified faster would
reach the leader first: OUT_OF_ORDER_SEQUENCE), its guard must travel with the commit, and a
failed verification answers the producer and lets no later batch of it slip through.

The cluster is the in-memory fake of ``test_representative_order`` (leaders applying commits with
Kafka's sequence checks); the leader's verification is a fake whose answers the test releases.
"""

from __future__ import annotations

import asyncio
from typing import Any

from batches import values_batch
from kio.schema.errors import ErrorCode
from test_representative_order import PRODUCER_ID, TOPIC, TOPIC_ID, FakeBroker, FakeCluster, FakeStore, Faults

from diskless.produce.representative import Representative, TxnCheck

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
    broker.apis.txn_verification = verification  # type: ignore[attr-defined]
    commits: list[dict[str, Any]] = []
    original = cluster.commit

    def recording(node: int, body: dict[str, Any]) -> dict[str, Any]:
        commits.extend(body["entries"])
        return original(node, body)

    cluster.commit = recording  # type: ignore[method-assign]
    rep = Representative(broker, FakeStore(set(), [0]), lambda key, data: None)  # type: ignore[arg-type]
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


async def test_close_answers_batches_still_being_verified() -> None:
    _, rep, _, _ = await setup()
    waiting = rep.submit(TOPIC, TOPIC_ID, 0, txn_batch(0), 1, check(0))
    await rep.close()
    assert (await asyncio.wait_for(waiting, 5))["error_code"] == int(ErrorCode.kafka_storage_error)

"""A classic leader that refuses an idempotent batch while its etcd lease may have lapsed (self-fencing,
``cluster/lease.py``) and serves again once the lease is refreshed must not answer the batches the
producer pipelined behind the refused one with OUT_OF_ORDER_SEQUENCE_NUMBER.

Why: librdkafka answers an out-of-order sequence that follows a failed request by bumping its
producer epoch and resending everything unacknowledged under new sequences. A batch in flight at
another leader that was appended there but answered NOT_LEADER (that leader was deposed while it
waited for acks=all) is then written a second time: ``diskless chaos --quick --seed 3`` read
records twice this way (an etcd restart fenced a leader for a moment, a zombie leader held the
other in-flight batch). The gap is of the broker's own making (it refused the batch without
appending it), so the later batches get what the refused one got, NOT_LEADER_OR_FOLLOWER: the
client refreshes metadata and resends from the refused batch, in order, under the same epoch.

Driven without sockets: the real ``ProduceApis`` handler and ``ReplicaManager`` over a temporary
directory, an in-memory broker stand-in whose lease fence is a real ``LeaseFence`` on a clock
the test moves.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from batches import make_batch
from fenced_broker import NODE, TTL_MS, FencedBroker, now_ms
from kio.schema.errors import ErrorCode

from diskless.broker.produce_apis import ProduceApis
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.log.config import LogConfig
from diskless.protocol import messages as m
from diskless.replication.partition import Partition

PID = 7


class ClassicBroker(FencedBroker):
    """The fenced broker of a classic topic."""

    def is_diskless(self, meta: TopicMetadata) -> bool:
        return False

    def host(self, name: str) -> Partition:
        state = PartitionState(replicas=[NODE], leader=NODE, leader_epoch=0, isr=[NODE])
        meta = TopicMetadata(name, str(uuid.uuid4()), [state], {})
        self.metadata.topics[name] = meta
        replica = self.replicas.apply(meta, 0, LogConfig(), now_ms())
        assert replica is not None
        return replica


@pytest.fixture
def broker(tmp_path: Path) -> ClassicBroker:
    return ClassicBroker(tmp_path / "logs")


def produce(apis: ProduceApis, seq: int, count: int = 1, epoch: int = 0, acks: int = 1) -> Any:
    batch = make_batch(
        [b"v%d" % (seq + i) for i in range(count)], producer_id=PID, producer_epoch=epoch, base_sequence=seq
    )
    request = SimpleNamespace(
        acks=acks,
        timeout=5000,
        transactional_id=None,
        topic_data=[SimpleNamespace(name="t", partition_data=[SimpleNamespace(index=0, records=batch)])],
    )
    return apis.produce(m.RequestHeader(m.API_PRODUCE, 9, 1, "c"), request)


def answer(body: Any) -> tuple[ErrorCode, int]:
    part = body["responses"][0]["partition_responses"][0]
    return ErrorCode(part["error_code"]), part["base_offset"]


async def produce_all(apis: ProduceApis, seq: int, count: int = 1) -> tuple[ErrorCode, int]:
    """acks=all: the handler answers at once when it refuses, else after replication (here: none)."""
    body = produce(apis, seq, count, acks=-1)
    return answer(body if isinstance(body, dict) else await body)


def test_batches_pipelined_behind_one_refused_while_fenced_are_refused_alike(broker: ClassicBroker) -> None:
    replica = broker.host("t")
    apis = ProduceApis(broker)  # type: ignore[arg-type]
    assert answer(produce(apis, 0, 2)) == (ErrorCode.none, 0)

    broker.clock = TTL_MS  # no keepalive succeeded for the TTL: fenced
    assert answer(produce(apis, 2)) == (ErrorCode.not_leader_or_follower, -1)
    broker.fence.on_refreshed(TTL_MS)  # the lease lives on: leading again, same epoch
    # Sequences 3 and 4-5 were in flight behind 2: refused like it, not out of order.
    assert answer(produce(apis, 3)) == (ErrorCode.not_leader_or_follower, -1)
    assert answer(produce(apis, 4, 2)) == (ErrorCode.not_leader_or_follower, -1)
    assert replica.log.log_end_offset == 2

    # The producer resends from the refused batch, in order, under the same epoch.
    assert answer(produce(apis, 2)) == (ErrorCode.none, 2)
    assert answer(produce(apis, 3)) == (ErrorCode.none, 3)
    assert answer(produce(apis, 4, 2)) == (ErrorCode.none, 4)
    assert answer(produce(apis, 3)) == (ErrorCode.none, 3)  # a retry is still a duplicate
    # With the gap closed, a real gap is out of order again.
    assert answer(produce(apis, 9))[0] == ErrorCode.out_of_order_sequence_number


def test_a_gap_the_leader_did_not_make_is_still_out_of_order(broker: ClassicBroker) -> None:
    broker.host("t")
    apis = ProduceApis(broker)  # type: ignore[arg-type]
    assert answer(produce(apis, 0, 2)) == (ErrorCode.none, 0)
    broker.clock = TTL_MS
    assert answer(produce(apis, 5))[0] == ErrorCode.not_leader_or_follower  # refused: sequence 5, not 2
    broker.fence.on_refreshed(TTL_MS)
    assert answer(produce(apis, 3))[0] == ErrorCode.out_of_order_sequence_number  # 2 never reached this leader
    assert answer(produce(apis, 2)) == (ErrorCode.none, 2)


async def test_batches_pipelined_behind_one_refused_for_too_small_an_isr_are_refused_alike(
    broker: ClassicBroker,
) -> None:
    """NOT_ENOUGH_REPLICAS is refused before the append too, and the ISR may be back for the next."""
    replica = broker.host("t")
    apis = ProduceApis(broker)  # type: ignore[arg-type]
    assert await produce_all(apis, 0, 2) == (ErrorCode.none, 0)
    replica.log.update_config(LogConfig(min_insync_replicas=2))
    assert await produce_all(apis, 2) == (ErrorCode.not_enough_replicas, -1)
    replica.log.update_config(LogConfig(min_insync_replicas=1))  # the ISR grew back, say
    assert await produce_all(apis, 3) == (ErrorCode.not_enough_replicas, -1)
    assert await produce_all(apis, 2) == (ErrorCode.none, 2)
    assert await produce_all(apis, 3) == (ErrorCode.none, 3)

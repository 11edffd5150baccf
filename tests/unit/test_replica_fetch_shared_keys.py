"""A replica fetch answer writes each WAL object key once across its partitions, through the real
Fetch handler, codec and fetcher, in the compact replica fetch form and in a Fetch v13 from a
follower that says it reads shared keys; a follower that does not (an older version, mid-upgrade)
gets every run with its own keys, as before."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

import pytest
from batches import values_batch
from test_topic_identity import CONFIG, FetchingBroker, now_ms, replica_fetch_round

from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.replication.fetcher import ReplicaFetcher
from diskless.replication.partition import SHARED_KEYS_FETCHER, Partition, collect_pointer_keys

LEADER, FOLLOWER = 0, 1
PARTITIONS = 12
KEYS = ["wal/2026/11/28/11/1795863000000-az-1-1-" + "a" * 32 + ".wal", "wal/other-object.wal"]


def topic() -> TopicMetadata:
    state = PartitionState(replicas=[LEADER, FOLLOWER], leader=LEADER, leader_epoch=0, isr=[LEADER, FOLLOWER])
    return TopicMetadata("t", str(uuid.uuid4()), [state] * PARTITIONS, {"diskless.enabled": "true"})


def hosted(broker: FetchingBroker, meta: TopicMetadata) -> list[Partition]:
    broker.metadata.topics[meta.name] = meta
    replicas = [broker.replicas.apply(meta, i, CONFIG, now_ms()) for i in range(PARTITIONS)]
    assert all(r is not None for r in replicas)
    return [r for r in replicas if r is not None]


def segment_bytes(replica: Partition) -> bytes:
    """The log's pointer entries as a read from its start returns them."""
    plog = replica.log
    return bytes(plog.read(plog.log_start_offset, 1 << 20, max_offset=plog.log_end_offset).records)


@pytest.mark.parametrize(
    "role", [None, SHARED_KEYS_FETCHER, "replica-fetcher"], ids=["compact-wire", "shared-keys", "older-follower"]
)
async def test_followers_copy_every_partitions_pointers_exactly(tmp_path: Path, role: str | None) -> None:
    leader = FetchingBroker(tmp_path / "leader", LEADER)
    follower = FetchingBroker(tmp_path / "follower", FOLLOWER)
    try:
        meta = topic()
        leading, following = hosted(leader, meta), hosted(follower, meta)
        for index, replica in enumerate(leading):
            # One flush's object in every partition, a second object in every third one.
            replica.log.append_pointer_as_leader(values_batch(2)[:61], KEYS[0], 100 * index, 0, now_ms())
            if index % 3 == 0:
                replica.log.append_pointer_as_leader(values_batch(3)[:61], KEYS[1], 7 * index, 0, now_ms())
            replica.on_local_append()
        fetcher = ReplicaFetcher(FOLLOWER, LEADER, lambda node: None, 0, 1 << 20, lambda: None)
        for replica in following:
            fetcher.add(replica)

        pause, answers = await replica_fetch_round(fetcher, following[0], leader, role)

        assert not pause and len(answers) == PARTITIONS
        for ours, theirs in zip(following, leading, strict=True):
            assert ours.log.log_end_offset == theirs.log.log_end_offset > 0
            assert segment_bytes(ours) == segment_bytes(theirs)
        marks = {bytes(a.records[:8]) for a in answers}
        if role != "replica-fetcher":
            assert marks == {struct.pack(">q", -4)}
            written = []
            for a in answers:  # the keys each run writes itself
                table: dict[int, bytes] = {}
                collect_pointer_keys(a.records, table)
                written.append(len(table))
            assert sum(written) == len(KEYS)  # each once in the whole answer; the other runs refer
        else:
            assert marks == {struct.pack(">q", -3)}  # an older follower: every run its own keys
    finally:
        await leader.replicas.close()
        await follower.replicas.close()


def test_a_run_using_a_key_written_in_a_partition_no_longer_asked_for_still_applies(tmp_path: Path) -> None:
    """The run that writes a key may belong to a partition the fetcher stopped asking for while
    the answer was on its way (moved, deleted): the keys are gathered from every run first."""
    from types import SimpleNamespace

    from kio.schema.errors import ErrorCode

    from diskless.log.partition_log import PartitionLog
    from diskless.replication.partition import wrap_pointers
    from diskless.storage import pointer

    topic_id = uuid.uuid4()
    state = PartitionState(replicas=[LEADER, FOLLOWER], leader=LEADER, leader_epoch=0, isr=[LEADER, FOLLOWER])
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, lambda node: None, 500, 1 << 20, lambda: None)
    replicas = []
    for index in (0, 1):
        replica = Partition("t", index, PartitionLog(str(tmp_path / f"t-{index}"), CONFIG, 0), FOLLOWER, str(topic_id))
        replica.apply_state(state, 0)
        fetcher.add(replica)
        replicas.append(replica)
    fetcher._request()
    fetcher.remove(("t", 0))  # no longer asked for: its answer is not applied

    header = values_batch(2)[:61]
    runs = [pointer.encode_pointer_entry(header, KEYS[0], 100 * i, 12 + int.from_bytes(header[8:12])) for i in (0, 1)]
    shared: dict[str, int] = {}
    wrapped = [wrap_pointers(run, shared) for run in runs]
    answers = [
        SimpleNamespace(
            partition_index=i,
            error_code=ErrorCode.none,
            diverging_epoch=None,
            records=wrapped[i],
            high_watermark=2,
            log_start_offset=0,
        )
        for i in (0, 1)
    ]

    pause = fetcher._handle(SimpleNamespace(responses=[SimpleNamespace(topic_id=topic_id, partitions=answers)]))

    assert pause == 0
    assert replicas[0].log.log_end_offset == 0
    assert replicas[1].log.log_end_offset == 2 and replicas[1].log.references(KEYS[0])

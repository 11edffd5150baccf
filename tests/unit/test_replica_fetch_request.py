"""A follower's full replica fetch names every partition it follows from a leader. Building the
request's per-partition entries was most of a follower's cost per fetch at 1,000 partitions
(``m.build`` makes a kio entity per partition), so the fetcher keeps each partition's entry and
builds anew only those whose watch fired (their fetch position may have changed). What goes on
the wire is exactly what a fresh build gives (``replication/fetcher.py``)."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_writer
from loghelpers import produce

from diskless.cluster.metadata import PartitionState
from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.protocol import messages as m
from diskless.replication.fetcher import FETCH_VERSION, ReplicaFetcher
from diskless.replication.partition import FOLLOWER, Partition

TOPIC_ID = str(uuid.uuid4())


def _replicas(tmp_path: Path, count: int) -> list[Partition]:
    out = []
    for i in range(count):
        replica = Partition("t", i, PartitionLog(str(tmp_path / f"t-{i}"), LogConfig(), 0), 2, TOPIC_ID)
        replica.leader_epoch = 3
        replica.role, replica.leader_id = FOLLOWER, 1
        out.append(replica)
    return out


def _fetcher(replicas: list[Partition]) -> ReplicaFetcher:
    fetcher = ReplicaFetcher(2, 1, lambda _: None, 500, 1 << 20, lambda: None)
    for replica in replicas:
        fetcher.add(replica)
    return fetcher


def _wire(request: object) -> bytes:
    cls = load_request_schema(m.API_FETCH, FETCH_VERSION)
    entity = request if isinstance(request, cls) else m.build(cls, request)  # type: ignore[arg-type]
    out = io.BytesIO()
    entity_writer(cls)(out, entity)
    return out.getvalue()


def test_unchanged_partitions_reuse_their_entries_and_the_wire_bytes_match_a_fresh_build(tmp_path: Path) -> None:
    replicas = _replicas(tmp_path, 50)
    fetcher = _fetcher(replicas)
    first = fetcher._request()
    produce(replicas[7].log, 3, epoch=3)  # partition 7 fetched records: its position moved
    second = fetcher._request()

    parts = {p.partition: p for t in second.topics for p in t.partitions}  # type: ignore[attr-defined]
    before = {p.partition: p for t in first.topics for p in t.partitions}  # type: ignore[attr-defined]
    assert parts[7].fetch_offset == 3 and parts[7] is not before[7]
    assert all(parts[i] is before[i] for i in parts if i != 7), "unchanged partitions were built again"

    assert _wire(second) == _wire(_fetcher(replicas)._request())
    # A partition no longer followed is no longer asked for.
    for replica in replicas[10:]:
        fetcher.remove((replica.topic, replica.index))
    third = fetcher._request()
    assert sorted(p.partition for t in third.topics for p in t.partitions) == list(range(10))  # type: ignore[attr-defined]


def test_a_round_with_no_position_moved_builds_nothing_generically(tmp_path: Path, monkeypatch: Any) -> None:
    """Every acks=all commit costs each follower two fetch rounds (the pointers, then the high
    watermark), and on a busy machine the CPU of each round is latency: a round whose partitions
    did not move reuses the request's constant fields instead of building it through
    ``messages.build`` (generic, ~half the cost of building a request), and parses no topic id."""
    replicas = _replicas(tmp_path, 3)
    fetcher = _fetcher(replicas)
    first = fetcher._request()
    built: list[object] = []
    real_build = m.build
    monkeypatch.setattr(m, "build", lambda cls, body: built.append(cls) or real_build(cls, body))
    parsed: list[str] = []
    real_uuid = uuid.UUID
    monkeypatch.setattr(uuid, "UUID", lambda *a, **k: parsed.append(str(a)) or real_uuid(*a, **k))

    second = fetcher._request()

    assert built == [] and parsed == [], (built, parsed)
    assert _wire(second) == _wire(first)
    monkeypatch.setattr(m, "build", real_build)
    monkeypatch.setattr(uuid, "UUID", real_uuid)
    assert _wire(second) == _wire(_fetcher(replicas)._request())


def test_the_partitions_asked_follow_the_replicas_followed(tmp_path: Path) -> None:
    """The fetcher keeps what it asked for between rounds while the replicas are the same objects.
    A replica replaced under the same name and id (dropped and added again, a re-created replica
    whose leader has not moved) is another object: the round asks for it, and an answer is applied
    to it, never to the replica it replaced. A replica that stops following this leader (a
    leadership change, applied to it without the fetcher being told) is no longer asked for."""
    replicas = _replicas(tmp_path, 5)
    fetcher = _fetcher(replicas)
    fetcher._request()
    assert fetcher._asked[("t", 2)] is replicas[2]

    replaced = Partition("t", 2, PartitionLog(str(tmp_path / "t-2-new"), LogConfig(), 0), 2, TOPIC_ID)
    replaced.leader_epoch = 4
    replaced.role, replaced.leader_id = FOLLOWER, 1
    fetcher.add(replaced)
    request = fetcher._request()
    assert fetcher._asked[("t", 2)] is replaced
    assert fetcher._asked_by_id[(TOPIC_ID, 2)] is replaced
    parts = {p.partition: p for t in request.topics for p in t.partitions}  # type: ignore[attr-defined]
    assert parts[2].current_leader_epoch == 4

    fetcher.remove(("t", 3))
    replicas[4].apply_state(PartitionState(replicas=[1, 2], leader=2, leader_epoch=5, isr=[1, 2]), 0)  # we lead
    fetcher._request()
    assert set(fetcher._asked) == {("t", 0), ("t", 1), ("t", 2)}
    assert set(fetcher._built) == {(TOPIC_ID, 0), (TOPIC_ID, 1), (TOPIC_ID, 2)}

"""A follower's replica fetch names every partition it follows from a leader, again after every
answer. Building the request's per-partition entries was most of a follower's cost per fetch at
1,000 partitions (``m.build`` makes a kio entity per partition), so the fetcher keeps each
partition's entry and builds anew only those whose fetch position changed. What goes on the wire
is exactly what a fresh build gives (``replication/fetcher.py``)."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_writer
from loghelpers import produce

from diskless.log.config import LogConfig
from diskless.log.partition_log import PartitionLog
from diskless.protocol import messages as m
from diskless.replication.fetcher import FETCH_VERSION, ReplicaFetcher
from diskless.replication.partition import Partition

TOPIC_ID = str(uuid.uuid4())


def _replicas(tmp_path: Path, count: int) -> list[Partition]:
    out = []
    for i in range(count):
        replica = Partition("t", i, PartitionLog(str(tmp_path / f"t-{i}"), LogConfig(), 0), 2, TOPIC_ID)
        replica.leader_epoch = 3
        out.append(replica)
    return out


def _wire(request: object) -> bytes:
    cls = load_request_schema(m.API_FETCH, FETCH_VERSION)
    entity = request if isinstance(request, cls) else m.build(cls, request)  # type: ignore[arg-type]
    out = io.BytesIO()
    entity_writer(cls)(out, entity)
    return out.getvalue()


def test_unchanged_partitions_reuse_their_entries_and_the_wire_bytes_match_a_fresh_build(tmp_path: Path) -> None:
    replicas = _replicas(tmp_path, 50)
    fetcher = ReplicaFetcher(2, 1, lambda _: None, 500, 1 << 20, lambda: None)
    first = fetcher._request(replicas)
    produce(replicas[7].log, 3, epoch=3)  # partition 7 fetched records: its position moved
    second = fetcher._request(replicas)

    parts = {p.partition: p for t in second.topics for p in t.partitions}  # type: ignore[attr-defined]
    before = {p.partition: p for t in first.topics for p in t.partitions}  # type: ignore[attr-defined]
    assert parts[7].fetch_offset == 3 and parts[7] is not before[7]
    assert all(parts[i] is before[i] for i in parts if i != 7), "unchanged partitions were built again"

    fresh = ReplicaFetcher(2, 1, lambda _: None, 500, 1 << 20, lambda: None)
    assert _wire(second) == _wire(fresh._request(replicas))
    # A partition no longer followed is no longer asked for.
    third = fetcher._request(replicas[:10])
    assert sorted(p.partition for t in third.topics for p in t.partitions) == list(range(10))  # type: ignore[attr-defined]


def test_a_round_with_no_position_moved_builds_nothing_generically(tmp_path: Path, monkeypatch: Any) -> None:
    """Every acks=all commit costs each follower two fetch rounds (the pointers, then the high
    watermark), and on a busy machine the CPU of each round is latency: a round whose partitions
    did not move reuses the request's constant fields instead of building it through
    ``messages.build`` (generic, ~half the cost of building a request), and parses no topic id."""
    replicas = _replicas(tmp_path, 3)
    fetcher = ReplicaFetcher(2, 1, lambda _: None, 500, 1 << 20, lambda: None)
    first = fetcher._request(replicas)
    built: list[object] = []
    real_build = m.build
    monkeypatch.setattr(m, "build", lambda cls, body: built.append(cls) or real_build(cls, body))
    parsed: list[str] = []
    real_uuid = uuid.UUID
    monkeypatch.setattr(uuid, "UUID", lambda *a, **k: parsed.append(str(a)) or real_uuid(*a, **k))

    second = fetcher._request(replicas)

    assert built == [] and parsed == [], (built, parsed)
    assert _wire(second) == _wire(first)
    fresh = ReplicaFetcher(2, 1, lambda _: None, 500, 1 << 20, lambda: None)
    monkeypatch.setattr(m, "build", real_build)
    monkeypatch.setattr(uuid, "UUID", real_uuid)
    assert _wire(second) == _wire(fresh._request(replicas))


def test_the_partitions_asked_follow_the_replicas_passed_each_round(tmp_path: Path) -> None:
    """The fetcher keeps what it asked for between rounds while the replicas are the same objects.
    A replica replaced under the same name and id (dropped and added again, a re-created replica
    whose leader has not moved) is another object: the round asks for it, and an answer is applied
    to it, never to the replica it replaced; one list changed in place is another set too."""
    replicas = _replicas(tmp_path, 5)
    fetcher = ReplicaFetcher(2, 1, lambda _: None, 500, 1 << 20, lambda: None)
    fetcher._request(replicas)
    assert fetcher._asked[("t", 2)] is replicas[2]

    replaced = Partition("t", 2, PartitionLog(str(tmp_path / "t-2-new"), LogConfig(), 0), 2, TOPIC_ID)
    replaced.leader_epoch = 4
    replicas[2] = replaced  # in place: the same list object
    request = fetcher._request(replicas)
    assert fetcher._asked[("t", 2)] is replaced
    assert fetcher._asked_by_id[(TOPIC_ID, 2)] is replaced
    parts = {p.partition: p for t in request.topics for p in t.partitions}  # type: ignore[attr-defined]
    assert parts[2].current_leader_epoch == 4

    fetcher._request(replicas[:3])
    assert set(fetcher._asked) == {("t", 0), ("t", 1), ("t", 2)}
    assert set(fetcher._built) == {(TOPIC_ID, 0), (TOPIC_ID, 1), (TOPIC_ID, 2)}

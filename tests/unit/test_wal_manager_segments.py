"""The WAL manager core on tiered segment objects: same rule as WAL objects, with the tier commit
timeout's hold, and a segment rewritten by a rerun starts over."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.storage.object_store import ObjectInfo
from diskless.storage.segment_object import segment_keys
from wal_manager.core import Answer, ManagerConfig, PartitionRef, WalManagerCore
from wal_manager.service import WalManagerService, manager_config

T0 = 1_700_000_000_000
TID = "6f1c2d3e-0000-4000-8000-000000000001"
GRACE = 10_000
HOLD = 5_000
CONFIRM = 1_000
REF = PartitionRef(TID, 3)
KEY = segment_keys(TID, 3, 0, 99)[0]


def core() -> WalManagerCore:
    return WalManagerCore(ManagerConfig(grace_ms=GRACE, confirm_ms=CONFIRM, check_interval_ms=500))


def unreferenced_rounds(c: WalManagerCore, now: int) -> int:
    """Answer every due question UNREFERENCED until the key is deletable; returns the time then."""
    for _ in range(20):
        for key, ref in c.checks_due(now):
            c.on_answers([(key, ref, Answer.UNREFERENCED, 0)], now)
        if KEY in c.deletable(now):
            return now
        now += 600
    raise AssertionError("never deletable")


def test_unreferenced_segment_goes_after_grace_plus_hold() -> None:
    c = core()
    c.on_segment_listed(KEY, 100, T0, REF, HOLD, T0)
    assert c.checks_due(T0 + GRACE) == []  # the hold: a TierCommit may still come
    due = c.checks_due(T0 + GRACE + HOLD + 1)
    assert due == [(KEY, REF)]
    c.on_answers([(KEY, REF, Answer.UNREFERENCED, 0)], T0 + GRACE + HOLD + 1)
    assert unreferenced_rounds(c, T0 + GRACE + HOLD + 2) >= T0 + GRACE + HOLD + CONFIRM


def test_referenced_segment_stays_and_a_rewrite_starts_over() -> None:
    c = core()
    c.on_segment_listed(KEY, 100, T0, REF, HOLD, T0)
    now = T0 + GRACE + HOLD + 1
    for key, ref in c.checks_due(now):
        c.on_answers([(key, ref, Answer.REFERENCED, 0)], now)
    assert KEY not in c.deletable(now + 10 * CONFIRM)
    # A rerun puts the same key again later: nothing is asked before its own grace and hold.
    rewritten = now + 2_000
    c.on_segment_listed(KEY, 100, rewritten, REF, HOLD, rewritten)
    assert all(k != KEY for k, _ in c.checks_due(rewritten + GRACE))
    assert unreferenced_rounds(c, rewritten + GRACE + HOLD + 1) > rewritten + GRACE + HOLD


# --- the service over an in-memory bucket -----------------------------------------------------------


class SegmentStore:
    """The ObjectStore calls the service makes, with each object's last-modified time."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, int]] = {}

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for key in sorted(self.objects):
            if key.startswith(prefix):
                yield ObjectInfo(key, len(self.objects[key][0]), self.objects[key][1])

    async def delete_many(self, keys: list[str]) -> list[str]:
        for key in keys:
            self.objects.pop(key, None)
        return []


def segment_service(store: SegmentStore) -> WalManagerService:
    config = BrokerConfig(
        metadata_etcd_endpoints="http://127.0.0.1:1",
        diskless_s3_endpoint="http://127.0.0.1:1",
        diskless_wal_commit_timeout_ms=2_000,
        diskless_tier_commit_timeout_ms=2_000,
        wal_manager_clock_skew_ms=1_000,
        wal_manager_grace_ms=GRACE,
        wal_manager_confirm_ms=0,
    )
    svc = WalManagerService(config)
    svc.store = store  # type: ignore[assignment]
    state = PartitionState(replicas=[1], leader=1, leader_epoch=3, isr=[1])
    svc.metadata.topics["t"] = TopicMetadata("t", TID, [state] * 4, {})
    svc.core = WalManagerCore(manager_config(svc.config))

    async def unreferenced(leader: int, queries: list[tuple[str, PartitionRef]]) -> list[tuple]:  # type: ignore[type-arg]
        return [(key, ref, Answer.UNREFERENCED, 3) for key, ref in queries]

    svc._ask = unreferenced  # type: ignore[method-assign]
    return svc


async def test_service_deletes_orphan_segments_but_not_one_rewritten_meanwhile() -> None:
    store = SegmentStore()
    now = int(time.time() * 1000)
    orphan = segment_keys(TID, 3, 100, 199)[0]
    rewritten = segment_keys(TID, 3, 200, 299)[0]
    store.objects[orphan] = (b"x", now - 10 * GRACE)
    store.objects[rewritten] = (b"y", now - 10 * GRACE)
    store.objects["segments/not-a-segment"] = (b"z", 0)
    svc = segment_service(store)
    await svc.scan()
    await svc._check_references()
    await svc._check_references()  # confirmed twice (confirm.ms 0): both are garbage now
    # A rerun of the tier job puts one of them again just before the delete (it may commit it).
    store.objects[rewritten] = (b"y", now)
    await svc._delete()
    assert orphan not in store.objects
    assert rewritten in store.objects, "a segment rewritten since it was judged was deleted"
    assert "segments/not-a-segment" in store.objects  # not ours

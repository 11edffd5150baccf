"""The WAL manager service's passes over an in-memory bucket and in-process leaders (no etcd, no
S3): one object that cannot be read never stops the collection of the others, and a backlog of
unknown trailers is read a bounded page per pass, interleaved with checks and deletes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from batches import values_batch
from prometheus_client import REGISTRY

import wal_manager.service
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.config import BrokerConfig
from diskless.storage.object_store import ObjectInfo, S3Error
from diskless.storage.wal_format import WalObjectWriter, wal_object_key
from wal_manager.core import Answer, PartitionRef, WalManagerCore
from wal_manager.service import WalManagerService

GRACE_MS = 5_000
TOPIC_ID = uuid.uuid4()


class MemoryStore:
    """The ObjectStore calls the service makes, over a dict; ``forbidden`` keys answer 403."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.forbidden: set[str] = set()
        self.heads: list[str] = []

    def _check(self, key: str, operation: str) -> None:
        if key in self.forbidden:
            raise S3Error(operation, 403, "AccessDenied", "Forbidden")

    async def head(self, key: str) -> int | None:
        self.heads.append(key)
        self._check(key, "HeadObject")
        data = self.objects.get(key)
        return None if data is None else len(data)

    async def get_range(self, key: str, start: int, end_inclusive: int) -> bytes:
        self._check(key, "GetObject")
        return self.objects[key][start : end_inclusive + 1]

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for key in sorted(self.objects):
            if key.startswith(prefix):
                yield ObjectInfo(key, len(self.objects[key]), 0)

    async def delete_many(self, keys: list[str]) -> list[str]:
        failed = [k for k in keys if k in self.forbidden]
        for key in keys:
            if key not in failed:
                self.objects.pop(key, None)
        return failed


def wal_object(created_ms: int, n: int) -> tuple[str, bytes]:
    writer = WalObjectWriter()
    writer.add(TOPIC_ID, 0, values_batch(1))
    return wal_object_key(created_ms, "az-1", 1, f"{n:032x}"), writer.finish(created_ms, 1, "az-1").data


@pytest.fixture
def service() -> WalManagerService:
    config = BrokerConfig(
        metadata_etcd_endpoints="http://127.0.0.1:1",
        diskless_s3_endpoint="http://127.0.0.1:1",
        diskless_wal_commit_timeout_ms=2_000,
        wal_manager_clock_skew_ms=1_000,
        wal_manager_grace_ms=GRACE_MS,
        wal_manager_confirm_ms=0,
    )
    svc = WalManagerService(config)
    svc.store = MemoryStore()  # type: ignore[assignment]
    state = PartitionState(replicas=[1], leader=1, leader_epoch=3, isr=[1])
    svc.metadata.topics["t"] = TopicMetadata("t", str(TOPIC_ID), [state], {})
    svc.core = WalManagerCore(wal_manager.service.manager_config(svc.config))  # as when it becomes the active instance
    svc.asked: list[tuple[str, PartitionRef]] = []  # type: ignore[attr-defined]

    async def leader_answers(leader: int, queries: list[tuple[str, PartitionRef]]) -> list[tuple]:  # type: ignore[type-arg]
        svc.asked += queries  # type: ignore[attr-defined]
        return [(key, ref, Answer.UNREFERENCED, 3) for key, ref in queries]  # nothing commits: orphans

    svc._ask = leader_answers  # type: ignore[method-assign]
    return svc


def store_of(svc: WalManagerService) -> MemoryStore:
    assert isinstance(svc.store, MemoryStore)
    return svc.store


async def one_pass(svc: WalManagerService) -> None:
    """The steps of one pass of the active loop, in order (what ``run_pass`` does)."""
    await svc._read_trailers()
    await svc._check_references()
    await svc._delete()


async def test_a_forbidden_object_does_not_stop_collection_of_the_others(service: WalManagerService) -> None:
    store = store_of(service)
    old = int(time.time() * 1000) - 10 * GRACE_MS
    objects = dict(wal_object(old + n, n) for n in range(3))
    store.objects.update(objects)
    forbidden = min(objects)  # the oldest: its trailer is read first
    store.forbidden.add(forbidden)
    before = REGISTRY.get_sample_value(
        "diskless_wal_manager_object_errors_total", {"operation": "trailer", "reason": "AccessDenied"}
    )
    await service.scan()

    for _ in range(3):  # learn, confirm twice (confirm.ms is 0), delete
        await one_pass(service)

    assert set(store.objects) == {forbidden}, "the readable orphans were collected"
    after = REGISTRY.get_sample_value(
        "diskless_wal_manager_object_errors_total", {"operation": "trailer", "reason": "AccessDenied"}
    )
    assert after is not None and after - (before or 0) == 1  # retried only after a backoff
    assert service._core().stats()["trailer_read_failures"] == 1
    assert not any(key == forbidden for key, _ in service.asked)  # type: ignore[attr-defined]


async def test_a_backlog_of_trailers_is_read_in_pages_interleaved_with_checks(service: WalManagerService) -> None:
    store = store_of(service)
    core = service._core()
    old = int(time.time() * 1000) - 10 * GRACE_MS
    backlog = dict(wal_object(old + n, n) for n in range(250))
    store.objects.update(backlog)
    known_key, known_data = wal_object(old - 1, 999)  # noticed by a representative: no trailer read needed
    store.objects[known_key] = known_data
    await service.scan()
    core.on_notice(known_key, len(known_data), [PartitionRef(str(TOPIC_ID), 0)], int(time.time() * 1000))

    await service._read_trailers()
    page = 100  # ManagerConfig.max_trailer_batch
    assert len(store.heads) == page < len(backlog)  # one bounded page of trailer reads...
    assert core.config.max_trailer_batch == page
    await service._check_references()
    await service._delete()
    asked = {key for key, _ in service.asked}  # type: ignore[attr-defined]
    assert known_key in asked  # ...and the checks due went out in the same pass
    assert set(store.heads) <= asked  # including the objects whose trailers this page read
    await one_pass(service)
    assert known_key not in store.objects  # deleted while most of the backlog is still unread
    assert len(store.heads) == 2 * page


async def test_a_topic_missing_from_a_lagging_view_is_not_taken_for_deleted(
    service: WalManagerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object's topic was created after the service's metadata view was last updated (a lost
    watch being resynchronised): the view lacks the id, etcd has it. Only a fresh read of the
    topics that lacks the id too proves the topic was deleted."""
    store = store_of(service)
    old = int(time.time() * 1000) - 10 * GRACE_MS
    key, data = wal_object(old, 1)
    store.objects[key] = data
    del service.metadata.topics["t"]  # the view lags the creation of topic t
    in_etcd = {str(TOPIC_ID)}

    async def fresh_topic_ids() -> set[str]:
        return set(in_etcd)

    service._fresh_topic_ids = fresh_topic_ids  # type: ignore[method-assign]
    service.core = WalManagerCore(replace(service._core().config, check_interval_ms=1))  # re-ask every pass
    clock = [int(time.time() * 1000)]
    monkeypatch.setattr(wal_manager.service, "_now_ms", lambda: clock[0])
    await service.scan()
    for _ in range(3):
        await one_pass(service)
        clock[0] += 10
    assert key in store.objects, "deleted although its topic exists (and may reference it)"

    in_etcd.clear()  # now the topic is deleted
    for _ in range(3):
        await one_pass(service)
        clock[0] += 10
    assert key not in store.objects


@pytest.mark.parametrize(
    "setting", [{"wal_manager_check_interval_ms": 0}, {"wal_manager_confirm_ms": -1}], ids=["check", "confirm"]
)
def test_settings_the_core_cannot_work_with_are_refused_at_start(setting: dict[str, int]) -> None:
    """Before, they passed the startup check and raised only when the instance became active,
    ending its task there: a process that looked healthy and never collected anything."""
    from diskless.config import ConfigError
    from wal_manager.service import check_config

    config = BrokerConfig(
        metadata_etcd_endpoints="127.0.0.1:2379", diskless_s3_endpoint="http://127.0.0.1:9000", **setting
    )
    with pytest.raises(ConfigError, match=r"wal\.manager settings"):
        check_config(config)


@pytest.mark.parametrize(("confirm_ms", "warned"), [(500, True), (2_000, False)])
def test_a_confirmation_delay_shorter_than_follower_staleness_is_warned_of(confirm_ms: int, warned: bool) -> None:
    """Zone-aligned followers serve reads up to 2 s (defaults) after their last word from the
    leader; deleting sooner than that lets one read an object just deleted."""
    from structlog.testing import capture_logs

    from wal_manager.service import check_config

    config = BrokerConfig(
        metadata_etcd_endpoints="127.0.0.1:2379",
        diskless_s3_endpoint="http://127.0.0.1:9000",
        wal_manager_confirm_ms=confirm_ms,
    )
    with capture_logs() as logs:
        check_config(config)
    assert any("wal.manager.confirm.ms" in entry["event"] for entry in logs) == warned

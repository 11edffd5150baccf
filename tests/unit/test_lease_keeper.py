"""The keepalive thread's decisions (``diskless/cluster/lease_keeper.py``), one round at a time
against a fake etcd lease service: what reaches the fence, when the event loop is asked to
register again, and that an answer about a lease no longer ours is ignored."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import grpc

from diskless.cluster.lease import LeaseFence
from diskless.cluster.lease_keeper import LeaseKeeper

TTL = 3_000


class FakeStub:
    """LeaseKeepAlive answering with ``ttl``; ``during`` runs while the call is in flight."""

    def __init__(self, ttl: int | None = 10, during: Callable[[], None] | None = None, fail: bool = False) -> None:
        self.ttl, self.during, self.fail = ttl, during, fail
        self.asked: list[int] = []

    def LeaseKeepAlive(self, requests: Iterable[Any], timeout: float, metadata: Any = None) -> Iterator[Any]:
        self.asked += [r.ID for r in requests]
        if self.during is not None:
            self.during()
        if self.fail:
            raise grpc.RpcError()
        return iter([] if self.ttl is None else [SimpleNamespace(TTL=self.ttl)])


def keeper() -> tuple[LeaseKeeper, LeaseFence, list[str]]:
    fence = LeaseFence(TTL)
    fence.on_registered(0, 1)
    fence.on_metadata_revision(1)
    expired: list[str] = []
    k = LeaseKeeper("unused:0", fence, 1.0, on_expired=lambda: expired.append("expired"))
    k.keep(7)
    return k, fence, expired


def test_a_positive_ttl_extends_the_fence_from_the_sending() -> None:
    k, fence, expired = keeper()
    stub = FakeStub(ttl=10)
    k._refresh_once(stub)  # type: ignore[arg-type]
    assert stub.asked == [7] and k.refreshes == 1 and expired == []
    assert fence.remaining_ms(0) >= TTL  # sent now (monotonic ms >> 0): valid well past the start


def test_an_expired_lease_closes_the_fence_and_asks_once_to_register_again() -> None:
    k, fence, expired = keeper()
    k._refresh_once(FakeStub(ttl=0))  # type: ignore[arg-type]
    assert fence.fenced(1) and expired == ["expired"]
    stub = FakeStub(ttl=0)
    k._refresh_once(stub)  # type: ignore[arg-type]
    assert stub.asked == [] and expired == ["expired"]  # waits for the loop to register again
    k.registration_failed(7)  # that failed: the next round reports the expiry again
    k._refresh_once(FakeStub(ttl=0))  # type: ignore[arg-type]
    assert expired == ["expired", "expired"]
    k.keep(8)  # registered under a new lease: refreshed from now on
    stub = FakeStub(ttl=10)
    k._refresh_once(stub)  # type: ignore[arg-type]
    assert stub.asked == [8] and k.refreshes == 1


def test_an_answer_about_a_replaced_lease_is_ignored() -> None:
    k, fence, expired = keeper()
    # The loop registers under lease 8 while the refresh of 7 is in flight, which then says expired.
    k._refresh_once(FakeStub(ttl=0, during=lambda: k.keep(8)))  # type: ignore[arg-type]
    assert expired == [] and not fence.fenced(1)
    k._refresh_once(FakeStub(ttl=10, during=k.forget))  # type: ignore[arg-type]
    assert k.refreshes == 0  # revoked meanwhile: a late success must not extend anything


def test_failures_and_empty_answers_change_nothing() -> None:
    k, fence, expired = keeper()
    before = fence.remaining_ms(0)
    k._refresh_once(FakeStub(fail=True))  # type: ignore[arg-type]
    k._refresh_once(FakeStub(ttl=None))  # type: ignore[arg-type]
    assert fence.remaining_ms(0) == before and expired == [] and k.refreshes == 0

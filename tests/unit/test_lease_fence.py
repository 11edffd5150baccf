"""Self-fencing of a broker that cannot refresh its etcd lease (diskless/cluster/lease.py), with
time passed in: the broker stops acting as a leader no later than the lease TTL after the sending
of its last successful keepalive, and resumes only after registering again and seeing that
registration in its metadata."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.cluster.lease import LeaseFence

TTL = 2_000


def registered(at: int = 0, revision: int = 10) -> LeaseFence:
    fence = LeaseFence(TTL)
    fence.on_registered(at, revision)
    fence.on_metadata_revision(revision)
    return fence


def test_unregistered_broker_is_fenced() -> None:
    fence = LeaseFence(TTL)
    assert fence.fenced(0) and fence.remaining_ms(0) == 0


def test_fenced_once_keepalives_fail_for_the_ttl() -> None:
    fence = registered(at=0)
    fence.on_refreshed(600)  # then etcd stops answering
    assert not fence.fenced(600 + TTL - 1)
    assert fence.remaining_ms(600 + TTL - 1) == 1
    assert fence.fenced(600 + TTL)  # etcd expires it at the earliest at 600 + TTL (processing time)
    fence.on_refreshed(700)  # sent at 700 and answered much later: counts from its sending
    assert not fence.fenced(700 + TTL - 1) and fence.fenced(700 + TTL)


def test_a_late_success_after_the_fence_point_unfences_while_the_lease_lives() -> None:
    fence = registered(at=0)
    assert fence.fenced(TTL)
    fence.on_refreshed(TTL + 50)  # etcd still had the lease: nobody was elected meanwhile
    assert not fence.fenced(TTL + 60)


def test_expired_lease_fences_until_registered_again_and_seen_in_metadata() -> None:
    fence = registered(at=0)
    fence.on_refreshed(500)
    fence.on_expired()  # etcd: TTL <= 0
    assert fence.fenced(600)
    fence.on_refreshed(650)  # a stray success of the old lease must not revive it
    assert fence.fenced(700)
    fence.on_registered(700, revision=42)
    assert fence.fenced(800)  # the metadata may still show us as leader of moved partitions
    fence.on_metadata_revision(41)
    assert fence.fenced(800)
    fence.on_metadata_revision(42)
    assert not fence.fenced(800) and fence.remaining_ms(800) == TTL - 100


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LeaseFence(0)


@given(
    events=st.lists(
        st.tuples(st.sampled_from(["refresh", "fail", "expire", "register", "view"]), st.integers(0, 3_000)),
        max_size=40,
    )
)
def test_never_acts_as_leader_past_ttl_after_its_last_successful_keepalive(events: list[tuple[str, int]]) -> None:
    """Whatever happens, at any time the broker acts as leader, some grant or keepalive sent no
    more than TTL earlier succeeded, and every re-registration has been seen in its metadata."""
    fence = LeaseFence(TTL)
    now = 0
    last_ok: int | None = None
    revision = 0
    pending: int | None = None
    alive = False  # the lease exists in etcd, as far as the broker was told
    for kind, dt in events:
        now += dt
        if kind == "refresh" and alive:
            sent = now - dt // 2  # answered some time after sending
            fence.on_refreshed(sent)
            last_ok = sent if last_ok is None else max(last_ok, sent)
        elif kind == "expire":
            fence.on_expired()
            alive, last_ok = False, None
        elif kind == "register":
            revision += 1
            fence.on_registered(now, revision)
            alive, last_ok, pending = True, now, revision
        elif kind == "view":
            fence.on_metadata_revision(revision)
            pending = None
        if not fence.fenced(now):
            assert alive and last_ok is not None and now - last_ok < TTL
            assert pending is None


def test_registration_seen_by_the_watch_before_its_put_returns_still_opens_the_fence() -> None:
    # The watch may deliver the broker key's put (revision 10) while the put's own answer is still
    # on its way; nothing else may change afterwards in a quiet cluster.
    fence = LeaseFence(TTL)
    fence.on_metadata_revision(10)
    fence.on_registered(0, 10)
    assert not fence.fenced(1)
    # A registration the metadata has not reached yet still waits for it.
    fence.on_expired()
    fence.on_registered(100, 12)
    assert fence.fenced(101)
    fence.on_metadata_revision(12)
    assert not fence.fenced(102)

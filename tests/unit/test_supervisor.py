"""The dev cluster's supervision decisions (``diskless/local/supervisor.py``), time passed in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from diskless.local.supervisor import RestartPolicy, State, Supervisor

POLICY = RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, multiplier=2.0, stable_after_s=10.0, max_failures=4)


def running(names: list[str], now: float = 0.0, policy: RestartPolicy = POLICY) -> Supervisor:
    supervisor = Supervisor(names, policy)
    for name in names:
        supervisor.started(name, now)
        supervisor.ready(name, now)
    return supervisor


def test_a_crash_is_restarted_after_the_initial_backoff_and_others_are_untouched() -> None:
    sup = running(["broker-1", "broker-2", "etcd"])
    event = sup.exited("broker-1", 100.0, -9)
    assert event.state is State.BACKOFF and event.restart_at == 100.5
    assert "restarting in 0.5s" in event.message
    assert sup.due(100.4) == []
    assert sup.due(100.5) == ["broker-1"]
    assert sup.state("broker-1") is State.STARTING
    assert sup.due(101.0) == []  # handed out once
    assert sup.state("broker-2") is State.RUNNING and sup.state("etcd") is State.RUNNING


def test_backoff_doubles_while_crashing_quickly_then_gives_up() -> None:
    sup = running(["s3"])
    now = 0.0
    waits = []
    for _ in range(POLICY.max_failures):
        event = sup.exited("s3", now, 1)
        assert event.state is State.BACKOFF
        assert event.restart_at is not None
        waits.append(event.restart_at - now)
        now = event.restart_at
        assert sup.due(now) == ["s3"]
        sup.started("s3", now)
        sup.ready("s3", now)
        now += 1.0  # crashes again long before it counts as stable
    assert waits == [0.5, 1.0, 2.0, 4.0]
    event = sup.exited("s3", now, 1)
    assert event.state is State.GAVE_UP and "giving up" in event.message
    assert sup.due(now + 1000) == []


def test_a_process_that_stayed_up_long_enough_starts_the_backoff_afresh() -> None:
    sup = running(["broker-1"])
    for now in (0.0, 1.0, 3.0):
        event = sup.exited("broker-1", now, -9)
        assert event.restart_at is not None
        sup.due(event.restart_at)
        sup.started("broker-1", event.restart_at)
        sup.ready("broker-1", event.restart_at)
    event = sup.exited("broker-1", 1000.0, -9)  # up for far longer than stable_after_s
    assert event.restart_at == 1000.5


def test_a_failed_start_counts_as_a_failure() -> None:
    sup = running(["etcd"])
    event = sup.exited("etcd", 0.0, 1)
    assert event.restart_at is not None
    sup.due(event.restart_at)
    event = sup.start_failed("etcd", 1.0, "not ready within 30s")
    assert event.state is State.BACKOFF and event.restart_at == 2.0
    assert "not ready within 30s" in event.message


def test_no_restart_keeps_a_dead_process_down_until_started() -> None:
    sup = running(["broker-2"], policy=RestartPolicy(restart=False))
    event = sup.exited("broker-2", 5.0, -9)
    assert event.state is State.DOWN and event.restart_at is None
    assert "kept down" in event.message
    assert sup.due(1e9) == []
    sup.release("broker-2", 6.0)
    assert sup.due(6.0) == ["broker-2"]


def test_user_stop_is_not_a_crash_and_start_brings_it_back_even_after_giving_up() -> None:
    sup = running(["wal-manager", "broker-1"])
    sup.hold("wal-manager")
    event = sup.exited("wal-manager", 3.0, 0)
    assert event.state is State.DOWN and "stopped" in event.message
    assert sup.due(1e9) == []
    sup.release("wal-manager", 10.0)
    assert sup.due(10.0) == ["wal-manager"]

    for _ in range(POLICY.max_failures + 1):
        event = sup.exited("broker-1", 0.0, 1)
        if event.restart_at is not None:
            sup.due(event.restart_at)
            sup.started("broker-1", event.restart_at)
    assert sup.state("broker-1") is State.GAVE_UP
    sup.release("broker-1", 50.0)
    assert sup.due(50.0) == ["broker-1"]
    sup.started("broker-1", 50.0)
    event = sup.exited("broker-1", 51.0, 1)
    assert event.restart_at == 51.5  # a user's start forgets the earlier failures


def test_next_wakeup_is_the_earliest_pending_restart() -> None:
    sup = running(["a", "b", "c"])
    sup.exited("a", 0.0, 1)
    assert sup.next_wakeup() == 0.5
    sup.exited("b", 0.2, 1)
    assert sup.next_wakeup() == 0.5
    sup.due(0.5)
    assert sup.next_wakeup() == 0.7
    sup.due(0.7)
    assert sup.next_wakeup() is None


@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["exit", "fail", "due", "hold", "release", "ready"]), st.floats(0, 5)),
        max_size=60,
    )
)
def test_backoff_stays_within_bounds_and_held_processes_are_never_due(steps: list[tuple[str, float]]) -> None:
    sup = running(["p"])
    now = 0.0
    for action, dt in steps:
        now += dt
        state = sup.state("p")
        if action == "exit" and state in (State.RUNNING, State.STARTING):
            event = sup.exited("p", now, 1)
            if event.restart_at is not None:
                assert POLICY.initial_backoff_s - 1e-9 <= event.restart_at - now <= POLICY.max_backoff_s + 1e-9
        elif action == "fail" and state is State.STARTING:
            sup.start_failed("p", now, "no")
        elif action == "due":
            due = sup.due(now)
            assert due == [] or state is State.BACKOFF
            if due:
                sup.started("p", now)
        elif action == "hold":
            sup.hold("p")
        elif action == "release":
            sup.release("p", now)
        elif action == "ready" and state is State.STARTING:
            sup.ready("p", now)
        if sup.state("p") in (State.DOWN, State.GAVE_UP):
            assert sup.due(now + 1e6) == []

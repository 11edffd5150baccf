"""A broker that cannot refresh its etcd lease stops acting as a partition leader within the
session timeout, and leads again once etcd is back and it has registered again.

One broker and etcd, real processes. etcd is SIGSTOPped: the broker's keepalives go unanswered,
so it cannot know whether its lease still exists, and a successor may be elected as soon as etcd
expires the lease. Produce to the partition it leads must answer NOT_LEADER_OR_FOLLOWER no later
than the lease TTL (broker.session.timeout.ms) after the stop; before, it answers normally.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from rawclient import Session, build_batch
from support import wait_until

pytestmark = pytest.mark.integration

SESSION_MS = 3000
NOT_LEADER_OR_FOLLOWER = 6


def test_a_broker_cut_off_from_etcd_stops_leading_within_the_session_timeout(cluster_factory: Any) -> None:
    cluster = cluster_factory(brokers=1, azs=1, overrides={"broker.session.timeout.ms": str(SESSION_MS)})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic("fenced", num_partitions=1, replication_factor=1)]).values():
        future.result(30)
    broker = cluster.brokers[0]
    etcd_pid = cluster.etcd.pid
    assert etcd_pid is not None

    with Session(broker.bootstrap, timeout=30) as session:
        wait_until(lambda: session.produce("fenced", 0, build_batch([(b"k", b"before")])).error_code == 0, 30)

        os.kill(etcd_pid, signal.SIGSTOP)
        stopped = time.monotonic()
        codes: list[int] = []
        try:
            while time.monotonic() - stopped < SESSION_MS / 1000 + 5:
                code = int(session.produce("fenced", 0, build_batch([(b"k", b"cut off")])).error_code)
                codes.append(code)
                if code == NOT_LEADER_OR_FOLLOWER:
                    break
                time.sleep(0.1)
            fenced_after = time.monotonic() - stopped
        finally:
            os.kill(etcd_pid, signal.SIGCONT)
        print(f"fenced {fenced_after:.2f} s after etcd stopped (session timeout {SESSION_MS} ms); codes {codes}")
        assert codes[-1] == NOT_LEADER_OR_FOLLOWER, f"still acting as leader {fenced_after:.1f} s after etcd stopped"
        # The fence falls at most one TTL after the last keepalive that succeeded, sent before the stop.
        assert fenced_after <= SESSION_MS / 1000 + 1.0
        assert codes[0] == 0  # it led normally right after the stop: the fence is not a hair trigger

        # etcd back: the broker re-registers (its lease may have expired meanwhile) and leads again.
        wait_until(
            lambda: session.produce("fenced", 0, build_batch([(b"k", b"after")])).error_code == 0,
            60,
            message="the broker never led its partition again after etcd came back",
        )

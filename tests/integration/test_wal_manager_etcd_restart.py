"""An active WAL manager exists again soon after every etcd restart.

Found by ``diskless chaos``: after an etcd restart the manager that lost its lease and the standby
both waited for the ``wal-manager`` key to vanish as their metadata watch reported it, but the
watch could be silently dead after the restart, so neither campaigned again and no WAL object
was collected until a manager process was restarted.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_until

from diskless.local.servers import EtcdServer, S3Server, WalManagerServer

pytestmark = pytest.mark.integration

RESTARTS = 3
RECOVERY_DEADLINE_S = 20.0


def is_active(manager: WalManagerServer) -> bool:
    if not manager.alive():
        return False
    fields = (manager.data_dir / f"{manager.name}.ready").read_text().split()
    try:
        with urllib.request.urlopen(f"http://{manager.host}:{fields[1]}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return False
    return any(line.startswith("diskless_wal_manager_active ") and line.endswith(" 1.0") for line in text.splitlines())


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[EtcdServer, list[WalManagerServer]]]:
    s3 = S3Server(tmp_path / "s3").start()
    s3.create_bucket("diskless")
    etcd = EtcdServer(tmp_path / "etcd").start()
    managers = []
    try:
        for i in range(2):
            manager = WalManagerServer(f"wal-manager-{i}", tmp_path, etcd.endpoint, s3.endpoint)
            manager.overrides.update(
                {
                    "broker.session.timeout.ms": "3000",
                    "metrics.port": "0",
                    "diskless.s3.bucket": "diskless",
                    "diskless.s3.access.key": s3.access_key,
                    "diskless.s3.secret.key": s3.secret_key,
                }
            )
            managers.append(manager)
            manager.start()
        yield etcd, managers
    finally:
        for manager in managers:
            manager.kill()
        etcd.kill()
        s3.kill()


def test_a_manager_is_active_again_after_each_etcd_restart(servers) -> None:
    etcd, managers = servers
    wait_until(lambda: any(is_active(m) for m in managers), RECOVERY_DEADLINE_S, 0.2)
    for restart in range(RESTARTS):
        etcd.kill()
        time.sleep(1.0)  # etcd down for a while, as a crash and restart would have it
        etcd.start()
        began = time.monotonic()
        wait_until(
            lambda: any(is_active(m) for m in managers),
            RECOVERY_DEADLINE_S,
            0.2,
            message=f"no active WAL manager {RECOVERY_DEADLINE_S}s after etcd restart {restart + 1}",
        )
        print(f"etcd restart {restart + 1}: an active manager after {time.monotonic() - began:.1f}s")
    assert sum(is_active(m) for m in managers) == 1

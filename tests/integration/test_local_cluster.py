"""The test harness's start-up, which every integration test pays for.

Python processes the tests start import no hypothesis (kio imports it whenever it is installed:
~0.4 s of CPU per broker start; production installs have none). ``LocalCluster`` starts broker 0
alone, so that it wins the controller election as when brokers started one by one, then the
others in parallel (most of a broker's start-up is importing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from diskless.local.servers import S3Server

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    """Epoch seconds at boot to 10 ms (/proc/stat's btime is whole seconds)."""
    with open("/proc/uptime") as f:
        return time.time() - float(f.read().split()[0])


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime


def _process_start(pid: int) -> float:
    """When ``pid`` started (epoch seconds, clock-tick resolution), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return _boot_time() + int(fields[19]) / _CLK_TCK  # field 22 of stat: starttime


def test_brokers_after_the_first_are_spawned_before_any_of_them_is_ready(cluster_factory: Any) -> None:
    cluster = cluster_factory(brokers=3, azs=3)
    first, *rest = cluster.brokers
    spawned = {b.node_id: _process_start(b.pid) for b in cluster.brokers}
    ready = {b.node_id: Path(b.ready_file).stat().st_mtime for b in cluster.brokers}
    # Broker 0 alone first: ready before the others exist.
    assert ready[first.node_id] <= min(spawned[b.node_id] for b in rest) + 0.05, (spawned, ready)
    # The rest overlap: every one of them was spawned before the first of them was ready.
    assert max(spawned[b.node_id] for b in rest) < min(ready[b.node_id] for b in rest), (spawned, ready)
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10)
    assert metadata.controller_id == 0
    assert sorted(metadata.brokers) == [0, 1, 2]


def test_python_processes_started_by_tests_import_no_hypothesis() -> None:
    # What a broker's start-up does: kio imports hypothesis.strategies when it can.
    code = "import sys, kio.static._phantom as p; print(p.hypothesis is None, 'hypothesis' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False"], run.stdout + run.stderr


def test_an_idle_s3_server_started_by_tests_uses_almost_no_cpu(tmp_path: Path) -> None:
    # Each S3 test keeps one for its whole duration; at GOMEMLIMIT=128MiB SeaweedFS's garbage
    # collector ran all the time (5-7% of a core while idle), at 256MiB it does not (~0.3%).
    s3 = S3Server(tmp_path / "s3").start()
    try:
        time.sleep(1.0)  # not a synchronisation: lets start-up work settle before the window
        before, started = _cpu_seconds(s3.pid), time.monotonic()
        time.sleep(4.0)  # the measurement window
        share = (_cpu_seconds(s3.pid) - before) / (time.monotonic() - started)
        assert share < 0.02, f"idle S3 server ({s3.kind}) used {100 * share:.1f}% of a core"
    finally:
        s3.kill()

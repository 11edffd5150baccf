"""The benchmark's cluster: ``diskless dev``'s launcher (3 brokers in 3 AZs, embedded S3, etcd), its topics,
and the environment that puts a load-generator process in an AZ.

The cluster is ``diskless.dev.DevCluster`` itself, with the run's broker settings (the WAL linger,
a Prometheus endpoint per broker), so the figures are those of what ``make run`` starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from diskless.dev import DevCluster, StopRequest, layout

SOURCE_HOST = 250  # load generators of az-k leave from 127.0.k.250, an address no broker uses


def start_cluster(
    root: Path,
    brokers: int,
    azs: int,
    overrides: dict[str, str],
    out: TextIO,
    s3_front: Callable[[str], str] | None = None,
) -> DevCluster:
    cluster = DevCluster(
        root,
        layout(brokers, azs),
        0,  # free ports: a benchmark must not collide with a `make run` cluster on 9092
        out,
        StopRequest(),
        broker_overrides={"metrics.port": "0", **overrides},
        s3_front=s3_front,
    )
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def azs_of(cluster: DevCluster) -> list[str]:
    return sorted({b.rack or "" for b in cluster.brokers})


def create_topics(cluster: DevCluster, topics: dict[str, bool], partitions: int, replication: int) -> None:
    """Create each topic (``True``: diskless) and wait until every partition has a leader."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "client.id": "bench-admin"})
    new = [
        NewTopic(name, partitions, replication, config={"diskless.enabled": "true" if diskless else "false"})
        for name, diskless in topics.items()
    ]
    for name, future in admin.create_topics(new, request_timeout=120).items():
        try:
            future.result(180)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"creating {name}: {exc}") from None
    deadline = time.monotonic() + 120
    for name in topics:
        while True:
            meta = admin.list_topics(name, timeout=10).topics[name]
            complete = meta.error is None and len(meta.partitions) == partitions
            if complete and all(p.leader >= 0 and len(p.isrs) == replication for p in meta.partitions.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: not every partition has a leader and a full ISR after 120 s")
            time.sleep(0.2)


def build_shim(into: Path) -> Path | None:
    """Compile the source-address shim (needs a C compiler); None without one."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None
    source = resources.files("diskless.bench").joinpath("bind_source.c")
    into.mkdir(parents=True, exist_ok=True)
    target = into / "bind_source.so"
    with resources.as_file(source) as path:
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(target), str(path), "-ldl"], check=True)
    return target


def az_env(az: str, shim: Path | None) -> dict[str, str]:
    """The environment of a load generator in ``az``: its connections leave from the AZ's network."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if shim is not None:
        number = int(az.rsplit("-", 1)[1])
        env["LD_PRELOAD"] = str(shim)
        env["DISKLESS_SOURCE_ADDR"] = f"127.0.{number}.{SOURCE_HOST}"
    return env


def spawn_loadgen(role: str, args: dict[str, Any], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "diskless.bench.loadgen", role]
    for name, value in args.items():
        flag = f"--{name.replace('_', '-')}"
        cmd.append(flag if value == "" else f"{flag}={value}")  # "": a bare flag; "=": values may start with -
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

"""Zone alignment for unmodified clients (issue 11): no ``diskless_az`` in any client.id.

``diskless dev``'s cluster (3 brokers in 3 AZs, each AZ its own loopback network 127.0.<az>.x),
a diskless topic, and per AZ one producer and one consumer process, each bootstrapped through the
addresses ``cluster.json`` lists for its AZ, with its library's default client.id. Every client
process leaves from its AZ's network (``diskless/bench/bind_source.c`` as LD_PRELOAD), so the bytes that cross
AZs are counted from the brokers' socket counters by address (``diskless_connection_network_bytes``:
the socket's own local and peer networks), not from the AZ a broker decided for a client.

- per-AZ listeners (the dev default): the listener decides;
- one listener per broker, consumers with ``client.rack`` and producers in a source-address map;
- no source at all: every record is still read back, by the receiving broker's AZ, and the
  decision metrics say so. Its cross-AZ share is what unmodified clients paid before.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from diskless.dev import DevCluster, StopRequest, layout

HERE = Path(__file__).parent
AZS = ["az-1", "az-2", "az-3"]
AZ_NETWORKS = {f"127.0.{k}.0/24": az for k, az in enumerate(AZS, start=1)}
PARTITIONS = 6
RECORDS = 15_000  # per producer
SIZE = 200
CLIENT_DEADLINE_S = 120

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("kcat") is None, reason="needs gcc (source-address shim) and kcat"
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> str:
    from diskless.bench.cluster import build_shim

    built = build_shim(tmp_path_factory.mktemp("shim"))
    assert built is not None
    return str(built)


@pytest.fixture
def dev_cluster(tmp_path: Path) -> Iterator[Callable[..., tuple[DevCluster, dict[str, Any]]]]:
    started: list[DevCluster] = []

    def make(az_listeners: bool = True, overrides: dict[str, str] | None = None) -> tuple[DevCluster, dict[str, Any]]:
        cluster = DevCluster(
            tmp_path / f"dev-{len(started)}",
            layout(3, 3),
            0,
            io.StringIO(),
            StopRequest(),
            az_listeners=az_listeners,
            broker_overrides=dict(overrides or {}),
        )
        started.append(cluster)
        cluster.start()
        return cluster, json.loads(cluster.write_description().read_text())

    yield make
    for cluster in started:
        cluster.stop()


def value(prefix: str, i: int) -> bytes:
    return f"{prefix}-{i:08d}-".encode().ljust(SIZE, b"x")  # as az_client.value


def digest(values: list[bytes]) -> str:
    h = hashlib.sha256()
    for v in sorted(values):
        h.update(v + b"\n")
    return h.hexdigest()


def create_topic(description: dict[str, Any], topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": description["all_bootstrap_servers"]})
    wait_until(lambda: len(admin.list_topics(timeout=5).brokers) == 3, 30, message="brokers did not register")
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={"diskless.enabled": "true"})])[topic].result(30)

    def led() -> bool:
        meta = admin.list_topics(topic, timeout=5).topics[topic]
        return (
            meta.error is None
            and len(meta.partitions) == PARTITIONS
            and all(p.leader >= 0 for p in meta.partitions.values())
        )

    wait_until(led, 30, message="topic has partitions without a leader")


def run_client(cmd: list[str], source: str, shim: str, stdin: bytes | None = None) -> bytes:
    env = {**os.environ, "LD_PRELOAD": shim, "DISKLESS_SOURCE_ADDR": source, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=CLIENT_DEADLINE_S)
    assert done.returncode == 0, f"{cmd[:4]} failed: {done.stderr.decode(errors='replace')[-2000:]}"
    return done.stdout


def produce(lib: str, bootstrap: str, topic: str, az: str, source: str, shim: str) -> None:
    if lib == "kcat":
        lines = b"".join(value(az, i) + b"\n" for i in range(RECORDS))
        cmd = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-X", "acks=all", "-X", "linger.ms=50"]
        run_client(cmd, source, shim, stdin=lines)
        return
    cmd = [sys.executable, str(HERE / "az_client.py"), "produce", lib, bootstrap, topic, az, str(RECORDS), str(SIZE)]
    out = json.loads(run_client(cmd, source, shim).decode().strip().splitlines()[-1])
    assert out["acked"] == RECORDS, f"{lib} in {az}: {out}"


def consume(
    lib: str, bootstrap: str, topic: str, expected: int, rack: str, source: str, shim: str, partitions: int = PARTITIONS
) -> str:
    """The digest of every value the consumer read (each exactly once, if it matches)."""
    if lib == "kcat":
        cmd = ["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-c", str(expected), "-e"]
        cmd += ["-f", "%s\\n"] + (["-X", f"client.rack={rack}"] if rack else [])
        values = run_client(cmd, source, shim).splitlines()
        return digest(values)
    cmd = [sys.executable, str(HERE / "az_client.py"), "consume", lib, bootstrap, topic]
    cmd += [str(partitions), str(expected), rack]
    out = json.loads(run_client(cmd, source, shim).decode().strip().splitlines()[-1])
    return str(out["digest"])


def scrape(description: dict[str, Any]) -> list[dict[str, float]]:
    import urllib.request

    out = []
    for broker in description["brokers"].values():
        with urllib.request.urlopen(broker["metrics"], timeout=5) as response:
            samples = {}
            for line in response.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, _, number = line.rpartition(" ")
                    samples[name] = float(number)
            out.append(samples)
    return out


def labels_of(key: str) -> dict[str, str]:
    inside = key[key.index("{") + 1 : key.rindex("}")]
    return {k: v.strip('"') for k, v in (part.split("=", 1) for part in inside.split(",") if part)}


def traffic(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float]:
    """Bytes by socket address during the run: crossing AZs, within one, and to/from elsewhere."""
    out = {"cross": 0.0, "same": 0.0, "other": 0.0}
    for b, a in zip(before, after, strict=True):
        for key, total in a.items():
            if not key.startswith("diskless_connection_network_bytes_total{"):
                continue
            delta = total - b.get(key, 0.0)
            labels = labels_of(key)
            here, there = AZ_NETWORKS.get(labels["local_network"]), AZ_NETWORKS.get(labels["peer_network"])
            out["other" if here is None or there is None else "same" if here == there else "cross"] += delta
    return out


def decisions(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b, a in zip(before, after, strict=True):
        for key, total in a.items():
            if key.startswith("diskless_connection_az_decisions_total{"):
                source = labels_of(key)["source"]
                out[source] = out.get(source, 0.0) + total - b.get(key, 0.0)
    return out


def run_round(
    description: dict[str, Any], topic: str, shim: str, producers: list[str], consumers: list[str], racks: bool
) -> tuple[dict[str, float], dict[str, float], float]:
    """Producers (one per AZ) then consumers (one per AZ); returns traffic, decisions, payload bytes."""
    create_topic(description, topic)
    before = scrape(description)
    with ThreadPoolExecutor(len(AZS)) as pool:
        list(
            pool.map(
                lambda i: produce(
                    producers[i], description["bootstrap_servers"][AZS[i]], topic, AZS[i], f"127.0.{i + 1}.200", shim
                ),
                range(len(AZS)),
            )
        )
    expected = digest([value(az, i) for az in AZS for i in range(RECORDS)])
    total = RECORDS * len(AZS)
    with ThreadPoolExecutor(len(AZS)) as pool:
        digests = list(
            pool.map(
                lambda i: consume(
                    consumers[i],
                    description["bootstrap_servers"][AZS[i]],
                    topic,
                    total,
                    AZS[i] if racks else "",
                    f"127.0.{i + 1}.100",
                    shim,
                ),
                range(len(AZS)),
            )
        )
    for az, lib, got in zip(AZS, consumers, digests, strict=True):
        assert got == expected, f"{lib} consumer in {az} did not read every produced record exactly once"
    after = scrape(description)
    payload = float(total * SIZE * (1 + len(AZS)))  # produced once, consumed in every AZ
    moved = traffic(before, after)
    made = decisions(before, after)
    share = moved["cross"] / payload
    print(f"cross-AZ {moved['cross']:.0f} B = {share:.4%} of {payload:.0f} payload B; {moved}; decided by {made}")
    return moved, made, share


def check_classic_topic(description: dict[str, Any], shim: str) -> None:
    """A classic topic: Metadata shows its true leader to every client, and a consumer outside the
    leader's AZ is sent (KIP-392, by the AZ its listener decided) to the in-sync replica in its
    own AZ, so the records it reads do not cross AZs either. (A function: its admin clients must
    not outlive the brokers, or they log reconnects.)"""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": description["all_bootstrap_servers"]})
    admin.create_topics([NewTopic("classic", 1, 3)])["classic"].result(30)
    racks = {int(node): info["az"] for node, info in description["brokers"].items()}

    def settled() -> Any:
        part = admin.list_topics("classic", timeout=5).topics["classic"].partitions.get(0)
        return part if part is not None and part.leader >= 0 and len(part.isrs) == 3 else None

    leader = wait_until(settled, 30, message="classic topic never got a leader and a full ISR").leader
    az = next(a for a in AZS if a != racks[leader])
    k = AZS.index(az) + 1
    shown = AdminClient({"bootstrap.servers": description["bootstrap_servers"][az]}).list_topics("classic", timeout=10)
    assert shown.topics["classic"].partitions[0].leader == leader, "a classic partition's leader must be the true one"
    # Produced from the leader's AZ with acks=all: replication is over when the producer is.
    producer_az = racks[leader]
    source = f"127.0.{AZS.index(producer_az) + 1}.201"
    produce("aiokafka", description["bootstrap_servers"][producer_az], "classic", producer_az, source, shim)
    before = scrape(description)
    bootstrap = description["bootstrap_servers"][az]
    got = consume("confluent-kafka", bootstrap, "classic", RECORDS, "", f"127.0.{k}.100", shim, partitions=1)
    assert got == digest([value(producer_az, i) for i in range(RECORDS)])
    classic = traffic(before, scrape(description))
    print(f"classic topic, consumer in {az}, leader in {racks[leader]}: {classic}")
    # Served by the leader, all of it would cross; what does is requests, redirects and replica polls.
    assert classic["cross"] < 0.05 * RECORDS * SIZE, classic


def test_per_az_listeners_keep_plain_clients_in_their_az(
    dev_cluster: Callable[..., tuple[DevCluster, dict[str, Any]]], shim: str
) -> None:
    _cluster, description = dev_cluster()
    for az in AZS:
        # The AZ's addresses are its own brokers' listeners for that AZ.
        index = AZS.index(az) + 1
        assert all(a.startswith(f"127.0.{index}.") for a in description["bootstrap_servers"][az].split(","))
    producers, consumers = ["confluent-kafka", "aiokafka", "kcat"], ["kafka-python", "kcat", "aiokafka"]
    moved, made, share = run_round(description, "listeners", shim, producers, consumers, False)
    assert made.get("listener", 0) > 0 and made.get("receiving_broker", 0) == 0, made
    assert moved["same"] > moved["cross"], moved  # the counters did see the clients' traffic
    assert share < 0.01

    check_classic_topic(description, shim)


def test_client_rack_and_source_address_map_keep_plain_clients_in_their_az(
    dev_cluster: Callable[..., tuple[DevCluster, dict[str, Any]]], shim: str
) -> None:
    # Producers leave from 127.0.<az>.200, inside the map; consumers from .100, outside it: only
    # their client.rack can tell their AZ.
    cidrs = ",".join(f"{az}:127.0.{k}.192/26" for k, az in enumerate(AZS, start=1))
    _cluster, description = dev_cluster(az_listeners=False, overrides={"diskless.client.az.cidrs": cidrs})
    producers, consumers = ["kafka-python", "kcat", "confluent-kafka"], ["confluent-kafka", "aiokafka", "kcat"]
    moved, made, share = run_round(description, "racks", shim, producers, consumers, True)
    assert made.get("source_address", 0) > 0 and made.get("client_rack", 0) > 0 and "listener" not in made, made
    assert moved["same"] > moved["cross"], moved
    assert share < 0.01


def test_a_client_no_source_can_place_is_served_in_the_receiving_brokers_az(
    dev_cluster: Callable[..., tuple[DevCluster, dict[str, Any]]], shim: str
) -> None:
    _cluster, description = dev_cluster(az_listeners=False)
    producers, consumers = ["aiokafka", "confluent-kafka", "kcat"], ["kcat", "kafka-python", "confluent-kafka"]
    _moved, made, share = run_round(description, "unplaced", shim, producers, consumers, False)
    client_sources = {k: v for k, v in made.items() if k != "broker"}
    assert set(client_sources) == {"receiving_broker"}, made
    print(f"without any source (the old fallback): {share:.2%} of payload bytes crossed AZs")

"""What the brokers say about a run: /proc CPU and memory, Prometheus counters, and the WAL objects in S3.

A ``Sampler`` thread takes a snapshot about once a second: per broker, CPU seconds (utime + stime
from ``/proc/<pid>/stat``), resident and peak resident memory (``VmRSS``/``VmHWM``), how long its
event loop ran and how long it waited for a CPU (``schedstat``), and the samples of the broker's
Prometheus endpoint that the bench reads (``SCRAPED``). Figures for a
phase are differences between the first and the last snapshot taken inside its window: a snapshot
of saturated brokers takes seconds, and one reaching into the next phase counted that phase's work
and records too.

Bytes crossing AZs come from the brokers' per-connection socket counters. Preferred is the
counter by the socket's own addresses (``diskless_connection_network_bytes``: each AZ is a
loopback /24, and the load generators' connections leave from their AZ's network), so nothing a
client says about itself is trusted; brokers that lack it are read through the counter by the AZ
the broker decided for the connection (``diskless_connection_bytes``), and the report says which.
Each TCP byte between brokers is counted once, by the broker that accepted the connection.
Brokers also count frame bytes by API key and by whether a broker sent the requests
(``diskless_connection_api_bytes``); ``cross_az_bytes`` splits the crossing bytes by that into
``by_api`` (``Fetch (client)``, ``Fetch (broker)`` for replica fetches, ``CommitBatches`` ...), so
an operator sees what crosses, and reports the group coordinator's share on its own: Kafka has one
coordinator per group, in one AZ, so a group's members in the other AZs talk to it across AZs
whatever the data path does.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diskless.bench import machine_speed
from diskless.local.servers import BrokerServer

CLOCK_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux; read at import below when available
try:
    import os

    CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):
    pass

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
NETWORK_BYTES = "diskless_connection_network_bytes_total"
API_BYTES = "diskless_connection_api_bytes_total"
AZ_BYTES = "diskless_connection_bytes_total"
OBJECT_REQUESTS = "diskless_object_store_requests_total"
OBJECT_BYTES = "diskless_object_store_bytes_total"
# The metric families the bench reads (counters by their ``_total`` name). A snapshot asks each
# broker for these alone: a full scrape once a second, with the per-partition tiering gauges of
# 1,000 partitions, took ~8% of the brokers' busy time, far more than a Prometheus server scraping
# every 15 s or more costs, and the bench would have measured its own observer.
COUNTERS = (
    NETWORK_BYTES,
    API_BYTES,
    AZ_BYTES,
    OBJECT_REQUESTS,
    OBJECT_BYTES,
    "diskless_requests_total",
    "diskless_replica_fetches_total",
    "diskless_object_store_hedges_total",
    "diskless_object_store_hedge_wins_total",
    "diskless_unwatched_changes_total",
)
HISTOGRAMS = (
    "diskless_flush_seconds",
    "diskless_commit_seconds",
    "diskless_produce_stage_seconds",
    "diskless_object_store_seconds",
    "diskless_event_loop_lag_seconds",
    "diskless_gc_pause_seconds",
)
SCRAPED = COUNTERS + tuple(f"{name}{suffix}" for name in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count"))


def parse_sample(key: str) -> tuple[str, dict[str, str]]:
    """``name{a="x",b="y"}`` -> (name, {a: x, b: y})."""
    match = _SAMPLE.match(key)
    if match is None:
        return key, {}
    return match["name"], dict(_LABEL.findall(match["labels"] or ""))


def proc_figures(pid: int) -> dict[str, float]:
    """CPU seconds so far and memory of one process, from /proc (zeros once it has gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {"cpu_s": 0.0, "rss_mb": 0.0, "peak_rss_mb": 0.0}
    # Fields after the command name, which may itself hold spaces: utime and stime are 14th and 15th.
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    memory = {}
    for line in status.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            memory[line.split(":")[0]] = int(line.split()[1]) / 1024
    figures = {"cpu_s": cpu, "rss_mb": memory.get("VmRSS", 0.0), "peak_rss_mb": memory.get("VmHWM", 0.0)}
    figures.update(schedule_figures(pid))
    return figures


def schedule_figures(pid: int) -> dict[str, float]:
    """How long a process ran and how long it was ready to run but waited for a CPU, seconds so far,
    from the scheduler's per-thread ``schedstat`` (on CPU, waiting on a run queue, both in ns):

    - ``loop_run_s``, ``loop_wait_s``, ``loop_runs``: the main thread's, which in a broker is the
      event loop, and how many times it was put on a CPU. The wait is time the loop had work and
      no core: every request, timer and answer it holds is that much later;
    - ``threads_wait_s``: all its threads' waits added up (the S3 server works in many threads).

    Empty where the kernel keeps no such figures (or the process has gone)."""
    try:
        main = Path(f"/proc/{pid}/schedstat").read_text().split()
        waits = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that just ended
                waits += int((task / "schedstat").read_text().split()[1])
        return {
            "loop_run_s": int(main[0]) / 1e9,
            "loop_wait_s": int(main[1]) / 1e9,
            "loop_runs": int(main[2]),
            "threads_wait_s": waits / 1e9,
        }
    except (OSError, IndexError, ValueError):
        return {}


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, in clock ticks, from /proc/stat: how
    busy the box was while a phase ran (brokers, S3 server, etcd and load generators share it)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


@dataclass
class Snapshot:
    at: float  # wall seconds when taking it began
    brokers: dict[int, dict[str, Any]]  # node id -> proc figures plus "metrics"
    s3: dict[str, float] = field(default_factory=dict)  # the S3 server's proc figures
    machine: tuple[int, int] = (0, 0)  # machine_jiffies()
    until: float = 0.0  # wall seconds when it was done (its figures were read in between)
    speed_ms: float | None = None  # machine_speed.probe() taken with it

    def __post_init__(self) -> None:
        self.until = max(self.until, self.at)


@dataclass
class Sampler:
    brokers: list[BrokerServer]
    s3_pid: int | None = None
    interval: float = 1.0
    snapshots: list[Snapshot] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def take(self) -> Snapshot:
        began = time.time()
        speed = machine_speed.probe()
        out: dict[int, dict[str, Any]] = {}
        for broker in self.brokers:
            figures: dict[str, Any] = proc_figures(broker.pid) if broker.pid else {}
            try:
                figures["metrics"] = broker.metrics(SCRAPED)
            except OSError:
                figures["metrics"] = {}
            out[broker.node_id] = figures
        s3 = proc_figures(self.s3_pid) if self.s3_pid else {}
        snapshot = Snapshot(began, out, s3, machine_jiffies(), until=time.time(), speed_ms=speed)
        self.snapshots.append(snapshot)
        return snapshot

    def start(self) -> None:
        self.take()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.take()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.take()

    def bracket(self, start: float, end: float) -> tuple[Snapshot, Snapshot]:
        """The first snapshot begun at or after ``start`` and the last done by ``end``; when the
        window holds fewer than two, the last begun by ``start`` and the first begun at or after
        ``end`` (or the nearest)."""
        snaps = list(self.snapshots)
        inside = [s for s in snaps if s.at >= start and s.until <= end]
        if len(inside) >= 2:
            return inside[0], inside[-1]
        before = [s for s in snaps if s.at <= start]
        after = [s for s in snaps if s.at >= end]
        return (before[-1] if before else snaps[0]), (after[0] if after else snaps[-1])

    def speed_between(self, start: float, end: float) -> float | None:
        """The median machine speed (``machine_speed.python_ms``) of the snapshots begun in the window."""
        speeds = sorted(s.speed_ms for s in list(self.snapshots) if start <= s.at <= end and s.speed_ms is not None)
        return speeds[len(speeds) // 2] if speeds else None

    def series(self) -> dict[str, Any]:
        """RSS and CPU per broker over time (for the JSON and plots)."""
        snaps = list(self.snapshots)
        return {
            str(node): {
                "t": [round(s.at, 3) for s in snaps],
                "rss_mb": [round(s.brokers.get(node, {}).get("rss_mb", 0.0), 1) for s in snaps],
                "cpu_s": [round(s.brokers.get(node, {}).get("cpu_s", 0.0), 2) for s in snaps],
            }
            for node in (b.node_id for b in self.brokers)
        }


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, value in metrics.items():
        sample, have = parse_sample(key)
        if sample == name and all(have.get(k) == v for k, v in labels.items()):
            total += value
    return total


def histogram_quantile(delta: WindowDelta, name: str, q: float, **labels: str) -> float | None:
    """A quantile of a Prometheus histogram's increase over a window, as Prometheus estimates it:
    linear within the bucket it falls in (the last finite bound when it falls beyond them)."""
    counts: dict[float, float] = {}
    for metrics in delta.metrics.values():
        for key, value in metrics.items():
            sample, have = parse_sample(key)
            if sample != f"{name}_bucket" or any(have.get(k) != v for k, v in labels.items()):
                continue
            bound = float(have["le"])
            counts[bound] = counts.get(bound, 0.0) + value
    bounds = sorted(counts)
    if not bounds or counts[bounds[-1]] <= 0:
        return None
    rank = q * counts[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        if counts[bound] >= rank:
            if bound == float("inf"):
                return lower
            share = (rank - below) / (counts[bound] - below) if counts[bound] > below else 1.0
            return lower + (bound - lower) * share
        lower, below = bound, counts[bound]
    return lower


def _diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {key: value - a.get(key, 0.0) for key, value in b.items()}


@dataclass
class WindowDelta:
    seconds: float
    cpu_s: dict[int, float]
    metrics: dict[int, dict[str, float]]  # counter increases per broker

    def total(self, name: str, **labels: str) -> float:
        return sum(metric_sum(m, name, **labels) for m in self.metrics.values())

    def per_broker(self, name: str, **labels: str) -> dict[int, float]:
        return {node: metric_sum(m, name, **labels) for node, m in self.metrics.items()}


def combined(deltas: list[WindowDelta]) -> WindowDelta:
    """Several windows' increases as one (their seconds, CPU and counters summed)."""
    metrics: dict[int, dict[str, float]] = {}
    cpu: dict[int, float] = {}
    for delta in deltas:
        for node, values in delta.metrics.items():
            into = metrics.setdefault(node, {})
            for key, value in values.items():
                into[key] = into.get(key, 0.0) + value
        for node, seconds in delta.cpu_s.items():
            cpu[node] = cpu.get(node, 0.0) + seconds
    return WindowDelta(seconds=sum(d.seconds for d in deltas), cpu_s=cpu, metrics=metrics)


def window_delta(sampler: Sampler, start: float, end: float) -> WindowDelta:
    a, b = sampler.bracket(start, end)
    nodes = sorted(set(a.brokers) & set(b.brokers))
    return WindowDelta(
        seconds=max(b.until - a.at, 1e-9),
        cpu_s={n: b.brokers[n].get("cpu_s", 0.0) - a.brokers[n].get("cpu_s", 0.0) for n in nodes},
        metrics={n: _diff(a.brokers[n].get("metrics", {}), b.brokers[n].get("metrics", {})) for n in nodes},
    )


def waits_between(a: Snapshot, b: Snapshot) -> dict[str, float | None]:
    """Per wall second between two snapshots, in ms: how long the brokers' event loops ran and how
    long they waited for a CPU (means over brokers), and how long the S3 server's threads waited
    for one (added up); and the loops' mean wait each time they were woken (ms: a message to a
    broker waits about that long before its loop reads it, once per hop between processes). None
    where the snapshots lack the figures (``schedule_figures``)."""
    seconds = b.until - a.at

    def per_s(before: dict[str, Any], after: dict[str, Any], name: str) -> float | None:
        if name not in before or name not in after or seconds <= 0:
            return None
        return max(0.0, after[name] - before[name]) / seconds * 1000  # a thread gone: no negative wait

    def mean(name: str) -> float | None:
        values = [per_s(a.brokers[n], b.brokers[n], name) for n in sorted(set(a.brokers) & set(b.brokers))]
        known = [v for v in values if v is not None]
        return round(sum(known) / len(known), 1) if known else None

    s3 = per_s(a.s3, b.s3, "threads_wait_s")
    nodes = sorted(
        n for n in set(a.brokers) & set(b.brokers) if "loop_runs" in a.brokers[n] and "loop_runs" in b.brokers[n]
    )
    runs = sum(b.brokers[n]["loop_runs"] - a.brokers[n]["loop_runs"] for n in nodes)
    waited = sum(max(0.0, b.brokers[n]["loop_wait_s"] - a.brokers[n]["loop_wait_s"]) for n in nodes)
    return {
        "loop_cpu_ms_per_s": mean("loop_run_s"),
        "loop_wait_ms_per_s": mean("loop_wait_s"),
        "loop_wait_per_wakeup_ms": round(waited / runs * 1000, 2) if runs > 0 else None,
        "s3_server_wait_ms_per_s": round(s3, 1) if s3 is not None else None,
    }


def az_of_network(network: str, azs: list[str]) -> str | None:
    """``127.0.2.0/24`` -> ``az-2`` when az-2 is one of the run's AZs (the dev layout's addressing)."""
    match = re.fullmatch(r"127\.0\.(\d+)\.0/24", network)
    if match is None:
        return None
    az = f"az-{int(match[1])}"
    return az if az in azs else None


def api_names() -> dict[str, str]:
    """API key (as the brokers label it) -> a name: Kafka's from protocol/messages.py, ours from internal.py."""
    from diskless.protocol import internal, messages

    names = {"sasl": "SASL token"}
    for module, prefix in ((messages, "API_"), (internal, "INTERNAL_")):
        for constant, key in vars(module).items():
            if constant.startswith(prefix) and isinstance(key, int) and not isinstance(key, bool):
                words = constant[len(prefix) :].lower().split("_")
                names.setdefault(str(key), "".join(w.capitalize() for w in words))
    return names


def requests_per_broker_per_s(delta: WindowDelta) -> dict[str, float]:
    """Requests each broker handled per second, by API (mean over brokers), most frequent first;
    Fetch is split into replica fetches (from followers of a version before ReplicaFetch) and the
    rest (consumers')."""
    names = api_names()
    counts: dict[str, float] = {}
    for metrics in delta.metrics.values():
        for key, value in metrics.items():
            sample, labels = parse_sample(key)
            if sample == "diskless_requests_total" and value > 0:
                name = names.get(labels.get("api", ""), labels.get("api", "?"))
                counts[name] = counts.get(name, 0.0) + value
    # Replica fetches in the compact form are ReplicaFetch requests; the rest came as Fetch.
    replica = max(0.0, delta.total("diskless_replica_fetches_total") - counts.get("ReplicaFetch", 0.0))
    if "Fetch" in counts:
        counts["Fetch (replicas)"] = replica
        counts["Fetch (consumers)"] = max(0.0, counts.pop("Fetch") - replica)
    brokers = max(1, len(delta.metrics))
    rates = {name: round(count / delta.seconds / brokers, 1) for name, count in counts.items()}
    return dict(sorted(rates.items(), key=lambda item: -item[1]))


# Group membership and offsets: answered by the group's one coordinator (Kafka's design, one AZ).
COORDINATOR_APIS = frozenset(
    {
        "FindCoordinator",
        "JoinGroup",
        "SyncGroup",
        "Heartbeat",
        "LeaveGroup",
        "OffsetCommit",
        "OffsetFetch",
        "ConsumerGroupHeartbeat",
        "TxnOffsetCommit",
    }
)


def _side(labels: dict[str, str], azs: list[str]) -> str:
    local, peer = (
        az_of_network(labels.get("local_network", ""), azs),
        az_of_network(labels.get("peer_network", ""), azs),
    )
    return "unattributed" if local is None or peer is None else "same" if local == peer else "cross"


def cross_az_by_api(delta: WindowDelta, azs: list[str]) -> dict[str, dict[str, float]]:
    """Bytes by ``API (client|broker)``: crossing AZs (and how many of those were requests), within
    one AZ, and not attributable; largest crossing first."""
    names = api_names()
    out: dict[str, dict[str, float]] = {}
    for m in delta.metrics.values():
        for key, value in m.items():
            name, labels = parse_sample(key)
            if name != API_BYTES or not value:
                continue
            api = names.get(labels.get("api", ""), f"api {labels.get('api')}")
            row = out.setdefault(
                f"{api} ({labels.get('peer', '?')})",
                {"cross": 0.0, "same": 0.0, "unattributed": 0.0, "cross_requests": 0.0},
            )
            side = _side(labels, azs)
            row[side] += value
            if side == "cross" and labels.get("direction") == "in":
                row["cross_requests"] += value  # the rest of "cross" is responses
    return dict(sorted(out.items(), key=lambda item: (-item[1]["cross"], item[0])))


def cross_az_bytes(delta: WindowDelta, azs: list[str]) -> dict[str, Any]:
    """Bytes on broker connections between different AZs, within one AZ, and not attributable; with
    the crossing bytes by API (``by_api``) and the group coordinator's share of them."""
    same = cross = unattributed = 0.0
    source = "address"
    samples = [(k, v) for m in delta.metrics.values() for k, v in m.items() if parse_sample(k)[0] == NETWORK_BYTES]
    if samples:
        for key, value in samples:
            labels = parse_sample(key)[1]
            local, peer = (
                az_of_network(labels.get("local_network", ""), azs),
                az_of_network(labels.get("peer_network", ""), azs),
            )
            if local is None or peer is None:
                unattributed += value
            elif local == peer:
                same += value
            else:
                cross += value
    else:
        source = "broker-decided AZ (no per-address counter on these brokers)"
        for m in delta.metrics.values():
            for key, value in m.items():
                name, labels = parse_sample(key)
                if name != AZ_BYTES:
                    continue
                if labels.get("local_az") == labels.get("peer_az"):
                    same += value
                else:
                    cross += value
    by_api = cross_az_by_api(delta, azs)
    coordinator = sum(row["cross"] for key, row in by_api.items() if key.split(" (")[0] in COORDINATOR_APIS)
    return {
        "cross_az_bytes": cross,
        "same_az_bytes": same,
        "unattributed_bytes": unattributed,
        "counted_by": source,
        "seconds": round(delta.seconds, 3),
        # Diskless batches the representatives committed: per-batch metadata is what crosses AZs.
        "batches": delta.total("diskless_produce_stage_seconds_count", stage="commit"),
        "coordinator_cross_az_bytes": coordinator,
        "by_api": by_api,
    }


@dataclass(frozen=True)
class WalObject:
    created_ms: int
    broker_id: int
    size: int


async def list_wal_objects(endpoint: str, bucket: str, access_key: str, secret_key: str) -> list[WalObject]:
    from diskless.storage.object_store import ObjectStore
    from diskless.storage.wal_format import WAL_KEY_ROOT, parse_wal_object_key

    out: list[WalObject] = []
    async with ObjectStore(endpoint, bucket, access_key, secret_key) as store:
        async for item in store.list(WAL_KEY_ROOT):
            try:
                info = parse_wal_object_key(item.key)
            except ValueError:
                continue
            out.append(WalObject(info.created_ms, info.broker_id, item.size))
    return out

"""``diskless bench``: start the cluster, measure raw S3, drive each topic kind through its phases, report.

Order: cluster up; raw S3 baseline (nothing else running); the sampler starts; per topic kind, one
consumer and one producer per AZ (zone-aligned: they bootstrap from their AZ's brokers and their
connections leave from their AZ's network), phases ``low``, ``max``, ``after-burst``, then ``80pct``
of the ``max`` phase's throughput; the WAL objects are listed; the cluster stops; figures, targets
and plots are written. Every process started here is stopped here, also on errors and Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from diskless.bench import machine_speed
from diskless.bench.cluster import az_env, azs_of, build_shim, create_topics, spawn_loadgen, start_cluster
from diskless.bench.collect import (
    OBJECT_BYTES,
    OBJECT_REQUESTS,
    Sampler,
    WalObject,
    combined,
    cross_az_bytes,
    histogram_quantile,
    list_wal_objects,
    requests_per_broker_per_s,
    waits_between,
    window_delta,
)
from diskless.bench.options import BenchOptions, phase_of
from diskless.bench.profile import Profiler, hot_spots
from diskless.bench.report import evaluate_targets, write_outputs
from diskless.bench.s3_baseline import run_baseline
from diskless.bench.stats import (
    ConsumerSamples,
    ProducerSamples,
    Window,
    client_view,
    e2e_blocks_ms,
    e2e_ms,
    p99_rise_interval,
    percentiles,
    phase_figures,
    size_distribution,
    throughput_series,
)
from diskless.chaos.s3proxy import FaultRates, S3FaultProxy
from diskless.dev import BUCKET, DevCluster
from diskless.metrics import PRODUCE_STAGES

READY_TIMEOUT_S = 90.0
FLUSH_TIMEOUT_S = 60.0
CATCH_UP_S = 10.0  # consumers get this long after the last phase to see every acknowledged record


class Progress:
    """One status line, rewritten in place on a terminal, printed every few seconds otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0
        self.open = False

    def update(self, text: str) -> None:
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r" + text[:150].ljust(150))
            self.stream.flush()
            self.open = True
        elif now - self.last >= 5.0:
            self.last = now
            print(text, file=self.stream, flush=True)

    def line(self, text: str) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False
        print(text, file=self.stream, flush=True)


@dataclass
class KindRun:
    kind: str
    topic: str
    windows: list[Window] = field(default_factory=list)
    produced: ProducerSamples | None = None
    consumed: ConsumerSamples | None = None
    consumed_by_az: dict[str, ConsumerSamples] = field(default_factory=dict)  # the tail consumer of each AZ
    started_at: float = 0.0
    profiles: list[Path] = field(default_factory=list)  # py-spy collapsed stacks, one per broker
    lagging_read: int | None = None  # records the lagging reader got during the ``lagging`` phase


class LoadGenerators:
    """The producer and consumer processes of one topic kind and their control directories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[Path, subprocess.Popen[bytes]] = {}

    def spawn(self, role: str, az: str, args: dict[str, Any], env: dict[str, str], name: str = "") -> Path:
        control = self.root / (name or f"{role}-{az}")
        control.mkdir(parents=True, exist_ok=True)
        self.procs[control] = spawn_loadgen(role, {**args, "az": az, "control": control}, env, control / "log.txt")
        return control

    def check(self, controls: list[Path] | None = None) -> None:
        for control in controls or list(self.procs):
            proc = self.procs[control]
            failed = control / "failed.txt"
            if failed.exists() or (proc.poll() is not None and proc.returncode != 0):
                reason = failed.read_text().strip() if failed.exists() else f"exit code {proc.returncode}"
                tail = (control / "log.txt").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"load generator {control.name} failed: {reason}\n{tail}")

    def wait_files(self, controls: list[Path], name: str, timeout: float, tick: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while not all((c / name).exists() for c in controls):
            self.check(controls)
            if time.monotonic() > deadline:
                missing = [c.name for c in controls if not (c / name).exists()]
                raise TimeoutError(f"{', '.join(missing)}: no {name} within {timeout:.0f}s")
            if tick is not None:
                tick()
            time.sleep(0.25)

    def stop(self, controls: list[Path], timeout: float = 30.0) -> None:
        for control in controls:
            (control / "stop").write_text("stop\n")
        deadline = time.monotonic() + timeout
        for control in controls:
            proc = self.procs[control]
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        self.check(controls)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _windows(order: dict[str, Any]) -> list[Window]:
    out, start = [], float(order["start_at"])
    for phase in order["phases"]:
        out.append(Window(phase["name"], start, start + float(phase["duration"])))
        start += float(phase["duration"])
    return out


def _run_reader_in(reader: subprocess.Popen[bytes], windows: list[Window]) -> threading.Thread:
    """Let the stopped reader run (SIGCONT) during each lagging slice among ``windows``, and stop
    it (SIGSTOP) at the slice's end; the thread ends with the last slice."""

    def switch() -> None:
        for window in windows:
            if phase_of(window.name) == "lagging":
                time.sleep(max(0.0, window.start - time.time()))
                reader.send_signal(signal.SIGCONT)
                time.sleep(max(0.0, window.end - time.time()))
                reader.send_signal(signal.SIGSTOP)

    thread = threading.Thread(target=switch, name="lagging-reader-switch", daemon=True)
    thread.start()
    return thread


def _publish(path: Path, value: dict[str, Any]) -> None:
    """Write-then-rename: a load generator polling for ``path`` never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _load_producers(controls: list[Path], round_: int) -> ProducerSamples:
    parts = []
    for control in controls:
        with np.load(control / f"out-{round_}.npz") as data:
            stats = data["client_stats"].copy() if "client_stats" in data else None
            part = ProducerSamples(data["sent_at"].copy(), data["latency"].copy(), int(data["errors"].sum()))
            if stats is not None:
                part.client_stats = stats
            parts.append(part)
    return ProducerSamples.join(parts)


def _load_consumers_by_az(controls: dict[str, Path]) -> tuple[ConsumerSamples, dict[str, ConsumerSamples]]:
    """All tail consumers' samples, and each AZ's as a view into them (no second copy: at the
    maximum rate they are millions of records per consumer)."""
    parts = []
    for control in controls.values():
        with np.load(control / "out.npz") as data:
            parts.append(ConsumerSamples(data["sent_at"].copy(), data["received_at"].copy()))
    joined = ConsumerSamples.join(parts)
    by_az: dict[str, ConsumerSamples] = {}
    start = 0
    for az, part in zip(controls, parts, strict=True):
        end = start + part.sent_at.size
        by_az[az] = ConsumerSamples(joined.sent_at[start:end], joined.received_at[start:end])
        start = end
    return joined, by_az


def run_kind(
    kind: str,
    topic: str,
    cluster: DevCluster,
    options: BenchOptions,
    shim: Path | None,
    raw: Path,
    progress: Progress,
    profiler: Profiler | None = None,
) -> KindRun:
    azs = azs_of(cluster)
    bootstrap = cluster.bootstrap_by_az()
    gens = LoadGenerators(raw / kind)
    run = KindRun(kind, topic)
    try:
        consumers = [
            gens.spawn("consumer", az, {"bootstrap": bootstrap[az], "topic": topic}, az_env(az, shim)) for az in azs
        ]
        gens.wait_files(consumers, "ready", READY_TIMEOUT_S)
        producer_args = {
            "topic": topic,
            "record_size": options.record_size,
            "linger_ms": options.producer_linger_ms,
            "queue_kbytes": options.producer_queue_kbytes,
            "config": json.dumps(options.producer_config),
        }
        count = options.producers_per_az
        producers = [
            gens.spawn(
                "producer",
                az,
                {**producer_args, "bootstrap": bootstrap[az]},
                az_env(az, shim),
                name=f"producer-{az}" if count == 1 else f"producer-{az}-{i}",
            )
            for az in azs
            for i in range(count)
        ]
        gens.wait_files(producers, "ready", READY_TIMEOUT_S)

        def tick_for(windows: list[Window], state: dict[str, Any]) -> Any:
            def tick() -> None:
                now = time.time()
                current = next((w for w in windows if w.start <= now < w.end), None)
                acked = sum(int(_read_json(c / "status.json").get("acked", 0)) for c in producers)
                received = sum(int(_read_json(c / "status.json").get("received", 0)) for c in consumers)
                if acked < state.get("acked", 0):
                    # The producers started a new round, whose count starts at zero: the previous
                    # round's total is no baseline (it showed as a large negative rate).
                    state["acked"] = 0
                rate = (acked - state.get("acked", acked)) / max(now - state.get("at", now), 1e-3)
                if now - state.get("at", 0.0) >= 1.0:
                    state.update(acked=acked, at=now, rate=rate)
                if current is not None:
                    label = f"{current.name} {now - current.start:4.0f}/{current.seconds:.0f}s"
                else:
                    label = "starting" if now < windows[0].start else "flushing"
                progress.update(
                    f"  {kind:8} {label:20} acked {acked:>9,} ({state.get('rate', 0.0):8,.0f} rec/s,"
                    f" {state.get('rate', 0.0) * options.record_size / 1e6:6.1f} MB/s)  consumed {received:>10,}"
                )

            return tick

        run.started_at = time.time() + 0.5
        order: dict[str, Any] = {
            "start_at": run.started_at,
            "phases": options.first_phases(),
            "flush_timeout": FLUSH_TIMEOUT_S,
        }
        first = _windows(order)
        if profiler is not None:
            profiler.start({b.node_id: b.pid for b in cluster.brokers if b.pid is not None})
        for control in producers:
            _publish(control / "go-1.json", order)
        total = first[-1].end - time.time()
        gens.wait_files(producers, "done-1", total + FLUSH_TIMEOUT_S + 30, tick_for(first, {}))
        round1 = _load_producers(producers, 1)
        burst = first[1]
        acked_at = round1.sent_at + round1.latency
        max_rps = float(((acked_at >= burst.start) & (acked_at < burst.end)).sum()) / burst.seconds
        per_producer = max(1, round(0.8 * max_rps / len(producers)))
        rounds = [round1]

        def fixed_rate_round(number: int, phases: list[dict[str, Any]], on_start: Any = None) -> list[Window]:
            """Phases at fixed rates (records/s per producer): round ``number`` of their orders;
            ``on_start`` gets the phases' windows once the order is out."""
            order = {"start_at": time.time() + 0.3, "phases": phases, "flush_timeout": FLUSH_TIMEOUT_S}
            windows = _windows(order)
            for control in producers:
                _publish(control / f"go-{number}.json", order)
            if on_start is not None:
                on_start(windows)
            wait = windows[-1].end - time.time() + FLUSH_TIMEOUT_S + 30
            gens.wait_files(producers, f"done-{number}", wait, tick_for(windows, {}))
            rounds.append(_load_producers(producers, number))
            return windows

        second = fixed_rate_round(2, [{"name": "80pct", "rate": per_producer, "duration": options.duration}])
        if options.lagging and kind == "diskless":
            # A reader of the whole topic from its start in the first AZ, beside that AZ's tail
            # reader, stopped (SIGSTOP) but in the lagging slices (options.lagging_phases).
            az = azs[0]
            lagging = gens.spawn(
                "consumer",
                az,
                {"bootstrap": bootstrap[az], "topic": topic, "from_beginning": "", "group_suffix": "-lagging"},
                az_env(az, shim),
                name=f"lagging-consumer-{az}",
            )
            gens.wait_files([lagging], "ready", READY_TIMEOUT_S)
            reader = gens.procs[lagging]
            reader.send_signal(signal.SIGSTOP)
            switches: list[threading.Thread] = []
            try:
                second += fixed_rate_round(
                    3, options.lagging_phases(), lambda windows: switches.append(_run_reader_in(reader, windows))
                )
            finally:
                for switch in switches:
                    switch.join()
                reader.send_signal(signal.SIGCONT)
            gens.stop([lagging])
            with np.load(lagging / "out.npz") as data:
                run.lagging_read = int(data["sent_at"].size)
        if profiler is not None:
            run.profiles = list(profiler.stop().values())
        run.produced = ProducerSamples.join(rounds)
        run.windows = first + second
        # Consumers see every acknowledged record (each reads the whole topic) or time runs out.
        expected = run.produced.sent_at.size * len(consumers)
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline:
            received = sum(int(_read_json(c / "status.json").get("received", 0)) for c in consumers)
            if received >= expected:
                break
            gens.check(consumers)
            time.sleep(0.25)
        gens.stop(producers + consumers)
        run.consumed, run.consumed_by_az = _load_consumers_by_az(dict(zip(azs, consumers, strict=True)))
        progress.line(
            f"  {kind}: done ({run.produced.sent_at.size:,} records acknowledged, {run.produced.errors} failed)"
        )
        return run
    finally:
        gens.kill_all()
        if profiler is not None:
            profiler.stop()


def _payload_between(produced: ProducerSamples, start: float, end: float, record_size: int) -> int:
    acked_at = produced.sent_at + produced.latency
    return int(((acked_at >= start) & (acked_at < end)).sum()) * record_size


def kind_figures(
    run: KindRun, sampler: Sampler, wal: list[WalObject], options: BenchOptions, azs: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(figures for the JSON, latency arrays per phase for the plots)."""
    assert run.produced is not None and run.consumed is not None
    phases: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    for window in run.windows:
        f = phase_figures(window, run.produced, run.consumed, options.record_size, len(azs))
        # An effect confined to one AZ's broker (the lagging reader's, say) hides in the pooled p99.
        by_az = run.consumed_by_az.items()
        f["end_to_end_p99_ms_by_az"] = {az: percentiles(e2e_ms(window, c))["p99"] for az, c in by_az}
        a, b = sampler.bracket(window.start, window.end)
        delta = window_delta(sampler, window.start, window.end)
        payload = _payload_between(run.produced, a.at, b.until, options.record_size)
        megabytes = payload / 1e6
        cpu = sum(delta.cpu_s.values())
        puts = delta.total(OBJECT_REQUESTS, operation="put")
        gets = delta.total(OBJECT_REQUESTS, operation="get")
        per_broker = {
            str(n): round(v / delta.seconds, 2) for n, v in delta.per_broker(OBJECT_REQUESTS, operation="put").items()
        }
        cross = cross_az_bytes(delta, azs)
        cross["payload_bytes"] = payload
        # The brokers' own timings: a WAL flush (upload plus commits) and a leader's commit of one request.
        timings = {}
        for name, metric in (("flush", "diskless_flush_seconds"), ("commit", "diskless_commit_seconds")):
            count = delta.total(f"{metric}_count")
            timings[f"{name}_mean_ms"] = round(delta.total(f"{metric}_sum") / count * 1000, 1) if count else None
        # Where a diskless batch's time goes (representative's stages), and how late the loops ran timers.
        for stage in PRODUCE_STAGES:
            metric, labels = "diskless_produce_stage_seconds", {"stage": stage}
            count = delta.total(f"{metric}_count", **labels)
            total = delta.total(f"{metric}_sum", **labels)
            timings[f"stage_{stage}_mean_ms"] = round(total / count * 1000, 1) if count else None
            p99 = histogram_quantile(delta, metric, 0.99, **labels)
            timings[f"stage_{stage}_p99_ms"] = round(p99 * 1000, 1) if p99 is not None else None
        count = delta.total("diskless_object_store_seconds_count", operation="put")
        put = delta.total("diskless_object_store_seconds_sum", operation="put")
        timings["s3_put_client_mean_ms"] = round(put / count * 1000, 1) if count else None
        timings["s3_put_hedges"] = int(delta.total("diskless_object_store_hedges_total", operation="put"))
        timings["s3_put_hedge_wins"] = int(delta.total("diskless_object_store_hedge_wins_total", operation="put"))
        timings["s3_get_hedges"] = int(delta.total("diskless_object_store_hedges_total", operation="get"))
        timings["s3_get_hedge_wins"] = int(delta.total("diskless_object_store_hedge_wins_total", operation="get"))
        # Partition changes found by the brokers' once-a-second comparison, not a watch: a bug.
        timings["unwatched_changes"] = int(delta.total("diskless_unwatched_changes_total"))
        # Its tail, set against the upload stage's, tells a slow store from a busy broker.
        p99 = histogram_quantile(delta, "diskless_object_store_seconds", 0.99, operation="put")
        timings["s3_put_client_p99_ms"] = round(p99 * 1000, 1) if p99 is not None else None
        count = delta.total("diskless_event_loop_lag_seconds_count")
        lag = delta.total("diskless_event_loop_lag_seconds_sum")
        timings["loop_lag_mean_ms"] = round(lag / count * 1000, 1) if count else None
        p99 = histogram_quantile(delta, "diskless_event_loop_lag_seconds", 0.99)
        timings["loop_lag_p99_ms"] = round(p99 * 1000, 1) if p99 is not None else None
        # Python's cyclic GC holds the whole broker while it runs: its share of the brokers' time,
        # and the full (generation 2) collections apart, whose pause grows with the live heap.
        pause_s = delta.total("diskless_gc_pause_seconds_sum")
        broker_seconds = delta.seconds * max(1, len(delta.metrics))
        timings["gc_pause_ms_per_s"] = round(pause_s / broker_seconds * 1000, 1) if broker_seconds else None
        full = delta.total("diskless_gc_pause_seconds_count", generation="2")
        full_s = delta.total("diskless_gc_pause_seconds_sum", generation="2")
        timings["gc_full_collections"] = int(full)
        timings["gc_full_mean_ms"] = round(full_s / full * 1000, 1) if full else None
        # How long the loops were ready to run with no core free: the machine's share of the latencies.
        waits = waits_between(a, b)
        s3_wait = waits.pop("s3_server_wait_ms_per_s")
        timings.update(waits)
        cross["per_payload_byte"] = round(cross["cross_az_bytes"] / payload, 5) if payload else None
        in_window = [o.size for o in wal if window.start * 1000 <= o.created_ms < window.end * 1000]
        s3_cpu = b.s3.get("cpu_s", 0.0) - a.s3.get("cpu_s", 0.0)
        busy, total = (b.machine[0] - a.machine[0]), (b.machine[1] - a.machine[1])
        f.update(
            window_start=window.start,
            machine_cpu_busy=round(busy / total, 3) if total > 0 else None,
            machine_speed_ms=sampler.speed_between(window.start, window.end),
            s3_server_cpu_s_per_gb=round(s3_cpu / (megabytes / 1000), 1) if megabytes and a.s3 else None,
            s3_server_wait_ms_per_s=s3_wait,
            broker_cpu_s=round(cpu, 2),
            broker_cpu_s_per_gb=round(cpu / (megabytes / 1000), 1) if megabytes else None,
            s3_puts=int(puts),
            s3_gets=int(gets),
            s3_get_bytes=int(delta.total(OBJECT_BYTES, direction="get")),
            s3_puts_per_mb=round(puts / megabytes, 3) if megabytes else None,
            s3_gets_per_mb=round(gets / megabytes, 3) if megabytes else None,
            s3_puts_per_broker_per_s=per_broker,
            s3_puts_per_broker_per_s_max=max(per_broker.values(), default=0.0),
            cross_az=cross,
            wal_objects=size_distribution(in_window),
            broker_timings=timings,
            requests_per_broker_per_s=requests_per_broker_per_s(delta),
            producer_client=client_view(run.produced, window),
        )
        phases[window.name] = f
        sent = (run.produced.sent_at >= window.start) & (run.produced.sent_at < window.end)
        samples[window.name] = {"produce": run.produced.latency[sent] * 1000, "e2e": e2e_ms(window, run.consumed)}
    first, last = run.windows[0].start, run.windows[-1].end
    # The whole run's bytes crossing AZs, but for the control phase: a measuring aid for the
    # lagging reader, it would add a second low-rate phase (whose fixed per-flush bytes are a
    # larger share of its payload) to the mix the target was set on.
    spans, start = [], first
    for window in run.windows:
        if phase_of(window.name) == "control":
            spans.append((start, window.start))
            start = window.end
    spans.append((start, last))
    whole = cross_az_bytes(combined([window_delta(sampler, start, end) for start, end in spans]), azs)
    payload = 0
    for start, end in spans:
        a, b = sampler.bracket(start, end)
        payload += _payload_between(run.produced, a.at, b.until, options.record_size)
    figures = {
        "topic": run.topic,
        "started_at": run.started_at,
        "failed_records": run.produced.errors,
        "phases": phases,
        "max_records_per_s": phases["max"]["records_per_s"],
        "max_mb_per_s": phases["max"]["mb_per_s"],
        "cross_az": whole,
        "cross_az_per_payload_byte": round(whole["cross_az_bytes"] / payload, 5) if payload else None,
        "cross_az_counted_by": whole["counted_by"],
        "lagging_reader_records": run.lagging_read,
        "lagging_reader_az": azs[0] if run.lagging_read is not None else None,  # where run_kind starts it
        "lagging_pooled": _pooled_slices(run, phases, ("control", "lagging")),
        "throughput_series": throughput_series(run.produced, run.started_at, last + 5, options.record_size),
    }
    return figures, samples


def _pooled_slices(run: KindRun, phases: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any] | None:
    """The tail consumers' end-to-end p99 (pooled and per AZ) and the object reads over all slices
    of each named phase (options.lagging_phases), and for two names, a 90% interval of the second's
    p99 rise over the first's; None if the run has none."""
    assert run.consumed is not None
    pooled: dict[str, Any] = {}
    for name in names:
        slices = [w for w in run.windows if phase_of(w.name) == name]
        if not slices:
            return None

        def p99(consumed: ConsumerSamples, slices: list[Window] = slices) -> Any:
            return percentiles(np.concatenate([e2e_ms(w, consumed) for w in slices]))["p99"]

        pooled[name] = {
            "phases": [w.name for w in slices],
            "end_to_end_p99_ms": p99(run.consumed),
            "end_to_end_p99_ms_by_az": {az: p99(c) for az, c in run.consumed_by_az.items()},
            "s3_gets": sum(phases[w.name]["s3_gets"] for w in slices),
            "s3_get_bytes": sum(phases[w.name]["s3_get_bytes"] for w in slices),
        }
    if len(names) == 2:
        # How sure the rise of the first's p99 over the second's is (stats.p99_rise_interval).
        blocks = [
            [b for w in run.windows if phase_of(w.name) == name for b in e2e_blocks_ms(w, run.consumed)]
            for name in names
        ]
        interval = p99_rise_interval(blocks[1], blocks[0])
        pooled["rise_interval_90"] = list(interval) if interval is not None else None
    return pooled


def run_bench(options: BenchOptions, out: TextIO = sys.stdout) -> int:
    options.validate()
    if options.profile and Profiler.binary() is None:
        print("diskless bench: --profile needs py-spy (pip install -e '.[bench]')", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result_dir = Path(options.out_dir).resolve() / stamp
    root = result_dir / "cluster"
    progress = Progress(out)
    progress.line(f"diskless bench: results in {result_dir}")
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    # Before anything of the bench runs: the machine's own speed, to compare runs of other times by.
    speed = machine_speed.measure()
    progress.line(f"  machine speed: a fixed Python workload took {speed['python_ms']:g} ms of CPU")
    overrides = options.broker_settings()
    cluster: DevCluster | None = None
    proxies: list[S3FaultProxy] = []

    def slow_front(endpoint: str) -> str:
        """The chaos proxy in front of the S3 server, holding ``--s3-slow``'s share of requests."""
        assert options.s3_slow is not None
        fraction, seconds = options.s3_slow
        proxy = S3FaultProxy(endpoint, seed=10, rates=FaultRates(slow=fraction, slow_s=seconds)).start()
        proxies.append(proxy)
        return proxy.endpoint

    try:
        front = slow_front if options.s3_slow is not None else None
        cluster = start_cluster(root, options.brokers, options.azs, overrides, out, front)
        assert cluster.s3 is not None
        s3 = cluster.s3
        s3_endpoint = proxies[0].endpoint if proxies else s3.endpoint  # the baseline measures what brokers get
        if proxies:
            progress.line(f"  S3 through the chaos proxy {s3_endpoint}: {options.s3_slow} (fraction, s) held")
        azs = azs_of(cluster)
        shim = build_shim(result_dir / "shim")
        if shim is None:
            progress.line("  no C compiler: clients leave from 127.0.0.1, their bytes are not attributed to AZs")
        progress.line("raw S3 baseline ...")
        baseline = asyncio.run(
            run_baseline(
                s3_endpoint,
                BUCKET,
                s3.access_key,
                s3.secret_key,
                options.s3_sizes,
                options.s3_latency_samples,
                options.s3_throughput_seconds,
                options.s3_concurrency,
            )
        )
        for b in baseline:
            progress.line(
                f"  {b['size_bytes'] // 1024:>5} KiB  PUT p50 {b['put_latency_ms']['p50']:.1f} p99"
                f" {b['put_latency_ms']['p99']:.1f} ms, {b['put_mb_per_s']:.1f} MB/s;  GET p50"
                f" {b['get_latency_ms']['p50']:.1f} p99 {b['get_latency_ms']['p99']:.1f} ms,"
                f" {b['get_mb_per_s']:.1f} MB/s"
            )
        topics = {f"bench-{kind}": kind == "diskless" for kind in options.kinds}
        progress.line(
            f"creating {', '.join(topics)} ({options.partitions} partitions, replication {options.replication}) ..."
        )
        create_topics(cluster, topics, options.partitions, options.replication)
        sampler = Sampler(cluster.brokers, s3_pid=cluster.s3.pid if cluster.s3 is not None else None)
        sampler.start()
        run_started = time.time()
        runs = []
        try:
            for kind in options.kinds:
                progress.line(f"{kind} topic: phases low, max, after-burst, 80pct")
                profiler = None
                if kind in options.profile:
                    profiler = Profiler(result_dir / "profile" / kind)
                    progress.line(f"  profiling the brokers with py-spy into {profiler.out}")
                run = run_kind(kind, f"bench-{kind}", cluster, options, shim, result_dir / "raw", progress, profiler)
                runs.append(run)
        finally:
            sampler.stop()
        wal = asyncio.run(list_wal_objects(s3.endpoint, BUCKET, s3.access_key, s3.secret_key))
        last = sampler.snapshots[-1]
        first = sampler.snapshots[0]
        brokers = {
            str(b.node_id): {
                "az": b.rack,
                "peak_rss_mb": round(last.brokers[b.node_id].get("peak_rss_mb", 0.0), 1),
                "cpu_s": round(
                    last.brokers[b.node_id].get("cpu_s", 0.0) - first.brokers[b.node_id].get("cpu_s", 0.0), 2
                ),
            }
            for b in cluster.brokers
        }
        kinds: dict[str, Any] = {}
        samples: dict[str, Any] = {}
        for run in runs:
            kinds[run.kind], samples[run.kind] = kind_figures(run, sampler, wal, options, azs)
            if run.profiles:
                kinds[run.kind]["profile"] = hot_spots(run.profiles)
        result: dict[str, Any] = {
            "started_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(run_started)),
            "run_started_at": run_started,
            "options": options.as_dict(),
            "cluster": {"s3_kind": s3.kind, "azs": azs, "source_address_shim": shim is not None},
            # Everything shares this machine's cores: other work running meanwhile moves every figure.
            "load_average": {"at_start": load_at_start, "at_end": [round(x, 2) for x in os.getloadavg()]},
            "cpus": os.cpu_count(),
            "machine_speed": speed,
            "s3_baseline": baseline,
            "kinds": kinds,
            "brokers": brokers,
            "broker_series": sampler.series(),
            "wal_objects": size_distribution([o.size for o in wal]),
        }
        result["targets"] = evaluate_targets(result)
    except KeyboardInterrupt:
        progress.line("interrupted")
        return 130
    finally:
        if cluster is not None:
            progress.line("stopping the cluster ...")
            cluster.stop()
            for proxy in proxies:
                proxy.stop()
            if not options.keep_data:
                data = [b.data_dir for b in cluster.brokers] + [root / "s3", root / "etcd"]
                for path in data:
                    shutil.rmtree(path, ignore_errors=True)
    paths = write_outputs(result, samples, result_dir, options.plots)
    progress.line("")
    for row in result["targets"]:
        measured = "-" if row["measured"] is None else f"{row['measured']:g} {row['unit']}"
        limit = "" if row["limit"] is None else f" (limit {row['limit']:g} {row['unit']})"
        progress.line(f"  [{row['result']:>4}] {row['target']} @ {row['phase']}: {measured}{limit}")
    progress.line("")
    for path in paths:
        progress.line(f"  wrote {path}")
    return 0

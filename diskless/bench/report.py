"""Issue 10's targets checked against a run's figures, and the run written out as JSON, Markdown and PNG plots.

``evaluate_targets`` is plain data in, rows out: each row names the target, the phase it was
checked in, the measured value, the limit and ``pass``/``fail`` (or ``n/a`` with the reason when a
run did not measure it, e.g. a classic-only run has no diskless figures).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LATENCY_PHASES = ("low", "80pct", "after-burst", "lagging")
RSS_LIMIT_MB = 300.0
CROSS_AZ_LIMIT = 0.01


def _row(
    target: str, phase: str, measured: float | None, limit: float | None, unit: str, ok: bool | None, note: str = ""
) -> dict[str, Any]:
    return {
        "target": target,
        "phase": phase,
        "measured": None if measured is None else round(measured, 4),
        "limit": None if limit is None else round(limit, 4),
        "unit": unit,
        "result": "n/a" if ok is None else ("pass" if ok else "fail"),
        "note": note,
    }


def raw_put_p99_for(baseline: list[dict[str, Any]], object_bytes: float | None) -> tuple[float, int]:
    """Raw PUT p99 (ms) at the baseline size nearest ``object_bytes`` (the phase's median WAL object)."""
    if object_bytes is None:
        chosen = max(baseline, key=lambda b: b["size_bytes"])
    else:
        chosen = min(baseline, key=lambda b: abs(b["size_bytes"] - object_bytes))
    return float(chosen["put_latency_ms"]["p99"]), int(chosen["size_bytes"])


def evaluate_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    linger = float(result["options"]["linger_ms"])
    baseline = result["s3_baseline"]
    kinds = result["kinds"]
    diskless = kinds.get("diskless")
    classic = kinds.get("classic")
    partitions = result["options"]["partitions"]
    if diskless is None:
        rows.append(_row("diskless targets", "-", None, None, "", None, "no diskless topic in this run"))
    else:
        phases = diskless["phases"]
        for phase in LATENCY_PHASES:
            figures = phases.get(phase)
            if figures is None:
                continue
            median_object = figures["wal_objects"].get("p50")
            put_p99, size = raw_put_p99_for(baseline, median_object)
            produce_p99 = figures["produce_latency_ms"]["p99"]
            limit = linger + put_p99 + 25
            note = f"linger {linger:g} + raw PUT p99 {put_p99:.1f} ms ({size // 1024} KiB) + 25"
            ok = None if produce_p99 is None else produce_p99 <= limit
            note += _cpu_wait_note(figures)
            rows.append(_row("diskless produce p99", phase, produce_p99, limit, "ms", ok, note))
            e2e_p99 = figures["end_to_end_latency_ms"]["p99"]
            ok = None if e2e_p99 is None or produce_p99 is None else e2e_p99 <= produce_p99 + 50
            limit = None if produce_p99 is None else produce_p99 + 50
            rows.append(_row("diskless end-to-end p99", phase, e2e_p99, limit, "ms", ok, "produce p99 + 50"))
        max_mb = phases["max"]["mb_per_s"] if "max" in phases else None
        if classic is not None and "max" in classic["phases"] and max_mb is not None:
            classic_mb = classic["phases"]["max"]["mb_per_s"]
            rows.append(
                _row("diskless max throughput >= classic", "max", max_mb, classic_mb, "MB/s", max_mb >= classic_mb)
            )
        else:
            rows.append(_row("diskless max throughput >= classic", "max", max_mb, None, "MB/s", None, "no classic run"))
        raw_mb = max(b["put_mb_per_s"] for b in baseline)
        if max_mb is not None:
            note = f"50% of the best raw PUT throughput ({raw_mb:.1f} MB/s)"
            rows.append(
                _row(
                    "diskless max throughput >= 50% raw PUT",
                    "max",
                    max_mb,
                    raw_mb / 2,
                    "MB/s",
                    max_mb >= raw_mb / 2,
                    note,
                )
            )
        ratio = diskless["cross_az_per_payload_byte"]
        rows.append(
            _row(
                "diskless bytes crossing AZs / payload",
                "all",
                ratio,
                CROSS_AZ_LIMIT,
                "ratio",
                None if ratio is None else ratio <= CROSS_AZ_LIMIT,
                diskless["cross_az_counted_by"],
            )
        )
        # Per phase as well: the whole run's ratio is carried by the high-rate phases' bytes, while
        # at a low rate every small batch pays its commit and its followers' copy (bytes per batch,
        # not per byte), which the whole-run figure hides.
        for phase, figures in phases.items():
            cross = figures["cross_az"]
            ratio = cross.get("per_payload_byte")
            batches = cross.get("batches") or 0
            payload = cross.get("payload_bytes") or 0
            note = (
                f"{cross['cross_az_bytes'] / batches:.0f} B crossing per batch of {payload / batches:.0f} B payload"
                if batches
                else ""
            )
            rows.append(
                _row(
                    "diskless bytes crossing AZs / payload",
                    phase,
                    ratio,
                    CROSS_AZ_LIMIT,
                    "ratio",
                    None if ratio is None else ratio <= CROSS_AZ_LIMIT,
                    note,
                )
            )
        put_limit = 1000.0 / linger * 1.1
        for phase, figures in phases.items():
            rate = figures["s3_puts_per_broker_per_s_max"]
            note = f"busiest broker; {partitions} partitions"
            rows.append(_row("PUTs per broker per second", phase, rate, put_limit, "1/s", rate <= put_limit, note))
    if classic is not None:
        ratio = classic["cross_az_per_payload_byte"]
        rows.append(
            _row(
                "classic bytes crossing AZs / payload (reported)",
                "all",
                ratio,
                None,
                "ratio",
                None,
                classic["cross_az_counted_by"],
            )
        )
    for kind, figures in sorted(kinds.items()):
        # Not an issue target: a correctness check of the brokers' partition watches under load.
        found = [p.get("broker_timings", {}).get("unwatched_changes") for p in figures["phases"].values()]
        total = None if any(n is None for n in found) else sum(found)
        note = "diskless_unwatched_changes_total: changes caught by the once-a-second comparison (a bug)"
        ok = None if total is None else total == 0
        rows.append(_row(f"{kind} partition changes found without their watch", "all", total, 0, "", ok, note))
    for node, broker in sorted(result["brokers"].items()):
        peak = broker["peak_rss_mb"]
        note = f"{partitions} partitions per topic (the issue's limit is at 1,000)"
        rows.append(_row(f"broker {node} peak RSS", "run", peak, RSS_LIMIT_MB, "MB", peak <= RSS_LIMIT_MB, note))
    lagging = diskless["phases"].get("lagging") if diskless is not None else None
    if lagging is None or diskless is None:
        rows.append(_row("lagging reader raises tail e2e p99 <= 20%", "lagging", None, 0.2, "", None, "not run"))
    else:
        # Over the lagging slices against the control slices between them (options.py); results
        # from before the slices: the one control phase before the reader, or else the low phase.
        pooled = diskless.get("lagging_pooled")
        if pooled:
            reference, with_reader, without = "the control slices", pooled["lagging"], pooled["control"]
            before, during = without["end_to_end_p99_ms"], with_reader["end_to_end_p99_ms"]
            where = f" over {len(with_reader['phases'])} lagging slice(s)"
        else:
            phase = "control" if "control" in diskless["phases"] else "low"
            reference, with_reader, without = phase, lagging, diskless["phases"][phase]
            before, during = without["end_to_end_latency_ms"]["p99"], lagging["end_to_end_latency_ms"]["p99"]
            where = ""
        low = diskless["phases"]["low"]["end_to_end_latency_ms"]["p99"]
        rise = None if not before or during is None else during / before - 1
        options = result["options"]
        read = diskless["lagging_reader_records"]
        mb_s = read * options["record_size"] / options["duration"] / 1e6
        quota = options.get("lagging_read_quota", 0)
        interval = pooled.get("rise_interval_90") if pooled else None
        note = (
            f"tail e2e p99 {during} ms{where} vs {before} ms in {reference}"
            + (f" ({low} ms in low)" if reference != "low" else "")
            + (
                f"; the rise's 90% interval {interval[0]:.2f} to {interval[1]:.2f} (1 s blocks resampled)"
                if interval
                else ""
            )
            + f"; the reader got {read} records ({mb_s:.1f} MB/s),"
            + (f" quota {quota / 2**20:g} MiB/s per broker" if quota else " no quota")
            + _object_reads_note(with_reader, without, reference)
            + _by_az_note(with_reader, without, reference, diskless.get("lagging_reader_az"))
        )
        ok = None if rise is None else rise <= 0.2
        rows.append(_row("lagging reader raises tail e2e p99 <= 20%", "lagging", rise, 0.2, "ratio", ok, note))
    return rows


def _cpu_wait_note(figures: dict[str, Any]) -> str:
    """What the machine did to the phase's latencies: how long each broker's event loop waited for a
    CPU while it had work (the raw baseline ran on an idle machine); empty without the figures."""
    timings = figures.get("broker_timings", {})
    wait, run = timings.get("loop_wait_ms_per_s"), timings.get("loop_cpu_ms_per_s")
    if wait is None or run is None:
        return ""
    per_wakeup, busy = timings.get("loop_wait_per_wakeup_ms"), figures.get("machine_cpu_busy")
    return (
        f"; each broker's loop ran {run:.0f} and waited {wait:.0f} ms/s for a CPU"
        + (f" ({per_wakeup:.2f} ms per wake-up)" if per_wakeup is not None else "")
        + (f", machine busy {busy:.2f}" if busy is not None else "")
        + (f", machine speed {speed:g} ms" if (speed := figures.get("machine_speed_ms")) is not None else "")
    )


def _object_reads_note(during: dict[str, Any], before: dict[str, Any], reference: str) -> str:
    """What the brokers read from object storage with the reader and without: its GETs and bytes
    are the S3 server's extra work (results without GET bytes: none)."""
    if during.get("s3_get_bytes") is None or before.get("s3_get_bytes") is None:
        return ""
    return (
        f"; S3 GETs {during['s3_gets']} ({during['s3_get_bytes'] / 1e6:.1f} MB)"
        f" against {before['s3_gets']} ({before['s3_get_bytes'] / 1e6:.1f} MB) in {reference}"
    )


def _by_az_note(during: dict[str, Any], before: dict[str, Any], reference: str, reader_az: str | None) -> str:
    """The tail consumers' e2e p99 per AZ, with the reader and without: an effect confined to the
    reader's AZ (its broker) shows here, not in the pooled p99 (results before the split: none)."""
    lagging, control = during.get("end_to_end_p99_ms_by_az"), before.get("end_to_end_p99_ms_by_az")
    if not lagging or not control:
        return ""
    per_az = ", ".join(f"{az} {_fmt(p99, 0)} ({_fmt(control.get(az), 0)})" for az, p99 in lagging.items())
    where = f", the reader in {reader_az}" if reader_az else ""
    return f"; tail e2e p99 by consumer AZ, ms ({reference} in brackets): {per_az}{where}"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def cross_az_breakdown(result: dict[str, Any], top: int = 8) -> list[str]:
    """Per kind: what crosses AZs, by API and sender (bytes per second of each phase), the busiest first."""
    lines: list[str] = []
    for kind, data in result["kinds"].items():
        phases = {name: f["cross_az"] for name, f in data["phases"].items() if f["cross_az"].get("by_api")}
        if not phases:
            continue
        totals: dict[str, float] = {}
        for cross in phases.values():
            for api, row in cross["by_api"].items():
                totals[api] = totals.get(api, 0.0) + row["cross"] / max(cross["seconds"], 1e-9)
        busiest = [api for api, rate in sorted(totals.items(), key=lambda kv: -kv[1]) if rate > 0][:top]
        lines += [
            "",
            f"## Bytes crossing AZs, {kind} (B/s by API and sender; socket addresses decide what crosses)",
            "",
            "coordinator = group APIs (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, OffsetCommit/Fetch...):"
            " a group has one coordinator, in one AZ, as in Kafka.",
            "",
            "| phase | payload B/s | crossing B/s | cross/payload | without coordinator | crossing B/batch | "
            + " | ".join(busiest)
            + " |",
            "|---|---|---|---|---|---|" + "---|" * len(busiest),
        ]
        for name, cross in phases.items():
            seconds = max(cross["seconds"], 1e-9)
            payload = cross.get("payload_bytes") or 0
            rest = cross["cross_az_bytes"] - cross.get("coordinator_cross_az_bytes", 0.0)
            cells = [_fmt(cross["by_api"].get(api, {}).get("cross", 0.0) / seconds, 0) for api in busiest]
            batches = cross.get("batches") or 0
            per_batch = cross["cross_az_bytes"] / batches if batches else None
            lines.append(
                f"| {name} | {_fmt(payload / seconds, 0)} | {_fmt(cross['cross_az_bytes'] / seconds, 0)}"
                f" | {_fmt(cross['per_payload_byte'], 4)} | {_fmt(rest / payload if payload else None, 4)}"
                f" | {_fmt(per_batch, 0)}"
                f" | {' | '.join(cells)} |"
            )
    return lines


def _client_settings(config: dict[str, str]) -> str:
    idempotence = {} if "enable.idempotence" in config else {"enable.idempotence": "false (librdkafka's default)"}
    return "".join(f", {name}={value}" for name, value in sorted({**config, **idempotence}.items()))


def _slow_s3(options: dict[str, Any]) -> str:
    slow = options.get("s3_slow")
    if not slow:
        return ""
    return f" through the chaos proxy, {slow[0]:g} of requests held {slow[1] * 1000:g} ms (--s3-slow)"


def _machine_speed(result: dict[str, Any]) -> str:
    speed = result.get("machine_speed")
    if not speed:
        return ""
    return (
        f" Machine speed: {speed['python_ms']:g} ms of CPU for the fixed Python workload of"
        " `diskless/bench/machine_speed.py` before the run (lower is faster; it moves within minutes,"
        " so each phase's target notes give the phase's own median)."
    )


def markdown(result: dict[str, Any]) -> str:
    o = result["options"]
    lines = [
        f"# diskless bench, {result['started_at']}",
        "",
        f"{o['brokers']} brokers in {o['azs']} AZs, S3: {result['cluster']['s3_kind']}{_slow_s3(o)};"
        f" {o['partitions']} partitions,"
        f" replication {o['replication']}, {o['record_size']} B records, acks=all, producer linger.ms"
        f" {o['producer_linger_ms']}{_client_settings(o.get('producer_config') or {})},"
        f" diskless.wal.linger.ms {o['linger_ms']};"
        f" {o.get('producers_per_az', 1)} producer(s) and one consumer per AZ;"
        f" fixed rate {o['rate']} records/s per AZ{' (quick mode)' if o['quick'] else ''}."
        f" {result['cpus']} CPUs, load average {result['load_average']['at_start'][0]:g} at the start"
        f" and {result['load_average']['at_end'][0]:g} at the end (1 minute).{_machine_speed(result)}",
        "",
        "## Targets",
        "",
        "| target | phase | measured | limit | result | note |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["targets"]:
        unit = f" {row['unit']}" if row["unit"] else ""
        measured = "-" if row["measured"] is None else f"{_fmt(row['measured'], 3)}{unit}"
        limit = "-" if row["limit"] is None else f"{_fmt(row['limit'], 3)}{unit}"
        lines.append(
            f"| {row['target']} | {row['phase']} | {measured} | {limit} | **{row['result']}** | {row['note']} |"
        )
    lines += [
        "",
        "## Figures per phase",
        "",
        "| kind | phase | rec/s | MB/s | produce p50 / p99 / p99.9 ms | e2e p50 / p99 ms | seen | broker CPU s/GB"
        " | S3 server CPU s/GB | machine busy | PUTs/MB | GETs/MB | PUTs/broker/s | cross-AZ/payload"
        " | WAL objects (n, p50 KiB) | flush / commit mean ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, data in result["kinds"].items():
        for phase, f in data["phases"].items():
            p, e, w = f["produce_latency_ms"], f["end_to_end_latency_ms"], f["wal_objects"]
            wal = (
                f"{w['objects']}, {_fmt(None if w.get('p50') is None else w['p50'] / 1024, 0)}" if w["objects"] else "0"
            )
            lines.append(
                f"| {kind} | {phase} | {_fmt(f['records_per_s'], 0)} | {_fmt(f['mb_per_s'], 2)}"
                f" | {_fmt(p['p50'])} / {_fmt(p['p99'])} / {_fmt(p['p99.9'])} | {_fmt(e['p50'])} / {_fmt(e['p99'])}"
                f" | {_fmt(f['consumed_fraction'], 3)} | {_fmt(f['broker_cpu_s_per_gb'], 0)}"
                f" | {_fmt(f.get('s3_server_cpu_s_per_gb'), 0)} | {_fmt(f.get('machine_cpu_busy'), 2)}"
                f" | {_fmt(f['s3_puts_per_mb'], 2)} | {_fmt(f['s3_gets_per_mb'], 2)}"
                f" | {_fmt(f['s3_puts_per_broker_per_s_max'], 1)}"
                f" | {_fmt(f['cross_az']['per_payload_byte'], 4)} | {wal}"
                f" | {_fmt(f['broker_timings']['flush_mean_ms'])} / {_fmt(f['broker_timings']['commit_mean_ms'])} |"
            )
    lines += cross_az_breakdown(result)
    diskless_phases = result["kinds"].get("diskless", {}).get("phases", {})
    first = next(iter(diskless_phases.values()), {})
    names = [
        k.removeprefix("stage_").removesuffix("_mean_ms")
        for k in first.get("broker_timings", {})
        if k.startswith("stage_") and k.endswith("_mean_ms")
    ]
    if names:
        lines += [
            "",
            "## Diskless produce stages (ms per batch, mean / p99, representatives' view),"
            " S3 PUT, event-loop lag (mean / p99) and garbage collection",
            "",
            "upload = WAL object encoding + PUT as the representative waits for it; PUT in client = the same"
            " PUT timed inside the object-store client (signing, HTTP); hedged = PUTs and tail GETs that got"
            " a second, identical request (won: answered first); loop lag = how late a timer fires;"
            " loop on CPU / waiting = ms per second a broker's event loop ran, and was ready to run but"
            " waited for a CPU (the kernel's schedstat, mean over brokers), and its mean wait per wake-up"
            " (each hop between processes waits about that long); S3 = the S3 server's threads' waits"
            " added up;"
            " GC = the cyclic garbage collector's pauses in ms per broker per second, and its full"
            " collections (count, mean pause)."
            " p99 from the brokers' histogram buckets (linear within a bucket).",
            "",
            "| phase | "
            + " | ".join(names)
            + " | PUT in client | hedged (won): PUTs, GETs | loop lag"
            + " | loop on CPU / waiting ms/s (per wake-up ms); S3 waiting ms/s | GC ms/s; full (n, mean ms) |",
            "|---|" + "---|" * (len(names) + 5),
        ]
        for phase, f in diskless_phases.items():
            t = f["broker_timings"]
            cells = " | ".join(
                f"{_fmt(t.get(f'stage_{n}_mean_ms'))} / {_fmt(t.get(f'stage_{n}_p99_ms'))}"
                if t.get(f"stage_{n}_p99_ms") is not None
                else _fmt(t.get(f"stage_{n}_mean_ms"))
                for n in names
            )
            put = f"{_fmt(t.get('s3_put_client_mean_ms'))} / {_fmt(t.get('s3_put_client_p99_ms'))}"
            lag = f"{_fmt(t.get('loop_lag_mean_ms'))} / {_fmt(t.get('loop_lag_p99_ms'))}"
            hedged = (
                f"{_fmt(t.get('s3_put_hedges'))} ({_fmt(t.get('s3_put_hedge_wins'))}),"
                f" {_fmt(t.get('s3_get_hedges'))} ({_fmt(t.get('s3_get_hedge_wins'))})"
            )
            gc = (
                f"{_fmt(t.get('gc_pause_ms_per_s'))}; {_fmt(t.get('gc_full_collections'))},"
                f" {_fmt(t.get('gc_full_mean_ms'))}"
            )
            waits = (
                f"{_fmt(t.get('loop_cpu_ms_per_s'))} / {_fmt(t.get('loop_wait_ms_per_s'))}"
                f" ({_fmt(t.get('loop_wait_per_wakeup_ms'), 2)}); {_fmt(f.get('s3_server_wait_ms_per_s'))}"
            )
            lines.append(f"| {phase} | {cells} | {put} | {hedged} | {lag} | {waits} | {gc} |")
    lines += producer_client_view(result)
    lines += requests_by_api(result)
    lines += [
        "",
        "## Raw S3 baseline (same server, the brokers' ObjectStore client)",
        "",
        "| size | PUT p50 / p99 ms | GET p50 / p99 ms | PUT MB/s | GET MB/s | in flight |",
        "|---|---|---|---|---|---|",
    ]
    for b in result["s3_baseline"]:
        lines.append(
            f"| {b['size_bytes'] // 1024} KiB | {_fmt(b['put_latency_ms']['p50'])} / {_fmt(b['put_latency_ms']['p99'])}"
            f" | {_fmt(b['get_latency_ms']['p50'])} / {_fmt(b['get_latency_ms']['p99'])} | {_fmt(b['put_mb_per_s'])}"
            f" | {_fmt(b['get_mb_per_s'])} | {b['concurrency']} |"
        )
    lines += ["", "## Brokers", "", "| broker | AZ | peak RSS MB | CPU s in run |", "|---|---|---|---|"]
    for node, b in sorted(result["brokers"].items()):
        lines.append(f"| {node} | {b['az']} | {_fmt(b['peak_rss_mb'])} | {_fmt(b['cpu_s'])} |")
    for kind, data in result["kinds"].items():
        profile = data.get("profile")
        if not profile:
            continue
        busy = profile["samples"] - profile["idle_samples"]
        lines += [
            "",
            f"## Broker hot spots, {kind} phases (py-spy, all brokers; {busy} busy of {profile['samples']} samples)",
            "",
            f"{profile['event_loop_busy_samples']} of the busy samples are on the event loop's thread. Shares are"
            " of busy samples; inclusive lists the project's (and kio's) own functions.",
            "",
            "| self % | function | | inclusive % | function |",
            "|---|---|---|---|---|",
        ]
        for own, incl in zip(profile["self"], profile["inclusive"], strict=False):
            lines.append(
                f"| {own['share_of_busy'] * 100:.1f} | `{own['function']}` | | {incl['share_of_busy'] * 100:.1f}"
                f" | `{incl['function']}` |"
            )
    lines += ["", "Plots: `latency_cdf.png`, `throughput.png`. Raw samples: `raw/`.", ""]
    return "\n".join(lines)


def plots(result: dict[str, Any], samples: dict[str, dict[str, Any]], out: Path) -> list[str]:
    """Latency CDFs (produce, end-to-end) per kind and phase; acknowledged MB/s and broker RSS over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    written = []
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for axis, key, title in (
        (axes[0], "produce", "produce latency (acks=all)"),
        (axes[1], "e2e", "end-to-end latency"),
    ):
        for kind, by_phase in samples.items():
            for phase, values in by_phase.items():
                data = np.sort(values[key])
                if data.size == 0:
                    continue
                axis.plot(data, np.arange(1, data.size + 1) / data.size, label=f"{kind} {phase}")
        axis.set_xscale("log")
        axis.set_xlabel("ms")
        axis.set_ylabel("fraction of records")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=110)
    plt.close(fig)
    written.append("latency_cdf.png")

    fig, axes = plt.subplots(2, 1, figsize=(13, 7), sharex=True)
    origin = result["run_started_at"]
    for kind, data in result["kinds"].items():
        series = data["throughput_series"]
        t0 = data["started_at"] - origin
        axes[0].plot([t0 + t for t in series["t"]], series["mb_per_s"], label=kind)
        for phase, f in data["phases"].items():
            start = f["window_start"] - origin
            axes[0].axvspan(start, start + f["window_s"], alpha=0.08, color="grey")
            axes[0].text(start, 0, phase, fontsize=7, rotation=90, va="bottom")
    axes[0].set_ylabel("acknowledged MB/s")
    axes[0].legend()
    axes[0].grid(True, alpha=0.3)
    for node, series in result["broker_series"].items():
        axes[1].plot([t - origin for t in series["t"]], series["rss_mb"], label=f"broker {node}")
    axes[1].set_ylabel("RSS MB")
    axes[1].set_xlabel("seconds since the load started")
    axes[1].legend()
    axes[1].grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    written.append("throughput.png")
    return written


def write_outputs(
    result: dict[str, Any], samples: dict[str, dict[str, Any]], out: Path, with_plots: bool
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "result.md").write_text(markdown(result))
    paths = [out / "result.json", out / "result.md"]
    if with_plots:
        paths += [out / name for name in plots(result, samples, out)]
    return paths


def _phase_rows(result: dict[str, Any], key: str) -> list[tuple[str, str, Any]]:
    """(kind, phase, figure) for every phase that has the figure ``key``."""
    return [
        (kind, phase, f[key])
        for kind, figures in result["kinds"].items()
        for phase, f in figures.get("phases", {}).items()
        if f.get(key)
    ]


def requests_by_api(result: dict[str, Any], top: int = 8) -> list[str]:
    """Requests per broker per second by API, per kind and phase (the most frequent ``top``)."""
    rows = _phase_rows(result, "requests_per_broker_per_s")
    if not rows:
        return []
    lines = [
        "",
        "## Requests per broker per second, by API (mean over brokers, the most frequent)",
        "",
        "| kind | phase | requests |",
        "|---|---|---|",
    ]
    for kind, phase, rates in rows:
        shown = ", ".join(f"{name} {rate:g}" for name, rate in list(rates.items())[:top])
        lines.append(f"| {kind} | {phase} | {shown} |")
    return lines


def producer_client_view(result: dict[str, Any]) -> list[str]:
    """The producers' librdkafka statistics per kind and phase (``stats.client_view``)."""
    rows = _phase_rows(result, "producer_client")
    if not rows:
        return []
    lines = [
        "",
        "## Producers' view (librdkafka statistics, weighted by requests)",
        "",
        "queue = how long records waited in the producer before their request was sent (its linger.ms, and"
        " waits for a free in-flight slot: an idempotent producer has at most 5 requests awaiting answers"
        " per broker, and librdkafka puts one partition in each request); round trip = request sent to"
        " answer read; in flight = requests awaiting answers.",
        "",
        "| kind | phase | queue avg / p99 ms | round trip avg / p99 ms | in flight |",
        "|---|---|---|---|---|",
    ]
    for kind, phase, c in rows:
        lines.append(
            f"| {kind} | {phase} | {_fmt(c['queue_avg_ms'])} / {_fmt(c['queue_p99_ms'])}"
            f" | {_fmt(c['rtt_avg_ms'])} / {_fmt(c['rtt_p99_ms'])} | {_fmt(c['in_flight'])} |"
        )
    return lines

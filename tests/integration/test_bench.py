"""``diskless bench --quick``: one whole run with tiny numbers writes every figure issue 10 asks for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PHASES = ("low", "max", "after-burst", "80pct")  # and "control", "lagging" for diskless


def test_bench_quick_writes_every_figure(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "diskless", "bench", "--quick", "--partitions", "2", "--rate", "20"]
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    result = json.loads((run / "result.json").read_text())
    # The cluster's data (GBs in a full run) goes once measured; the processes' logs stay.
    assert not [p.name for p in (run / "cluster").iterdir() if p.is_dir() and p.name != "tls"]
    assert {"broker-1.log", "s3.log", "etcd.log"} <= {p.name for p in (run / "cluster").glob("*.log")}

    for size in result["s3_baseline"]:
        for key in ("put_latency_ms", "get_latency_ms"):
            assert size[key]["p50"] > 0 and size[key]["p99"] >= size[key]["p50"]
        assert size["put_mb_per_s"] > 0 and size["get_mb_per_s"] > 0
    assert set(result["kinds"]) == {"diskless", "classic"}
    for kind, data in result["kinds"].items():
        assert data["failed_records"] == 0, kind
        slices = ["control", "lagging", "lagging-2", "control-2"]  # --quick: 2 pairs, ABBA
        expected = [*PHASES, *slices] if kind == "diskless" else list(PHASES)
        assert list(data["phases"]) == expected, kind
        assert data["max_mb_per_s"] > 0 and data["cross_az_per_payload_byte"] is not None
        assert data["throughput_series"]["mb_per_s"], kind
        # librdkafka's statistics reach the report: where a record waited, client side.
        views = [f["producer_client"] for f in data["phases"].values() if f["producer_client"]]
        assert views and all(v["rtt_avg_ms"] > 0 and v["queue_avg_ms"] >= 0 for v in views), kind
        for phase, f in data["phases"].items():
            where = f"{kind} {phase}"
            assert f["records_per_s"] > 0 and f["mb_per_s"] > 0, where
            assert all(f["produce_latency_ms"][q] is not None for q in ("p50", "p99", "p99.9")), where
            assert all(f["end_to_end_latency_ms"][q] is not None for q in ("p50", "p99")), where
            assert f["consumed_fraction"] is not None and f["consumed_fraction"] > 0.9, where
            # Per tail consumer's AZ too: an effect confined to one AZ's broker hides in the pooled p99.
            by_az = f["end_to_end_p99_ms_by_az"]
            assert set(by_az) == {"az-1", "az-2", "az-3"} and all(v is not None and v > 0 for v in by_az.values())
            assert f["broker_cpu_s_per_gb"] is not None and f["broker_cpu_s_per_gb"] > 0, where
            assert f["s3_puts_per_mb"] is not None and f["s3_gets_per_mb"] is not None, where
            assert f["cross_az"]["per_payload_byte"] is not None, where
            assert set(f["s3_puts_per_broker_per_s"]) == {"1", "2", "3"}, where
            assert (
                f["requests_per_broker_per_s"]["Produce"] > 0 and "Fetch (consumers)" in f["requests_per_broker_per_s"]
            )
        if kind == "diskless":
            assert all(f["s3_puts_per_mb"] > 0 and f["wal_objects"]["objects"] > 0 for f in data["phases"].values())
            assert all(f["broker_timings"]["flush_mean_ms"] > 0 for f in data["phases"].values())
            if Path("/proc/self/schedstat").exists():  # the brokers' loops ran, and any wait for a CPU is known
                timings = [f["broker_timings"] for f in data["phases"].values()]
                assert all(t["loop_cpu_ms_per_s"] > 0 and t["loop_wait_ms_per_s"] >= 0 for t in timings)
                assert all(t["loop_wait_per_wakeup_ms"] >= 0 for t in timings)
                assert all(f["s3_server_wait_ms_per_s"] is not None for f in data["phases"].values())
            assert data["lagging_reader_records"] > 0
        else:
            assert all(f["wal_objects"]["objects"] == 0 for f in data["phases"].values())
    assert result["wal_objects"]["objects"] > 0 and result["wal_objects"]["p50"] > 0
    assert {b["az"] for b in result["brokers"].values()} == {"az-1", "az-2", "az-3"}
    assert all(b["peak_rss_mb"] > 0 and b["cpu_s"] > 0 for b in result["brokers"].values())

    targets = {(row["target"], row["phase"]): row for row in result["targets"]}
    for phase in ("low", "80pct", "after-burst"):
        row = targets[("diskless produce p99", phase)]
        assert row["result"] in ("pass", "fail") and row["limit"] > result["options"]["linger_ms"]
        if Path("/proc/self/schedstat").exists():
            assert "ms/s for a CPU" in row["note"], row["note"]
        speed = result["kinds"]["diskless"]["phases"][phase]["machine_speed_ms"]  # probed every second
        assert speed > 0 and f"machine speed {speed:g} ms" in row["note"], row["note"]
    assert targets[("diskless max throughput >= classic", "max")]["result"] in ("pass", "fail")
    assert targets[("diskless bytes crossing AZs / payload", "all")]["result"] in ("pass", "fail")
    for kind in ("diskless", "classic"):  # the brokers' partition watches missed nothing under load
        assert targets[(f"{kind} partition changes found without their watch", "all")]["result"] == "pass"
    lagging = targets[("lagging reader raises tail e2e p99 <= 20%", "lagging")]
    assert lagging["result"] in ("pass", "fail")
    # Over the lagging slices against the control slices between them, the low phase also named.
    pooled = result["kinds"]["diskless"]["lagging_pooled"]
    assert [pooled[name]["phases"] for name in ("control", "lagging")] == [slices[0::3], slices[1:3]]
    control = pooled["control"]["end_to_end_p99_ms"]
    assert f"over 2 lagging slice(s) vs {control} ms in the control slices" in lagging["note"]
    assert "in low" in lagging["note"] and "S3 GETs" in lagging["note"]
    assert all(pooled[name]["end_to_end_p99_ms"] > 0 for name in ("control", "lagging"))
    low, high = pooled["rise_interval_90"]
    assert low <= high and "the rise's 90% interval" in lagging["note"]
    assert "by consumer AZ" in lagging["note"] and "the reader in az-1" in lagging["note"]
    table = (run / "result.md").read_text()
    assert result["machine_speed"]["python_ms"] > 0  # measured before the cluster started
    assert f"Machine speed: {result['machine_speed']['python_ms']:g} ms of CPU" in table
    assert "| target | phase | measured | limit | result | note |" in table
    assert "## Requests per broker per second, by API" in table
    assert "loop on CPU / waiting ms/s (per wake-up ms); S3 waiting ms/s" in table
    assert table.count("**pass**") + table.count("**fail**") >= len(PHASES) + 6
    for plot in ("latency_cdf.png", "throughput.png"):
        assert (run / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

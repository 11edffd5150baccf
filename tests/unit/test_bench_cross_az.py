"""What the bench says crosses AZs (bench/collect.py): bytes by socket address, split by API and sender."""

from __future__ import annotations

from diskless.bench.collect import API_BYTES, NETWORK_BYTES, WindowDelta, cross_az_bytes
from diskless.bench.report import cross_az_breakdown

AZS = ["az-1", "az-2", "az-3"]


def sample(name: str, **labels: str) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def api(direction: str, key: str, peer: str, local: int, remote: int) -> str:
    return sample(
        API_BYTES,
        direction=direction,
        api=key,
        peer=peer,
        local_network=f"127.0.{local}.0/24",
        peer_network=f"127.0.{remote}.0/24",
    )


def net(direction: str, local: int, remote: int) -> str:
    return sample(
        NETWORK_BYTES, direction=direction, local_network=f"127.0.{local}.0/24", peer_network=f"127.0.{remote}.0/24"
    )


def test_crossing_bytes_are_split_by_api_sender_and_direction() -> None:
    broker1 = {
        net("in", 1, 2): 300.0,
        net("out", 1, 2): 700.0,
        net("in", 1, 1): 5000.0,
        api("in", "1", "broker", 1, 2): 100.0,  # replica fetch requests from az-2
        api("out", "1", "broker", 1, 2): 600.0,  # their answers
        api("in", "32001", "broker", 1, 2): 150.0,  # CommitBatches
        api("out", "32001", "broker", 1, 2): 50.0,
        api("in", "12", "client", 1, 2): 50.0,  # a consumer's heartbeats to its coordinator
        api("out", "12", "client", 1, 2): 50.0,
        api("in", "0", "client", 1, 1): 5000.0,  # produce within the AZ
    }
    delta = WindowDelta(seconds=2.0, cpu_s={1: 0.0}, metrics={1: broker1})
    cross = cross_az_bytes(delta, AZS)
    assert cross["cross_az_bytes"] == 1000.0 and cross["same_az_bytes"] == 5000.0
    by_api = cross["by_api"]
    assert list(by_api)[:3] == ["Fetch (broker)", "CommitBatches (broker)", "Heartbeat (client)"]
    assert by_api["Fetch (broker)"]["cross"] == 700.0 and by_api["Fetch (broker)"]["cross_requests"] == 100.0
    assert by_api["Produce (client)"] == {"cross": 0.0, "same": 5000.0, "unattributed": 0.0, "cross_requests": 0.0}
    assert cross["coordinator_cross_az_bytes"] == 100.0
    assert sum(row["cross"] for row in by_api.values()) == cross["cross_az_bytes"]


def test_report_shows_the_breakdown_per_phase() -> None:
    delta = WindowDelta(
        seconds=2.0, cpu_s={1: 0.0}, metrics={1: {net("out", 1, 2): 600.0, api("out", "1", "broker", 1, 2): 600.0}}
    )
    cross = cross_az_bytes(delta, AZS)
    cross.update(payload_bytes=60000, per_payload_byte=0.01, batches=10)
    result = {"kinds": {"diskless": {"phases": {"low": {"cross_az": cross}}}}}
    table = "\n".join(cross_az_breakdown(result))
    header = "| phase | payload B/s | crossing B/s | cross/payload | without coordinator | crossing B/batch |"
    assert header + " Fetch (broker) |" in table
    assert "| low | 30000 | 300 | 0.0100 | 0.0100 | 60 | 300 |" in table


def test_the_target_is_checked_per_phase_too_not_only_over_the_whole_run() -> None:
    """A run whose high-rate phase carries most of the payload passes the 1% over the whole run
    while its low-rate phase, where every small batch pays its commit and its followers' copy,
    does not: the report must show both."""
    from diskless.bench.report import evaluate_targets

    def phase(ratio: float, payload: int, batches: int) -> dict[str, object]:
        return {
            "wal_objects": {"p50": 32768},
            "produce_latency_ms": {"p99": 100.0},
            "end_to_end_latency_ms": {"p99": 110.0},
            "mb_per_s": payload / 1e6,
            "s3_puts_per_broker_per_s_max": 9.0,
            "cross_az": {
                "per_payload_byte": ratio,
                "cross_az_bytes": ratio * payload,
                "payload_bytes": payload,
                "batches": batches,
            },
        }

    baseline = [{"size_bytes": 65536, "put_latency_ms": {"p99": 3.0}, "put_mb_per_s": 80.0}]
    result = {
        "options": {"linger_ms": 100, "partitions": 12},
        "s3_baseline": baseline,
        "brokers": {},
        "kinds": {
            "diskless": {
                "phases": {"low": phase(0.15, 1_000_000, 500), "max": phase(0.001, 50_000_000, 2_000)},
                "cross_az_per_payload_byte": 0.004,
                "cross_az_counted_by": "address",
            }
        },
    }
    rows = {(r["target"], r["phase"]): r for r in evaluate_targets(result)}
    target = "diskless bytes crossing AZs / payload"
    assert rows[(target, "all")]["result"] == "pass"
    assert rows[(target, "max")]["result"] == "pass"
    low = rows[(target, "low")]
    assert low["result"] == "fail" and low["note"] == "300 B crossing per batch of 2000 B payload"

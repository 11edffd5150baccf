"""``diskless bench`` load options: ``--producers-per-az`` splits each AZ's fixed rate among that
many producer processes (an idempotent producer has at most 5 requests in flight per broker, so
one producer cannot show diskless's maximum throughput); the default keeps one producer per AZ."""

from __future__ import annotations

import argparse

import pytest

from diskless.bench.options import BenchOptions, add_arguments, options_from


def _parse(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return options_from(parser.parse_args(list(argv)))


def test_the_rate_is_per_az_and_split_among_its_producers() -> None:
    options = _parse("--rate", "300", "--producers-per-az", "4")
    assert options.producers_per_az == 4 and options.producer_rate == 75
    assert {p["name"]: p["rate"] for p in options.first_phases()} == {"low": 75, "max": None, "after-burst": 75}
    default = _parse("--rate", "300")
    assert default.producers_per_az == 1 and default.producer_rate == 300
    assert _parse("--rate", "2", "--producers-per-az", "8").producer_rate == 1  # never below 1 record/s


def test_producers_per_az_must_be_positive() -> None:
    with pytest.raises(ValueError, match="producers-per-az"):
        _parse("--producers-per-az", "0").validate()


def test_the_lagging_read_quota_reaches_the_brokers_unless_overridden_or_off() -> None:
    name = "diskless.fetch.lagging.max.bytes.per.second"
    assert _parse().broker_settings()[name] == str(8 << 20)
    assert _parse("--lagging-quota", "1000").broker_settings()[name] == "1000"
    assert name not in _parse("--lagging-quota", "0").broker_settings()
    assert _parse("--broker-override", f"{name}=5").broker_settings()[name] == "5"
    with pytest.raises(ValueError, match="lagging-quota"):
        _parse("--lagging-quota", "-1").validate()


def test_producer_settings_are_passed_through_by_name() -> None:
    options = _parse("--producer-config", "enable.idempotence=true", "--producer-config", "batch.size=65536")
    assert options.producer_config == {"enable.idempotence": "true", "batch.size": "65536"}
    with pytest.raises(SystemExit):
        _parse("--producer-config", "no-equals-sign")


def test_s3_slow_puts_a_tail_on_the_store_only_when_asked() -> None:
    assert _parse().s3_slow is None and _parse().as_dict()["s3_slow"] is None
    options = _parse("--s3-slow", "0.02:0.2")
    options.validate()
    assert options.s3_slow == (0.02, 0.2) and options.as_dict()["s3_slow"] == [0.02, 0.2]
    with pytest.raises(ValueError, match="s3-slow"):
        _parse("--s3-slow", "often")
    with pytest.raises(ValueError, match="s3-slow"):
        _parse("--s3-slow", "1.5:0.2").validate()


def test_control_and_lagging_run_in_abba_slices_that_add_up_to_their_durations() -> None:
    from diskless.bench.options import phase_of

    options = BenchOptions(duration=20.0, lagging_slices=2)
    phases = options.lagging_phases()
    assert [p["name"] for p in phases] == ["control", "lagging", "lagging-2", "control-2"]  # ABBA
    assert sum(p["duration"] for p in phases if phase_of(p["name"]) == "lagging") == 20.0
    starts = {"control": [], "lagging": []}
    at = 0.0
    for p in phases:
        starts[phase_of(p["name"])].append(at)
        at += p["duration"]
    assert sum(starts["control"]) == sum(starts["lagging"])  # a linear drift cancels
    assert phase_of("after-burst") == "after-burst" and phase_of("low") == "low"
    with pytest.raises(ValueError, match="lagging-slices"):
        BenchOptions(lagging_slices=0).validate()

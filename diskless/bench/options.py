"""What a benchmark run does: its options (the CLI's flags) and the phases each topic kind goes through.

Each topic kind runs the same sequence, so the figures of the two kinds compare within one run:

- ``low``: every producer at a fixed ``rate`` records/s for ``duration`` seconds;
- ``max``: every producer as fast as the cluster takes records, for ``burst`` seconds;
- ``after-burst``: the fixed ``rate`` again, for ``after`` seconds, starting the instant the burst ends
  (issue 10: "within 10 s after a burst at maximum throughput ends");
- ``80pct``: 80 % of the throughput the ``max`` phase reached, for ``duration`` seconds;
- ``control`` and ``lagging`` (diskless only): the fixed ``rate`` again for ``duration`` seconds
  each, in ``lagging_slices`` pairs of slices in ABBA order (``control``, ``lagging``,
  ``lagging-2``, ``control-2``, ...). One more consumer reads the topic from its start
  (everything the phases before wrote), stopped by SIGSTOP but in the lagging slices. The tail
  consumers' end-to-end p99 over the lagging slices is compared with theirs over the control
  slices (issue 10: lagging reads must not evict the tail cache).

  Why slices: the machine's speed drifts by tens of percent within minutes (other tenants,
  thermal limits). One control phase and one lagging phase after it, each 20 s, measured the
  same code's rise at 0.16, 0.39 and 0.67 in three runs within an hour: the verdict was the
  drift's. Pooled over slices in ABBA order, drift falls on both sides alike, and a linear drift
  cancels. Against the ``low`` phase, at the run's start, the comparison also took in how the
  cluster changed since (data written, a burst behind it): one run's ``after-burst`` p99, with
  no reader, was 63% above its ``low`` p99.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("diskless", "classic")
PHASES = ("low", "max", "after-burst", "80pct", "control", "lagging")
FIXED_RATE_PHASES = ("low", "after-burst", "80pct")
KIB = 1024


@dataclass
class BenchOptions:
    partitions: int = 12
    record_size: int = 1024  # bytes of record value (the payload); the first 8 carry the send time
    rate: int = 300  # records/s per AZ in the fixed-rate phases, split among the AZ's producers
    # Producers per AZ. With enable.idempotence=true a producer has at most 5 requests in flight
    # per broker, so its maximum rate is about 5 requests / produce latency: diskless, with its
    # linger and PUT in every request's latency, then needs more producers than classic.
    producers_per_az: int = 1
    duration: float = 20.0  # seconds of each of the ``low`` and ``80pct`` phases
    burst: float = 15.0  # seconds at maximum rate
    after: float = 10.0  # seconds of the ``after-burst`` phase
    linger_ms: int = 100  # the brokers' diskless.wal.linger.ms
    producer_linger_ms: int = 5  # the producers' linger.ms
    # librdkafka's queue bound: at maximum rate latency is queueing, and a deep queue would make the
    # ``after-burst`` phase measure the producer's backlog instead of the cluster.
    producer_queue_kbytes: int = 4096
    kinds: tuple[str, ...] = KINDS
    brokers: int = 3
    azs: int = 3
    replication: int = 3
    s3_sizes: tuple[int, ...] = (64 * KIB, 512 * KIB, 2048 * KIB)
    s3_latency_samples: int = 40  # sequential PUTs (then GETs) per size
    s3_throughput_seconds: float = 3.0  # per size and direction, ``s3_concurrency`` requests in flight
    s3_concurrency: int = 8
    out_dir: str = "bench-results"
    quick: bool = False
    plots: bool = True
    # The cluster's data (every WAL object in the S3 server, the classic topics' logs on the brokers:
    # GBs per full run) is deleted once the run is measured; the processes' logs stay.
    keep_data: bool = False
    broker_overrides: dict[str, str] = field(default_factory=dict)
    # librdkafka settings of the producers on top of the bench's own (acks=all, linger.ms, queue
    # bounds; librdkafka's defaults otherwise, as in issue 10's setup, so no idempotence): e.g.
    # enable.idempotence=true, whose 5 requests in flight per broker, with librdkafka's one
    # partition per ProduceRequest, keep records waiting in the producer (report: "Producers' view").
    producer_config: dict[str, str] = field(default_factory=dict)
    lagging: bool = True  # the diskless kind's ``control`` and ``lagging`` phases
    lagging_slices: int = 2  # alternating control/lagging slice pairs they are run in
    # Each broker's diskless.fetch.lagging.max.bytes.per.second (0: no quota, Kafka's default). The
    # lagging reader catches up as fast as it is let; on a machine the whole cluster shares, an
    # unbounded reader takes the tail's CPU (issue 10: it may cost the tail at most +20% e2e p99).
    lagging_read_quota: int = 8 * 1024 * KIB
    profile: tuple[str, ...] = ()  # topic kinds during whose phases py-spy samples the brokers
    # (fraction, seconds): brokers and the raw baseline reach S3 through the chaos proxy, which holds
    # that fraction of requests that long, a tail like a remote store's (hedged PUTs are for it).
    s3_slow: tuple[float, float] | None = None

    @classmethod
    def quick_run(cls, **changes: Any) -> BenchOptions:
        """A smoke test: every phase and figure, tiny numbers (about 40 s on an idle 2-core machine)."""
        base = cls(
            partitions=3,
            rate=50,
            duration=2.0,
            burst=2.0,
            after=2.0,
            s3_sizes=(64 * KIB, 512 * KIB),
            s3_latency_samples=5,
            s3_throughput_seconds=0.5,
            quick=True,
        )
        for name, value in changes.items():
            setattr(base, name, value)
        return base

    def validate(self) -> None:
        if self.partitions < 1 or self.record_size < 16 or self.rate < 1:
            raise ValueError("--partitions >= 1, --record-size >= 16 and --rate >= 1 are required")
        if min(self.duration, self.burst, self.after) <= 0:
            raise ValueError("phase durations must be positive")
        unknown = set(self.kinds) - set(KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"--kinds takes {', '.join(KINDS)}; got {sorted(unknown) or 'nothing'}")
        if set(self.profile) - set(self.kinds):
            raise ValueError("--profile names a kind this run does not run")
        if self.linger_ms < 1:
            raise ValueError("--linger-ms must be >= 1")
        if self.producers_per_az < 1:
            raise ValueError("--producers-per-az must be >= 1")
        if self.lagging_slices < 1:
            raise ValueError("--lagging-slices must be >= 1")
        if self.lagging_read_quota < 0:
            raise ValueError("--lagging-quota must be >= 0")
        if self.s3_slow is not None and not (0.0 <= self.s3_slow[0] <= 1.0 and self.s3_slow[1] >= 0.0):
            raise ValueError("--s3-slow takes FRACTION:SECONDS, a fraction in [0, 1] and seconds >= 0")

    @property
    def producer_rate(self) -> int:
        """Records/s of each producer in the fixed-rate phases (the AZ's rate split among them)."""
        return max(1, round(self.rate / self.producers_per_az))

    def broker_settings(self) -> dict[str, str]:
        """The brokers' settings for the run: its own, then ``--broker-override``."""
        settings = {"diskless.wal.linger.ms": str(self.linger_ms)}
        if self.lagging_read_quota:
            settings["diskless.fetch.lagging.max.bytes.per.second"] = str(self.lagging_read_quota)
        return {**settings, **self.broker_overrides}

    def first_phases(self) -> list[dict[str, Any]]:
        """``low``, ``max``, ``after-burst``: one schedule the producers run back to back."""
        return [
            {"name": "low", "rate": self.producer_rate, "duration": self.duration},
            {"name": "max", "rate": None, "duration": self.burst},
            {"name": "after-burst", "rate": self.producer_rate, "duration": self.after},
        ]

    def lagging_phases(self) -> list[dict[str, Any]]:
        """``control`` and ``lagging`` in alternating slices, ``duration`` seconds each in all."""
        seconds = self.duration / self.lagging_slices
        return [
            {"name": name if n == 1 else f"{name}-{n}", "rate": self.producer_rate, "duration": seconds}
            for n in range(1, self.lagging_slices + 1)
            # ABBA: every other pair reversed, so a drift linear in time cancels out over two pairs.
            for name in (("control", "lagging") if n % 2 else ("lagging", "control"))
        ]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kinds"] = list(self.kinds)
        out["s3_sizes"] = list(self.s3_sizes)
        out["profile"] = list(self.profile)
        out["s3_slow"] = list(self.s3_slow) if self.s3_slow is not None else None
        return out


def phase_of(name: str) -> str:
    """The phase a window belongs to: ``lagging-2`` is the lagging phase's second slice."""
    base, _, number = name.rpartition("-")
    return base if base in PHASES and number.isdigit() else name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``diskless bench`` flags; defaults are a full run of about 4 minutes."""
    d = BenchOptions()
    parser.add_argument("--quick", action="store_true", help="smoke test: every figure, tiny numbers (~1 minute)")
    parser.add_argument("--partitions", type=int, help=f"partitions per topic (default {d.partitions})")
    parser.add_argument("--record-size", type=int, help=f"bytes per record value (default {d.record_size})")
    parser.add_argument("--rate", type=int, help=f"records/s per AZ in fixed-rate phases (default {d.rate})")
    parser.add_argument(
        "--producers-per-az",
        type=int,
        help=f"producer processes per AZ, sharing the AZ's rate (default {d.producers_per_az})",
    )
    parser.add_argument("--duration", type=float, help=f"seconds of the low and 80pct phases (default {d.duration:g})")
    parser.add_argument("--burst", type=float, help=f"seconds at maximum rate (default {d.burst:g})")
    parser.add_argument("--after", type=float, help=f"seconds of the after-burst phase (default {d.after:g})")
    parser.add_argument("--linger-ms", type=int, help=f"brokers' diskless.wal.linger.ms (default {d.linger_ms})")
    parser.add_argument("--producer-linger-ms", type=int, help=f"producers' linger.ms (default {d.producer_linger_ms})")
    parser.add_argument("--kinds", help=f"topic kinds to run, comma-separated, in order (default {','.join(d.kinds)})")
    parser.add_argument("--out", help=f"results directory; each run gets a subdirectory (default {d.out_dir})")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--no-lagging", action="store_true", help="skip the diskless lagging-reader phase")
    parser.add_argument(
        "--lagging-slices",
        type=int,
        help=f"alternating control/lagging slice pairs the reader's effect is measured in (default {d.lagging_slices})",
    )
    parser.add_argument(
        "--lagging-quota",
        type=int,
        dest="lagging_read_quota",
        help=f"brokers' diskless.fetch.lagging.max.bytes.per.second, 0 for none (default {d.lagging_read_quota})",
    )
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the cluster's data (S3 objects, broker logs) after the run"
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="diskless",
        help="py-spy the brokers while these kinds run (default diskless); hot spots in the report",
    )
    parser.add_argument(
        "--broker-override", action="append", default=[], metavar="NAME=VALUE", help="one more broker setting"
    )
    parser.add_argument(
        "--s3-slow",
        metavar="FRACTION:SECONDS",
        help="reach S3 through the chaos proxy, which holds that fraction of requests that long (a remote"
        " store's tail, e.g. 0.02:0.2)",
    )
    parser.add_argument(
        "--producer-config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one more librdkafka setting of the producers (e.g. enable.idempotence=true)",
    )


def options_from(args: argparse.Namespace) -> BenchOptions:
    options = BenchOptions.quick_run() if args.quick else BenchOptions()
    for flag in (
        "partitions",
        "record_size",
        "rate",
        "producers_per_az",
        "duration",
        "burst",
        "after",
        "linger_ms",
        "producer_linger_ms",
        "lagging_read_quota",
        "lagging_slices",
    ):
        value = getattr(args, flag)
        if value is not None:
            setattr(options, flag, value)
    if args.kinds:
        options.kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if args.out:
        options.out_dir = args.out
    options.plots = not args.no_plots
    options.lagging = not args.no_lagging
    options.keep_data = args.keep_data
    if args.profile:
        options.profile = tuple(k.strip() for k in args.profile.split(",") if k.strip())
    options.broker_overrides.update(_settings("--broker-override", args.broker_override))
    if args.s3_slow:
        fraction, _, seconds = args.s3_slow.partition(":")
        try:
            options.s3_slow = (float(fraction), float(seconds))
        except ValueError:
            raise ValueError(f"--s3-slow takes FRACTION:SECONDS, got {args.s3_slow!r}") from None
    options.producer_config.update(_settings("--producer-config", args.producer_config))
    return options


def _settings(flag: str, items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{flag} expects name=value, got {item!r}")
        out[name.strip()] = value.strip()
    return out

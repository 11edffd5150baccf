"""The ``diskless`` command line: ``diskless broker`` runs one broker, ``diskless dev`` a local cluster."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import structlog

from diskless.config import ConfigError, load_config
from diskless.logs import configure_logging

log = structlog.get_logger(__name__)

# A thread waiting for the GIL gets it only when the holder gives it up, at the latest after the
# switch interval (5 ms by default). The object store no longer runs in threads, but a few things
# still do and are on a deadline: the lease keeper's refreshes, SHA-256 of WAL objects over 256 KiB
# (hashlib gives the GIL back while it hashes, and needs it again to return), high-watermark
# checkpoint writes. 1 ms bounds how long a busy event loop makes them wait; it measured a boto3
# PUT behind a busy loop going from 50-60 to ~13 ms, when PUTs still ran in threads.
GIL_SWITCH_INTERVAL_S = 0.001


def _overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--override expects name=value, got {item!r}")
        out[name.strip()] = value.strip()
    return out


async def _run_broker(args: argparse.Namespace) -> int:
    from diskless.broker.broker import Broker
    from diskless.broker.process_memory import freeze_startup_heap, observe_gc_pauses, tune_gc, tune_malloc

    tune_malloc()  # before the broker allocates its buffers and starts threads
    tune_gc()
    observe_gc_pauses()
    overrides = _overrides(args.override)
    for flag, prop in (
        ("node_id", "node.id"),
        ("listeners", "listeners"),
        ("log_dirs", "log.dirs"),
        ("rack", "broker.rack"),
    ):
        if getattr(args, flag) is not None:
            overrides[prop] = str(getattr(args, flag))
    try:
        config = load_config(args.config, overrides=overrides)
    except (ConfigError, OSError) as exc:
        log.error("invalid configuration", error=str(exc))
        return 2
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    broker = Broker(config)
    await broker.start()
    freeze_startup_heap()
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write(f"{broker.port} {broker.metrics_port}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Stop on a signal, or when another incarnation of our node id registered (it leads now).
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(broker.superseded.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for waiting in waits:
        waiting.cancel()
    await broker.stop()
    return 1 if broker.superseded.is_set() else 0


async def _run_wal_manager(args: argparse.Namespace) -> int:
    from wal_manager.service import run_service

    overrides = _overrides(args.override)
    if args.listeners:
        overrides["listeners"] = args.listeners
    try:
        config = load_config(args.config, overrides=overrides)
        return await run_service(config, args.ready_file)
    except (ConfigError, OSError) as exc:
        log.error("invalid configuration", error=str(exc))
        return 2


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] in (["broker"], ["wal-manager"]):
        from diskless.broker.process_memory import hide_test_only_modules

        hide_test_only_modules()  # before the command line's modules import kio
    parser = argparse.ArgumentParser(prog="diskless", description="Kafka-compatible broker with diskless topics")
    sub = parser.add_subparsers(dest="command", required=True)
    broker = sub.add_parser("broker", help="run one broker")
    broker.add_argument("--config", help="Java properties file with Kafka-style settings")
    broker.add_argument("--override", action="append", default=[], metavar="NAME=VALUE", help="set any property")
    broker.add_argument("--node-id", type=int)
    broker.add_argument("--listeners", help="e.g. PLAINTEXT://127.0.0.1:9092 (port 0 picks a free port)")
    broker.add_argument("--log-dirs")
    broker.add_argument("--rack", help="availability zone (broker.rack)")
    broker.add_argument("--ready-file", help="write the bound port here once serving")
    broker.add_argument("--log-level", default="INFO")
    manager = sub.add_parser("wal-manager", help="run the WAL file manager (one active instance per cluster)")
    manager.add_argument("--config", help="Java properties file with Kafka-style settings")
    manager.add_argument("--override", action="append", default=[], metavar="NAME=VALUE", help="set any property")
    manager.add_argument("--listeners", help="where representatives send commit notices (port 0 picks one)")
    manager.add_argument("--ready-file", help="write the bound port here once serving")
    manager.add_argument("--log-level", default="INFO")
    dev = sub.add_parser(
        "dev",
        help="run a local cluster (S3, etcd, brokers in AZs on 127.0.<az>.x) and a short demo (make run)",
    )
    dev.add_argument(
        "action",
        nargs="?",
        choices=["kill", "stop", "start", "pause", "resume", "status"],
        help="instead of starting a cluster, act on a process of the one running on --data-dir",
    )
    dev.add_argument("target", nargs="?", help="the process: broker-<id>, etcd, s3 or wal-manager")
    dev.add_argument(
        "--no-restart", action="store_true", help="leave a process that dies down (default: restart with backoff)"
    )
    dev.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    dev.add_argument("--azs", type=int, default=3, help="AZs az-1..az-K, brokers round-robin (default 3)")
    dev.add_argument("--data-dir", default="./data", help="where etcd, S3 and the brokers keep their data (reused)")
    dev.add_argument(
        "--port", type=int, default=9092, help="port of the first broker, then +1 per broker (0: free ports)"
    )
    dev.add_argument("--no-demo", action="store_true", help="skip the produce/consume demo")
    dev.add_argument(
        "--no-az-listeners",
        action="store_true",
        help="one listener per broker instead of one per AZ (clients then say their AZ otherwise: README)",
    )
    reassign = sub.add_parser(
        "reassign", help="plan, apply and follow partition reassignments: scale-out, decommission (reassign.py)"
    )
    from diskless.reassign import add_arguments as reassign_arguments

    reassign_arguments(reassign)
    chaos = sub.add_parser(
        "chaos", help="faults against a local cluster under load; checks no acknowledged record is lost or duplicated"
    )
    chaos.add_argument("--seed", type=int, default=1, help="decides the faults, victims and timings (default 1)")
    chaos.add_argument("--duration", type=float, default=45.0, help="seconds of faults, roughly (default 45)")
    chaos.add_argument("--brokers", type=int, default=3)
    chaos.add_argument("--partitions", type=int, default=3, help="per topic (default 3)")
    chaos.add_argument("--rate", type=int, default=100, help="records per second per topic (default 100)")
    chaos.add_argument("--data-dir", help="keep the cluster's data and logs here (default: a temporary dir)")
    chaos.add_argument("--json", help="also write the result as JSON to this file")
    chaos.add_argument("--quick", action="store_true", help="every kind of fault once (about a minute; make test)")
    tier = sub.add_parser(
        "tier", help="tier committed WAL ranges into per-partition segment objects (PySpark job, make tier)"
    )
    from diskless.spark.tier_job import add_arguments as tier_arguments

    tier_arguments(tier)
    users = sub.add_parser("users", help="add, delete or list SCRAM users in the cluster's store (the first admin)")
    from diskless.security.users_cli import add_arguments as users_arguments

    users_arguments(users)
    bench = sub.add_parser("bench", help="benchmark a local 3-AZ cluster against issue 10's targets (make bench)")
    from diskless.bench.options import add_arguments, options_from

    add_arguments(bench)
    args = parser.parse_args(argv)
    if args.command == "reassign":
        from diskless.reassign import main as reassign_main

        configure_logging("WARNING")
        return reassign_main(args)
    if args.command == "tier":
        from diskless.spark.tier_job import main as tier_main

        configure_logging("WARNING")
        return tier_main(args)
    if args.command == "users":
        from diskless.security.users_cli import main as users_main

        configure_logging("WARNING")
        return users_main(args)
    if args.command == "bench":
        from diskless.bench.runner import run_bench

        configure_logging("WARNING")
        return run_bench(options_from(args))
    if args.command == "chaos":
        from diskless.chaos.run import Options, main_chaos

        configure_logging("WARNING")
        return main_chaos(
            Options(
                seed=args.seed,
                duration_s=args.duration,
                brokers=args.brokers,
                azs=min(3, args.brokers),
                partitions=args.partitions,
                rate=args.rate,
                data_dir=args.data_dir,
                json_path=args.json,
                quick=args.quick,
            )
        )
    if args.command == "dev":
        from diskless.dev import control, run_dev

        if args.action is not None:
            return control(args.data_dir, args.action, args.target)
        return run_dev(
            args.data_dir,
            args.brokers,
            args.azs,
            args.port,
            not args.no_demo,
            not args.no_az_listeners,
            restart=not args.no_restart,
        )
    configure_logging(args.log_level)
    if args.command == "wal-manager":
        return asyncio.run(_run_wal_manager(args))
    return asyncio.run(_run_broker(args))


if __name__ == "__main__":
    sys.exit(main())

"""``diskless tier``: the PySpark job turning committed WAL ranges into per-partition segment objects.

Driver (this process):
1. Learns the brokers (Kafka Metadata on ``--bootstrap-servers``) and asks each for the ranges it
   may tier (TierableRanges, broker/tier_rpcs.py): only partitions a broker *leads* are answered,
   each with its leader epoch and [start, last stable offset), so no open transaction is split.
2. Reads the range's pointer entries from that leader (FetchPointers, read_committed), cuts them
   into segments of at most ``diskless.tier.segment.bytes``, and hands one task per segment to Spark.
3. Sends each finished segment's TierCommit to the leader, in offset order per partition (a
   refusal stops that partition's later segments; the next run starts from what is tiered).

Executors read the WAL byte ranges straight from object storage with diskless's ObjectStore
(coalesced ranged GETs per WAL object, objects in parallel), check every batch against its pointer,
and write ``segments/<topic-id>/<partition>/<base>-<last>.log`` and ``.index``
(``storage/segment_object.py``). Keys and bytes are deterministic: a job killed at any point and
rerun rewrites the same objects, and a TierCommit already applied is answered as a duplicate, so
the topic ends exactly as before plus tiered. Objects written but never committed are garbage the
WAL manager deletes after its grace period (nothing references them).

Connections are ``KafkaClientConnection``s with the cluster secret, as brokers open theirs; S3 and
the secret come from the broker-style configuration (``--config``, ``DISKLESS_*``, ``--override``;
``--dev-dir`` reads a ``diskless dev`` cluster's cluster.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.config import BrokerConfig, load_config
from diskless.log.segment import POINTERS
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.security.cluster_secret import fetch_cluster_secret
from diskless.storage import pointer
from diskless.storage.object_store import ObjectStore
from diskless.storage.segment_object import SegmentInfo, SegmentWriter

log = structlog.get_logger(__name__)

METADATA_VERSION = 12
POINTERS_PER_REQUEST = 64 * 1024 * 1024  # batch bytes per FetchPointers answer


class TierJobError(Exception):
    """Bad input or an unreachable cluster, worded for the operator."""


@dataclass(frozen=True)
class TierSettings:
    """What the driver and executors need; picklable (goes to executors with each task)."""

    bootstrap: tuple[tuple[str, int], ...]
    config_path: str | None = None
    overrides: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold secrets
    timeout_s: float = 30.0
    secret: bytes | None = field(default=None, repr=False)

    def config(self) -> BrokerConfig:
        return load_config(self.config_path, overrides=dict(self.overrides))


def settings_from_args(
    bootstrap: str | None, config_path: str | None, overrides: dict[str, str], dev_dir: str | None
) -> TierSettings:
    extra: dict[str, str] = {}
    if dev_dir:
        described = Path(dev_dir) / "cluster.json"
        try:
            cluster = json.loads(described.read_text())
        except (OSError, ValueError) as exc:
            raise TierJobError(f"--dev-dir: cannot read {described}: {exc}") from exc
        s3 = cluster.get("s3") or {}
        for prop, key in (
            ("diskless.s3.endpoint", "endpoint"),
            ("diskless.s3.bucket", "bucket"),
            ("diskless.s3.access.key", "access_key"),
            ("diskless.s3.secret.key", "secret_key"),
        ):
            if s3.get(key):
                extra[prop] = str(s3[key])
        etcd = (cluster.get("etcd") or {}).get("endpoint")
        if etcd:
            extra["metadata.etcd.endpoints"] = str(etcd)
        if cluster.get("cluster_secret"):  # diskless dev gives its brokers one
            extra["diskless.cluster.secret"] = str(cluster["cluster_secret"])
        if not bootstrap:
            bootstrap = ",".join(b["address"] for b in cluster.get("brokers", {}).values())
    if not bootstrap:
        raise TierJobError("--bootstrap-servers (or --dev-dir) is required")
    settings = TierSettings(_parse_bootstrap(bootstrap), config_path, tuple(sorted({**extra, **overrides}.items())))
    try:
        config = settings.config()
    except Exception as exc:
        raise TierJobError(f"bad configuration: {exc}") from exc
    if not config.diskless_s3_endpoint:
        raise TierJobError("diskless.s3.endpoint is not set (--config, DISKLESS_DISKLESS_S3_ENDPOINT, --dev-dir)")
    return settings


def _parse_bootstrap(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for item in text.split(","):
        item = item.strip().split("://", 1)[-1]
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise TierJobError(f"--bootstrap-servers: {item!r} is not host:port")
        out.append((host, int(port)))
    return tuple(out)


async def resolve_secret(settings: TierSettings, config: BrokerConfig) -> bytes | None:
    """The cluster secret as brokers find it: configured, else etcd's copy."""
    try:
        return await fetch_cluster_secret(config, settings.timeout_s)
    except Exception as exc:
        endpoint = (config.metadata_etcd_endpoints or "").split(",")[0].strip()
        raise TierJobError(f"cannot read the cluster secret from etcd at {endpoint}: {exc!r}") from exc


def object_store(config: BrokerConfig) -> ObjectStore:
    assert config.diskless_s3_endpoint is not None
    return ObjectStore(
        config.diskless_s3_endpoint,
        config.diskless_s3_bucket,
        config.diskless_s3_access_key,
        config.diskless_s3_secret_key,
        config.diskless_s3_region,
    )


# --- driver ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """A tierable range as its leader answered it."""

    broker: int
    topic: str
    topic_id: str
    partition: int
    leader_epoch: int
    start: int
    end: int  # exclusive: the last stable offset
    pointer_bytes: int
    oldest_untiered_ms: int
    tiered_end: int = 0  # offsets below are served from segment objects
    segment_objects: int = 0
    tiered_bytes: int = 0


@dataclass
class Segment:
    """One executor task: the entries of [base, last] of one partition."""

    range: Range
    base: int
    last: int
    entries: bytes  # framed pointer/inline entries (storage/pointer.py)
    data_bytes: int


class Driver:
    def __init__(self, settings: TierSettings) -> None:
        self.settings = settings
        self.brokers: dict[int, tuple[str, int]] = {}
        self._conns: dict[tuple[str, int], KafkaClientConnection] = {}
        self._connecting = asyncio.Lock()  # partitions commit concurrently: one connection per broker
        self._closed = False

    async def close(self) -> None:
        self._closed = True  # a caller still running gets no new connection (it would stay open)
        conns, self._conns = list(self._conns.values()), {}  # a snapshot: a caller may still connect
        for conn in conns:
            await conn.close()

    async def _conn(self, address: tuple[str, int]) -> KafkaClientConnection:
        async with self._connecting:
            return await self._open(address)

    async def _open(self, address: tuple[str, int]) -> KafkaClientConnection:
        if self._closed:
            raise TierJobError("the tier job's driver is closed")
        conn = self._conns.get(address)
        if conn is not None and conn.connected:
            return conn
        # Opened as the data source opens its own: the secret proved, TLS when brokers use it.
        # Imported here: the data source's module loads pyarrow, which every `diskless` command
        # (brokers included: the command line is built whole) would otherwise map (~50 MB RSS).
        from diskless.spark.cluster import open_connection

        conn = open_connection(
            self.settings.config(), address[0], address[1], "diskless-tier-job", self.settings.secret
        )
        try:
            await conn.connect(timeout=min(5.0, self.settings.timeout_s))
        except (OSError, TimeoutError, ClientError) as exc:
            raise TierJobError(f"cannot reach broker at {address[0]}:{address[1]}: {exc!r}") from exc
        if self._closed:  # closed while this one connected
            await conn.close()
            raise TierJobError("the tier job's driver is closed")
        self._conns[address] = conn
        return conn

    async def _internal(self, broker: int, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
        address = self.brokers.get(broker)
        if address is None:
            raise TierJobError(f"broker {broker} is not registered")
        conn = await self._conn(address)
        try:
            answer = await conn.wait(conn.send_internal(api_key, body), timeout=self.settings.timeout_s)
        except (ClientError, OSError, TimeoutError) as exc:
            self._conns.pop(address, None)
            await conn.close()
            raise TierJobError(f"broker {broker}: {exc!r}") from exc
        if answer.get("error_code") == ErrorCode.cluster_authorization_failed:
            raise TierJobError(
                f"broker {broker} refuses the job's internal requests: give the cluster secret"
                " (diskless.cluster.secret) or where it is kept (metadata.etcd.endpoints, --dev-dir)"
            )
        return answer

    async def discover(self) -> None:
        errors = []
        for address in self.settings.bootstrap:
            try:
                conn = await self._conn(address)
                answer = await conn.request(
                    m.API_METADATA,
                    METADATA_VERSION,
                    {"topics": [], "allow_auto_topic_creation": False},
                    timeout=self.settings.timeout_s,
                )
            except (TierJobError, ClientError, OSError, TimeoutError) as exc:
                errors.append(f"{address[0]}:{address[1]}: {exc!r}")
                continue
            self.brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
            return
        raise TierJobError(f"no bootstrap server answered: {'; '.join(errors)}")

    async def ranges(self) -> list[Range]:
        """Every diskless partition's tierable range, from its leader (one answer per partition)."""
        out: dict[tuple[str, int], Range] = {}
        for broker in sorted(self.brokers):
            try:
                answer = await self._internal(broker, internal.INTERNAL_TIERABLE_RANGES, {})
            except TierJobError as exc:
                log.warning("broker skipped", broker=broker, error=str(exc))
                continue
            for p in answer.get("partitions", []):
                found = Range(
                    broker,
                    p["topic"],
                    p["topic_id"],
                    p["partition"],
                    p["leader_epoch"],
                    p["start"],
                    p["end"],
                    p["pointer_bytes"],
                    p["oldest_untiered_ms"],
                    p.get("tiered_end", 0),
                    p.get("segment_objects", 0),
                    p.get("tiered_bytes", 0),
                )
                known = out.get((found.topic_id, found.partition))
                if known is None or known.leader_epoch < found.leader_epoch:
                    out[(found.topic_id, found.partition)] = found
        return sorted(out.values(), key=lambda r: (r.topic, r.partition))

    async def segments(self, r: Range, max_segment_bytes: int) -> list[Segment]:
        """The range's entries from its leader, cut into segments on batch boundaries."""
        out: list[Segment] = []
        current = bytearray()
        base = -1
        last = -1
        size = 0
        offset = r.start
        log_start = -1
        while offset < r.end:
            body = {
                "topic": r.topic,
                "topic_id": r.topic_id,
                "partition": r.partition,
                # A range starts on a batch boundary, which may lie below the log start (DeleteRecords
                # inside a batch): asked from the log start, the leader answers that batch whole.
                "offset": max(offset, log_start),
                "max_bytes": POINTERS_PER_REQUEST,
                "read_committed": True,
            }
            answer = await self._internal(r.broker, internal.INTERNAL_FETCH_POINTERS, body)
            code = answer.get("error_code", 0)
            moved = answer.get("log_start_offset", -1)
            if code == ErrorCode.offset_out_of_range and body["offset"] < moved < r.end:
                log_start = moved
                continue
            if code != 0 or answer.get("kind") != POINTERS or not answer.get("data"):
                log.info(
                    "range not readable as pointers",
                    topic=r.topic,
                    partition=r.partition,
                    answer_kind=answer.get("kind"),
                )
                break
            data = memoryview(answer["data"])
            pos = 0
            progressed = False
            while pos < len(data):
                entry_size = pointer.pointer_entry_size(data, pos)
                header = pointer.entry_header_at(data, pos)
                if header.base_offset >= r.end:
                    break
                if header.last_offset >= offset:
                    if current and size + header.size > max_segment_bytes:
                        out.append(Segment(r, base, last, bytes(current), size))
                        current, size = bytearray(), 0
                    if not current:
                        base = header.base_offset
                    current += data[pos : pos + entry_size]
                    size += header.size
                    last = header.last_offset
                    offset = last + 1
                    progressed = True
                pos += entry_size
            if not progressed:
                break
        if current:
            out.append(Segment(r, base, last, bytes(current), size))
        # Leader-written batches alone (the last run's tier entries, markers) are not worth a
        # segment: they wait for the next range with data.
        while out and all(isinstance(e, pointer.InlineEntry) for e in pointer.iter_entries(out[-1].entries)):
            out.pop()
        return out

    async def commit(self, segment: Segment, info: SegmentInfo) -> dict[str, Any]:
        r = segment.range
        body = {
            "topic": r.topic,
            "topic_id": r.topic_id,
            "partition": r.partition,
            "leader_epoch": r.leader_epoch,
            "segment": info.to_dict(),
        }
        return await self._internal(r.broker, internal.INTERNAL_TIER_COMMIT, body)


# --- executors ------------------------------------------------------------------------------------


def write_segment(task: dict[str, Any]) -> dict[str, Any]:
    """Executor side of one segment: read its batches from WAL objects, write .log and .index."""
    settings: TierSettings = task["settings"]
    return asyncio.run(_write_segment(settings, task["topic_id"], task["partition"], task["entries"]))


async def _write_segment(settings: TierSettings, topic_id: str, partition: int, raw: bytes) -> dict[str, Any]:
    started = time.monotonic()
    entries = pointer.iter_entries(raw)
    served: list[bytes | None] = [None] * len(entries)
    by_key: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        if isinstance(entry, pointer.PointerEntry):
            by_key.setdefault(entry.key, []).append(i)
        else:
            served[i] = entry.batch
    store = object_store(settings.config())
    try:

        async def load(key: str, indexes: list[int]) -> None:
            ranges = [(entries[i].offset, entries[i].offset + entries[i].size) for i in indexes]  # type: ignore[union-attr]
            chunks = await store.get_ranges(key, ranges)
            for i, chunk in zip(indexes, chunks, strict=True):
                served[i] = bytes(entries[i].serve(chunk))  # type: ignore[union-attr]

        await asyncio.gather(*(load(key, idx) for key, idx in by_key.items()))
        writer = SegmentWriter(topic_id, partition)
        for batch in served:
            assert batch is not None
            writer.add(batch)
        # Keys of this run's own (segment_object module docstring): a rerun never puts a key the
        # WAL manager may be deleting as a failed run's leftover.
        log_bytes, index_bytes, info = writer.finish(created_ms=time.time_ns() // 1_000_000, run=uuid.uuid4().hex[:16])
        await asyncio.gather(store.put(info.index_key, index_bytes), store.put(info.log_key, log_bytes))
        gets, got_bytes = store.stats.gets, store.stats.get_bytes
    finally:
        await store.close()
    return {
        "segment": info.to_dict(),
        "wal_objects": len(by_key),
        "gets": gets,
        "wal_bytes_read": got_bytes,
        "seconds": time.monotonic() - started,
    }


# --- one run --------------------------------------------------------------------------------------


@dataclass
class TierReport:
    partitions: int = 0
    segments: int = 0
    committed: int = 0
    duplicates: int = 0
    refused: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (
            f"tiered {self.committed} segments ({self.duplicates} already tiered) of {self.partitions} partitions,"
            f" {self.bytes / 1e6:.1f} MB in {self.seconds:.1f} s ({self.mb_per_s:.1f} MB/s)"
            + (f"; refused: {'; '.join(self.refused)}" if self.refused else "")
        )


def due(r: Range, config: BrokerConfig, now_ms: int) -> bool:
    """The ``--every`` policy: old enough, or enough pointer bytes."""
    old = r.oldest_untiered_ms >= 0 and now_ms - r.oldest_untiered_ms > config.diskless_tier_min_age_ms
    return old or r.pointer_bytes > config.diskless_tier_min_bytes


def run_once(
    spark: Any,
    settings: TierSettings,
    policy: bool = False,
    after_segments: Callable[[list[dict[str, Any]]], None] | None = None,
) -> TierReport:
    """Tier every tierable range (``policy``: only those due) once; returns what happened.

    ``after_segments`` is called with the executors' results before any TierCommit (tests kill
    the driver there)."""
    started = time.monotonic()
    config = settings.config()
    if settings.secret is None:
        settings = replace(settings, secret=asyncio.run(resolve_secret(settings, config)))

    async def plan() -> list[Segment]:
        driver = Driver(settings)
        try:
            await driver.discover()
            now_ms = time.time_ns() // 1_000_000
            wanted = [r for r in await driver.ranges() if r.end > r.start and (not policy or due(r, config, now_ms))]
            found = await asyncio.gather(*(driver.segments(r, config.diskless_tier_segment_bytes) for r in wanted))
            return [s for per in found for s in per]
        finally:
            await driver.close()

    segments = asyncio.run(plan())
    report = TierReport(partitions=len({(s.range.topic_id, s.range.partition) for s in segments}))
    if not segments:
        report.seconds = time.monotonic() - started
        return report
    tasks = [
        {"settings": settings, "topic_id": s.range.topic_id, "partition": s.range.partition, "entries": s.entries}
        for s in segments
    ]
    results = spark.sparkContext.parallelize(tasks, len(tasks)).map(write_segment).collect()
    report.segments = len(results)
    if after_segments is not None:
        after_segments(results)
    for attempt in range(COMMIT_ATTEMPTS):
        late = asyncio.run(_commit_all(settings, segments, results, report, last=attempt == COMMIT_ATTEMPTS - 1))
        if not late:
            break
        # Segments whose commit came too late for the leader (diskless.tier.commit.timeout.ms):
        # written again (same bytes, a fresh time) and committed again.
        again = spark.sparkContext.parallelize([tasks[i] for i in late], len(late)).map(write_segment).collect()
        for i, result in zip(late, again, strict=True):
            results[i] = result
    report.seconds = time.monotonic() - started
    return report


COMMIT_ATTEMPTS = 3


async def _commit_all(
    settings: TierSettings, segments: list[Segment], results: list[dict[str, Any]], report: TierReport, last: bool
) -> list[int]:
    """TierCommit every segment not committed yet: partitions concurrently, each partition's
    segments in offset order, stopping at its first refusal. Returns the indexes refused only
    because they were written too long ago (to write again), unless this is the ``last`` try."""
    driver = Driver(settings)
    late: list[int] = []
    by_partition: dict[tuple[str, int], list[int]] = {}
    for i, segment in enumerate(segments):
        if not results[i].get("committed"):
            by_partition.setdefault((segment.range.topic_id, segment.range.partition), []).append(i)

    async def one_partition(indexes: list[int]) -> None:
        for i in indexes:
            segment = segments[i]
            info = SegmentInfo.from_dict(results[i]["segment"])
            answer = await driver.commit(segment, info)
            code = answer.get("error_code", 0)
            if code == ErrorCode.request_timed_out and not last:
                late.extend(indexes[indexes.index(i) :])
                return
            if code != 0:
                report.refused.append(
                    f"{segment.range.topic}-{segment.range.partition} [{info.base_offset}, {info.last_offset}]:"
                    f" {ErrorCode(code).name} {answer.get('error_message', '')}"
                )
                return
            results[i]["committed"] = True
            report.committed += 1
            report.duplicates += bool(answer.get("duplicate"))
            report.bytes += info.size

    try:
        await driver.discover()
        await asyncio.gather(*(one_partition(indexes) for indexes in by_partition.values()))
    finally:
        await driver.close()
    return sorted(late)


# --- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", help="host:port,... of brokers (default: --dev-dir's)")
    parser.add_argument("--config", help="broker-style properties file (S3 settings, etcd, cluster secret)")
    parser.add_argument("--override", action="append", default=[], metavar="NAME=VALUE", help="set any property")
    parser.add_argument("--dev-dir", help="a `diskless dev` cluster's data dir: brokers and S3 from its cluster.json")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--every",
        type=float,
        help="run every SECONDS, tiering partitions due by diskless.tier.min.age.ms / diskless.tier.min.bytes",
    )


def main(args: argparse.Namespace) -> int:
    overrides = {}
    for item in args.override:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--override expects name=value, got {item!r}")
        overrides[name.strip()] = value.strip()
    try:
        settings = settings_from_args(args.bootstrap_servers, args.config, overrides, args.dev_dir)
    except TierJobError as exc:
        print(f"diskless tier: {exc}")
        return 2
    from .session import build_session

    spark = build_session(args.master, "diskless-tier")
    try:
        while True:
            ok = True
            try:
                report = run_once(spark, settings, policy=args.every is not None)
                print(report.line(), flush=True)
                ok = not report.refused
            except TierJobError as exc:
                print(f"diskless tier: {exc}", flush=True)
                ok = False
            except Exception as exc:
                if args.every is None:
                    raise
                # A periodic job outlives a failed pass (an executor's S3 error, a broker's odd
                # answer): ended, tiering would stop, and pointer logs and the WAL objects they
                # reference would grow until someone restarted it. The next pass starts afresh.
                log.exception("tier pass failed; trying again at the next interval")
                print(f"diskless tier: pass failed: {exc!r}", flush=True)
                ok = False
            if args.every is None:
                return 0 if ok else 1
            time.sleep(args.every)
    finally:
        spark.stop()

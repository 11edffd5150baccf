"""What the ``diskless`` Spark data source asks brokers, and how executors read a partition's range.

Brokers are asked only for metadata, through the Kafka protocol (Metadata, ListOffsets) and the
internal FetchPointers RPC (pointer entries, last stable offset and aborted transactions of a
range). Record data of diskless segments is then read by the executor itself from object storage
(coalesced ranged GETs of WAL objects); tiered ranges, which FetchPointers answers with a
descriptor of the segment object holding them, are read from that object (``fetch.tier_reader``:
its offset index, then ranged GETs of whole batches); classic segments come back from
FetchPointers as record batches read from the leader's disk, exactly what its Fetch would return.

Connections are ``KafkaClientConnection``s opened by ``open_connection`` with the broker-style
``BrokerConfig`` (``diskless.config`` properties file, ``DISKLESS_*`` environment, ``dev.dir``'s
cluster.json, ``diskless.*`` options), the same way brokers open theirs, so that whatever brokers
require of internal connections applies here too.

Metadata answers show a diskless partition's leader as a broker in the client's AZ (zone
alignment), which may be a follower or hold no replica; FetchPointers must reach the true
leader, so it is tried on the shown leader, then on each replica, and the one that answers is
remembered. Every network step is bounded by ``timeout.ms``; failures raise ``DisklessSourceError``
naming the topic, partition, offsets, broker or object concerned. Records of a range that are gone
when it is read (below the log start offset now, or of a topic id the leader no longer has) are
data loss, which ``DataLossPolicy`` (the ``failOnDataLoss`` option) fails on or skips.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from kio.schema.errors import ErrorCode

from diskless.config import BrokerConfig, load_config
from diskless.fetch.tier_reader import TierReader
from diskless.fetch.wal_reader import WalCache
from diskless.log.partition_log import TIERED
from diskless.log.segment import POINTERS, RECORDS
from diskless.protocol import internal, records
from diskless.protocol import messages as m
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.security.cluster_secret import fetch_cluster_secret
from diskless.security.internal_auth import ClusterSecret
from diskless.security.tls import internal_client_context
from diskless.storage import pointer
from diskless.storage.object_store import NoSuchKey, ObjectStore

from .batches import AbortedFilter, Columns, CorruptBatch, control_type, iter_batches

METADATA_VERSION = 12
LIST_OFFSETS_VERSION = 7
EARLIEST = -2
LATEST = -1
READ_COMMITTED = 1

# ListOffsets errors of a partition in transition (its topic being deleted or created, its leader
# moving or catching up): a streaming query asks again at its next trigger.
RETRIABLE_LIST_OFFSETS = frozenset(
    {
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.replica_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.offset_not_available,
    }
)
# FetchPointers errors saying the incarnation read is not (or not yet) the one the leader has: the
# topic was deleted or re-created, or the broker has not applied the metadata change yet.
_INCARNATION_ERRORS = frozenset({ErrorCode.unknown_topic_id, ErrorCode.unknown_topic_or_partition})

_CONFIG_PREFIX = "diskless."  # options that are broker-style config properties
_CONFIG_NAMES = ("metadata.etcd.endpoints", "cluster.id")  # and these (the cluster secret's place)


class DisklessSourceError(Exception):
    """Bad input or an unreachable broker/object store, worded for the Spark user."""


class DataLossError(DisklessSourceError):
    """Records a query was to read are gone, and ``failOnDataLoss`` is true (the default)."""


class DataLossPolicy:
    """Spark's Kafka source's ``failOnDataLoss``: records the query was to read are gone (deleted by
    retention or DeleteRecords, or their topic deleted or re-created); fail, or warn and go on.

    A warning is logged once per event (``event``), although a micro-batch's planning meets it
    several times (latestOffset, then partitions) and a stalled partition at every trigger.
    """

    def __init__(self, fail: bool, log: logging.Logger | None = None) -> None:
        self.fail = fail
        self.log = log or logging.getLogger("diskless.spark")
        self._warned: set[tuple[Any, ...]] = set()

    def report(self, event: tuple[Any, ...], message: str, action: str) -> None:
        """Raise DataLossError if failing on data loss, else warn (once) that the query does ``action``."""
        if self.fail:
            raise DataLossError(
                f"{message}. Some data may have been lost: records were deleted (retention, DeleteRecords) or "
                "their topic was deleted or re-created before the query read them. For the query to go on in such "
                'cases, reading what is still there, set the source option "failOnDataLoss" to "false"'
            )
        if event not in self._warned:
            self._warned.add(event)
            self.log.warning(
                '%s. Some data may have been lost; the query goes on ("failOnDataLoss" is "false"): %s', message, action
            )


@dataclass(frozen=True)
class Settings:
    """Everything drivers and executors need to reach the cluster; picklable."""

    bootstrap: tuple[tuple[str, int], ...]
    read_committed: bool = True
    timeout_s: float = 30.0
    config_path: str | None = None
    config_overrides: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold secrets
    client_id: str = "diskless-spark"
    fetch_max_bytes: int = 1024 * 1024  # pointer entries (or classic records) per FetchPointers
    chunk_bytes: int = 16 * 1024 * 1024  # WAL bytes fetched and decoded at a time
    # The cluster secret internal requests prove, resolved once on the driver (never printed).
    secret: bytes | None = field(default=None, repr=False)

    def broker_config(self) -> BrokerConfig:
        """The broker-style configuration: file, then DISKLESS_* environment, then options."""
        try:
            return load_config(self.config_path, overrides=dict(self.config_overrides))
        except Exception as exc:
            raise DisklessSourceError(f"bad diskless configuration: {exc}") from exc


def _parse_bootstrap(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not item or not sep or not port.isdigit():
            raise DisklessSourceError(f"bootstrap.servers: {item!r} is not host:port")
        out.append((host, int(port)))
    return tuple(out)


def settings_from_options(options: Mapping[str, str]) -> Settings:
    """Settings from data source options (case-insensitive, as Spark passes them)."""
    opts = {k.lower(): v for k, v in options.items()}
    overrides: dict[str, str] = {}
    bootstrap = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
    dev_dir = opts.get("dev.dir") or opts.get("diskless.dev.dir") or os.environ.get("DISKLESS_DEV_DIR")
    if dev_dir:
        described = Path(dev_dir) / "cluster.json"
        try:
            cluster = json.loads(described.read_text())
        except (OSError, ValueError) as exc:
            raise DisklessSourceError(f"dev.dir: cannot read {described}: {exc}") from exc
        s3 = cluster.get("s3") or {}
        for name, key in (("endpoint", "endpoint"), ("bucket", "bucket"), ("access.key", "access_key")):
            if s3.get(key):
                overrides[f"diskless.s3.{name}"] = str(s3[key])
        if s3.get("secret_key"):
            overrides["diskless.s3.secret.key"] = str(s3["secret_key"])
        if cluster.get("cluster_secret"):  # diskless dev gives its brokers one
            overrides["diskless.cluster.secret"] = str(cluster["cluster_secret"])
        etcd = (cluster.get("etcd") or {}).get("endpoint")
        if etcd:
            overrides["metadata.etcd.endpoints"] = str(etcd)
        if not bootstrap:
            bootstrap = ",".join(b["address"] for b in cluster.get("brokers", {}).values())
    if not bootstrap:
        raise DisklessSourceError("option bootstrap.servers (or dev.dir) is required")
    for name, value in options.items():
        lowered = name.lower()
        if lowered in ("diskless.config", "diskless.dev.dir"):
            continue
        if lowered.startswith(_CONFIG_PREFIX) or lowered in _CONFIG_NAMES:
            overrides[lowered] = value
    isolation = opts.get("isolation.level") or opts.get("kafka.isolation.level") or "read_committed"
    if isolation not in ("read_committed", "read_uncommitted"):
        raise DisklessSourceError(f"isolation.level must be read_committed or read_uncommitted, not {isolation!r}")
    try:
        timeout_s = int(opts.get("timeout.ms", "30000")) / 1000
        fetch_max = int(opts.get("fetch.max.bytes", str(1024 * 1024)))
    except ValueError as exc:
        raise DisklessSourceError(f"timeout.ms / fetch.max.bytes: {exc}") from exc
    settings = Settings(
        bootstrap=_parse_bootstrap(bootstrap),
        read_committed=isolation == "read_committed",
        timeout_s=timeout_s,
        config_path=opts.get("diskless.config"),
        config_overrides=tuple(sorted(overrides.items())),
        fetch_max_bytes=fetch_max,
    )
    settings.broker_config()  # a bad option fails on the driver, not in every task
    return settings


async def resolve_secret(settings: Settings, config: BrokerConfig) -> bytes | None:
    """The cluster secret, as brokers find it: ``diskless.cluster.secret``, else etcd's copy
    (``metadata.etcd.endpoints``); None when neither is given (internal requests will be refused)."""
    if settings.secret is not None:
        return settings.secret
    try:
        return await fetch_cluster_secret(config, settings.timeout_s)
    except Exception as exc:
        endpoint = (config.metadata_etcd_endpoints or "").split(",")[0].strip()
        raise DisklessSourceError(f"cannot read the cluster secret from etcd at {endpoint}: {exc!r}") from exc


def open_connection(
    config: BrokerConfig, host: str, port: int, client_id: str, secret: bytes | None
) -> KafkaClientConnection:
    """A connection to a broker, opened the way brokers open theirs: with the cluster secret it
    proves it at connect time, which FetchPointers needs; ``connect`` it before use."""
    # TLS as brokers use it between themselves when the inter-broker listener is SSL/SASL_SSL.
    credentials = ClusterSecret(secret, internal_client_context(config)) if secret is not None else None
    return KafkaClientConnection(host, port, client_id, credentials=credentials)


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    topic_id: str
    index: int
    leader: int  # as Metadata shows it to us (zone-aligned for diskless topics)
    replicas: tuple[int, ...]

    def candidates(self) -> list[int]:
        return [self.leader, *(r for r in self.replicas if r != self.leader)]


@dataclass
class ClusterView:
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    topics: dict[str, list[PartitionInfo]] = field(default_factory=dict)
    # Topics an all-topics Metadata answered with an error (subscribePattern): only a read of
    # one of them fails (``partitions``), not the listing.
    errors: dict[str, int] = field(default_factory=dict)

    def partitions(self, topic: str) -> list[PartitionInfo]:
        """The partitions of a topic to read; a topic Metadata answered with an error raises."""
        code = self.errors.get(topic)
        if code is not None:
            raise DisklessSourceError(f"topic {topic!r}: {_error_name(code)} (does it exist?)")
        return self.topics[topic]


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


class ClusterClient:
    """One asyncio client of the cluster: Metadata, ListOffsets and FetchPointers, all bounded."""

    def __init__(self, settings: Settings, config: BrokerConfig | None = None) -> None:
        self.settings = settings
        self.config = config or settings.broker_config()
        self.view = ClusterView()
        self._conns: dict[tuple[str, int], KafkaClientConnection] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._secret_resolved = settings.secret is not None
        self._closed = False

    async def with_secret(self) -> Settings:
        """``settings`` carrying the resolved cluster secret, for executors (resolved once, here)."""
        if not self._secret_resolved:
            secret = await resolve_secret(self.settings, self.config)
            self.settings = replace(self.settings, secret=secret)
            self._secret_resolved = True
        return self.settings

    async def close(self) -> None:
        self._closed = True  # a caller still running gets no new connection (it would stay open)
        conns, self._conns = list(self._conns.values()), {}  # a snapshot: a caller may still connect
        for conn in conns:
            await conn.close()

    async def _connection(self, address: tuple[str, int]) -> KafkaClientConnection:
        if self._closed:
            raise ClientError("the cluster client is closed")
        conn = self._conns.get(address)
        if conn is not None and conn.connected:
            return conn
        if conn is not None:
            await conn.close()
        settings = await self.with_secret()
        conn = open_connection(self.config, address[0], address[1], settings.client_id, settings.secret)
        try:
            await conn.connect(timeout=min(5.0, self.settings.timeout_s))
        except (OSError, TimeoutError) as exc:
            raise ClientError(f"cannot reach broker at {address[0]}:{address[1]}: {exc or type(exc).__name__}") from exc
        if self._closed:  # closed while this one connected
            await conn.close()
            raise ClientError("the cluster client is closed")
        self._conns[address] = conn
        return conn

    async def _any_request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """A request to the first bootstrap server (or known broker) that answers."""
        errors = []
        addresses = list(dict.fromkeys([*self.view.brokers.values(), *self.settings.bootstrap]))
        for address in addresses:
            try:
                conn = await self._connection(address)
                return await conn.request(api_key, version, body, timeout=self.settings.timeout_s)
            except (ClientError, OSError, TimeoutError) as exc:
                errors.append(f"{address[0]}:{address[1]}: {exc or type(exc).__name__}")
        raise DisklessSourceError(f"no broker answered (bootstrap.servers): {'; '.join(errors)}")

    async def metadata(self, topics: list[str] | None, strict: bool = True) -> ClusterView:
        """Brokers and the partitions of ``topics`` (every topic when None). A named topic in error
        (unknown, ...) raises, unless not ``strict``; of every topic (or not ``strict``), those in
        error are kept in ``errors`` instead."""
        body = {
            "topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False,
        }
        answer = await self._any_request(m.API_METADATA, METADATA_VERSION, body)
        self.view.brokers = {b.node_id: (b.host, b.port) for b in answer.brokers}
        for t in answer.topics:
            if t.error_code != ErrorCode.none:
                if topics is not None and strict:
                    raise DisklessSourceError(f"topic {t.name!r}: {_error_name(t.error_code)} (does it exist?)")
                # Every topic: one in error (a leader being elected, ...) that the pattern does not
                # pick must not fail the read. Not strict (a streaming query between micro-batches):
                # a topic deleted, or being created, is for the caller to judge.
                self.view.errors[t.name] = t.error_code
                self.view.topics.pop(t.name, None)
                continue
            self.view.errors.pop(t.name, None)
            if t.is_internal and topics is None:
                continue
            self.view.topics[t.name] = [
                PartitionInfo(t.name, str(t.topic_id), p.partition_index, p.leader_id, tuple(p.replica_nodes))
                for p in sorted(t.partitions, key=lambda p: p.partition_index)
            ]
        return self.view

    async def list_offsets(self, queries: list[tuple[PartitionInfo, int]]) -> list[int]:
        """ListOffsets of (partition, timestamp) pairs (EARLIEST, LATEST or a time in ms), at our
        isolation level; -1 where no record is at or after a timestamp."""
        answers = await self._list_offsets(queries, tolerant=False)
        out = []
        for (part, _), (offset, problem) in zip(queries, answers, strict=True):
            if problem is not None:
                raise DisklessSourceError(f"ListOffsets for {part.topic}-{part.index} failed: {problem}")
            out.append(offset)
        return out

    async def try_list_offsets(self, queries: list[tuple[PartitionInfo, int]]) -> list[int | None]:
        """``list_offsets``, with None for a partition that cannot answer now: no leader, or one
        that answers with a retriable error (a topic being deleted or created, a leader moving)."""
        answers = await self._list_offsets(queries, tolerant=True)
        return [offset if problem is None else None for offset, problem in answers]

    async def _list_offsets(
        self, queries: list[tuple[PartitionInfo, int]], tolerant: bool
    ) -> list[tuple[int, str | None]]:
        """(offset, problem) per query; a problem that is not retriable raises even if ``tolerant``."""
        by_broker: dict[int, list[int]] = {}
        out: list[tuple[int, str | None]] = [(-1, None)] * len(queries)
        for i, (part, _) in enumerate(queries):
            if tolerant and part.leader not in self.view.brokers:
                out[i] = (-1, "no leader")  # being elected, or its broker just left
                continue
            by_broker.setdefault(part.leader, []).append(i)
        for broker, indexes in by_broker.items():
            topics: dict[str, list[dict[str, Any]]] = {}
            for i in indexes:
                part, ts = queries[i]
                topics.setdefault(part.topic, []).append({"partition_index": part.index, "timestamp": ts})
            body = {
                "replica_id": -1,
                "isolation_level": READ_COMMITTED if self.settings.read_committed else 0,
                "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
            }
            answer = await self._broker_request(broker, m.API_LIST_OFFSETS, LIST_OFFSETS_VERSION, body)
            found = {(t.name, p.partition_index): p for t in answer.topics for p in t.partitions}
            for i in indexes:
                part, _ = queries[i]
                entry = found.get((part.topic, part.index))
                if entry is None or entry.error_code != ErrorCode.none:
                    code = "missing from the answer" if entry is None else _error_name(entry.error_code)
                    if not tolerant or (entry is not None and entry.error_code not in RETRIABLE_LIST_OFFSETS):
                        raise DisklessSourceError(f"ListOffsets for {part.topic}-{part.index} failed: {code}")
                    out[i] = (-1, code)
                    continue
                out[i] = (entry.offset, None)
        return out

    async def _broker_request(self, broker: int, api_key: int, version: int, body: dict[str, Any]) -> Any:
        address = self.view.brokers.get(broker)
        if address is None:
            raise DisklessSourceError(f"broker {broker} is not in the cluster's metadata (partition offline?)")
        try:
            conn = await self._connection(address)
            return await conn.request(api_key, version, body, timeout=self.settings.timeout_s)
        except (ClientError, OSError, TimeoutError) as exc:
            raise DisklessSourceError(f"broker {broker} at {address[0]}:{address[1]}: {exc or 'timed out'}") from exc

    async def fetch_pointers(self, part: PartitionInfo, offset: int, max_bytes: int) -> dict[str, Any]:
        """FetchPointers from the partition's true leader (tried on the shown leader, then replicas)."""
        body = {
            "topic": part.topic,
            "topic_id": part.topic_id,
            "partition": part.index,
            "offset": offset,
            "max_bytes": max_bytes,
            "read_committed": self.settings.read_committed,
        }
        key = (part.topic, part.index)
        known = self._leaders.get(key)
        candidates = [known] if known is not None else []
        candidates += [c for c in part.candidates() if c != known]
        problems = []
        for broker in candidates:
            address = self.view.brokers.get(broker)
            if address is None:
                problems.append(f"broker {broker} not registered")
                continue
            try:
                conn = await self._connection(address)
                answer = await conn.wait(
                    conn.send_internal(internal.INTERNAL_FETCH_POINTERS, body), timeout=self.settings.timeout_s
                )
            except (ClientError, OSError, TimeoutError) as exc:
                problems.append(f"broker {broker}: {exc or 'timed out'}")
                continue
            code = answer.get("error_code", 0)
            if code == ErrorCode.cluster_authorization_failed:
                raise DisklessSourceError(
                    f"broker {broker} refuses this reader's internal requests (CLUSTER_AUTHORIZATION_FAILED): "
                    "give the cluster secret (option diskless.cluster.secret, DISKLESS_DISKLESS_CLUSTER_SECRET) "
                    "or where it is kept (metadata.etcd.endpoints, dev.dir, diskless.config)"
                )
            if code in (ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available):
                problems.append(f"broker {broker}: {_error_name(code)}")
                continue
            self._leaders[key] = broker
            return answer
        raise DisklessSourceError(f"{part.topic}-{part.index}: no replica answered as leader ({'; '.join(problems)})")


MAX_POINTER_REFRESHES = 3


class _PointersMoved(Exception):
    """A WAL object named by pointer entries no longer exists (its range moved or was deleted)."""


class PartitionReader:
    """Reads offsets [start, end) of one partition into Arrow batches (executor side).

    Pointer entries come from the leader a slice at a time; their WAL byte ranges are fetched per
    object with coalesced ranged GETs, ``chunk_bytes`` at a time, decoded and filtered
    (read_committed: aborted transactions; always: control batches), and returned as one batch.
    """

    def __init__(
        self,
        client: ClusterClient,
        part: PartitionInfo,
        start: int,
        end: int,
        schema: pa.Schema,
        data_loss: DataLossPolicy | None = None,
    ) -> None:
        self.client = client
        self.data_loss = data_loss or DataLossPolicy(fail=True)
        self.settings = client.settings
        self.part = part
        self.offset = start
        self.end = end
        self.columns = Columns(part.topic, part.index, schema)
        self._units: deque[Any] = deque()  # PointerEntry | InlineEntry | memoryview batch, in offset order
        self._filter: AbortedFilter | None = None
        self._store: ObjectStore | None = None
        self._tiers: TierReader | None = None
        self._moved = 0  # consecutive refreshes that found a WAL object gone (reset by a step that reads)
        self.bytes_read = 0

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    def _where(self) -> str:
        return f"{self.part.topic}-{self.part.index}"

    async def _refill(self) -> bool:
        """Units from ``offset`` on; False when the rest of the range is gone (the data loss was
        reported, and tolerated: failOnDataLoss=false) or holds no batch (compacted away), which
        ends the read."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            answer = await self.client.fetch_pointers(self.part, self.offset, self.settings.fetch_max_bytes)
            code = answer.get("error_code", 0)
            if code == ErrorCode.offset_out_of_range:
                if not self._out_of_range(answer):
                    return False
                continue  # from the log start offset
            if code in _INCARNATION_ERRORS:
                # The leader has another incarnation of the topic, or none: ours was deleted or
                # re-created since the batch was planned, or the leader has not applied its creation
                # yet (a topic re-created just before). Only time tells which.
                if time.monotonic() <= deadline:
                    await asyncio.sleep(0.2)
                    continue
                self.data_loss.report(
                    ("gone", self.part.topic, self.part.index, self.part.topic_id),
                    f"{self._where()}: topic {self.part.topic!r} with topic id {self.part.topic_id} is gone "
                    f"({_error_name(code)} from its leader for {self.settings.timeout_s:g} s: deleted, or deleted "
                    f"and re-created, after this batch was planned), so its offsets [{self.offset}, {self.end}) "
                    "cannot be read",
                    f"offsets [{self.offset}, {self.end}) are skipped",
                )
                return False
            if code != 0:
                raise DisklessSourceError(
                    f"{self._where()}: FetchPointers at offset {self.offset}: {_error_name(code)}"
                )
            units = await self._units_of(answer)
            if units:
                break
            readable = answer["last_stable_offset"] if self.settings.read_committed else answer["high_watermark"]
            bound = "last stable offset" if self.settings.read_committed else "high watermark"
            if isinstance(readable, int) and readable >= self.end:
                # The leader reads at least one batch below its bound when there is one: none from
                # ``offset`` up to the range's end is left (compaction removed them).
                return False
            if time.monotonic() > deadline:
                raise DisklessSourceError(
                    f"{self._where()}: offsets [{self.offset}, {self.end}) requested but the log is readable "
                    f"only up to {readable} ({bound})"
                )
            await asyncio.sleep(0.2)  # a new leader's high watermark catches up; bounded by timeout.ms
        self._units.extend(units)
        aborted = answer.get("aborted_transactions") or []
        self._filter = AbortedFilter.of(aborted) if self.settings.read_committed else None
        return True

    def _out_of_range(self, answer: dict[str, Any]) -> bool:
        """OFFSET_OUT_OF_RANGE at ``offset``: report the data loss; True to read on from the log
        start offset (records below it were deleted), False when nothing of the range is left."""
        log_start, log_end = answer.get("log_start_offset"), answer.get("high_watermark")
        if isinstance(log_start, int) and self.offset < log_start:
            resume = min(log_start, self.end)
            self.data_loss.report(
                ("deleted", self.part.topic, self.part.index, self.offset, log_start),
                f"{self._where()}: offsets [{self.offset}, {resume}) were deleted before they were read "
                f"(retention or DeleteRecords): the log starts at offset {log_start} now",
                f"offsets [{self.offset}, {resume}) are skipped",
            )
            self.offset = resume
            return self.offset < self.end
        # Past the end of the log: it was truncated (or re-created) under the range planned.
        self.data_loss.report(
            ("truncated", self.part.topic, self.part.index, self.offset, log_end),
            f"{self._where()}: offset {self.offset} is outside the log [{log_start}, {log_end}), so offsets "
            f"[{self.offset}, {self.end}) planned for this batch are gone (the log was truncated or re-created)",
            f"offsets [{self.offset}, {self.end}) are skipped",
        )
        self.offset = self.end
        return False

    async def _units_of(self, answer: dict[str, Any]) -> list[Any]:
        """Pointer entries, or batches: classic ones as read, tiered ones from their segment object."""
        data = answer.get("data") or b""
        if not data:
            return []
        kind = answer.get("kind", RECORDS)
        if kind == POINTERS:
            return list(pointer.iter_entries(data))
        if kind == RECORDS:
            return list(iter_batches(data))
        if kind == TIERED:
            if self._tiers is None:
                # Blocks of segment bytes are cached for the next slice of the same segment.
                self._tiers = TierReader(self._object_store(), WalCache(64 * 1024 * 1024, 64 * 1024 * 1024))
            store = self._object_store()
            try:
                batches = await asyncio.wait_for(self._tiers.read(bytes(data)), self.settings.timeout_s * 2)
            except Exception as exc:
                raise DisklessSourceError(
                    f"{self._where()}: cannot read the tiered segment object at offset {self.offset} from S3 at "
                    f"{store.endpoint_url} (bucket {store.bucket}): {type(exc).__name__}: {exc}"
                ) from exc
            self.bytes_read += len(batches)
            return list(iter_batches(batches))
        raise DisklessSourceError(f"{self._where()}: the leader answered entries of kind {kind!r}, unknown here")

    def _object_store(self) -> ObjectStore:
        if self._store is None:
            config = self.client.config
            if not config.diskless_s3_endpoint:
                raise DisklessSourceError(
                    f"{self._where()} keeps its records in object storage but no S3 endpoint is configured "
                    "(option diskless.s3.endpoint, diskless.config, dev.dir or DISKLESS_DISKLESS_S3_ENDPOINT)"
                )
            self._store = ObjectStore(
                config.diskless_s3_endpoint,
                config.diskless_s3_bucket,
                config.diskless_s3_access_key,
                config.diskless_s3_secret_key,
                config.diskless_s3_region,
                max_concurrency=8,
                max_attempts=3,
                connect_timeout=min(5.0, self.settings.timeout_s),
                read_timeout=self.settings.timeout_s,
                backoff_max=1.0,
            )
        return self._store

    async def _resolve(self, units: list[Any]) -> list[memoryview]:
        """The served batch of each unit: WAL ranges for pointers, grouped per object."""
        out: list[Any] = list(units)
        wanted: dict[str, list[int]] = {}
        for i, unit in enumerate(units):
            if isinstance(unit, pointer.PointerEntry):
                wanted.setdefault(unit.key, []).append(i)
            elif isinstance(unit, pointer.InlineEntry):
                out[i] = memoryview(unit.batch)
        if wanted:
            store = self._object_store()

            async def one(key: str, indexes: list[int]) -> None:
                ranges = [(units[i].offset, units[i].offset + units[i].size) for i in indexes]
                try:
                    chunks = await asyncio.wait_for(store.get_ranges(key, ranges), self.settings.timeout_s * 2)
                except NoSuchKey as exc:
                    raise _PointersMoved(key) from exc
                except Exception as exc:
                    raise DisklessSourceError(
                        f"{self._where()}: cannot read WAL object {key} from S3 at {store.endpoint_url} "
                        f"(bucket {store.bucket}): {type(exc).__name__}: {exc}"
                    ) from exc
                for i, chunk in zip(indexes, chunks, strict=True):
                    self.bytes_read += len(chunk)
                    out[i] = memoryview(units[i].serve(chunk))

            await asyncio.gather(*(one(key, indexes) for key, indexes in wanted.items()))
        return out

    async def next_batch(self) -> pa.RecordBatch | None:
        """The next non-empty Arrow batch of the range, or None once it is read entirely."""
        while self.offset < self.end:
            if not self._units and not await self._refill():
                self.offset = self.end  # the rest of the range is gone (reported, and tolerated) or empty
                break
            units = []
            size = 0
            past_end = False
            while self._units and size < self.settings.chunk_bytes:
                unit = self._units[0]
                header = unit.header if not isinstance(unit, memoryview) else None
                base = header.base_offset if header is not None else int.from_bytes(unit[:8], "big", signed=True)
                if base >= self.end:
                    self._units.clear()
                    past_end = True
                    break
                units.append(self._units.popleft())
                size += header.size if header is not None else len(unit)
            try:
                resolved = await self._resolve(units)
            except _PointersMoved as exc:
                # The object went after our pointers were read: its range was tiered (or removed by
                # retention) meanwhile, and the WAL manager deleted it. Ask the leader again.
                self._moved += 1
                if self._moved > MAX_POINTER_REFRESHES:
                    raise DisklessSourceError(
                        f"{self._where()}: WAL object {exc} is gone from object storage although the leader "
                        f"still points into it at offset {self.offset}"
                    ) from exc
                self._units.clear()
                continue
            # Only consecutive misses fail the read: a long read may see several objects tiered away.
            self._moved = 0
            for batch in resolved:
                try:
                    header = records.parse_header(batch)
                    hidden = False
                    if self._filter is not None or header.is_control:
                        kind = control_type(batch, header) if header.is_control else None
                        filt = self._filter or AbortedFilter()
                        hidden = filt.skip(header, kind)
                    if not hidden:
                        self.columns.add_batch(batch, self.offset, self.end)
                except CorruptBatch as exc:
                    raise DisklessSourceError(f"{self._where()}: {exc}") from exc
                self.offset = max(self.offset, header.last_offset + 1)
            if past_end:  # the rest lies beyond the range (compaction may leave a gap before it)
                self.offset = self.end
            if len(self.columns):
                return self.columns.take()
        if len(self.columns):
            return self.columns.take()
        return None

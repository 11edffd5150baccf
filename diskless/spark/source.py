"""The ``diskless`` Spark data source: batch and streaming reads of topics, and a writer.

``spark.dataSource.register(DisklessDataSource)`` then ``spark.read.format("diskless")`` gives
Kafka's Spark schema (key, value, topic, partition, offset, timestamp, timestampType, headers).
Options follow Spark's Kafka source: ``bootstrap.servers`` (or ``dev.dir``, a ``diskless dev``
directory), ``topic`` / ``subscribe`` (comma list) / ``subscribePattern`` (a regex the whole name
matches), ``startingOffsets`` and ``endingOffsets`` (``earliest``, ``latest`` or JSON ``{"topic":
{"0": 12, "1": -2}}`` with -2 earliest and -1 latest), ``startingTimestamp`` / ``endingTimestamp``
(ms; the first offset whose record is at or after it, the end of the log when there is none),
``isolation.level`` (``read_committed`` by default), ``maxRecordsPerPartition`` (splits a
partition's range over several Spark partitions), ``maxOffsetsPerTrigger`` (streaming),
``failOnDataLoss`` (``true`` by default: records to read that are gone fail the query; ``false``
logs a warning and reads what is still there, see ``offsets``), ``timeout.ms`` (every network
step), and broker-style ``diskless.*`` properties (``diskless.s3.endpoint``...) or
``diskless.config`` (a broker properties file) for object storage.

Planning runs on the driver and asks brokers for metadata only; each Spark partition then reads
its offset range on an executor (``cluster.PartitionReader``): diskless data straight from S3,
classic data through the leader. Rows reach Spark as Arrow batches.

Streaming offsets are ``{"topic": {"partition": next offset}}`` plus the topics' ids (``offsets``:
a topic deleted and re-created under the same name is told by its id, not by offsets that may
have grown past the old ones); a micro-batch reads exactly [start, end) of each partition, ends
are at most the last stable offset (read_committed), so a query restarted from its checkpoint
re-reads nothing and skips nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from kio.schema.errors import ErrorCode
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .cluster import (
    EARLIEST,
    LATEST,
    ClusterClient,
    DataLossPolicy,
    DisklessSourceError,
    PartitionInfo,
    PartitionReader,
    Settings,
    settings_from_options,
)
from .offsets import Bounds, StreamOffset, batch_ranges, next_batch, parse_fail_on_data_loss

# Spark's Kafka source schema (built here, not parsed from DDL: executors have no SparkContext).
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
        ),
    ]
)

__all__ = ["SCHEMA", "DisklessDataSource", "DisklessSourceError"]

log = logging.getLogger("diskless.spark")

# A latest offset below the query's position under the same topic id is asked again this many
# times, this far apart, before it counts as data loss: a new leader's high watermark (and so its
# last stable offset) may lag the old leader's for a moment, as in Kafka (Spark's Kafka source
# retries likewise, fetchOffset.numRetries). An AvailableNow run asks a partition without a leader
# for its end as many times.
BACKWARDS_RETRIES = 3
BACKWARDS_RETRY_S = 0.5


def arrow_schema() -> pa.Schema:
    """The Arrow schema Spark checks read batches against (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """Offsets [start, end) of one topic partition: one Spark partition's work."""

    part: PartitionInfo
    brokers: tuple[tuple[int, str, int], ...]
    start: int
    end: int
    settings: Settings = field(repr=False)  # with the cluster secret the driver resolved
    fail_on_data_loss: bool = True  # records of the range gone when it is read: fail, or skip them


def _topics_option(options: dict[str, str]) -> tuple[list[str] | None, re.Pattern[str] | None]:
    names = options.get("topic") or options.get("subscribe") or options.get("topics")
    pattern = options.get("subscribepattern")
    if bool(names) == bool(pattern):
        raise DisklessSourceError("give exactly one of the options topic / subscribe (comma list) or subscribePattern")
    if pattern:
        try:
            return None, re.compile(pattern)
        except re.error as exc:
            raise DisklessSourceError(f"subscribePattern {pattern!r}: {exc}") from exc
    assert names is not None
    topics = [t.strip() for t in names.split(",") if t.strip()]
    if not topics:
        raise DisklessSourceError("option topic names no topic")
    return topics, None


def _offsets_spec(name: str, text: str | None, default: str) -> str | dict[str, dict[str, int]]:
    text = (text or default).strip()
    # The keywords in any case ("LATEST"), as Spark's Kafka source compares them lower-cased.
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        spec = json.loads(text)
        out: dict[str, dict[str, int]] = {}
        for topic, parts in spec.items():
            out[str(topic)] = {}
            for index, offset in parts.items():
                # Whole numbers only (a cast would read 1.5, true or "12" as offsets), and partitions
                # keyed as their number prints, which is how they are looked up ("00" is "0").
                if not isinstance(offset, int) or isinstance(offset, bool):
                    raise TypeError(f"offset {offset!r} of partition {index!r} is not an integer")
                out[str(topic)][str(int(index))] = offset
        return out
    except (ValueError, AttributeError, TypeError) as exc:
        raise DisklessSourceError(
            f'{name} must be earliest, latest or JSON like {{"topic": {{"0": 23}}}}, not {text!r} ({exc})'
        ) from exc


def _int_option(options: dict[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise DisklessSourceError(f"option {name} must be an integer, not {raw!r}") from exc
    if value < 0:
        raise DisklessSourceError(f"option {name} must not be negative ({value})")
    return value


class _Plan:
    """Driver-side planning: which partitions, and which offsets, from options and the cluster."""

    def __init__(self, options: dict[str, str], streaming: bool) -> None:
        self.options = {k.lower(): v for k, v in options.items()}
        self.settings: Settings = settings_from_options(options)
        self.topics, self.pattern = _topics_option(self.options)
        self.starting = _offsets_spec(
            "startingOffsets", self.options.get("startingoffsets"), "latest" if streaming else "earliest"
        )
        self.ending = _offsets_spec("endingOffsets", self.options.get("endingoffsets"), "latest")
        if isinstance(self.starting, str) and self.starting == "latest" and not streaming:
            raise DisklessSourceError("startingOffsets=latest is not allowed for a batch query (it reads nothing)")
        if streaming and "endingoffsets" in self.options:
            raise DisklessSourceError("endingOffsets is not allowed for a streaming query")
        self.starting_ts = _int_option(self.options, "startingTimestamp")
        self.ending_ts = _int_option(self.options, "endingTimestamp")
        self.max_records = _int_option(self.options, "maxRecordsPerPartition")
        self.max_per_trigger = _int_option(self.options, "maxOffsetsPerTrigger")
        if self.max_records == 0 or self.max_per_trigger == 0:
            raise DisklessSourceError("maxRecordsPerPartition and maxOffsetsPerTrigger must be positive")
        self.fail_on_data_loss = parse_fail_on_data_loss(self.options)

    async def partitions(self, client: ClusterClient) -> list[PartitionInfo]:
        view = await client.metadata(self.topics)
        # The whole name must match, as Kafka's consumer (and Spark's Kafka source) subscribe.
        # Topics in error are matched too: a read of one fails (view.partitions), as it should.
        listed = {*view.topics, *view.errors}
        names = self.topics if self.topics is not None else sorted(t for t in listed if self.pattern.fullmatch(t))  # type: ignore[union-attr]
        if not names:
            raise DisklessSourceError(f"subscribePattern {self.pattern.pattern!r} matches no topic")  # type: ignore[union-attr]
        return [p for name in names for p in view.partitions(name)]

    async def listing(self, client: ClusterClient) -> tuple[list[PartitionInfo], set[str]]:
        """For a streaming query between micro-batches: the partitions of the topics read that exist
        now, and the topics the cluster answered for with an error other than unknown (a leader
        being elected...). A topic deleted is simply absent (the caller judges what that means)."""
        view = await client.metadata(self.topics, strict=False)
        if self.topics is not None:
            names = list(self.topics)
        else:
            names = sorted(t for t in {*view.topics, *view.errors} if self.pattern.fullmatch(t))  # type: ignore[union-attr]
        parts: list[PartitionInfo] = []
        unready: set[str] = set()
        for name in names:
            code = view.errors.get(name)
            if code is None and name in view.topics:
                parts.extend(view.topics[name])
            elif code is not None and code not in (ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id):
                unready.add(name)
        return parts, unready

    def _resolve_spec(
        self, name: str, spec: str | dict[str, dict[str, int]], parts: list[PartitionInfo], default: int
    ) -> list[int]:
        """Requested offsets per partition (EARLIEST/LATEST markers or absolute offsets)."""
        if isinstance(spec, str):
            return [EARLIEST if spec == "earliest" else LATEST] * len(parts)
        known = {(p.topic, p.index) for p in parts}
        for topic, entries in spec.items():
            for index in entries:
                if (topic, int(index)) not in known:
                    topics = {p.topic for p in parts}
                    what = f"partition {index} of topic {topic!r}" if topic in topics else f"topic {topic!r}"
                    raise DisklessSourceError(f"{name} names {what}, which is not read (does it exist?)")
        return [spec.get(p.topic, {}).get(str(p.index), default) for p in parts]

    async def offsets(
        self, client: ClusterClient, parts: list[PartitionInfo], which: str
    ) -> tuple[list[int], list[int], list[int]]:
        """(wanted, earliest, latest) per partition for ``which`` = "start" or "end"."""
        earliest = await client.list_offsets([(p, EARLIEST) for p in parts])
        latest = await client.list_offsets([(p, LATEST) for p in parts])
        spec = self.starting if which == "start" else self.ending
        ts = self.starting_ts if which == "start" else self.ending_ts
        if ts is not None:
            found = await client.list_offsets([(p, ts) for p in parts])
            wanted = [f if f >= 0 else last for f, last in zip(found, latest, strict=True)]
        else:
            requested = self._resolve_spec(
                "startingOffsets" if which == "start" else "endingOffsets",
                spec,
                parts,
                EARLIEST if which == "start" else LATEST,
            )
            wanted = [
                first if r == EARLIEST else last if r == LATEST else r
                for r, first, last in zip(requested, earliest, latest, strict=True)
            ]
        return wanted, earliest, latest


def _check_range(
    part: PartitionInfo, start: int, end: int, earliest: int, latest: int, loss: DataLossPolicy | None = None
) -> int:
    """The range's start, once checked: a start below the log start offset is data loss (records
    deleted by retention or DeleteRecords), read from the log start offset if ``loss`` tolerates it."""
    where = f"{part.topic}-{part.index}"
    if start < earliest:
        (loss or DataLossPolicy(fail=True)).report(
            ("deleted", part.topic, part.index, start, earliest),
            f"{where}: starting offset {start} is before the log start offset {earliest} (records deleted by "
            "retention or DeleteRecords)",
            f"the partition is read from offset {earliest} on",
        )
        start = earliest
        end = max(end, start)
    if end > latest:
        raise DisklessSourceError(f"{where}: ending offset {end} is past the latest readable offset {latest}")
    if start > end:
        raise DisklessSourceError(f"{where}: starting offset {start} is after ending offset {end}")
    return start


def _split(
    part: PartitionInfo,
    brokers: tuple[tuple[int, str, int], ...],
    start: int,
    end: int,
    plan: _Plan,
    settings: Settings,
) -> list[RangePartition]:
    if start >= end:
        return []
    step = plan.max_records or (end - start)
    return [
        RangePartition(part, brokers, s, min(s + step, end), settings, plan.fail_on_data_loss)
        for s in range(start, end, step)
    ]


async def _latest_again(
    client: ClusterClient, parts: list[PartitionInfo], latest: list[int | None], wanted: Callable[[int], bool]
) -> None:
    """Ask the partitions ``wanted`` picks (by index) for their LATEST offset again, in ``latest``,
    BACKWARDS_RETRIES times BACKWARDS_RETRY_S apart, until it picks none."""
    for _ in range(BACKWARDS_RETRIES):
        again_of = [i for i in range(len(parts)) if wanted(i)]
        if not again_of:
            return
        await asyncio.sleep(BACKWARDS_RETRY_S)
        answers = await client.try_list_offsets([(parts[i], LATEST) for i in again_of])
        for i, offset in zip(again_of, answers, strict=True):
            latest[i] = offset


def _brokers(client: ClusterClient) -> tuple[tuple[int, str, int], ...]:
    return tuple((node, host, port) for node, (host, port) in sorted(client.view.brokers.items()))


def _read(partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """An executor's read of one range: Arrow batches as they are decoded."""
    schema = arrow_schema()
    loop = asyncio.new_event_loop()
    client = ClusterClient(partition.settings)
    client.view.brokers = {node: (host, port) for node, host, port in partition.brokers}
    loss = DataLossPolicy(partition.fail_on_data_loss, log)
    reader = PartitionReader(client, partition.part, partition.start, partition.end, schema, loss)
    try:
        while True:
            batch = loop.run_until_complete(reader.next_batch())
            if batch is None:
                return
            yield batch
    finally:
        loop.run_until_complete(reader.close())
        loop.run_until_complete(client.close())
        loop.close()


class DisklessReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = dict(options)
        self.settings = settings_from_options(options)

    def partitions(self) -> Sequence[InputPartition]:
        plan = _Plan(self.options, streaming=False)

        async def run() -> list[RangePartition]:
            client = ClusterClient(plan.settings)
            try:
                parts = await plan.partitions(client)
                starts, earliest, _ = await plan.offsets(client, parts, "start")
                # Ends are checked against the latest offsets of their own ListOffsets: records
                # produced since the starts were resolved make "latest" larger than it was then.
                ends, _, latest = await plan.offsets(client, parts, "end")
                out: list[RangePartition] = []
                brokers = _brokers(client)
                settings = await client.with_secret()
                loss = DataLossPolicy(plan.fail_on_data_loss, log)
                for part, s, e, first, last in zip(parts, starts, ends, earliest, latest, strict=True):
                    s = _check_range(part, s, e, first, last, loss)
                    out.extend(_split(part, brokers, s, e, plan, settings))
                return out
            finally:
                await client.close()

        ranges = asyncio.run(run())
        # Spark needs at least one partition; an empty range reads nothing.
        return ranges or [RangePartition(PartitionInfo("", "", 0, -1, ()), (), 0, 0, self.settings)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        if partition.start >= partition.end:
            return iter(())
        return _read(partition)


class DisklessStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the topics read; offsets and data loss as ``offsets`` describes them.

    Under ``Trigger.AvailableNow`` the query reads what the topics held when it started, in as
    many micro-batches as ``maxOffsetsPerTrigger`` asks, then ends, as Spark's Kafka source:
    ``prepareForTriggerAvailableNow`` notes each partition's end then, and no batch goes past it.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = dict(options)
        self.plan = _Plan(self.options, streaming=True)
        self.settings = self.plan.settings
        self.loss = DataLossPolicy(self.plan.fail_on_data_loss, log)
        self._parts: dict[tuple[str, int], PartitionInfo] = {}
        self._brokers: tuple[tuple[int, str, int], ...] = ()
        # Trigger.AvailableNow: (topic, partition) -> (topic id, end offset) when the query
        # started; None for other triggers.
        self._available_now: dict[tuple[str, int], tuple[str, int]] | None = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    async def _snapshot(self, client: ClusterClient) -> list[PartitionInfo]:
        parts = await self.plan.partitions(client)
        self._remember(client, parts)
        self.settings = await client.with_secret()
        return parts

    def _remember(self, client: ClusterClient, parts: list[PartitionInfo]) -> None:
        self._parts = {(p.topic, p.index): p for p in parts}
        self._brokers = _brokers(client)

    def initialOffset(self) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            client = ClusterClient(self.settings)
            try:
                parts = await self._snapshot(client)
                starts, earliest, latest = await self.plan.offsets(client, parts, "start")
                positions: dict[tuple[str, int], int] = {}
                for part, s, first, last in zip(parts, starts, earliest, latest, strict=True):
                    positions[(part.topic, part.index)] = _check_range(part, s, last, first, last, self.loss)
                return StreamOffset(positions, {p.topic: p.topic_id for p in parts}).to_json()
            finally:
                await client.close()

        return self._run(run())

    def prepareForTriggerAvailableNow(self) -> None:
        """Note where every partition ends now: this run reads up to there and no further. A
        partition that cannot say (no leader) is asked again a few times, as Spark's Kafka source
        retries (fetchOffset.numRetries); one that still cannot, or appears later (new partitions,
        a topic created or re-created after this), is left to the next run, so the run always ends."""

        async def run() -> dict[tuple[str, int], tuple[str, int]]:
            client = ClusterClient(self.settings)
            try:
                parts, _ = await self.plan.listing(client)
                self._remember(client, parts)
                self.settings = await client.with_secret()
                latest = await client.try_list_offsets([(p, LATEST) for p in parts])
                await _latest_again(client, parts, latest, lambda i: latest[i] is None)
            finally:
                await client.close()
            return {(p.topic, p.index): (p.topic_id, x) for p, x in zip(parts, latest, strict=True) if x is not None}

        self._available_now = self._run(run())

    def _target(self, topic: str, index: int, topic_id: str, latest: int) -> int:
        """How far a partition may be read in this batch: its end now, or under AvailableNow at
        most its end when the query started (nothing of another incarnation of the topic)."""
        if self._available_now is None:
            return latest
        noted = self._available_now.get((topic, index))
        if noted is None or noted[0] != topic_id:
            return -1
        return min(latest, noted[1])

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.plan.max_per_trigger is not None:
            return ReadMaxRows(self.plan.max_per_trigger)
        return ReadAllAvailable()

    async def _bounds(self, client: ClusterClient, start: StreamOffset) -> tuple[list[Bounds], set[str]]:
        """The partitions of the topics read as the cluster shows them now (offsets None where
        they cannot answer yet), and the topics it answered for with an error."""
        parts, unready = await self.plan.listing(client)
        self._remember(client, parts)
        self.settings = await client.with_secret()
        earliest = await client.try_list_offsets([(p, EARLIEST) for p in parts])
        latest = await client.try_list_offsets([(p, LATEST) for p in parts])

        def behind(i: int) -> bool:
            p, offset = parts[i], latest[i]
            return (
                offset is not None
                and start.ids.get(p.topic, p.topic_id) == p.topic_id
                and start.positions.get((p.topic, p.index), -1) > offset
            )

        await _latest_again(client, parts, latest, behind)
        bounds = [Bounds(p.topic, p.index, p.topic_id, e, x) for p, e, x in zip(parts, earliest, latest, strict=True)]
        return bounds, unready

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begun = StreamOffset.parse(start)

        async def run() -> tuple[list[Bounds], set[str]]:
            client = ClusterClient(self.settings)
            try:
                return await self._bounds(client, begun)
            finally:
                await client.close()

        now, unready = self._run(run())
        plans, ids = next_batch(begun, now, unready, self.loss)
        end: dict[tuple[str, int], int] = {}
        lags = []
        for n in plans:
            end[(n.topic, n.index)] = n.begin
            target = self._target(n.topic, n.index, ids.get(n.topic, ""), n.latest)
            if not n.first_seen and target > n.begin:
                lags.append(dataclasses.replace(n, latest=target))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        total = sum(n.latest - n.begin for n in lags)
        for n in lags:
            take = n.latest - n.begin
            if budget is not None and total > budget:
                # Proportionally to each partition's lag, as Spark's Kafka source rate-limits.
                take = min(take, (take * budget) // total)
            end[(n.topic, n.index)] = n.begin + take
        if budget is not None and total > budget and all(end[(n.topic, n.index)] == n.begin for n in lags):
            # Rounding gave nobody anything: let the most lagging partition advance.
            n = max(lags, key=lambda n: n.latest - n.begin)
            end[(n.topic, n.index)] = n.begin + min(n.latest - n.begin, budget)
        return StreamOffset(end, ids).to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begun, planned = StreamOffset.parse(start), StreamOffset.parse(end)

        def stale() -> bool:
            # Partitions the batch names that this snapshot lacks, or has under another topic id
            # (a query restarted, a topic re-created since the last listing): list again.
            return not self._parts or any(
                (p := self._parts.get(key)) is None or p.topic_id != planned.ids.get(key[0], p.topic_id)
                for key in planned.positions
            )

        async def run() -> list[RangePartition]:
            client = ClusterClient(self.settings)
            client.view.brokers = {node: (host, port) for node, host, port in self._brokers}
            try:
                if stale():
                    parts, _ = await self.plan.listing(client)
                    self._remember(client, parts)
                    self.settings = await client.with_secret()
                current = {key: p.topic_id for key, p in self._parts.items()}
                ranges = batch_ranges(begun, planned, current, self.loss)
                # A topic re-created within the batch is read from where the new topic starts now.
                restart = [r for r in ranges if r.begin is None]
                earliest = await client.list_offsets([(self._parts[(r.topic, r.index)], EARLIEST) for r in restart])
            finally:
                await client.close()
            first = {(r.topic, r.index): e for r, e in zip(restart, earliest, strict=True)}
            out: list[RangePartition] = []
            for r in ranges:
                part = self._parts[(r.topic, r.index)]
                begin = first[(r.topic, r.index)] if r.begin is None else r.begin
                out.extend(_split(part, self._brokers, begin, r.stop, self.plan, self.settings))
            return out

        return self._run(run())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return _read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in the cluster."""


@dataclass
class _Written(WriterCommitMessage):
    records: int


class DisklessWriter(DataSourceWriter):
    """Rows (key, value, headers, partition[, topic]) produced with an idempotent producer."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = {k.lower(): v for k, v in options.items()}
        self.settings = settings_from_options(options)
        self.topic = self.options.get("topic")
        names = set(schema.fieldNames())
        if "value" not in names:
            raise DisklessSourceError("the DataFrame written needs a value column (key, headers, partition optional)")
        if not self.topic and "topic" not in names:
            raise DisklessSourceError("give option topic or a topic column")
        if self.topic:

            async def run() -> None:
                client = ClusterClient(self.settings)
                try:
                    await client.metadata([self.topic])  # type: ignore[list-item]
                finally:
                    await client.close()

            asyncio.run(run())

    def write(self, iterator: Iterator[Any]) -> _Written:
        from confluent_kafka import KafkaException, Producer

        timeout_ms = int(self.settings.timeout_s * 1000)
        producer = Producer(
            {
                "bootstrap.servers": ",".join(f"{h}:{p}" for h, p in self.settings.bootstrap),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": max(timeout_ms, 5000),
                "client.id": "diskless-spark-writer",
            }
        )
        errors: list[str] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

        def as_bytes(value: Any) -> bytes | None:
            if value is None or isinstance(value, bytes):
                return value
            if isinstance(value, (bytearray, memoryview)):
                return bytes(value)
            return str(value).encode()

        count = 0
        for row in iterator:
            fields = row.asDict() if hasattr(row, "asDict") else dict(row)
            topic = self.topic or fields.get("topic")
            if not topic:
                raise DisklessSourceError("a row has no topic (and no topic option is set)")
            kwargs: dict[str, Any] = {"value": as_bytes(fields.get("value")), "key": as_bytes(fields.get("key"))}
            if fields.get("partition") is not None:
                kwargs["partition"] = int(fields["partition"])
            headers = fields.get("headers")
            if headers:
                kwargs["headers"] = [(h["key"], as_bytes(h["value"])) for h in headers]
            while True:
                try:
                    producer.produce(topic, on_delivery=delivered, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: let deliveries drain it
                except KafkaException as exc:
                    raise DisklessSourceError(f"producing to {topic}: {exc}") from exc
            producer.poll(0)
            count += 1
            if errors:
                break
        remaining = producer.flush(self.settings.timeout_s + 5)
        if errors:
            raise DisklessSourceError(f"{len(errors)} records were not written: {errors[:3]}")
        if remaining:
            raise DisklessSourceError(f"{remaining} records not acknowledged within {self.settings.timeout_s} s")
        return _Written(count)


class DisklessDataSource(DataSource):
    """``format("diskless")``: see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return "diskless"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return DisklessReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DisklessStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DisklessWriter(self.options, schema)

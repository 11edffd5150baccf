"""Streaming offsets of the ``diskless`` data source, and what a micro-batch reads when the log
under them changed between two triggers (records deleted, a topic deleted or re-created).

An offset is Spark's Kafka source's JSON, ``{"topic": {"partition": next offset}}``, plus the id of
each topic's incarnation the offsets belong to, under a key no topic can have ('@' is not allowed
in Kafka topic names): ``{"t": {"0": 12}, "@topicIds": {"t": "<uuid>"}}``. Offsets of a topic
deleted and re-created under the same name start again at 0, so only the id tells an offset of the
old topic from one of the new; offsets going backwards would miss a new topic that had already
grown past the old offsets (it would be read from the old offsets on, its first records skipped).
Checkpoints written before ids were kept have none: their first micro-batch only compares offsets.

What to do about records that are gone follows Spark's Kafka source (``failOnDataLoss``, see
``cluster.DataLossPolicy``): fail the query, or warn and go on: from the new topic's earliest
offsets for a re-created topic (Spark's Kafka source, blind to ids, resumes a partition whose
offsets went back at its new end, skipping what the new topic held by then; here a re-creation is
known), from the log start offset when records were deleted below the query's position, and from
the log's end when it went backwards under the same id (truncated: what was read up to the old
position is not read again). A topic gone keeps its offsets and id: a topic that
comes back under the same id (a broker that did not list it for a moment) is read on from them,
without reading anything twice; a new topic of that name is a re-creation. A partition gone from
a topic that still exists (re-created with fewer partitions) is dropped.

Everything here is pure (no I/O): ``source.DisklessStreamReader`` lists the cluster and applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .cluster import DataLossPolicy, DisklessSourceError

TOPIC_IDS = "@topicIds"

Key = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class StreamOffset:
    """A streaming offset: the next offset to read per partition, and the topics' ids."""

    positions: dict[Key, int]
    ids: dict[str, str]

    @classmethod
    def parse(cls, offset: Mapping[str, Any]) -> StreamOffset:
        positions: dict[Key, int] = {}
        ids: dict[str, str] = {}
        for topic, value in offset.items():
            if topic == TOPIC_IDS:
                ids = {str(t): str(i) for t, i in value.items()}
                continue
            for index, position in value.items():
                positions[(topic, int(index))] = int(position)
        return cls(positions, ids)

    def to_json(self) -> dict[str, Any]:
        """The offset Spark checkpoints; sorted, as Spark compares offsets by their JSON text (an
        offset written in another order would look like new data)."""
        out: dict[str, Any] = {}
        for topic, index in sorted(self.positions):
            out.setdefault(topic, {})[str(index)] = self.positions[(topic, index)]
        ids = {t: i for t, i in sorted(self.ids.items()) if t in out}
        if ids:
            out[TOPIC_IDS] = ids
        return out


@dataclass(frozen=True)
class Bounds:
    """One partition as the cluster shows it now; offsets None while it cannot answer (no leader,
    or its leader does not know the topic yet)."""

    topic: str
    index: int
    topic_id: str
    earliest: int | None
    latest: int | None

    @property
    def ready(self) -> bool:
        return self.earliest is not None and self.latest is not None


@dataclass(frozen=True)
class Next:
    """One partition in the next micro-batch: it may read offsets [begin, latest) (rate limits
    take less). A partition ``first_seen`` reads nothing yet: the batch only records where it
    starts, so that the start of its first read is in the checkpoint, never re-derived."""

    topic: str
    index: int
    begin: int
    latest: int
    first_seen: bool = False


def next_batch(
    start: StreamOffset, now: list[Bounds], unready: set[str], loss: DataLossPolicy
) -> tuple[list[Next], dict[str, str]]:
    """Where the micro-batch after ``start`` reads each partition from, given the partitions of the
    topics read as the cluster shows them ``now`` (``unready``: topics the cluster answered for
    with an error, left as they are until it answers); and the topic ids of the batch's end offset.

    Data loss is reported to ``loss``, which raises (failOnDataLoss) or lets the query go on as
    the module docstring says.
    """
    by_topic: dict[str, list[Bounds]] = {}
    for bounds in now:
        by_topic.setdefault(bounds.topic, []).append(bounds)
    out: list[Next] = []
    ids: dict[str, str] = {}

    for (topic, index), begun in sorted(start.positions.items()):
        known = start.ids.get(topic)
        if topic not in by_topic and topic not in unready:
            loss.report(
                ("gone", topic, index, known),
                f"{topic}-{index}: topic {topic!r}" + (f" (topic id {known})" if known else "") + " is gone "
                f"(deleted); partition {index} had been read up to offset {begun}",
                "its offsets are kept: if the topic comes back, it is read on from them, and a new topic of "
                "that name from its earliest offsets",
            )
        if topic not in by_topic:
            # Absent (deleted, or a broker that does not list it yet) or in error: left as it is. The id
            # kept tells a topic that comes back from a new one of the same name.
            out.append(Next(topic, index, begun, begun))
            if known is not None:
                ids[topic] = known
        elif all(b.index != index for b in by_topic[topic]):
            loss.report(
                ("gone", topic, index, known),
                f"{topic}-{index}: partition {index} of topic {topic!r} is gone (the topic was re-created with "
                f"fewer partitions); it had been read up to offset {begun}",
                "the partition is no longer read",
            )

    for topic, parts in by_topic.items():
        parts.sort(key=lambda b: b.index)
        known, current = start.ids.get(topic), parts[0].topic_id
        read = {b.index: start.positions[(topic, b.index)] for b in parts if (topic, b.index) in start.positions}
        if known is not None and known != current and read:
            earliest = ", ".join(f"{b.index}: {b.earliest}" for b in parts if b.earliest is not None)
            positions = ", ".join(f"{i}: {p}" for i, p in sorted(read.items()))
            loss.report(
                ("recreated", topic, known, current),
                f"topic {topic!r} was deleted and re-created (topic id {known} is now {current}): the old topic had "
                f"been read up to offsets {{{positions}}} (partition: next offset), and whatever it held past them "
                f"cannot be read any more; the new topic's offsets start again"
                + (f" ({{{earliest}}})" if earliest else ""),
                "the new topic is read from its earliest offsets",
            )
            if not all(b.ready for b in parts):
                # Every partition of the new topic must answer before any moves to it: the batch's
                # end offset names one id per topic, so a partition left at an offset of the old
                # topic must keep the old id (then none moves yet; the next trigger tries again).
                out.extend(Next(topic, i, p, p) for i, p in sorted(read.items()))
                ids[topic] = known
                continue
            ids[topic] = current
            for b in parts:
                assert b.earliest is not None and b.latest is not None
                out.append(Next(topic, b.index, b.earliest, b.latest, first_seen=b.index not in read))
            continue

        # The same topic (or a checkpoint from before ids were kept: offsets alone tell).
        ids[topic] = current
        for b in parts:
            begun = read.get(b.index)
            if not b.ready:
                if begun is not None:
                    out.append(Next(topic, b.index, begun, begun))  # asked again at the next trigger
                continue
            assert b.earliest is not None and b.latest is not None
            if begun is None:
                out.append(Next(topic, b.index, b.earliest, b.earliest, first_seen=True))
            elif begun > b.latest:
                loss.report(
                    ("backwards", topic, b.index, begun, b.latest),
                    f"{topic}-{b.index}: the log went back from offset {begun} to {b.latest} "
                    + (
                        f"under the same topic id {current}: records the query read from offset {b.latest} on are "
                        "gone (the log was truncated)"
                        if known
                        else f"(topic id {current} now; the checkpoint has none to compare): records the query read "
                        f"from offset {b.latest} on are gone (the log was truncated, or the topic re-created)"
                    ),
                    f"the partition is read from offset {b.latest} on, where its log ends now",
                )
                out.append(Next(topic, b.index, b.latest, b.latest))
            elif begun < b.earliest:
                loss.report(
                    ("deleted", topic, b.index, begun, b.earliest),
                    f"{topic}-{b.index}: offsets [{begun}, {b.earliest}) were deleted before they were read "
                    f"(retention or DeleteRecords): the log starts at offset {b.earliest} now",
                    f"the partition is read from offset {b.earliest} on",
                )
                out.append(Next(topic, b.index, b.earliest, b.latest))
            else:
                out.append(Next(topic, b.index, begun, b.latest))
    out.sort(key=lambda n: (n.topic, n.index))
    return out, ids


@dataclass(frozen=True)
class Range:
    """Offsets [begin, stop) of one partition in a micro-batch; ``begin`` None: from the earliest
    offset the partition has now (its topic was re-created within the batch)."""

    topic: str
    index: int
    begin: int | None
    stop: int


def batch_ranges(
    start: StreamOffset, end: StreamOffset, current: Mapping[Key, str], loss: DataLossPolicy
) -> list[Range]:
    """The ranges micro-batch [start, end) reads, given the partitions that exist now and their
    topic ids (``current``). ``end`` was planned by ``next_batch`` against ``start`` (the topic
    ids of both then agree, or a re-creation was already reported), or against another offset
    (Trigger.AvailableNow's, which Spark plans from the query's initial offset): data loss is
    checked again here, and reported to ``loss``.
    """
    out: list[Range] = []
    for (topic, index), stop in sorted(end.positions.items()):
        begun = start.positions.get((topic, index))
        if begun is None:
            continue  # first seen: its batch only records where it starts
        before, planned, now = start.ids.get(topic), end.ids.get(topic), current.get((topic, index))
        crossing = before is not None and planned is not None and before != planned
        if stop == begun and not crossing:
            continue  # nothing to read (a partition that cannot answer, or a topic gone, keeps its offset)
        if now is None:
            loss.report(
                ("gone", topic, index, planned),
                f"{topic}-{index}: partition {index} of topic {topic!r} is gone (deleted since this batch was "
                f"planned), so its offsets [{begun}, {stop}) cannot be read",
                f"offsets [{begun}, {stop}) are skipped",
            )
        elif planned is not None and now != planned:
            loss.report(
                ("recreated", topic, planned, now),
                f"topic {topic!r} was deleted and re-created (topic id {planned} is now {now}) since this batch "
                f"was planned, so offsets [{begun}, {stop}) of partition {index} of the old topic cannot be read",
                f"offsets [{begun}, {stop}) are skipped",
            )
        elif crossing:
            loss.report(
                ("recreated", topic, before, planned),
                f"topic {topic!r} was deleted and re-created (topic id {before} is now {planned}): the old topic had "
                f"been read up to offset {begun} of partition {index}, and whatever it held past it cannot be read "
                "any more",
                "the new topic is read from its earliest offsets",
            )
            out.append(Range(topic, index, None, stop))
        elif stop < begun:
            loss.report(
                ("backwards", topic, index, begun, stop),
                f"{topic}-{index}: the log went back from offset {begun} to {stop}: records the query read from "
                f"offset {stop} on are gone (the log was truncated, or the topic re-created)",
                f"the partition is read from offset {stop} on, where its log ended",
            )
        elif stop > begun:
            out.append(Range(topic, index, begun, stop))
    return out


def parse_fail_on_data_loss(options: Mapping[str, str]) -> bool:
    """``failOnDataLoss`` (options lower-cased): true (the default) or false, in any case, as
    Spark's Kafka source reads it."""
    raw = options.get("failondataloss")
    if raw is None:
        return True
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise DisklessSourceError(f"option failOnDataLoss must be true or false, not {raw!r}")
    return value == "true"

"""Cluster metadata as a sans-IO state machine: brokers, topics, partitions and topic configs.

Every change (create/delete topic, add partitions, alter configs) is validated here and raises
``MetadataError`` carrying the Kafka error code a real broker returns. Storage is someone else's
job: ``LocalMetadataStore`` keeps a single broker's copy in a JSON file; the cluster keeps it in
etcd. The JSON form is the same in both places.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.files import replace_durably
from diskless.log.config import ConfigError, canonical_name, validate_overrides

from .client_quotas import RECORD_PREFIX, Entity, decode_values, entity_from_path, entity_of
from .producer_ids import LocalProducerIdStore, ProducerIdBlock

log = structlog.get_logger(__name__)

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


class MetadataError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class BrokerInfo:
    """A live broker. ``host``/``port`` are its inter-broker listener's address; ``endpoints`` has
    every listener's advertised ``host:port`` by listener name (clients are shown the listener they
    came in on, as Kafka does)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    endpoints: dict[str, str] = field(default_factory=dict)
    # Which process holds this node id: a new one per start. A broker that finds its node id
    # registered by another incarnation was superseded and must not register again (Kafka's
    # incarnation id and DuplicateBrokerRegistration). Empty in records of older versions.
    incarnation: str = ""

    def endpoint(self, listener: str | None) -> tuple[str, int] | None:
        """The address of ``listener`` on this broker; the inter-broker address for a broker that
        registered without listener names (an older version); None if it lacks that listener."""
        if not self.endpoints or listener is None:
            return self.host, self.port
        address = self.endpoints.get(listener)
        if address is None:
            return None
        host, _, port = address.rpartition(":")
        return host, int(port)


@dataclass
class PartitionState:
    """A partition's replicas, leader, leader epoch and ISR. During a reassignment (KIP-455),
    ``replicas`` is the target set followed by the replicas leaving it; ``adding`` are target
    replicas that are not yet in sync, ``removing`` the replicas that leave once they are
    (``cluster/reassignment.py``)."""

    replicas: list[int]
    leader: int
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)
    adding: list[int] = field(default_factory=list)
    removing: list[int] = field(default_factory=list)


@dataclass
class TopicMetadata:
    name: str
    topic_id: str
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False


def validate_topic_name(name: str) -> None:
    if not name or name in (".", "..") or len(name) > MAX_TOPIC_NAME or not _LEGAL_TOPIC.fullmatch(name):
        raise MetadataError(ErrorCode.invalid_topic_exception, f"Topic name {name!r} is illegal")


class ClusterMetadata:
    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicMetadata] = {}
        self.controller_id = -1
        self.wal_manager: tuple[str, int] | None = None  # where representatives send commit notices
        # Dynamic broker configs by node id, "default" for the cluster-wide ones (broker_configs.py).
        self.broker_configs: dict[str, dict[str, str]] = {}
        # Client quotas by entity (cluster/client_quotas.py), cluster-wide.
        self.client_quotas: dict[Entity, dict[str, float]] = {}
        self.generation = 0  # moves on every applied change (answers built from this copy go stale)
        # Moves when topics or brokers change (not on leader/ISR churn): an answer built before a
        # topic was created, grown or deleted is never reused, however young.
        self.topology_generation = 0
        self._name_of_id: dict[str, str] = {}  # a cache for topic_by_id, checked on every hit

    # --- queries -------------------------------------------------------------------------------

    def topic_by_id(self, topic_id: str) -> TopicMetadata | None:
        topic = self.topics.get(self._name_of_id.get(topic_id, ""))
        if topic is not None and topic.topic_id == topic_id:
            return topic
        # ``topics`` is changed in place by its writers: rebuild the cache when it missed.
        self._name_of_id = {t.topic_id: t.name for t in self.topics.values()}
        topic = self.topics.get(self._name_of_id.get(topic_id, ""))
        return topic if topic is not None and topic.topic_id == topic_id else None

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        meta = self.topics.get(topic)
        if meta is None or not 0 <= partition < len(meta.partitions):
            return None
        return meta.partitions[partition]

    def partition_by_id(self, topic_id: str, partition: int) -> PartitionState | None:
        """A partition of the topic incarnation ``topic_id``: None once that incarnation is deleted,
        even when its name now belongs to a re-created topic."""
        meta = self.topic_by_id(topic_id)
        if meta is None or not 0 <= partition < len(meta.partitions):
            return None
        return meta.partitions[partition]

    # --- changes -------------------------------------------------------------------------------

    def _assign(self, count: int, replication_factor: int, first_partition: int) -> list[PartitionState]:
        """Round-robin replicas over brokers, alternating racks so replicas land in distinct AZs."""
        ids = self._rack_alternating_brokers()
        out = []
        for p in range(first_partition, first_partition + count):
            out.append(initial_state([ids[(p + r) % len(ids)] for r in range(replication_factor)]))
        return out

    def _rack_alternating_brokers(self) -> list[int]:
        by_rack: dict[str | None, list[int]] = {}
        for node_id in sorted(self.brokers):
            by_rack.setdefault(self.brokers[node_id].rack, []).append(node_id)
        racks = sorted(by_rack, key=lambda r: "" if r is None else r)
        ordered: list[int] = []
        while any(by_rack.values()):
            for rack in racks:
                if by_rack[rack]:
                    ordered.append(by_rack[rack].pop(0))
        return ordered

    def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        configs: Mapping[str, str | None],
        assignments: Sequence[Sequence[int]] = (),
        validate_only: bool = False,
        internal: bool = False,
    ) -> TopicMetadata:
        validate_topic_name(name)
        if name in self.topics:
            raise MetadataError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        # As Kafka: '.' and '_' collide in metric names, so names differing only there cannot coexist.
        colliding = [t for t in self.topics if t.replace(".", "_") == name.replace(".", "_")]
        if colliding:
            raise MetadataError(
                ErrorCode.invalid_topic_exception, f"Topic '{name}' collides with existing topic '{colliding[0]}'."
            )
        if assignments:
            if num_partitions != -1 or replication_factor != -1:
                raise MetadataError(
                    ErrorCode.invalid_request, "Both assignments and partitions/replication factor were set."
                )
            for replicas in assignments:
                if not replicas or len(set(replicas)) != len(replicas):
                    raise MetadataError(ErrorCode.invalid_replica_assignment, "Duplicate or empty replica list.")
                unknown = [b for b in replicas if b not in self.brokers]
                if unknown:
                    raise MetadataError(ErrorCode.invalid_replica_assignment, f"Unknown brokers {unknown}.")
        else:
            if num_partitions <= 0:
                raise MetadataError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
            if replication_factor <= 0:
                raise MetadataError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
            if replication_factor > len(self.brokers):
                raise MetadataError(
                    ErrorCode.invalid_replication_factor,
                    f"Replication factor: {replication_factor} larger than available brokers: {len(self.brokers)}.",
                )
        try:
            overrides = validate_overrides(configs)
        except ConfigError as exc:
            raise MetadataError(ErrorCode.invalid_config, str(exc)) from None
        if assignments:
            partitions = [initial_state(r) for r in assignments]
        else:
            partitions = self._assign(num_partitions, replication_factor, 0)
        topic = TopicMetadata(name, str(uuid.uuid4()), partitions, overrides, internal)
        if not validate_only:
            self.topics[name] = topic
        return topic

    def delete_topic(self, name: str) -> TopicMetadata:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise MetadataError(ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist.")
        return topic

    def _existing(self, name: str) -> TopicMetadata:
        topic = self.topics.get(name)
        if topic is None:
            raise MetadataError(ErrorCode.unknown_topic_or_partition, f"Topic '{name}' does not exist.")
        return topic

    def plan_new_partitions(
        self, name: str, count: int, assignments: Sequence[Sequence[int]] | None = None
    ) -> dict[int, PartitionState]:
        """States of the partitions that growing ``name`` to ``count`` partitions adds, placed by
        ``assignments`` (one replica list per new partition) when given, with Kafka's checks."""
        topic = self._existing(name)
        current = len(topic.partitions)
        if count <= current:
            raise MetadataError(
                ErrorCode.invalid_partitions,
                f"Topic currently has {current} partitions, which is higher than the requested {count}.",
            )
        rf = len(topic.partitions[0].replicas)
        if not assignments:
            return dict(enumerate(self._assign(count - current, rf, current), start=current))
        if len(assignments) != count - current:
            raise MetadataError(
                ErrorCode.invalid_replica_assignment,
                f"Increasing the number of partitions by {count - current} but {len(assignments)} assignments"
                " provided.",
            )
        for replicas in assignments:
            if len(replicas) != rf:
                raise MetadataError(
                    ErrorCode.invalid_replica_assignment,
                    f"Inconsistent replication factor between partitions, partition 0 has {rf} while"
                    f" partitions [{current}] has replication factor {len(replicas)}.",
                )
            if len(set(replicas)) != len(replicas):
                raise MetadataError(ErrorCode.invalid_replica_assignment, f"Duplicate brokers in {list(replicas)}.")
            unknown = [b for b in replicas if b not in self.brokers]
            if unknown:
                raise MetadataError(
                    ErrorCode.invalid_replica_assignment, f"Unknown broker(s) in replica assignment: {unknown}."
                )
        return {current + i: initial_state(list(r)) for i, r in enumerate(assignments)}

    def add_partitions(self, name: str, count: int, validate_only: bool = False) -> TopicMetadata:
        new = self.plan_new_partitions(name, count)
        topic = self.topics[name]
        if not validate_only:
            topic.partitions.extend(state for _, state in sorted(new.items()))
        return topic

    def plan_configs(self, name: str, updates: Mapping[str, str | None]) -> dict[str, str]:
        """A topic's overrides after set (value) / delete (None) updates, validated (alone, and
        together against Kafka's defaults: the broker's own defaults are the admin APIs' to add)."""
        current = self._existing(name).configs
        merged = dict(current)
        for key, value in updates.items():
            if value is None:
                merged.pop(canonical_name(key), None)
            else:
                merged[canonical_name(key)] = value
        try:
            return validate_overrides(merged, previous=current)
        except ConfigError as exc:
            raise MetadataError(ErrorCode.invalid_config, str(exc)) from None

    def alter_topic_configs(self, name: str, updates: Mapping[str, str | None], validate_only: bool = False) -> None:
        validated = self.plan_configs(name, updates)
        if not validate_only:
            self.topics[name].configs = validated

    # --- serialisation ---------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(
            {
                "cluster_id": self.cluster_id,
                "topics": [asdict(t) for t in self.topics.values()],
                "broker_configs": self.broker_configs,
                "client_quotas": [[list(e), v] for e, v in self.client_quotas.items()],
            },
            indent=1,
        )

    def load_json(self, text: str) -> None:
        data = json.loads(text)
        self.broker_configs = {k: dict(v) for k, v in data.get("broker_configs", {}).items()}
        self.client_quotas = {entity_of(tuple(p) for p in e): dict(v) for e, v in data.get("client_quotas", [])}
        self.topics = {}
        for raw in data.get("topics", []):
            parts = [PartitionState(**p) for p in raw.pop("partitions")]
            topic = TopicMetadata(partitions=parts, **raw)
            self.topics[topic.name] = topic


# --- records: the per-key form of metadata in etcd ------------------------------------------------


def broker_record(info: BrokerInfo) -> bytes:
    return json.dumps(asdict(info)).encode()


def broker_from_record(value: bytes) -> BrokerInfo:
    """The ``BrokerInfo`` a ``brokers/<id>`` record holds (ValueError, TypeError if unreadable)."""
    return BrokerInfo(**_known_fields(BrokerInfo, json.loads(value)))


def initial_state(replicas: Sequence[int]) -> PartitionState:
    """A new partition's state: led by its first replica, every replica in sync, epoch 0."""
    return PartitionState(replicas=list(replicas), leader=replicas[0], leader_epoch=0, isr=list(replicas))


def is_initial(state: PartitionState) -> bool:
    return bool(state.replicas) and state == initial_state(state.replicas)


def topic_record(topic: TopicMetadata) -> bytes:
    """A topic with its partitions' replica assignments: one key however many partitions it has
    (etcd caps a transaction at 128 operations by default). A partition's later states (leader,
    epoch, ISR) are ``partition_record``s; a partition without one is in its initial state."""
    return json.dumps(
        {
            "name": topic.name,
            "topic_id": topic.topic_id,
            "configs": topic.configs,
            "internal": topic.internal,
            "partitions": len(topic.partitions),
            "replicas": [p.replicas for p in topic.partitions],
        },
        separators=(",", ":"),
    ).encode()


def partition_record(state: PartitionState, topic_id: str) -> bytes:
    record = asdict(state)
    # No reassignment, no keys for one: records stay as they were before reassignments existed.
    for name in ("adding", "removing"):
        if not record[name]:
            del record[name]
    return json.dumps({**record, "topic_id": topic_id}).encode()


RecordKey = tuple[str, ...]


class UnreadableRecord(ValueError):
    """A stored metadata record this version cannot read (malformed, or a shape it does not know)."""


def _known_fields(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without the fields ``cls`` does not have: a newer version may add fields to its
    records (its broker registration, a partition state) while older brokers still read them,
    as Kafka's tagged fields allow during a rolling upgrade."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in raw.items() if key in names}


def apply_record(metadata: ClusterMetadata, path: str, value: bytes | None) -> list[RecordKey]:
    """Apply one stored record (``brokers/1``, ``topics/t``, ``partitions/t/0``, ``controller``).

    ``value`` None means the record was deleted. Returns what changed (a new topic's record also
    brings its partitions), empty if the record is not ours. ``UnreadableRecord`` for a record it
    cannot read, with the metadata left as it was for that key: the caller goes on with the others.
    """
    try:
        return _apply_record(metadata, path, value)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise UnreadableRecord(f"{path}: {exc!r}") from exc


def _apply_record(metadata: ClusterMetadata, path: str, value: bytes | None) -> list[RecordKey]:
    metadata.generation += 1
    parts = path.split("/")
    if parts[0] != "partitions":
        metadata.topology_generation += 1
    if parts[0] == "brokers" and len(parts) == 2:
        node_id = int(parts[1])
        if value is None:
            metadata.brokers.pop(node_id, None)
        else:
            metadata.brokers[node_id] = broker_from_record(value)
        return [("broker", parts[1])]
    if parts[0] == "controller" and len(parts) == 1:
        metadata.controller_id = -1 if value is None else int(json.loads(value)["node_id"])
        return [("controller",)]
    if parts[0] == "wal-manager" and len(parts) == 1:
        raw = None if value is None else json.loads(value)
        metadata.wal_manager = None if raw is None else (raw["host"], int(raw["port"]))
        return [("wal-manager",)]
    if parts[0] == "broker-configs" and len(parts) == 2:
        if value is None:
            metadata.broker_configs.pop(parts[1], None)
        else:
            metadata.broker_configs[parts[1]] = dict(json.loads(value))
        return [("broker-config", parts[1])]
    if path.startswith(RECORD_PREFIX):
        entity = entity_from_path(path)
        if value is None:
            metadata.client_quotas.pop(entity, None)
        else:
            metadata.client_quotas[entity] = decode_values(value)
        return [("client-quota",)]
    if parts[0] == "topics" and len(parts) == 2:
        name = parts[1]
        if value is None:
            metadata.topics.pop(name, None)
            return [("topic", name)]
        raw = json.loads(value)
        existing = metadata.topics.get(name)
        # Known partitions keep their state (their assignment never changes; a later state came
        # from their own record); partitions new to us start from the stored assignment.
        partitions = existing.partitions if existing is not None and existing.topic_id == raw["topic_id"] else []
        known = len(partitions)
        assignments = raw.get("replicas")
        while len(partitions) < raw["partitions"]:
            if assignments is not None:
                partitions.append(initial_state(assignments[len(partitions)]))
            else:  # written before assignments lived in the topic record: partition records follow
                partitions.append(PartitionState(replicas=[], leader=-1, leader_epoch=-1, isr=[]))
        metadata.topics[name] = TopicMetadata(name, raw["topic_id"], partitions, raw["configs"], raw["internal"])
        return [("topic", name)] + [("partition", name, str(i)) for i in range(known, len(partitions))]
    if parts[0] == "partitions" and len(parts) == 3:
        topic = metadata.topics.get(parts[1])
        index = int(parts[2])
        if topic is None or value is None or index >= len(topic.partitions):
            return []
        raw = json.loads(value)
        if raw.pop("topic_id", topic.topic_id) != topic.topic_id:
            return []  # a state decided for an earlier incarnation of the name
        topic.partitions[index] = PartitionState(**_known_fields(PartitionState, raw))
        return [("partition", parts[1], parts[2])]
    return []


class LocalBackend:
    """Single-broker metadata storage: the whole state as one JSON file, written atomically.

    Offers the same operations as the etcd store, so the broker has one code path: a change is
    written, applied to the in-memory metadata, and reported through ``on_change``.
    """

    def __init__(self, path: str, metadata: ClusterMetadata) -> None:
        self.path = path
        self.metadata = metadata
        self.on_change: Callable[[list[RecordKey]], Awaitable[None]] | None = None
        self._pid_store = LocalProducerIdStore(path + ".producer-ids")
        self._applying: set[asyncio.Future[None]] = set()  # applications under way (their callers may be gone)

    def load(self) -> None:
        try:
            with open(self.path) as f:
                self.metadata.load_json(f.read())
        except FileNotFoundError:
            pass

    def _save(self) -> None:
        replace_durably(self.path, self.metadata.to_json().encode())

    async def _changed(self, changes: list[RecordKey]) -> None:
        self.metadata.generation += 1
        self.metadata.topology_generation += 1
        self._save()
        if self.on_change is None:
            return
        # The change is stored and in the metadata: its application must run to the end even when
        # the caller is cancelled. The caller is a request handler, cancelled when its connection
        # closes, and the application yields to the event loop (at most every APPLY_SLICE_S); a
        # cancelled application left the rest of the changes unapplied for good: a new topic's
        # later partitions never got a replica (librdkafka sends FindCoordinator on its bootstrap
        # connection and closes that connection at once: the __consumer_offsets partitions after
        # the cut had no coordinator, and consumers of groups hashed to them waited forever).
        applying = asyncio.ensure_future(self.on_change(changes))
        self._applying.add(applying)
        applying.add_done_callback(self._applied)
        await asyncio.shield(applying)

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait for the applications whose caller went away (the broker stopping: before its logs close)."""
        if self._applying:
            await asyncio.wait(set(self._applying), timeout=timeout)

    def _applied(self, applying: asyncio.Future[None]) -> None:
        self._applying.discard(applying)
        if not applying.cancelled() and applying.exception() is not None:
            log.error("metadata change not applied", exc_info=applying.exception())

    async def create_topic(self, topic: TopicMetadata) -> bool:
        if topic.name in self.metadata.topics:
            return False
        self.metadata.topics[topic.name] = topic
        await self._changed(
            [("topic", topic.name)] + [("partition", topic.name, str(i)) for i in range(len(topic.partitions))]
        )
        return True

    async def delete_topic(self, name: str) -> bool:
        if self.metadata.topics.pop(name, None) is None:
            return False
        await self._changed([("topic", name)])
        return True

    async def update_topic(self, topic: TopicMetadata, new_partitions: dict[int, PartitionState]) -> bool:
        """Replace a topic's record; ``topic.partitions`` already includes ``new_partitions``."""
        current = self.metadata.topics.get(topic.name)
        if current is None or current.topic_id != topic.topic_id:
            return False
        self.metadata.topics[topic.name] = topic
        await self._changed([("topic", topic.name)] + [("partition", topic.name, str(i)) for i in new_partitions])
        return True

    def revision_of(self, topic: str, partition: int) -> int:
        return 0  # one writer: nothing to compare against

    async def update_partition(
        self, topic: str, partition: int, state: PartitionState, expected_revision: int | None = None
    ) -> bool:
        meta = self.metadata.topics.get(topic)
        if meta is None or partition >= len(meta.partitions):
            return False
        meta.partitions[partition] = state
        await self._changed([("partition", topic, str(partition))])
        return True

    async def update_broker_configs(self, name: str, configs: dict[str, str]) -> bool:
        """Replace the dynamic configs of broker ``name`` ("default": the cluster-wide ones)."""
        if configs:
            self.metadata.broker_configs[name] = dict(configs)
        else:
            self.metadata.broker_configs.pop(name, None)
        await self._changed([("broker-config", name)])
        return True

    async def update_client_quotas(self, changes: Mapping[Entity, dict[str, float]]) -> bool:
        """Replace the quotas of each entity named (empty: it has none), all at once."""
        for entity, quotas in changes.items():
            if quotas:
                self.metadata.client_quotas[entity] = dict(quotas)
            else:
                self.metadata.client_quotas.pop(entity, None)
        await self._changed([("client-quota",)])
        return True

    async def reserve_producer_id_block(self) -> ProducerIdBlock:
        return self._pid_store.reserve_block()

"""The broker's one typed configuration object, loaded from file, environment and flags.

Names are Kafka's dotted property names. Precedence, lowest first: built-in defaults, a Java
properties file (``--config``), environment variables (``DISKLESS_LOG_RETENTION_MS`` sets
``log.retention.ms``), then ``--override name=value`` flags. Topic-level defaults (the ``log.*``
synonyms of topic configs) are validated against the topic config table at load time so a bad
value stops the broker at startup rather than at first use.
"""

from __future__ import annotations

import math
import os
import re
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from diskless.broker.connection_quotas import INT_MAX, ConnectionLimits, LimitError, parse_overrides
from diskless.cluster.client_az import (
    ListenerSpec,
    ZonePolicy,
    parse_client_az_cidrs,
    parse_listener_az_map,
    parse_listeners,
)
from diskless.log.config import (
    DEFAULT_DEDUPE_BUFFER_SIZE,
    DOUBLE_MAX,
    TOPIC_CONFIGS,
    CleanerConfig,
    ConfigError,
    check_combination,
    effective_values,
    parse_java_double,
)
from diskless.security import redact

ENV_PREFIX = "DISKLESS_"
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Settings whose values are credentials: registered with the log redactor (security/redact.py).
SECRET_PROPERTIES = frozenset(
    {
        "diskless.s3.access.key",
        "diskless.s3.secret.key",
        "diskless.cluster.secret",
        "ssl.key.password",
        "metadata.etcd.password",
    }
)


def _prop(name: str, doc: str = "") -> dict[str, Any]:
    return {"property": name, "doc": doc}


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """Accepts ``PLAINTEXT://host:port``, ``host:port`` or ``:port``."""
        text = text.split(",")[0].strip()
        if "://" in text:
            text = text.split("://", 1)[1]
        host, _, port = text.rpartition(":")
        return cls(host or "0.0.0.0", int(port))


@dataclass(frozen=True)
class BrokerConfig:
    node_id: int = field(default=0, metadata=_prop("node.id", "Broker id; broker.id is accepted too."))
    listeners: str = field(default="PLAINTEXT://127.0.0.1:9092", metadata=_prop("listeners"))
    advertised_listeners: str | None = field(default=None, metadata=_prop("advertised.listeners"))
    inter_broker_listener_name: str | None = field(
        default=None,
        metadata=_prop(
            "inter.broker.listener.name",
            "The listener other brokers and the WAL manager connect to; defaults to the first listener.",
        ),
    )
    broker_rack: str | None = field(default=None, metadata=_prop("broker.rack", "Availability zone of the broker."))
    diskless_listener_az_map: str | None = field(
        default=None,
        metadata=_prop(
            "diskless.listener.az.map",
            "LISTENER:az,... : a connection that arrives on a mapped listener is a client in that AZ"
            " (cluster/client_az.py), unless its client.id or Fetch rack says otherwise.",
        ),
    )
    diskless_client_az_cidrs: str | None = field(
        default=None,
        metadata=_prop(
            "diskless.client.az.cidrs",
            "az:cidr,... : a client whose source address is in a network is in that AZ (most specific"
            " network wins), when neither its client.id, Fetch rack nor listener says.",
        ),
    )
    log_dirs: str = field(default="./data", metadata=_prop("log.dirs"))
    cluster_id: str = field(default="diskless-cluster-0000000", metadata=_prop("cluster.id"))
    num_partitions: int = field(default=1, metadata=_prop("num.partitions"))
    default_replication_factor: int = field(default=1, metadata=_prop("default.replication.factor"))
    auto_create_topics_enable: bool = field(default=True, metadata=_prop("auto.create.topics.enable"))
    log_retention_check_interval_ms: int = field(default=300000, metadata=_prop("log.retention.check.interval.ms"))
    # --- the log cleaner of compacted classic topics (Kafka's CleanerConfig) ---
    # All but log.cleaner.enable are dynamic, as in Kafka (LogCleaner.ReconfigurableConfigs): the
    # cleaner reads them through cluster/broker_configs.cleaner_config at each pass.
    log_cleaner_enable: bool = field(
        default=True,
        metadata=_prop(
            "log.cleaner.enable",
            "Run the log cleaner, which compacts topics whose cleanup.policy includes compact. Disabled,"
            " those topics are not compacted and grow (produce still refuses records without a key).",
        ),
    )
    log_cleaner_threads: int = field(
        default=1, metadata=_prop("log.cleaner.threads", "Logs cleaned at once (each with its share of the buffers).")
    )
    log_cleaner_dedupe_buffer_size: int = field(
        default=DEFAULT_DEDUPE_BUFFER_SIZE,
        metadata=_prop(
            "log.cleaner.dedupe.buffer.size",
            "Bytes of the cleaners' key -> offset maps together. An entry costs ~128 bytes in Python"
            " (24 in Kafka), so a cleaner holds size / threads / 128 x load factor keys per pass."
            " Kafka's default is 128 MiB; 32 MiB here (about 230k keys) fits the broker's memory budget.",
        ),
    )
    log_cleaner_io_buffer_load_factor: float = field(
        default=0.9,
        metadata=_prop("log.cleaner.io.buffer.load.factor", "The share of a cleaner's map entries it fills."),
    )
    log_cleaner_io_buffer_size: int = field(
        default=512 * 1024,
        metadata=_prop(
            "log.cleaner.io.buffer.size", "Bytes of the cleaners' read and write buffers together (half each)."
        ),
    )
    log_cleaner_io_max_bytes_per_second: float = field(
        default=DOUBLE_MAX,
        metadata=_prop(
            "log.cleaner.io.max.bytes.per.second",
            "The cleaners' reads and writes together are throttled to this rate on average.",
        ),
    )
    log_cleaner_backoff_ms: int = field(
        default=15000,
        metadata=_prop("log.cleaner.backoff.ms", "How long the cleaner sleeps when no log needs cleaning."),
    )
    socket_request_max_bytes: int = field(default=104857600, metadata=_prop("socket.request.max.bytes"))
    # Kafka's default is -1 (unbounded; its produce path does not park requests). Here produce
    # requests waiting for room in the representative's buffer hold their frames, so without a
    # bound a burst of producers holds 512 requests per connection in memory (issue 10).
    queued_max_request_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=_prop(
            "queued.max.request.bytes",
            "Bytes of client requests being handled at once; beyond it the broker stops reading client"
            " requests until earlier ones are answered. Broker connections are not counted. -1: unbounded.",
        ),
    )
    # --- accepted connections (broker/connection_quotas.py) ---
    connections_max_idle_ms: int = field(
        default=600000,
        metadata=_prop(
            "connections.max.idle.ms",
            "A connection with no bytes read or written for this long, and no request being handled,"
            " is closed by the broker (clients reconnect). Negative: never.",
        ),
    )
    max_connections_per_ip: int = field(
        default=INT_MAX,
        metadata=_prop(
            "max.connections.per.ip",
            "Connections accepted from one address, on all listeners together (brokers' too); a new"
            " one beyond it is closed at once. 0 only with max.connections.per.ip.overrides.",
        ),
    )
    max_connections_per_ip_overrides: str = field(
        default="",
        metadata=_prop(
            "max.connections.per.ip.overrides",
            "host:count,... : per-address (or host name) limits instead of max.connections.per.ip.",
        ),
    )
    max_connections: int = field(
        default=INT_MAX,
        metadata=_prop(
            "max.connections",
            "Connections accepted by the broker; a new client connection beyond it is closed at once."
            " Brokers, the WAL manager and pipeline jobs (which prove the cluster secret on the"
            " inter-broker listener) are never refused by it.",
        ),
    )
    # --- client quotas (broker/throttle.py; the quotas themselves are set with AlterClientQuotas) ---
    quota_window_num: int = field(
        default=11,
        metadata=_prop("quota.window.num", "Samples a client quota's rate is measured over (Kafka's)."),
    )
    quota_window_size_seconds: int = field(
        default=1,
        metadata=_prop("quota.window.size.seconds", "Length of each sample of a client quota's rate."),
    )
    metrics_port: int = field(default=-1, metadata=_prop("metrics.port", "Prometheus endpoint port; -1 disables it."))
    metrics_host: str | None = field(default=None, metadata=_prop("metrics.host", "Defaults to the listener's host."))
    metadata_etcd_endpoints: str | None = field(
        default=None, metadata=_prop("metadata.etcd.endpoints", "host:port of etcd; unset runs a standalone broker.")
    )
    metadata_etcd_username: str | None = field(
        default=None, metadata=_prop("metadata.etcd.username", "etcd user when etcd has authentication on.")
    )
    metadata_etcd_password: str | None = field(
        default=None,
        metadata=_prop(
            "metadata.etcd.password", "Its password (DISKLESS_METADATA_ETCD_PASSWORD keeps it off the command line)."
        ),
    )
    broker_session_timeout_ms: int = field(
        default=9000, metadata=_prop("broker.session.timeout.ms", "Lease TTL: a broker silent this long is fenced.")
    )
    replica_lag_time_max_ms: int = field(default=30000, metadata=_prop("replica.lag.time.max.ms"))
    replica_fetch_wait_max_ms: int = field(default=500, metadata=_prop("replica.fetch.wait.max.ms"))
    replica_fetch_max_bytes: int = field(default=1048576, metadata=_prop("replica.fetch.max.bytes"))
    # Kafka's default is 55 MiB, sent from the page cache by sendfile. Here a response's batches are
    # read from the WAL cache or object storage and held in memory (a few copies) until written: a
    # lagging consumer's 49 MiB responses took a broker from ~160 to 358 MB (issue 10: <= 300 MB).
    # 16 MiB still carries 16 partitions' worth of max.partition.fetch.bytes per round trip.
    fetch_max_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata=_prop("fetch.max.bytes", "The most a consumer's Fetch response carries, whatever the request asks."),
    )
    max_incremental_fetch_session_cache_slots: int = field(
        default=1000,
        metadata=_prop(
            "max.incremental.fetch.session.cache.slots",
            "Fetch sessions (KIP-227) a leader keeps for its followers; 0 turns them off.",
        ),
    )
    controlled_shutdown_timeout_ms: int = field(default=15000, metadata=_prop("controlled.shutdown.timeout.ms"))
    diskless_s3_endpoint: str | None = field(default=None, metadata=_prop("diskless.s3.endpoint"))
    diskless_s3_bucket: str = field(default="diskless", metadata=_prop("diskless.s3.bucket"))
    diskless_s3_access_key: str = field(default="diskless", metadata=_prop("diskless.s3.access.key"))
    diskless_s3_secret_key: str = field(default="diskless-secret", metadata=_prop("diskless.s3.secret.key"))
    diskless_s3_region: str = field(default="us-east-1", metadata=_prop("diskless.s3.region"))
    diskless_cluster_secret: str | None = field(
        default=None,
        metadata=_prop(
            "diskless.cluster.secret",
            "Secret brokers, the WAL manager and pipeline jobs prove (HMAC challenge) before sending"
            " internal requests; unset, one is created in etcd (security/cluster_secret.py).",
        ),
    )
    # --- tiering (diskless tier, diskless/spark/tier_job.py) ---
    diskless_tier_min_age_ms: int = field(
        default=3600000,
        metadata=_prop(
            "diskless.tier.min.age.ms",
            "diskless tier --every: tier a partition once its oldest untiered batch is older than this.",
        ),
    )
    diskless_tier_min_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata=_prop(
            "diskless.tier.min.bytes",
            "diskless tier --every: tier a partition once its pointer segments hold more bytes than this.",
        ),
    )
    diskless_tier_commit_timeout_ms: int = field(
        default=300000,
        metadata=_prop(
            "diskless.tier.commit.timeout.ms",
            "Leaders refuse TierCommits of segment objects written longer ago; the WAL manager gives"
            " unreferenced segment objects at least this plus twice the clock skew before deleting them.",
        ),
    )
    diskless_tier_segment_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata=_prop("diskless.tier.segment.bytes", "Largest segment object the tier job writes."),
    )
    # --- security (diskless/security/) ---
    listener_security_protocol_map: str | None = field(
        default=None,
        metadata=_prop(
            "listener.security.protocol.map",
            "LISTENER:PROTOCOL,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL). A listener not named is"
            " the protocol of its name when that is one, else PLAINTEXT.",
        ),
    )
    sasl_enabled_mechanisms: str = field(
        default="PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", metadata=_prop("sasl.enabled.mechanisms")
    )
    ssl_keystore_location: str | None = field(
        default=None,
        metadata=_prop("ssl.keystore.location", "PEM file with the broker's certificate (chain) and private key."),
    )
    ssl_key_password: str | None = field(default=None, metadata=_prop("ssl.key.password"))
    ssl_truststore_location: str | None = field(
        default=None,
        metadata=_prop("ssl.truststore.location", "PEM file of the CAs client certificates must chain to."),
    )
    ssl_client_auth: str = field(default="none", metadata=_prop("ssl.client.auth", "none, requested or required."))
    connection_failed_authentication_delay_ms: int = field(
        default=100,
        metadata=_prop(
            "connection.failed.authentication.delay.ms",
            "A failed SASL authentication is answered (and the connection closed) this much later (slows guessing).",
        ),
    )
    authorizer_class_name: str = field(
        default="",
        metadata=_prop("authorizer.class.name", "Any non-empty value enables ACL authorization (security/acl.py)."),
    )
    super_users: str = field(default="", metadata=_prop("super.users", "User:a;User:b : allowed everything."))
    allow_everyone_if_no_acl_found: bool = field(default=False, metadata=_prop("allow.everyone.if.no.acl.found"))
    diskless_wal_linger_ms: int = field(
        default=100,
        metadata=_prop(
            "diskless.wal.linger.ms",
            "The longest a diskless batch waits in the representative's buffer, and the shortest time"
            " between two of its WAL objects (PUTs) unless diskless.wal.max.bytes fill one sooner.",
        ),
    )
    diskless_wal_gather_ms: int = field(
        default=10,
        metadata=_prop(
            "diskless.wal.gather.ms",
            "A WAL object waits at least this long after its first batch for batches sent with it"
            " (capped by diskless.wal.linger.ms).",
        ),
    )
    diskless_wal_linger_aligned: bool = field(
        default=False,
        metadata=_prop(
            "diskless.wal.linger.aligned",
            "Time-driven WAL flushes start on the wall clock's multiples of diskless.wal.linger.ms"
            " (one per such slot), so every broker's flushes, and their commits to each leader, come"
            " together and share replication rounds. Off by default: diskless bench at 900 records/s"
            " (3 brokers on 2 cores) measured 30% fewer replica fetches and 13-45% fewer bytes"
            " crossing AZs, but a p50 20-25 ms higher, since every broker then works at once on"
            " shared cores.",
        ),
    )
    diskless_wal_max_bytes: int = field(default=8 * 1024 * 1024, metadata=_prop("diskless.wal.max.bytes"))
    diskless_s3_hedge_quantile: float = field(
        default=0.95,
        metadata=_prop(
            "diskless.s3.hedge.quantile",
            "A WAL object PUT or tail GET still unanswered after this quantile of the recent ones'"
            " latencies (of its size) gets a second, identical request; the first answer wins"
            " (storage/hedging.py). 0 turns hedging off.",
        ),
    )
    diskless_s3_hedge_max_ratio: float = field(
        default=0.05,
        metadata=_prop(
            "diskless.s3.hedge.max.ratio",
            "At most this share of the last 200 WAL object PUTs, and of the last 200 tail GETs, get a"
            " hedge, however slow the store is.",
        ),
    )
    diskless_produce_buffer_max_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=_prop(
            "diskless.produce.buffer.max.bytes",
            "Bound on the representative's diskless batches that are buffered, uploading or waiting for"
            " their commit. Beyond it new batches wait (in arrival order) before being buffered, so"
            " producers get their answers later; a single batch larger than the bound is taken once"
            " nothing else is held.",
        ),
    )
    diskless_wal_commit_timeout_ms: int = field(
        default=60000, metadata=_prop("diskless.wal.commit.timeout.ms", "Leaders refuse commits of older WAL objects.")
    )
    # Kafka leaves caching to the OS page cache; a diskless broker has no files to page in, so this
    # cache is its page cache and counts in its RSS (issue 10: <= 300 MB at 1,000 partitions). An
    # idle broker with 1,000 replicas is ~90 MB and the produce buffer may hold 64 MiB, so 96 MiB
    # leaves room for fetch responses. The tail share (72 MiB) holds about 1.5 s of a 46 MB/s
    # cluster (every broker prefetches every object its replicas point into), and tail consumers
    # read an object within a few hundred ms of its commit.
    diskless_cache_max_bytes: int = field(
        default=96 * 1024 * 1024,
        metadata=_prop(
            "diskless.cache.max.bytes",
            "Bytes of WAL objects and segment blocks kept in memory for consumers (both shares).",
        ),
    )
    diskless_fetch_miss_max_requests: int = field(
        default=4,
        metadata=_prop(
            "diskless.fetch.miss.max.requests",
            "Object-storage requests in flight for reads that miss the cache (consumers far behind the"
            " tail, tiered segments). They have their own connections, so however many there are they"
            " never hold up WAL object uploads and the tail's prefetches.",
        ),
    )
    diskless_fetch_lagging_max_bytes_per_second: int = field(
        default=2**63 - 1,
        metadata=_prop(
            "diskless.fetch.lagging.max.bytes.per.second",
            "Bytes per second this broker reads from object storage for consumers whose reads miss the"
            " cache (far behind the tail, tiered segments); Kafka's remote.log.manager.fetch.max.bytes."
            "per.second for diskless topics. A fetch over the quota waits for it within its max wait, or"
            " is answered without those partitions' batches when it has others. Default: no limit.",
        ),
    )
    diskless_cache_lagging_max_bytes: int = field(
        default=-1,
        metadata=_prop(
            "diskless.cache.lagging.max.bytes",
            "The share of diskless.cache.max.bytes for reads far behind the tail (tiered segment blocks);"
            " it never evicts the tail's WAL objects, nor they it. -1: a quarter of diskless.cache.max.bytes.",
        ),
    )
    wal_manager_grace_ms: int = field(
        default=600000,
        metadata=_prop(
            "wal.manager.grace.ms",
            "Objects younger than this are never deleted; must exceed the commit timeout plus skew.",
        ),
    )
    wal_manager_clock_skew_ms: int = field(default=30000, metadata=_prop("wal.manager.clock.skew.ms"))
    wal_manager_confirm_ms: int = field(
        default=30000,
        metadata=_prop("wal.manager.confirm.ms", "Unreferenced must hold across two checks this far apart."),
    )
    wal_manager_check_interval_ms: int = field(default=30000, metadata=_prop("wal.manager.check.interval.ms"))
    wal_manager_scan_interval_ms: int = field(default=300000, metadata=_prop("wal.manager.scan.interval.ms"))
    wal_manager_delete_rate: int = field(
        default=1000, metadata=_prop("wal.manager.delete.rate", "Objects deleted per second at most.")
    )
    offsets_topic_num_partitions: int = field(default=50, metadata=_prop("offsets.topic.num.partitions"))
    offsets_topic_replication_factor: int = field(default=3, metadata=_prop("offsets.topic.replication.factor"))
    offsets_retention_minutes: int = field(default=10080, metadata=_prop("offsets.retention.minutes"))
    offsets_retention_check_interval_ms: int = field(
        default=600000,
        metadata=_prop(
            "offsets.retention.check.interval.ms",
            "How often the group coordinator expires offsets and appends live ones again "
            "(at least four times per offsets.retention.minutes).",
        ),
    )
    group_initial_rebalance_delay_ms: int = field(default=3000, metadata=_prop("group.initial.rebalance.delay.ms"))
    group_min_session_timeout_ms: int = field(default=6000, metadata=_prop("group.min.session.timeout.ms"))
    group_max_session_timeout_ms: int = field(default=1800000, metadata=_prop("group.max.session.timeout.ms"))
    group_consumer_session_timeout_ms: int = field(default=45000, metadata=_prop("group.consumer.session.timeout.ms"))
    group_consumer_heartbeat_interval_ms: int = field(
        default=5000, metadata=_prop("group.consumer.heartbeat.interval.ms")
    )
    group_consumer_assignors: str = field(
        default="uniform,range",
        metadata=_prop("group.consumer.assignors", "Server-side assignors (KIP-848); the first is the default."),
    )
    transaction_partition_verification_enable: bool = field(
        default=True,
        metadata=_prop(
            "transaction.partition.verification.enable",
            "Leaders verify with the coordinator that a transactional diskless batch's partition is in "
            "its ongoing transaction before taking it (KIP-890 part 1; log/txn_verification.py).",
        ),
    )
    transaction_state_log_num_partitions: int = field(
        default=50, metadata=_prop("transaction.state.log.num.partitions")
    )
    transaction_state_log_replication_factor: int = field(
        default=3, metadata=_prop("transaction.state.log.replication.factor")
    )
    transaction_max_timeout_ms: int = field(default=900000, metadata=_prop("transaction.max.timeout.ms"))
    transactional_id_expiration_ms: int = field(
        default=604800000,
        metadata=_prop(
            "transactional.id.expiration.ms",
            "How long the transaction coordinator keeps an idle transactional id (Complete or Empty).",
        ),
    )
    producer_id_expiration_ms: int = field(
        default=86400000,
        metadata=_prop(
            "producer.id.expiration.ms",
            "How long a partition keeps an idle producer's idempotence state (none with an open transaction).",
        ),
    )
    auto_leader_rebalance_enable: bool = field(
        default=True,
        metadata=_prop(
            "auto.leader.rebalance.enable",
            "The controller moves leadership back to preferred replicas (broker/operations.py).",
        ),
    )
    leader_imbalance_check_interval_seconds: int = field(
        default=300, metadata=_prop("leader.imbalance.check.interval.seconds")
    )
    leader_imbalance_per_broker_percentage: int = field(
        default=10, metadata=_prop("leader.imbalance.per.broker.percentage")
    )
    topic_defaults: Mapping[str, str] = field(default_factory=dict)

    @property
    def listener_specs(self) -> list[ListenerSpec]:
        """Every listener (``NAME://host:port,...``), in the order given."""
        return parse_listeners(self.listeners)

    @property
    def inter_broker_listener(self) -> str:
        return (self.inter_broker_listener_name or self.listener_specs[0].name).upper()

    @property
    def listener(self) -> Endpoint:
        """The inter-broker listener's bind address."""
        spec = next(s for s in self.listener_specs if s.name == self.inter_broker_listener)
        return Endpoint(spec.host or "0.0.0.0", spec.port)

    def advertised(self, bound_port: int) -> Endpoint:
        """The inter-broker listener's advertised address (``bound_port`` when it bound port 0)."""
        return self.advertised_endpoints({self.inter_broker_listener: bound_port})[self.inter_broker_listener]

    def advertised_endpoints(self, bound_ports: Mapping[str, int]) -> dict[str, Endpoint]:
        """Each listener's advertised address: ``advertised.listeners`` by listener name, else its
        bind address (a wildcard host advertises 127.0.0.1) with the port it bound."""
        given = {s.name: s for s in parse_listeners(self.advertised_listeners)} if self.advertised_listeners else {}
        if len(given) == 1 and len(self.listener_specs) == 1:
            # One listener: an advertised address under another name (PLAINTEXT by default) is its.
            given = {self.listener_specs[0].name: next(iter(given.values()))}
        out = {}
        for spec in self.listener_specs:
            if spec.name in given:
                out[spec.name] = Endpoint(given[spec.name].host, given[spec.name].port)
            else:
                host = "127.0.0.1" if spec.host in ("0.0.0.0", "", "::") else spec.host
                out[spec.name] = Endpoint(host, bound_ports.get(spec.name, spec.port))
        return out

    def security_protocol(self, listener: str) -> str:
        """A listener's security protocol (``listener.security.protocol.map``, Kafka's defaults)."""
        mapping = {}
        for item in (self.listener_security_protocol_map or "").split(","):
            name, sep, protocol = item.strip().partition(":")
            if sep:
                mapping[name.strip().upper()] = protocol.strip().upper()
        if listener.upper() in mapping:
            return mapping[listener.upper()]
        return listener.upper() if listener.upper() in _PROTOCOLS else "PLAINTEXT"

    @property
    def super_user_set(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.super_users.split(";") if u.strip())

    @property
    def etcd_credentials(self) -> tuple[str, str] | None:
        """(user, password) for etcd, when both are set."""
        if self.metadata_etcd_username and self.metadata_etcd_password:
            return self.metadata_etcd_username, self.metadata_etcd_password
        return None

    def zone_policy(self) -> ZonePolicy:
        """How this broker decides its clients' AZs (``cluster/client_az.py``)."""
        return ZonePolicy(
            local_az=self.broker_rack or "none",
            listener_azs=parse_listener_az_map(self.diskless_listener_az_map),
            cidrs=tuple(parse_client_az_cidrs(self.diskless_client_az_cidrs)),
        )

    def validate_listeners(self) -> None:
        """Listener settings that contradict each other stop the broker at startup."""
        names = {s.name for s in self.listener_specs}
        if self.inter_broker_listener not in names:
            raise ConfigError(f"inter.broker.listener.name {self.inter_broker_listener} is not a listener")
        if self.advertised_listeners:
            # Parsed here, not first when the broker advertises itself (after binding its ports). A
            # name that is no listener would be ignored, advertising the bind address instead; with
            # one listener, one advertised address is its own whatever its name (advertised_endpoints).
            advertised = {s.name for s in parse_listeners(self.advertised_listeners)}
            if not advertised <= names and not (len(advertised) == 1 and len(names) == 1):
                raise ConfigError(
                    f"advertised.listeners names {sorted(advertised - names)} that are not in listeners {sorted(names)}"
                )
        unknown = set(parse_listener_az_map(self.diskless_listener_az_map)) - names
        if unknown:
            raise ConfigError(f"diskless.listener.az.map names unknown listeners {sorted(unknown)}")
        parse_client_az_cidrs(self.diskless_client_az_cidrs)
        for spec in self.listener_specs:
            protocol = self.security_protocol(spec.name)
            if protocol not in _PROTOCOLS:
                raise ConfigError(f"listener {spec.name}: unknown security protocol {protocol}")
            if protocol.endswith("SSL") and not self.ssl_keystore_location:
                raise ConfigError(f"listener {spec.name} is {protocol}: ssl.keystore.location must be set")
        if self.ssl_client_auth not in ("none", "requested", "required"):
            raise ConfigError(f"ssl.client.auth: expected none, requested or required, got {self.ssl_client_auth!r}")

    def connection_limits(self) -> ConnectionLimits:
        """The connection limits and idle time of the static configuration (ConfigError if invalid)."""
        try:
            return ConnectionLimits(
                self.max_connections_per_ip,
                parse_overrides(self.max_connections_per_ip_overrides),
                self.max_connections,
                self.connections_max_idle_ms,
            )
        except LimitError as exc:
            raise ConfigError(str(exc)) from None

    def broker_value(self, name: str) -> str | None:
        """Raw value of a broker-level synonym of a topic config, if set explicitly."""
        return self.topic_defaults.get(name)

    def cleaner_config(self) -> CleanerConfig:
        """The log cleaner's settings in this (static) configuration; the dynamic ones laid over
        them are ``cluster/broker_configs.cleaner_config``."""
        return CleanerConfig(
            enable=self.log_cleaner_enable,
            threads=self.log_cleaner_threads,
            dedupe_buffer_size=self.log_cleaner_dedupe_buffer_size,
            dedupe_buffer_load_factor=self.log_cleaner_io_buffer_load_factor,
            io_buffer_size=self.log_cleaner_io_buffer_size,
            io_max_bytes_per_second=self.log_cleaner_io_max_bytes_per_second,
            backoff_ms=self.log_cleaner_backoff_ms,
        )

    def validate_log_defaults(self) -> None:
        """The broker's topic defaults and cleaner settings together, as Kafka checks them at startup
        (LogConfig.validateBrokerLogConfigValues, KafkaConfig, LogCleaner); ConfigError if refused."""
        values = {name: value for name, (value, _) in effective_values({}, self.broker_value).items()}
        try:
            check_combination(values)
        except ConfigError as exc:
            # Every topic created without overrides would be refused: say so at startup instead.
            raise ConfigError(f"broker topic defaults: {exc}") from None
        self.cleaner_config().validate()


_PROPERTY_FIELDS = {f.metadata["property"]: f for f in fields(BrokerConfig) if "property" in f.metadata}
_ALIASES = {"broker.id": "node.id"}
_TOPIC_SYNONYMS = {d.broker_synonym: d for d in TOPIC_CONFIGS.values() if d.broker_synonym}


def _coerce(name: str, raw: str) -> Any:
    f = _PROPERTY_FIELDS[name]
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    # As Kafka's ConfigDef.parseType: every value trimmed first, whatever its source or type.
    raw = raw.strip()
    if kind.startswith("int"):
        if "_" in raw:  # Python's int() accepts "1_000"; Java's parseInt does not
            raise ValueError(f"invalid number {raw!r}")
        return int(raw)
    if kind.startswith("float"):
        # Kafka's DOUBLE: Double.parseDouble (no "inf", "nan" or "1_0"); NaN is refused, it would
        # silently turn off whatever the setting bounds.
        value = parse_java_double(raw)
        if math.isnan(value):
            raise ValueError(f"invalid number {raw!r}")
        return value
    if kind.startswith("bool"):
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"expected true or false, got {raw!r}")  # load_config names the setting
        return raw.lower() == "true"
    return raw


_BLANKS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> Iterator[str]:
    """java.util.Properties' logical lines: a line ending in an odd number of backslashes goes on
    on the next one (whose leading blanks are dropped); comments and blank lines are skipped."""
    pending: str | None = None
    for line in re.split(r"\r\n|\r|\n", text):
        line = line.lstrip(_BLANKS)
        if pending is None and (not line or line[0] in "#!"):
            continue
        if (len(line) - len(line.rstrip("\\"))) % 2:
            pending = (pending or "") + line[:-1]
            continue
        yield (pending or "") + line
        pending = None
    if pending is not None:
        yield pending


def _unescape(text: str, path: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            if text[i + 1] == "u":
                digits = text[i + 2 : i + 6]
                if len(digits) != 4 or not all(c in string.hexdigits for c in digits):
                    raise ConfigError(f"{path}: malformed \\uxxxx escape in {text!r}")
                out.append(chr(int(digits, 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(text[i + 1], text[i + 1]))
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def read_properties(path: str) -> dict[str, str]:
    """A Java properties file, read as java.util.Properties (Kafka's server.properties) reads it:
    continuation lines, a key ended by '=', ':' or a blank, backslash escapes."""
    out: dict[str, str] = {}
    with open(path) as f:
        text = f.read()
    for line in _logical_lines(text):
        end = 0
        while end < len(line) and line[end] not in "=:" + _BLANKS:
            end += 2 if line[end] == "\\" else 1
        rest = line[end:].lstrip(_BLANKS)
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(_BLANKS)
        out[_unescape(line[:end], path)] = _unescape(rest, path).strip()
    return out


def env_properties(environ: Mapping[str, str]) -> dict[str, str]:
    known = {name.upper().replace(".", "_"): name for name in [*_PROPERTY_FIELDS, *_ALIASES, *_TOPIC_SYNONYMS]}
    out = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :] in known:
            out[known[key[len(ENV_PREFIX) :]]] = value
    return out


def load_config(
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> BrokerConfig:
    raw: dict[str, str] = {}
    sources = (read_properties(path) if path else {}, env_properties(os.environ if environ is None else environ))
    for source in (*sources, overrides or {}):
        # Canonical names here, so that a later source wins even when it spells the alias.
        raw.update({_ALIASES.get(name, name): value for name, value in source.items()})
    values: dict[str, Any] = {}
    topic_defaults: dict[str, str] = {}
    for name, value in raw.items():
        name = _ALIASES.get(name, name)
        if name in _TOPIC_SYNONYMS:
            definition = _TOPIC_SYNONYMS[name]
            topic_defaults[name] = definition.render(definition.parse(value))
            if name in _PROPERTY_FIELDS:
                values[_PROPERTY_FIELDS[name].name] = _coerce(name, value)
        elif name in _PROPERTY_FIELDS:
            try:
                values[_PROPERTY_FIELDS[name].name] = _coerce(name, value)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        else:
            raise ConfigError(f"unknown broker config {name!r}")
    config = BrokerConfig(topic_defaults=topic_defaults, **values)
    # Built-in defaults are public (they are in this file) and "diskless" would redact every log
    # line naming the project: only values someone set are registered.
    redact.register(
        str(getattr(config, _PROPERTY_FIELDS[name].name) or "")
        for name in SECRET_PROPERTIES
        if getattr(config, _PROPERTY_FIELDS[name].name) != _PROPERTY_FIELDS[name].default
    )
    config.validate_listeners()
    config.connection_limits()
    config.validate_log_defaults()
    if config.quota_window_num < 1 or config.quota_window_size_seconds < 1:
        raise ConfigError("quota.window.num and quota.window.size.seconds must be at least 1")
    return config

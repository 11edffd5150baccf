"""Prometheus metrics of the broker and the endpoint that serves them."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

# No ``*_created`` series: a sample per counter and histogram that only says when the process
# started counting, half the endpoint's lines, each rendered in the broker's process (GIL) per scrape.
disable_created_metrics()

REQUESTS = Counter("diskless_requests_total", "Kafka requests received", ["api"])
REQUEST_ERRORS = Counter("diskless_request_errors_total", "Connections closed on undecodable input", ["reason"])
CONNECTIONS = Gauge("diskless_connections", "Open client connections")
CONNECTION_QUOTA_CLOSES = Counter(
    "diskless_connections_closed_total",
    "Connections the broker closed by itself (broker/connection_quotas.py), by reason: idle"
    " (connections.max.idle.ms), max_connections_per_ip or max_connections (refused at accept, or on"
    " the inter-broker listener at a first request that was not a broker's authentication)",
    ["reason"],
)
CONNECTION_BYTES = Counter(
    "diskless_connection_bytes",
    "Bytes on accepted connections by the peer's AZ (clients and other brokers); each TCP byte between "
    "brokers is counted once, by the broker that accepted the connection",
    ["direction", "local_az", "peer_az"],
)
CONNECTION_NETWORK_BYTES = Counter(
    "diskless_connection_network_bytes",
    "Bytes on accepted connections by the socket's own addresses, as networks (IPv4 /24, IPv6 /64):"
    " what crossed which network boundary whatever the broker decided the peer's AZ to be",
    ["direction", "local_network", "peer_network"],
)
CONNECTION_API_BYTES = Counter(
    "diskless_connection_api_bytes",
    "Bytes of request and response frames on accepted connections by API key (Kafka's, or an internal"
    " RPC's from protocol/internal.py; 'sasl' for raw SASL tokens), by who sent the requests (a broker or"
    " the WAL manager that proved the cluster secret: 'broker'; anyone else: 'client') and by the socket's"
    " networks as in diskless_connection_network_bytes: what the bytes that cross AZs are",
    ["direction", "api", "peer", "local_network", "peer_network"],
)
CONNECTION_AZ_DECISIONS = Counter(
    "diskless_connection_az_decisions",
    "Connections whose client AZ was decided, by source (client_id, client_rack, listener,"
    " source_address, receiving_broker, broker); a consumer's Fetch rack that refines a decision"
    " counts once more, as client_rack (cluster/client_az.py)",
    ["source"],
)
CONNECTIONS_BY_AZ_SOURCE = Gauge(
    "diskless_connections_by_az_source", "Open connections by how their client AZ was decided", ["source"]
)
FETCH_SESSIONS = Gauge("diskless_fetch_sessions", "KIP-227 fetch sessions this broker keeps for its followers")
METADATA_APPLY_ERRORS = Counter(
    "diskless_metadata_apply_errors_total",
    "Metadata this broker skipped (stays 0), by stage: a stored record it could not read (a damaged "
    "record, a shape it does not know), or a change it could not apply locally (a log directory)",
    ["stage"],
)
UNWATCHED_CHANGES = Counter(
    "diskless_unwatched_changes_total",
    "Partition changes found by the periodic check instead of a watch (a bug; stays 0), by the party watching",
    ["party"],
)
REPLICA_FETCH_UNAPPLIED = Counter(
    "diskless_replica_fetch_unapplied_total",
    "Replica fetch answers a follower could not apply (stays 0), by scope: one partition's answer "
    "(corrupt, undecodable, a failed truncation) or a whole round (retried with a fresh session)",
    ["scope"],
)
REPLICA_FETCHES = Counter(
    "diskless_replica_fetches_total", "Replica fetches served, by kind (full or incremental session fetch)", ["kind"]
)
REPLICA_FETCH_PARTITIONS = Counter(
    "diskless_replica_fetch_partitions_total",
    "Partitions named in replica fetch requests (an incremental fetch names only those that moved)",
    ["kind"],
)
LOG_CLEANER_PASSES = Counter(
    "diskless_log_cleaner_passes_total",
    "Log cleaner passes by outcome: installed, log_changed (the log moved under the pass: truncated,"
    " closed, a segment dropped; it is tried again), gave_up (a segment vanished before it was read,"
    " or no batch fit the key map), failed (an error; the log is left alone for ten backoffs)",
    ["outcome"],
)
LOG_CLEANER_BYTES = Counter(
    "diskless_log_cleaner_bytes_total", "Segment bytes the log cleaner replaced (read) and wrote", ["direction"]
)
LOG_CLEANER_DIRTIEST_RATIO = Gauge(
    "diskless_log_cleaner_dirtiest_ratio",
    "Dirty ratio of the log the cleaner picked at its last look, 0 when no compacted log was due"
    " (Kafka's max-dirty-percent, as a ratio)",
)
LOG_CLEANER_UNCLEANABLE = Gauge(
    "diskless_log_cleaner_uncleanable_partitions",
    "Compacted partitions whose last pass failed and that the cleaner leaves alone for now"
    " (Kafka's uncleanable-partitions-count)",
)
LOG_CLEANER_LAST_PASS = Gauge(
    "diskless_log_cleaner_last_pass_timestamp_seconds",
    "When the cleaner last installed a pass (Kafka's time-since-last-run-ms, as a timestamp)",
)
RETENTION_DELETED_SEGMENTS = Counter("diskless_retention_deleted_segments_total", "Segments deleted by retention")
# Kafka's NoKeyCompactedTopicRecordsPerSec: produce refused INVALID_RECORD (log/key_check.py).
NO_KEY_COMPACTED_RECORDS = Counter(
    "diskless_no_key_compacted_topic_records_total", "Records without a key refused by compacted topics"
)

# Client quotas (broker/throttle.py). Kafka labels its throttle-time and byte-rate metrics by user
# and client id; here by quota type and KIP-55 level only, so clients cannot grow the label set.
CLIENT_QUOTA_THROTTLE = Histogram(
    "diskless_client_quota_throttle_seconds",
    "Throttle times given to clients over a quota (Kafka's throttle-time), by quota type"
    " (producer_byte_rate, consumer_byte_rate, request_percentage) and the KIP-55 level of the"
    " entity whose quota it was (user_client, user, default_client...)",
    ["quota", "level"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CLIENT_QUOTA_RECORDED = Counter(
    "diskless_client_quota_recorded_total",
    "What clients under a quota were counted for, by quota type: bytes produced, bytes fetched,"
    " request_percentage as percent-seconds of handler time (Kafka's byte-rate and request-time)",
    ["quota"],
)
CLIENT_QUOTA_RATES = Gauge(
    "diskless_client_quota_rates",
    "Rates kept for clients under a quota (one per quota entity met), by quota type",
    ["quota"],
)


_CHILDREN: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, bound once: ``labels()`` validates and locks on every call, which
    showed in profiles on per-request and per-read paths (2-3 % of a busy broker)."""
    key = (id(metric), values)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*values)
    return found


def serve_metrics(host: str, port: int) -> int:
    """Start the Prometheus HTTP endpoint; returns the bound port (port 0 picks one)."""
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)


# Object storage (diskless/storage/object_store.py). Requests count every HTTP attempt, retries included,
# because that is what the provider bills and what shows up as load on the store.
OBJECT_STORE_REQUESTS = Counter("diskless_object_store_requests_total", "Object storage requests sent", ["operation"])
# Time of one attempt from signing to the whole answer read, on the event loop (so late wake-ups of a
# busy loop are included), without the wait for a free connection slot: set against the produce
# "upload" stage, it tells a slow store from a busy broker.
OBJECT_STORE_SECONDS = Histogram(
    "diskless_object_store_seconds",
    "Duration of one object storage attempt, request sent to answer read",
    ["operation"],
    buckets=(0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0),
)
OBJECT_STORE_BYTES = Counter("diskless_object_store_bytes_total", "Object data bytes moved", ["direction"])
OBJECT_STORE_RETRIES = Counter("diskless_object_store_retries_total", "Object storage attempts retried", ["operation"])
OBJECT_STORE_HEDGES = Counter(
    "diskless_object_store_hedges_total",
    "Second, identical requests sent for a WAL object PUT or tail GET still unanswered",
    ["operation"],
)
OBJECT_STORE_HEDGE_WINS = Counter(
    "diskless_object_store_hedge_wins_total", "Hedges answered before the request they were sent for", ["operation"]
)
OBJECT_STORE_FAILURES = Counter(
    "diskless_object_store_failures_total", "Object storage operations that failed after retries", ["operation"]
)

# Diskless produce and fetch.
DISKLESS_WAL_OBJECT_BYTES = Histogram(
    "diskless_wal_object_bytes",
    "Size of WAL objects uploaded",
    buckets=(16e3, 64e3, 256e3, 1e6, 2e6, 4e6, 8e6, 16e6, 64e6),
)
DISKLESS_FLUSH_SECONDS = Histogram("diskless_flush_seconds", "WAL flush: upload plus commits, per object")
DISKLESS_COMMIT_RPCS = Counter("diskless_commit_rpcs_total", "CommitBatches sent by representatives", ["target"])
DISKLESS_COMMIT_RPCS_IN_FLIGHT = Gauge(
    "diskless_commit_rpcs_in_flight", "CommitBatches a representative sent to remote leaders and has no answer to yet"
)
DISKLESS_COMMIT_SECONDS = Histogram("diskless_commit_seconds", "Leader-side commit of one CommitBatches request")
# Where a diskless produce's time goes, per batch, from the representative's view (issue 10).
# Stages in order: admission (waiting for room under diskless.produce.buffer.max.bytes), linger
# (buffered until the flush), upload (encoding the WAL object and its PUT), order (uploaded until its
# commit is sent: waiting for an earlier batch of its partition, a leader or a back-off), commit
# (sent until the leader's append answer, retries included; a remote leader may hold that answer up to
# 50 ms for acks=all replication, then replication is ~0), replication (acks=all: appended until
# replicated), and total (accepted until the producer's answer is ready).
PRODUCE_STAGES = ("admission", "linger", "upload", "order", "commit", "replication", "total")
DISKLESS_PRODUCE_STAGE_SECONDS = Histogram(
    "diskless_produce_stage_seconds",
    "Time a diskless batch spends in each stage of the representative's pipeline",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0),
)
# Children bound once: a labels() lookup per batch and stage showed in profiles.
PRODUCE_STAGE = {stage: DISKLESS_PRODUCE_STAGE_SECONDS.labels(stage=stage) for stage in PRODUCE_STAGES}
# How late the event loop runs a timer: the time every callback and answer waits for a turn.
EVENT_LOOP_LAG_SECONDS = Histogram(
    "diskless_event_loop_lag_seconds",
    "Delay between when a periodic timer was due and when the broker's event loop ran it",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
GC_PAUSE_SECONDS = Histogram(
    "diskless_gc_pause_seconds",
    "Python's cyclic garbage collector: how long each collection held the process, by generation",
    ["generation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
)
GC_FROZEN_OBJECTS = Gauge("diskless_gc_frozen_objects", "Objects moved out of the collector's reach after start-up")
DISKLESS_CACHE = Counter("diskless_cache_lookups_total", "WAL cache lookups when serving batches", ["result"])
DISKLESS_CACHE_BYTES = Gauge(
    "diskless_cache_bytes", "Bytes held by the WAL cache, by share (tail, lagging)", ["segment"]
)
DISKLESS_LAGGING_BYTES = Counter(
    "diskless_fetch_lagging_bytes_total",
    "Bytes read from object storage for consumers whose reads missed the cache (far behind the tail)",
)
DISKLESS_LAGGING_DEFERRED = Counter(
    "diskless_fetch_lagging_deferred_total",
    "Partitions answered without batches because reads that miss the cache were over"
    " diskless.fetch.lagging.max.bytes.per.second",
)

# Zone-aligned reads on followers (diskless/replication/follower_reads.py): one per consumer fetch pass
# over a diskless partition whose local replica is a follower, by how it was answered.
DISKLESS_FOLLOWER_READS = Counter(
    "diskless_follower_reads_total",
    "Consumer fetch decisions at a follower replica of a diskless partition",
    ["outcome"],
)

# Sessionless consumer fetches (diskless/broker/idle_fetches.py): partition answers taken from the
# connection's memo of idle partitions instead of the full serving decision, and those decided afresh.
FETCH_IDLE_PARTITIONS = Counter(
    "diskless_fetch_idle_partitions_total",
    "Partitions of consumer fetch passes on a connection with a memo, by whether the idle answer was"
    " reused or the partition decided afresh",
    ["answer"],
)

# Tiering (issue 12): brokers count accepted TierCommits; the job reports its own figures.
TIER_COMMITS = Counter("diskless_tier_commits_total", "TierCommits appended as leader")
TIERED_BYTES = Counter("diskless_tiered_bytes_total", "Bytes of segment objects tiered as leader")
TIER_READ_BYTES = Counter("diskless_tier_read_bytes_total", "Bytes served to fetches from segment objects")

"""Prometheus metrics of the broker and the endpoint that serves them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, start_http_server

REQUESTS = Counter("diskless_requests_total", "Kafka requests received", ["api"])
REQUEST_ERRORS = Counter("diskless_request_errors_total", "Connections closed on undecodable input", ["reason"])
CONNECTIONS = Gauge("diskless_connections", "Open client connections")
CONNECTION_BYTES = Counter(
    "diskless_connection_bytes",
    "Bytes on accepted connections by the peer's AZ (clients and other brokers); each TCP byte between "
    "brokers is counted once, by the broker that accepted the connection",
    ["direction", "local_az", "peer_az"],
)
LOG_APPENDED_BYTES = Counter("diskless_log_appended_bytes_total", "Bytes appended to partition logs")
RETENTION_DELETED_SEGMENTS = Counter("diskless_retention_deleted_segments_total", "Segments deleted by retention")


def serve_metrics(host: str, port: int) -> int:
    """Start the Prometheus HTTP endpoint; returns the bound port (port 0 picks one)."""
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)


# Object storage (diskless/storage/object_store.py). Requests count every HTTP attempt, retries included,
# because that is what the provider bills and what shows up as load on the store.
OBJECT_STORE_REQUESTS = Counter("diskless_object_store_requests_total", "Object storage requests sent", ["operation"])
OBJECT_STORE_BYTES = Counter("diskless_object_store_bytes_total", "Object data bytes moved", ["direction"])
OBJECT_STORE_RETRIES = Counter("diskless_object_store_retries_total", "Object storage attempts retried", ["operation"])
OBJECT_STORE_FAILURES = Counter(
    "diskless_object_store_failures_total", "Object storage operations that failed after retries", ["operation"]
)

"""Broker-to-broker RPCs that are not Kafka APIs, carried on the Kafka listener with msgpack bodies.

A request frame has a normal v1 request header (api key, version, correlation id, client id)
whose api key is one of the ``INTERNAL_*`` values below (far from Kafka's own key space, and
never advertised in ApiVersions), followed by a msgpack map. The response frame is the
correlation id followed by a msgpack map. Keeping them on the Kafka port means one listener,
one connection pool and the same per-connection accounting of cross-AZ bytes. CommitBatches and
AwaitReplicated bodies travel in a compact form (``commit_wire.py``: they cross AZs for every
produced batch): send with ``pack_request`` and read with ``unpack_request``. ReplicaFetch is the
exception to msgpack: a Fetch in its own binary form (``replica_fetch_wire.py``), answered in
request order like a Kafka API, and only by servers that list it at the handshake (``SERVED_APIS``).
"""

from __future__ import annotations

import re
import struct
from typing import Any

import msgpack

from . import commit_wire

INTERNAL_COMMIT_BATCHES = 32001  # representative -> leader: append pointer batches
INTERNAL_FETCH_POINTERS = 32002  # broker without a replica -> leader: pointer entries of a range
INTERNAL_WAL_REFERENCES = 32003  # WAL file manager -> leader: does a partition reference a WAL object
INTERNAL_WAL_NOTICE = 32004  # representative -> WAL file manager: a WAL object was committed (best effort)
INTERNAL_AWAIT_REPLICATED = 32005  # representative -> leader: acks=all, are these appends replicated yet
# follower -> leader: a Fetch in a compact binary form, not msgpack (``replica_fetch_wire.py``)
INTERNAL_REPLICA_FETCH = 32006
# KIP-890-style transaction verification of diskless commits (log/txn_verification.py).
INTERNAL_VERIFY_TXN_PARTITION = 32020  # representative -> leader: a guard for a transactional batch
INTERNAL_VERIFY_TXN = 32021  # leader -> transaction coordinator: is the partition in the ongoing txn
# Proof of the cluster secret at a connection's start (security/internal_auth.py); every other
# internal request is refused on a connection that has not passed it.
INTERNAL_AUTH_CHALLENGE = 32030  # -> a fresh server nonce
INTERNAL_AUTH_PROVE = 32031  # HMAC proof of the secret over both nonces -> the server's proof back
AUTH_APIS = frozenset({INTERNAL_AUTH_CHALLENGE, INTERNAL_AUTH_PROVE})
# The challenge's answer maps, under this key, the internal APIs a server answers beyond those
# every version does (``INTERNAL_APIS``) to the highest version of each it reads: a client uses one
# only where the server listed it, at a version it listed, so a newer broker keeps working with an
# older one during a rolling upgrade (as ApiVersions does for Kafka's APIs).
SERVED_APIS = "apis"
OPTIONAL_APIS: dict[int, int] = {INTERNAL_REPLICA_FETCH: 0}
INTERNAL_TIERABLE_RANGES = 32010  # tier job -> leader: ranges it may tier next (broker/tier_rpcs.py)
INTERNAL_TIER_COMMIT = 32011  # tier job -> leader: offsets [a, b] now live in a segment object
INTERNAL_APIS = frozenset(
    {
        INTERNAL_VERIFY_TXN_PARTITION,
        INTERNAL_VERIFY_TXN,
        INTERNAL_COMMIT_BATCHES,
        INTERNAL_FETCH_POINTERS,
        INTERNAL_WAL_REFERENCES,
        INTERNAL_AWAIT_REPLICATED,
        INTERNAL_TIERABLE_RANGES,
        INTERNAL_TIER_COMMIT,
        INTERNAL_AUTH_CHALLENGE,
        INTERNAL_AUTH_PROVE,
    }
)

BROKER_CLIENT_PREFIX = "diskless-broker-"
_BROKER_CLIENT = re.compile(r"^diskless-broker-(\d+)\b")
_CLIENT_AZ = re.compile(r"diskless_az=([A-Za-z0-9_.:-]+)")


def pack(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def unpack(data: bytes | memoryview) -> dict[str, Any]:
    value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(value, dict):
        raise ValueError("internal RPC body must be a map")
    return value


# A request field saying the sender reads compact answers (``commit_wire.compact_answer``);
# leaders that predate it ignore it and answer in maps, which every reader still takes.
COMPACT_ANSWERS = "ca"
_COMPACT_ANSWER_APIS = frozenset({INTERNAL_COMMIT_BATCHES, INTERNAL_AWAIT_REPLICATED, INTERNAL_FETCH_POINTERS})


_EXPANDERS = {INTERNAL_COMMIT_BATCHES: commit_wire.expand, INTERNAL_AWAIT_REPLICATED: commit_wire.expand_await}


def pack_request(api_key: int, body: dict[str, Any]) -> bytes:
    """An internal request's bytes; CommitBatches and AwaitReplicated bodies in their wire form
    (``commit_wire``)."""
    if api_key == INTERNAL_COMMIT_BATCHES:
        body = commit_wire.compact(body)
    elif api_key == INTERNAL_AWAIT_REPLICATED:
        body = commit_wire.compact_await(body)
    if api_key in _COMPACT_ANSWER_APIS:
        body = {**body, COMPACT_ANSWERS: True}
    return pack(body)


def unpack_request(api_key: int, data: bytes | memoryview) -> dict[str, Any]:
    """Inverse of ``pack_request`` (reads the plain form too); ``COMPACT_ANSWERS`` stays in the body."""
    body = unpack(data)
    expand = _EXPANDERS.get(api_key)
    if expand is not None:
        compact = body.pop(COMPACT_ANSWERS, False)
        body = expand(body)
        if compact:
            body[COMPACT_ANSWERS] = True
    return body


def encode_response(correlation_id: int, body: dict[str, Any], compact: bool = False) -> bytes:
    """A response frame; ``compact`` (the request had ``COMPACT_ANSWERS``): results in rows."""
    payload = struct.pack(">i", correlation_id) + pack(commit_wire.compact_answer(body) if compact else body)
    return struct.pack(">i", len(payload)) + payload


def unpack_response(data: bytes | memoryview) -> dict[str, Any]:
    """A response body, compact answers expanded."""
    return commit_wire.expand_answer(unpack(data))


def broker_client_id(node_id: int, role: str) -> str:
    return f"{BROKER_CLIENT_PREFIX}{node_id}-{role}"


def broker_of_client(client_id: str | None) -> int | None:
    """The peer broker's id for connections our own brokers open, else None."""
    if not client_id:
        return None
    match = _BROKER_CLIENT.match(client_id)
    return int(match.group(1)) if match else None


def az_of_client(client_id: str | None) -> str | None:
    """A client's AZ when its ``client.id`` carries ``diskless_az=<az>`` (zone-aligned clients)."""
    if not client_id:
        return None
    match = _CLIENT_AZ.search(client_id)
    return match.group(1) if match else None

"""Proof of the cluster secret at the start of an internal connection (sans-IO).

Internal requests (CommitBatches, FetchPointers, WalReferences, AwaitReplicated, WAL notices,
replica fetches, WriteTxnMarkers) change what partitions hold, so a broker serves them only on a
connection that proved it belongs to the cluster: brokers, the WAL manager and pipeline jobs
share a secret (``diskless.cluster.secret``, or one kept in etcd when unset), and each internal
connection proves it with an HMAC challenge-response before its first internal request. The
secret never crosses the wire, each proof is bound to a fresh server nonce (no replay), and the
server proves the secret back (a client never sends commits to an impostor).

The exchange, as internal RPCs with msgpack bodies::

    client -> AUTH_CHALLENGE {}                               server -> {error_code: 0, nonce: Ns}
    client -> AUTH_PROVE {nonce: Nc, proof: HMAC(k, C|Ns|Nc|client_id)}
    server -> {error_code: 0, proof: HMAC(k, S|Ns|Nc|client_id)}
           or {error_code: SASL_AUTHENTICATION_FAILED} and the connection is closed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

NONCE_BYTES = 32
_CLIENT = b"diskless-internal-auth-v1 client"
_SERVER = b"diskless-internal-auth-v1 server"


class ClusterSecret:
    """The secret every internal party holds; set once it is known (read from etcd at startup).

    Shared by reference between the server and every outgoing connection of a process, so a
    value learned after they were built still reaches them. Never printed."""

    def __init__(self, value: bytes | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._value = value
        # When the inter-broker listener is SSL/SASL_SSL: internal connections open TLS with this
        # context (verifying the listener against ssl.truststore.location) before the handshake.
        self.tls = tls

    @property
    def value(self) -> bytes | None:
        return self._value

    def set(self, value: bytes) -> None:
        if not value:
            raise ValueError("the cluster secret must not be empty")
        self._value = value

    def __repr__(self) -> str:
        return "ClusterSecret(<set>)" if self._value else "ClusterSecret(<unset>)"


def _mac(secret: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes, client_id: str) -> bytes:
    message = b"\x00".join((label, server_nonce, client_nonce, client_id.encode()))
    return hmac.new(secret, message, hashlib.sha256).digest()


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, client_id: str) -> bytes:
    return _mac(secret, _CLIENT, server_nonce, client_nonce, client_id)


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, client_id: str) -> bytes:
    return _mac(secret, _SERVER, server_nonce, client_nonce, client_id)


@dataclass
class InternalAuthState:
    """One server connection's side of the exchange: whether it may send internal requests."""

    secret: ClusterSecret
    random: Callable[[int], bytes] = os.urandom
    authenticated: bool = False
    _nonce: bytes | None = field(default=None, repr=False)

    def challenge(self) -> dict[str, Any]:
        self._nonce = self.random(NONCE_BYTES)
        return {"error_code": 0, "nonce": self._nonce}

    def prove(self, body: Any, client_id: str | None) -> tuple[dict[str, Any], bool]:
        """The answer to AUTH_PROVE and whether the connection must be closed after it. ``body``
        is whatever msgpack an unauthenticated peer sent: anything but a map is refused too."""
        server_nonce, self._nonce = self._nonce, None  # one attempt per challenge
        secret = self.secret.value
        if not isinstance(body, dict):
            return {"error_code": int(ErrorCode.sasl_authentication_failed)}, True
        client_nonce, proof = body.get("nonce"), body.get("proof")
        well_formed = isinstance(client_nonce, bytes) and isinstance(proof, bytes) and len(client_nonce) >= 16
        if secret is None or server_nonce is None or not well_formed:
            return {"error_code": int(ErrorCode.sasl_authentication_failed)}, True
        assert isinstance(client_nonce, bytes) and isinstance(proof, bytes)
        expected = client_proof(secret, server_nonce, client_nonce, client_id or "")
        if not hmac.compare_digest(expected, proof):
            return {"error_code": int(ErrorCode.sasl_authentication_failed)}, True
        self.authenticated = True
        return {"error_code": 0, "proof": server_proof(secret, server_nonce, client_nonce, client_id or "")}, False

    def refusal(self) -> dict[str, Any]:
        """What an internal request gets on a connection that has not proved the secret."""
        return {"error_code": int(ErrorCode.cluster_authorization_failed)}

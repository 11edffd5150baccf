"""SASL SCRAM-SHA-256/512 (RFC 5802, 7677; Kafka's KIP-84) and PLAIN, server side, sans-IO.

Brokers keep only salted credentials (salt, iterations, StoredKey, ServerKey), never passwords:
AlterUserScramCredentials sends the salted password, from which the keys are derived here.
PLAIN (KIP-43) is checked against the same credentials: the password is salted with the stored
salt and its StoredKey compared, so one set of users serves both mechanisms.

``ScramServer`` is one exchange: ``client_first`` names the user (the caller looks its
credential up), ``server_first`` answers with the nonce, salt and iterations, ``client_final``
checks the proof and returns the server's signature. Any failure raises ``AuthenticationFailed``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's ScramMechanism ids (AlterUserScramCredentials / DescribeUserScramCredentials).
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {v: k for k, v in MECHANISM_IDS.items()}
MIN_ITERATIONS = 4096  # Kafka's bounds (ScramMechanism.minIterations, ScramFormatter)
MAX_ITERATIONS = 16384


class AuthenticationFailed(Exception):
    """The exchange cannot succeed; the message is for the broker's log, the client gets a generic one."""


@dataclass(frozen=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, Any]:
        b64 = base64.b64encode
        return {
            "mechanism": self.mechanism,
            "salt": b64(self.salt).decode(),
            "iterations": self.iterations,
            "stored_key": b64(self.stored_key).decode(),
            "server_key": b64(self.server_key).decode(),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ScramCredential:
        b64 = base64.b64decode
        return cls(
            str(value["mechanism"]),
            b64(value["salt"]),
            int(value["iterations"]),
            b64(value["stored_key"]),
            b64(value["server_key"]),
        )

    def __repr__(self) -> str:
        return f"ScramCredential({self.mechanism}, iterations={self.iterations})"


def _digest(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise AuthenticationFailed(f"unsupported mechanism {mechanism}") from None


def _hmac(key: bytes, message: bytes, digest: str) -> bytes:
    return hmac.new(key, message, digest).digest()


def credential_from_salted(mechanism: str, salted_password: bytes, salt: bytes, iterations: int) -> ScramCredential:
    digest = _digest(mechanism)
    client_key = _hmac(salted_password, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = _hmac(salted_password, b"Server Key", digest)
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


def salt_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_digest(mechanism), password.encode(), salt, iterations)


def credential_from_password(
    mechanism: str, password: str, salt: bytes | None = None, iterations: int = MIN_ITERATIONS
) -> ScramCredential:
    salt = secrets.token_bytes(24) if salt is None else salt
    return credential_from_salted(mechanism, salt_password(mechanism, password, salt, iterations), salt, iterations)


def parse_plain(message: bytes) -> tuple[str, str]:
    """``authzid NUL authcid NUL passwd`` (RFC 4616) -> (user, password).

    An authorization id other than the user itself is refused, as Kafka's PlainSaslServer does:
    a client asking to act as someone else must not be let in as itself without being told."""
    parts = message.split(b"\x00")
    if len(parts) != 3:
        raise AuthenticationFailed("malformed PLAIN message")
    try:
        authzid, user, password = (p.decode() for p in parts)
    except UnicodeDecodeError:
        raise AuthenticationFailed("PLAIN message is not UTF-8") from None
    if not user or not password:
        raise AuthenticationFailed("PLAIN user or password empty")
    if authzid and authzid != user:
        raise AuthenticationFailed("PLAIN authorization id differs from the user")
    return user, password


def verify_plain(password: str, credential: ScramCredential) -> bool:
    salted = salt_password(credential.mechanism, password, credential.salt, credential.iterations)
    derived = credential_from_salted(credential.mechanism, salted, credential.salt, credential.iterations)
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


def _attributes(message: str) -> list[tuple[str, str]]:
    out = []
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise AuthenticationFailed(f"malformed SCRAM attribute {part[:20]!r}")
        out.append((key, value))
    return out


def _saslname(value: str) -> str:
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationFailed("malformed SCRAM user name")
    return value.replace("=2C", ",").replace("=3D", "=")


def _default_nonce() -> str:
    return secrets.token_urlsafe(24)


class ScramServer:
    def __init__(self, mechanism: str, nonce: Callable[[], str] = _default_nonce) -> None:
        self.mechanism = mechanism
        self._digest = _digest(mechanism)
        self._new_nonce = nonce
        self.username: str | None = None
        self.complete = False
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._client_nonce = ""
        self._credential: ScramCredential | None = None

    def client_first(self, message: bytes) -> str:
        """Parse the client's first message; returns the user whose credential is needed."""
        try:
            text = message.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("SCRAM message is not UTF-8") from None
        flag, sep1, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not (sep1 and sep2) or flag not in ("n", "y"):
            raise AuthenticationFailed("unsupported or malformed GS2 header (no channel binding is offered)")
        attributes = _attributes(bare)
        if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r" or not attributes[1][1]:
            raise AuthenticationFailed("malformed SCRAM client-first message")
        self.username = _saslname(attributes[0][1])
        if not self.username:
            raise AuthenticationFailed("empty SCRAM user name")
        if authzid and authzid != f"a={attributes[0][1]}":
            raise AuthenticationFailed("authorization id differs from the user")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._client_nonce = attributes[1][1]
        self._nonce = self._client_nonce + self._new_nonce()
        return self.username

    def server_first(self, credential: ScramCredential | None) -> bytes:
        if self.username is None:
            raise AuthenticationFailed("client-first message not received")
        if credential is None or credential.mechanism != self.mechanism:
            raise AuthenticationFailed(f"no {self.mechanism} credential for user {self.username!r}")
        self._credential = credential
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first.encode()

    def client_final(self, message: bytes) -> bytes:
        credential = self._credential
        if credential is None or self.complete:
            raise AuthenticationFailed("unexpected SCRAM client-final message")
        try:
            text = message.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("SCRAM message is not UTF-8") from None
        without_proof, sep, proof_text = text.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("SCRAM client-final message has no proof")
        attributes = dict(_attributes(without_proof))
        expected_binding = base64.b64encode(self._gs2_header.encode()).decode()
        if attributes.get("c") != expected_binding:
            raise AuthenticationFailed("SCRAM channel binding differs from the GS2 header")
        # librdkafka before 2.6.1 (Debian's kcat among others) repeats its own nonce in front of the
        # combined one (librdkafka#4895); Kafka 3.8.1-3.9 accepted it. That one form is accepted
        # too: it still carries this server's nonce, and the proof covers the message as sent.
        if attributes.get("r") not in (self._nonce, self._client_nonce + self._nonce):
            raise AuthenticationFailed("SCRAM nonce differs from the server's")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except (binascii.Error, ValueError):
            raise AuthenticationFailed("SCRAM proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(credential.stored_key, auth_message, self._digest)
        if len(proof) != len(signature):
            raise AuthenticationFailed("SCRAM proof of the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._digest, client_key).digest(), credential.stored_key):
            raise AuthenticationFailed(f"invalid SCRAM proof for user {self.username!r}")
        self.complete = True
        return b"v=" + base64.b64encode(_hmac(credential.server_key, auth_message, self._digest))

"""AWS Signature Version 4 for S3 requests, sans-IO: strings and HMACs in, headers out.

``ObjectStore`` signs every request with a ``SigV4Signer``: it builds the canonical request (method,
URI-encoded path, sorted query, lower-cased signed headers, payload hash), the string to sign, and
the ``Authorization`` header. The signing key depends only on the date, region and service, so it
is derived once per UTC day rather than with four HMACs per request.

Payload hash: always the SHA-256 of the body, never ``UNSIGNED-PAYLOAD``. On http the hash is the
only integrity check the server makes on the body; on https TLS would cover the wire, but TLS may end
at a proxy in front of the store, and the hash costs little: about 10 us for a 9 KiB WAL object, and
``ObjectStore`` hashes bodies above 256 KiB in a worker thread (hashlib releases the GIL) so a large
body does not hold the event loop. One rule for both schemes also means every server that speaks
SigV4 accepts it (some S3-compatible servers refuse unsigned payloads).

The published examples this is tested against are in ``tests/unit/test_sigv4.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping, MutableMapping
from urllib.parse import quote

__all__ = ["EMPTY_SHA256", "SigV4Signer", "amz_date", "canonical_query", "uri_encode"]

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def uri_encode(value: str, *, slash: bool = True) -> str:
    """Percent-encode ``value`` as SigV4 wants: every byte but ``A-Za-z0-9-_.~`` (and ``/`` if ``slash``).

    S3 signs the path encoded once (other services encode it twice); the same string goes on the wire.
    """
    return quote(value, safe="/~" if slash else "~")


def canonical_query(params: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    """The canonical query string: encoded names and values, sorted, ``name=value`` joined by ``&``.

    It is also a valid query string to send, so callers put exactly this on the wire.
    """
    items = params.items() if isinstance(params, Mapping) else params
    encoded = sorted((uri_encode(k, slash=False), uri_encode(v, slash=False)) for k, v in items)
    return "&".join(f"{k}={v}" for k, v in encoded)


def amz_date(epoch_s: float) -> str:
    """``YYYYMMDDTHHMMSSZ`` (the ``x-amz-date`` format) of a Unix time."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(epoch_s))


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class SigV4Signer:
    """Signs requests with one credential for one region and service."""

    def __init__(self, access_key: str, secret_key: str, region: str, service: str = "s3") -> None:
        self.access_key = access_key
        self._secret = secret_key
        self.region = region
        self.service = service
        self._key_date = ""
        self._key = b""

    def signing_key(self, date: str) -> bytes:
        """The derived key for ``date`` (``YYYYMMDD``); the last one is kept, as requests share a day."""
        if date != self._key_date:
            k = _hmac(("AWS4" + self._secret).encode(), date)
            k = _hmac(k, self.region)
            k = _hmac(k, self.service)
            self._key = _hmac(k, "aws4_request")
            self._key_date = date
        return self._key

    def canonical_request(
        self, method: str, path: str, query: str, headers: Mapping[str, str], payload_hash: str
    ) -> tuple[str, str]:
        """The canonical request and its ``SignedHeaders`` list; every header given is signed.

        ``path`` is already URI-encoded and ``query`` already canonical (``canonical_query``).
        """
        canonical = sorted((name.lower(), " ".join(value.split())) for name, value in headers.items())
        signed = ";".join(name for name, _ in canonical)
        lines = "".join(f"{name}:{value}\n" for name, value in canonical)
        return f"{method}\n{path}\n{query}\n{lines}\n{signed}\n{payload_hash}", signed

    def _scope(self, date: str) -> str:
        return f"{date}/{self.region}/{self.service}/aws4_request"

    def string_to_sign(self, when: str, canonical_request: str) -> str:
        digest = hashlib.sha256(canonical_request.encode()).hexdigest()
        return f"{ALGORITHM}\n{when}\n{self._scope(when[:8])}\n{digest}"

    def authorization(
        self, method: str, path: str, query: str, headers: Mapping[str, str], payload_hash: str, when: str
    ) -> str:
        """The ``Authorization`` header value; ``headers`` must already hold ``x-amz-date: when``."""
        canonical, signed = self.canonical_request(method, path, query, headers, payload_hash)
        to_sign = self.string_to_sign(when, canonical)
        signature = hmac.new(self.signing_key(when[:8]), to_sign.encode(), hashlib.sha256).hexdigest()
        credential = f"{self.access_key}/{self._scope(when[:8])}"
        return f"{ALGORITHM} Credential={credential},SignedHeaders={signed},Signature={signature}"

    def sign(
        self, method: str, path: str, query: str, headers: MutableMapping[str, str], payload_hash: str, now: float
    ) -> None:
        """Add ``x-amz-date``, ``x-amz-content-sha256`` and ``Authorization`` to ``headers`` (which must
        hold ``Host`` and every other header to sign)."""
        when = amz_date(now)
        headers["x-amz-date"] = when
        headers["x-amz-content-sha256"] = payload_hash
        headers["Authorization"] = self.authorization(method, path, query, headers, payload_hash, when)

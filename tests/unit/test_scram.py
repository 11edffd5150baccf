"""SCRAM-SHA-256/512 and PLAIN, server side (security/scram.py), against RFC 7677's example."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskless.security.scram import (
    AuthenticationFailed,
    ScramServer,
    credential_from_password,
    credential_from_salted,
    parse_plain,
    verify_plain,
)

# RFC 7677 section 3.
USER, PASSWORD = "user", "pencil"
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc7677_exchange() -> None:
    credential = credential_from_password("SCRAM-SHA-256", PASSWORD, SALT, 4096)
    server = ScramServer("SCRAM-SHA-256", nonce=lambda: SERVER_NONCE)
    assert server.client_first(f"n,,n={USER},r={CLIENT_NONCE}".encode()) == USER
    first = server.server_first(credential)
    assert first == f"r={CLIENT_NONCE}{SERVER_NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    assert server.client_final(CLIENT_FINAL) == SERVER_FINAL
    assert server.complete


def test_wrong_proof_unknown_user_and_replayed_nonce_fail() -> None:
    credential = credential_from_password("SCRAM-SHA-256", "other", SALT, 4096)
    server = ScramServer("SCRAM-SHA-256", nonce=lambda: SERVER_NONCE)
    server.client_first(f"n,,n={USER},r={CLIENT_NONCE}".encode())
    server.server_first(credential)
    with pytest.raises(AuthenticationFailed):
        server.client_final(CLIENT_FINAL)
    assert not server.complete
    unknown = ScramServer("SCRAM-SHA-256")
    unknown.client_first(b"n,,n=nobody,r=abc")
    with pytest.raises(AuthenticationFailed):
        unknown.server_first(None)
    # A final message whose nonce is not the one this server issued.
    right = credential_from_password("SCRAM-SHA-256", PASSWORD, SALT, 4096)
    fresh = ScramServer("SCRAM-SHA-256", nonce=lambda: "another-server-nonce")
    fresh.client_first(f"n,,n={USER},r={CLIENT_NONCE}".encode())
    fresh.server_first(right)
    with pytest.raises(AuthenticationFailed):
        fresh.client_final(CLIENT_FINAL)


def client_exchange(mechanism: str, user: str, password: str, server: ScramServer, credential: object) -> bytes:
    """A textbook SCRAM client (RFC 5802), independent of the server code."""
    digest = hashlib.sha256 if mechanism == "SCRAM-SHA-256" else hashlib.sha512
    name = user.replace("=", "=3D").replace(",", "=2C")
    bare = f"n={name},r=clientnonce"
    assert server.client_first(f"n,,{bare}".encode()) == user
    first = server.server_first(credential).decode()  # type: ignore[arg-type]
    fields = dict(part.split("=", 1) for part in first.split(","))
    salted = hashlib.pbkdf2_hmac(digest().name, password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    without_proof = f"c=biws,r={fields['r']}"
    auth = f"{bare},{first},{without_proof}".encode()
    signature = hmac.new(digest(client_key).digest(), auth, digest).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = server.client_final(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    assert final == b"v=" + base64.b64encode(hmac.new(server_key, auth, digest).digest())
    return final


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512"]),
    st.text(st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=12),
    st.text(min_size=1, max_size=12).filter(lambda p: "\x00" not in p),
)
def test_any_user_and_password_round_trip(mechanism: str, user: str, password: str) -> None:
    credential = credential_from_password(mechanism, password, b"salty-salt", 4096)
    client_exchange(mechanism, user, password, ScramServer(mechanism), credential)
    # AlterUserScramCredentials sends the salted password: the same credential results.
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), b"salty-salt", 4096)
    assert credential_from_salted(mechanism, salted, b"salty-salt", 4096) == credential


def test_plain_is_checked_against_the_scram_credential() -> None:
    credential = credential_from_password("SCRAM-SHA-512", PASSWORD, SALT, 4096)
    assert parse_plain(b"\x00user\x00pencil") == ("user", "pencil")
    assert parse_plain(b"user\x00user\x00pencil") == ("user", "pencil")  # authorization id: itself
    assert verify_plain("pencil", credential)
    assert not verify_plain("pencil2", credential)
    for bad in (b"user\x00pencil", b"\x00\x00pencil", b"\x00user\x00"):
        with pytest.raises(AuthenticationFailed):
            parse_plain(bad)


def test_plain_refuses_an_authorization_id_other_than_the_user() -> None:
    """As Kafka's PlainSaslServer: asking to act as another principal fails authentication.
    Before, the id was ignored and the client was let in as itself."""
    with pytest.raises(AuthenticationFailed, match="authorization id"):
        parse_plain(b"admin\x00user\x00pencil")


def test_librdkafka_before_2_6_1_repeated_client_nonce_is_accepted() -> None:
    """librdkafka#4895: the client nonce in front of the combined nonce (Debian's kcat 1.7/2.0.2)."""
    credential = credential_from_password("SCRAM-SHA-256", PASSWORD, SALT, 4096)
    server = ScramServer("SCRAM-SHA-256", nonce=lambda: SERVER_NONCE)
    server.client_first(f"n,,n={USER},r={CLIENT_NONCE}".encode())
    first = server.server_first(credential).decode()
    digest = hashlib.sha256
    salted = hashlib.pbkdf2_hmac("sha256", PASSWORD.encode(), SALT, 4096)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    without_proof = f"c=biws,r={CLIENT_NONCE}{CLIENT_NONCE}{SERVER_NONCE}"
    auth = f"n={USER},r={CLIENT_NONCE},{first},{without_proof}".encode()
    signature = hmac.new(digest(client_key).digest(), auth, digest).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
    assert server.client_final(f"{without_proof},p={proof}".encode()).startswith(b"v=")
    # Any other nonce is still refused.
    other = ScramServer("SCRAM-SHA-256", nonce=lambda: SERVER_NONCE)
    other.client_first(f"n,,n={USER},r={CLIENT_NONCE}".encode())
    other.server_first(credential)
    with pytest.raises(AuthenticationFailed):
        other.client_final(f"c=biws,r=x{CLIENT_NONCE}{SERVER_NONCE},p={proof}".encode())


def test_certificate_principal_is_the_rfc2253_subject() -> None:
    from diskless.security.tls import principal_of

    subject = ((("countryName", "SE"),), (("organizationName", "Acme, Inc"),), (("commonName", "alice"),))
    assert principal_of({"subject": subject}) == "User:CN=alice,O=Acme\\, Inc,C=SE"
    assert principal_of({}) == "User:ANONYMOUS"
    assert principal_of(None) == "User:ANONYMOUS"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=300))
def test_hostile_sasl_bytes_only_ever_fail_authentication(first: bytes, final: bytes) -> None:
    """What an unauthenticated client sends can only end in AuthenticationFailed, never a crash."""
    credential = credential_from_password("SCRAM-SHA-256", PASSWORD, SALT, 4096)
    server = ScramServer("SCRAM-SHA-256")
    with contextlib.suppress(AuthenticationFailed):
        server.client_first(first)
        server.server_first(credential)
        server.client_final(final)
    assert not server.complete
    with contextlib.suppress(AuthenticationFailed):
        parse_plain(first)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.binary(max_size=40), st.text())))
def test_hostile_internal_handshake_bodies_are_refused(body: dict) -> None:
    from diskless.security.internal_auth import ClusterSecret, InternalAuthState

    state = InternalAuthState(ClusterSecret(b"secret"))
    state.challenge()
    answer, close = state.prove(body, "client")
    assert close and not state.authenticated and answer == {"error_code": 58}

"""The internal handshake's server side (security/internal_auth.py), without sockets."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from diskless.security.internal_auth import ClusterSecret, InternalAuthState, client_proof, server_proof

SASL_AUTHENTICATION_FAILED = 58
CLUSTER_AUTHORIZATION_FAILED = 31
SECRET = b"cluster-secret"


def handshake(state: InternalAuthState, secret: bytes, client_id: str = "b-1") -> tuple[dict, bool, bytes, bytes]:
    server_nonce = state.challenge()["nonce"]
    client_nonce = os.urandom(32)
    proof = client_proof(secret, server_nonce, client_nonce, client_id)
    answer, close = state.prove({"nonce": client_nonce, "proof": proof}, client_id)
    return answer, close, server_nonce, client_nonce


def test_the_right_secret_authenticates_and_the_server_proves_it_back() -> None:
    state = InternalAuthState(ClusterSecret(SECRET))
    assert not state.authenticated
    answer, close, server_nonce, client_nonce = handshake(state, SECRET)
    assert answer["error_code"] == 0 and not close and state.authenticated
    assert answer["proof"] == server_proof(SECRET, server_nonce, client_nonce, "b-1")


@given(st.binary(min_size=1, max_size=64).filter(lambda s: s != SECRET))
def test_any_other_secret_is_refused_and_closes(wrong: bytes) -> None:
    state = InternalAuthState(ClusterSecret(SECRET))
    answer, close, *_ = handshake(state, wrong)
    assert answer == {"error_code": SASL_AUTHENTICATION_FAILED} and close and not state.authenticated


def test_a_proof_is_bound_to_its_challenge_and_client_id() -> None:
    state = InternalAuthState(ClusterSecret(SECRET))
    server_nonce = state.challenge()["nonce"]
    client_nonce = os.urandom(32)
    proof = client_proof(SECRET, server_nonce, client_nonce, "b-1")
    # Another client id with the same proof: refused.
    assert state.prove({"nonce": client_nonce, "proof": proof}, "b-2")[0]["error_code"] == SASL_AUTHENTICATION_FAILED
    # Replayed on a new connection (a new challenge): refused.
    other = InternalAuthState(ClusterSecret(SECRET))
    other.challenge()
    assert other.prove({"nonce": client_nonce, "proof": proof}, "b-1")[0]["error_code"] == SASL_AUTHENTICATION_FAILED
    # Without any challenge: refused.
    fresh = InternalAuthState(ClusterSecret(SECRET))
    assert fresh.prove({"nonce": client_nonce, "proof": proof}, "b-1")[1]


def test_unknown_secret_refuses_everyone() -> None:
    state = InternalAuthState(ClusterSecret())
    answer, close, *_ = handshake(state, b"")
    assert answer["error_code"] == SASL_AUTHENTICATION_FAILED and close
    assert state.refusal() == {"error_code": CLUSTER_AUTHORIZATION_FAILED}
    assert "cluster-secret" not in repr(ClusterSecret(SECRET))

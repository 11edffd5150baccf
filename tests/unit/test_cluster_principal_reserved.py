"""The cluster's own principal (``User:diskless-cluster``) is a super user proved by the cluster
secret only. Before, a SCRAM user of that name could be created (AlterUserScramCredentials or
``diskless users add``) and then authenticated, through PLAIN or SCRAM, as that super user.

Driven through the real SecurityApis handlers over a LocalSecurityStore."""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from diskless.broker.security_apis import SecurityApis
from diskless.config import BrokerConfig
from diskless.protocol import messages as m
from diskless.security import users_cli
from diskless.security.scram import credential_from_password
from diskless.security.session import CLUSTER_USER, CURRENT_SESSION, SecuritySession
from diskless.security.store import LocalSecurityStore

PASSWORD = "pencil"


def _apis(tmp_path: Path) -> SecurityApis:
    config = BrokerConfig(
        authorizer_class_name="diskless",
        sasl_enabled_mechanisms="PLAIN,SCRAM-SHA-256",
        connection_failed_authentication_delay_ms=0,
    )
    apis = SecurityApis(SimpleNamespace(config=config))  # type: ignore[arg-type]
    apis.store = LocalSecurityStore(str(tmp_path / "security.json"))
    return apis


def _authenticate(apis: SecurityApis, mechanism: str, token: bytes) -> tuple[SecuritySession, dict[str, Any]]:
    async def main() -> tuple[SecuritySession, dict[str, Any]]:
        session = SecuritySession("SASL_PLAINTEXT", "10.0.0.9")
        CURRENT_SESSION.set(session)
        handshake = apis.sasl_handshake(m.RequestHeader(17, 1, 1, "c"), SimpleNamespace(mechanism=mechanism))
        assert handshake["error_code"] == ErrorCode.none
        request = SimpleNamespace(auth_bytes=token)
        return session, await apis.sasl_authenticate(m.RequestHeader(36, 2, 2, "c"), request)

    return asyncio.run(main())


def _planted(apis: SecurityApis, user: str) -> None:
    """A credential written straight into the store, as an older broker could have let one in."""
    assert apis.store is not None
    for mechanism in ("SCRAM-SHA-256",):
        asyncio.run(apis.store.put_credential(user, credential_from_password(mechanism, PASSWORD, None, 4096)))


def test_plain_as_the_cluster_user_fails(tmp_path: Path) -> None:
    apis = _apis(tmp_path)
    _planted(apis, CLUSTER_USER)
    session, answer = _authenticate(apis, "PLAIN", f"\x00{CLUSTER_USER}\x00{PASSWORD}".encode())
    assert answer["error_code"] == ErrorCode.sasl_authentication_failed
    assert not session.authenticated
    # Any other user with the same credential still gets in.
    _planted(apis, "alice")
    session, answer = _authenticate(apis, "PLAIN", f"\x00alice\x00{PASSWORD}".encode())
    assert answer["error_code"] == ErrorCode.none and session.principal == "User:alice"


def test_scram_as_the_cluster_user_fails_at_the_first_message(tmp_path: Path) -> None:
    apis = _apis(tmp_path)
    _planted(apis, CLUSTER_USER)
    nonce = base64.b64encode(hashlib.sha256(b"n").digest()).decode()
    session, answer = _authenticate(apis, "SCRAM-SHA-256", f"n,,n={CLUSTER_USER},r={nonce}".encode())
    assert answer["error_code"] == ErrorCode.sasl_authentication_failed
    assert answer["auth_bytes"] == b""  # no salt or iterations disclosed either
    assert not session.authenticated


def test_no_scram_credential_can_be_made_for_the_cluster_user(tmp_path: Path) -> None:
    apis = _apis(tmp_path)
    upsert = SimpleNamespace(name=CLUSTER_USER, mechanism=1, iterations=4096, salt=b"s" * 16, salted_password=b"p" * 32)
    request = SimpleNamespace(deletions=(), upsertions=(upsert,))

    async def main() -> dict[str, Any]:
        CURRENT_SESSION.set(None)
        return await apis.alter_user_scram_credentials(m.RequestHeader(51, 0, 1, "admin"), request)

    answer = asyncio.run(main())
    assert [(r["user"], r["error_code"]) for r in answer["results"]] == [
        (CLUSTER_USER, ErrorCode.unacceptable_credential)
    ]
    assert apis.store is not None
    assert asyncio.run(apis.store.credential(CLUSTER_USER, "SCRAM-SHA-256")) is None


def test_users_cli_refuses_the_cluster_user(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setenv("DISKLESS_SCRAM_PASSWORD", PASSWORD)
    args = argparse.Namespace(
        action="add",
        user=CLUSTER_USER,
        password=None,
        mechanism=None,
        iterations=8192,
        config=None,
        override=[f"log.dirs={tmp_path}"],
    )
    assert users_cli.main(args) == 1
    assert "reserved" in capsys.readouterr().err
    assert not (tmp_path / "security.json").exists()

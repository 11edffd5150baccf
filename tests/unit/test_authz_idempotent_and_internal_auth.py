"""Idempotent InitProducerId honours the host and DENY of WRITE ACLs (Kafka's
authorizeByResourceType), and a malformed internal AUTH_PROVE is refused, never raised."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from diskless.broker.security_apis import SecurityApis
from diskless.config import BrokerConfig
from diskless.protocol import messages as m
from diskless.security import acl as a
from diskless.security.internal_auth import ClusterSecret, InternalAuthState
from diskless.security.session import CURRENT_SESSION, SecuritySession


def test_idempotent_init_producer_id_ignores_the_host_of_write_acls() -> None:
    """KIP-679: without IDEMPOTENT_WRITE, InitProducerId needs WRITE on some topic
    (Authorizer.authorizeByResourceType, which matches the ACL's host and honours DENY).
    _writes_some_topic ignores the host: an ACL granting WRITE only from 10.0.0.1 lets the
    principal obtain a producer id from anywhere."""
    broker = SimpleNamespace(config=BrokerConfig(authorizer_class_name="diskless"), metadata=SimpleNamespace(topics={}))
    apis = SecurityApis(broker)  # type: ignore[arg-type]
    assert apis.authorizer is not None
    apis.authorizer.replace([a.AclBinding(a.TOPIC, "t", a.LITERAL, "User:p", "10.0.0.1", a.WRITE, a.ALLOW)])
    request = load_request_schema(m.API_INIT_PRODUCER_ID, 4)(
        transactional_id=None,
        transaction_timeout=__import__("datetime").timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )
    seen: list[Any] = []

    async def handle(allowed: Any) -> dict[str, Any]:
        seen.append(allowed)
        return {"error_code": 0}

    async def main() -> Any:
        CURRENT_SESSION.set(SecuritySession("SASL_SSL", "192.168.7.7", "User:p", authenticated=True))
        return await apis.handle_authorized(m.RequestHeader(m.API_INIT_PRODUCER_ID, 4, 1, "c"), request, handle)

    body = asyncio.run(main())
    assert seen == [] and body["error_code"] == ErrorCode.cluster_authorization_failed


@pytest.mark.parametrize("body", [[1, 2], "x", 7])
def test_auth_prove_with_a_non_map_body_is_refused_not_raised(body: Any) -> None:
    """AUTH_PROVE's msgpack body is whatever an unauthenticated peer sent; a non-map one raises
    AttributeError out of Connection._dispatch (unhandled: a traceback per connection) instead of
    the SASL_AUTHENTICATION_FAILED answer and close that a malformed proof gets."""
    state = InternalAuthState(ClusterSecret(b"k" * 32))
    state.challenge()
    answer, close = state.prove(body, "client")
    assert close and answer["error_code"] == int(ErrorCode.sasl_authentication_failed)

"""A connection's security state: its listener's protocol, its principal, its SASL exchange.

``server.Connection`` makes one per connection and sets ``CURRENT_SESSION`` in its reading task;
handler tasks inherit the context, so SASL and authorization code find their own connection's
session. Outside a connection (handlers called directly in tests) there is none: such calls act
as the broker itself.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

from .scram import ScramServer

ANONYMOUS = "User:ANONYMOUS"
# Connections that proved the cluster secret (security/internal_auth.py): brokers, the WAL
# manager, pipeline jobs. Always a super user, as Kafka's inter-broker principal must be.
CLUSTER_PRINCIPAL = "User:diskless-cluster"
# Its user name: reserved, since a SASL user of that name would be that super user without the
# secret. No such SCRAM user can be made, and authenticating as one fails.
CLUSTER_USER = CLUSTER_PRINCIPAL.removeprefix("User:")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
API_SASL_HANDSHAKE = 17
API_SASL_AUTHENTICATE = 36
API_API_VERSIONS = 18
# Before a SASL listener's connection authenticated, only these are served (Kafka's
# SaslServerAuthenticator); anything else closes the connection.
PRE_AUTHENTICATION_APIS = frozenset({API_API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE})


@dataclass
class SecuritySession:
    protocol: str = "PLAINTEXT"
    host: str = "*"
    principal: str = ANONYMOUS
    authenticated: bool = False
    mechanism: str | None = None
    scram: ScramServer | None = field(default=None, repr=False)
    # Set by a failed SASL exchange: the error answer goes out, then the connection closes.
    close_after_answer: bool = False
    # After a SaslHandshake v0 the client sends bare SASL tokens (length-prefixed, no header)
    # until the exchange completes (KIP-43's original framing).
    raw_tokens: bool = False

    def __post_init__(self) -> None:
        if not self.sasl:
            self.authenticated = True  # PLAINTEXT and SSL: ANONYMOUS (or the certificate's name)

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def allows_before_authentication(self, api_key: int) -> bool:
        return self.authenticated or api_key in PRE_AUTHENTICATION_APIS

    def became(self, principal: str) -> None:
        self.principal = principal
        self.authenticated = True
        self.scram = None
        self.raw_tokens = False


CURRENT_SESSION: contextvars.ContextVar[SecuritySession | None] = contextvars.ContextVar("session", default=None)


def current_session() -> SecuritySession | None:
    return CURRENT_SESSION.get()

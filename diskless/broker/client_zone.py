"""The client AZ of the connection a handler is answering, without threading it through every call.

``server.Connection`` sets ``CURRENT_ZONE`` in its reading task; the handler tasks it starts
inherit that context, so ``current_zone()`` in any handler is its own connection's decision
(``cluster/client_az.ConnectionZone``). Outside a connection (tests calling handlers directly)
there is none and callers fall back to the receiving broker's AZ.
"""

from __future__ import annotations

import contextvars

from diskless.cluster.client_az import ConnectionZone

CURRENT_ZONE: contextvars.ContextVar[ConnectionZone | None] = contextvars.ContextVar("client_zone", default=None)


def current_zone() -> ConnectionZone | None:
    return CURRENT_ZONE.get()


def current_client_az() -> str | None:
    """The decided AZ of the current connection's client, if a connection decided one."""
    zone = CURRENT_ZONE.get()
    return None if zone is None else zone.az


def current_listener() -> str | None:
    zone = CURRENT_ZONE.get()
    return None if zone is None else zone.listener

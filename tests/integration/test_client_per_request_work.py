"""The inter-broker client (``diskless.protocol.client``) does no per-request schema lookup.

kio's ``load_request_schema``/``load_response_schema`` resolve a dotted module path through
``pkgutil.resolve_name`` on every call (~40 us for the pair); replica fetchers and forwarded fetches
send a request per round, so the lookup must happen once per (api key, version), not per request.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import kio.index
import pytest
from support import BrokerProcess

from diskless.protocol import client as client_module
from diskless.protocol import messages as m
from diskless.protocol.client import KafkaClientConnection

pytestmark = pytest.mark.integration


async def test_schema_lookup_once_per_api_version(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[tuple[str, int, int]] = Counter()

    def counting(kind: str, real: Any) -> Any:
        def load(api_key: int, version: int) -> Any:
            calls[(kind, api_key, version)] += 1
            return real(api_key, version)

        return load

    # Every route to kio's loaders: the client's own imports (if any) and the shared cached helpers.
    load_request = counting("request", kio.index.load_request_schema)
    load_response = counting("response", kio.index.load_response_schema)
    for module in (client_module, m, kio.index):
        monkeypatch.setattr(module, "load_request_schema", load_request, raising=False)
        monkeypatch.setattr(module, "load_response_schema", load_response, raising=False)
    m._request_type.cache_clear()
    m._response_type.cache_clear()
    conn = KafkaClientConnection(broker.host, broker.port, "per-request-work")
    await conn.connect()
    try:
        for _ in range(5):
            answer = await conn.request(m.API_METADATA, 9, {"topics": [], "allow_auto_topic_creation": False})
            assert answer.brokers, answer  # a real answer each time
    finally:
        await conn.close()
    metadata_calls = {k: n for k, n in calls.items() if k[1] == m.API_METADATA}
    assert metadata_calls and max(metadata_calls.values()) == 1, metadata_calls

"""Client quota APIs: DescribeClientQuotas (48) and AlterClientQuotas (49), KIP-546.

Any broker answers both from its copy of the cluster metadata; an alteration is written to the
metadata store in one transaction (``Operations.alter_client_quotas``) and every broker's watch
hands it to its quota enforcement (``throttle.py``). Authorization (DESCRIBE_CONFIGS or
ALTER_CONFIGS on the cluster, as Kafka) is decided before these handlers run (``security_apis``).
The rules and messages are Kafka's (``cluster/client_quotas.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from diskless.cluster import client_quotas as cq
from diskless.protocol import messages as m

from .api_base import ApiFamily

log = structlog.get_logger(__name__)

API_DESCRIBE_CLIENT_QUOTAS = m.API_DESCRIBE_CLIENT_QUOTAS
API_ALTER_CLIENT_QUOTAS = m.API_ALTER_CLIENT_QUOTAS


def _entity_data(entity: cq.Entity) -> list[dict[str, Any]]:
    return [{"entity_type": kind, "entity_name": name} for kind, name in entity]


class QuotaApis(ApiFamily):
    def handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        return {
            API_DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
            API_ALTER_CLIENT_QUOTAS: self.alter_client_quotas,
        }

    def describe_client_quotas(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        components = [cq.Component(c.entity_type, int(c.match_type), c.match) for c in request.components]
        try:
            found = cq.describe(self._meta.client_quotas, components, bool(request.strict))
        except cq.QuotaError as exc:
            return {"throttle_time": 0, "error_code": exc.code, "error_message": exc.message, "entries": None}
        entries = [
            {"entity": _entity_data(entity), "values": [{"key": k, "value": v} for k, v in sorted(values.items())]}
            for entity, values in sorted(found.items(), key=lambda item: cq.render(item[0]))
        ]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "entries": entries}

    async def alter_client_quotas(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        alterations = [
            cq.Alteration(
                cq.entity_of((e.entity_type, e.entity_name) for e in entry.entity),
                [(op.key, None if op.remove else float(op.value)) for op in entry.ops],
            )
            for entry in request.entries
        ]
        results = await self.broker.operations.alter_client_quotas(alterations, bool(request.validate_only))
        entries = []
        for entry, alteration in zip(request.entries, alterations, strict=True):
            code, message = results[alteration.entity]
            entries.append(
                {
                    "error_code": code,
                    "error_message": message,
                    "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity],
                }
            )
        return {"throttle_time": 0, "entries": entries}

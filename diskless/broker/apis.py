"""Kafka API dispatch: maps each API key to the handler of its family.

Handlers are version-agnostic: requests arrive as kio entities of whatever version the client
sent (fields an older version lacks are read with defaults), responses are plain dicts that the
codec fits to the client's version, and errors are Kafka error codes per topic/partition, as Kafka
returns them. Each family lives in its own module: ``metadata_apis``, ``produce_apis``,
``fetch_apis``, ``admin_apis``, ``txn_apis``, ``quota_apis``, the coordinators' handlers in ``diskless.groups`` and
``diskless.transactions``, and the internal diskless RPCs in ``diskless_rpcs``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from diskless.cluster.client_az import AzSource, ConnectionZone
from diskless.protocol import internal
from diskless.protocol import messages as m

from .admin_apis import AdminApis
from .api_base import CloseConnection
from .config_apis import ConfigApis
from .diskless_rpcs import DisklessRpcs
from .features import api_versions_features
from .fetch_apis import FetchApis
from .logdir_apis import LogDirApis
from .metadata_apis import MetadataApis
from .produce_apis import ProduceApis
from .quota_apis import QuotaApis
from .reassign_apis import ReassignApis
from .security_apis import AUTHORIZED_OPERATIONS_APIS, SecurityApis
from .tier_rpcs import TierRpcs
from .txn_apis import TxnApis
from .txn_verification_rpcs import TxnVerificationRpcs

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["CloseConnection", "KafkaApis", "api_version_entries"]


CLIENT_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


class KafkaApis:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.metadata = MetadataApis(broker)
        self.produce = ProduceApis(broker)
        self.fetch = FetchApis(broker)
        self.admin = AdminApis(broker)
        self.reassign = ReassignApis(broker)
        self.logdirs = LogDirApis(broker)
        self.configs = ConfigApis(broker)
        self.quotas = QuotaApis(broker)
        self.txn = TxnApis(broker)
        self.diskless = DisklessRpcs(broker)
        self.security = SecurityApis(broker)
        self.tier = TierRpcs(broker)
        self.zone_policy = broker.config.zone_policy()
        self._handlers: dict[int, Callable[[m.RequestHeader, Any], Any]] = {
            m.API_API_VERSIONS: self.api_versions,
            **self._coordinator_handlers(),
        }
        for family in (self.metadata, self.produce, self.fetch, self.admin, self.txn, self.security):
            self._handlers.update(family.handlers())
        for family in (self.reassign, self.logdirs, self.configs, self.quotas):
            self._handlers.update(family.handlers())
        self._internal_handlers: dict[int, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            internal.INTERNAL_COMMIT_BATCHES: self.diskless.commit_batches_rpc,
            internal.INTERNAL_AWAIT_REPLICATED: self.diskless.await_replicated,
            internal.INTERNAL_FETCH_POINTERS: self.diskless.fetch_pointers_rpc,
            internal.INTERNAL_WAL_REFERENCES: self.diskless.wal_references_rpc,
            internal.INTERNAL_TIERABLE_RANGES: self.tier.tierable_ranges_rpc,
            internal.INTERNAL_TIER_COMMIT: self.tier.tier_commit_rpc,
        }
        # KIP-890-style verification of transactional diskless commits (txn_verification_rpcs.py).
        self.txn_verification = TxnVerificationRpcs(broker)
        self._internal_handlers[internal.INTERNAL_VERIFY_TXN_PARTITION] = self.txn_verification.verify_partition
        self._internal_handlers[internal.INTERNAL_VERIFY_TXN] = self.txn_verification.verify_txn

    # --- zones ---------------------------------------------------------------------------------

    @property
    def local_az(self) -> str:
        return self.broker.config.broker_rack or "none"

    def decide_zone(self, zone: ConnectionZone, client_id: str | None) -> tuple[str, AzSource]:
        """A connection's AZ at its first request (``cluster/client_az.py``): a peer broker's rack,
        else the client's, from the strongest source there is."""
        peer = internal.broker_of_client(client_id)
        info = self.broker.metadata.brokers.get(peer) if peer is not None else None
        return zone.on_first_request(internal.az_of_client(client_id), info.rack if info is not None else None)

    def known_azs(self) -> set[str]:
        """The AZs live brokers are in: the only racks a consumer's Fetch may decide."""
        return {info.rack for info in self.broker.metadata.brokers.values() if info.rack}

    async def handle_internal(self, header: m.RequestHeader, body: dict[str, Any]) -> dict[str, Any]:
        handler = self._internal_handlers.get(header.api_key)
        if handler is None:
            return {"error_code": int(ErrorCode.invalid_request)}
        return await handler(body)

    async def handle(self, header: m.RequestHeader, request: Any) -> dict[str, Any] | None:
        """Run the API's handler on what the connection's principal may do (security_apis)."""

        async def run(allowed: Any) -> dict[str, Any] | None:
            result = self._handlers[header.api_key](header, allowed)
            if hasattr(result, "__await__"):
                result = await result
            return result

        if self.security.authorizer is None and header.api_key not in AUTHORIZED_OPERATIONS_APIS:
            return await run(request)  # no authorizer (Kafka's default): nothing to decide or fill
        # The answers of a few APIs carry authorized operations (KIP-430), filled in there even
        # with no authorizer: every operation, as Kafka answers.
        return await self.security.handle_authorized(header, request, run)

    def api_versions(self, header: m.RequestHeader, request: Any) -> dict[str, Any]:
        # v3+ names the client software; Kafka refuses names outside its pattern (KIP-511).
        names = (getattr(request, "client_software_name", None), getattr(request, "client_software_version", None))
        error = ErrorCode.none
        if header.api_version >= 3 and not all(n is not None and CLIENT_SOFTWARE.fullmatch(n) for n in names):
            error = ErrorCode.invalid_request
        body = {"error_code": error, "api_keys": api_version_entries(), "throttle_time": 0}
        return body | api_versions_features(header.api_version)

    def _coordinator_handlers(self) -> dict[int, Callable[[m.RequestHeader, Any], Any]]:
        from diskless.groups import handlers as g
        from diskless.transactions import handlers as t

        txn_table = {
            m.API_ADD_PARTITIONS_TO_TXN: t.add_partitions_to_txn,
            m.API_ADD_OFFSETS_TO_TXN: t.add_offsets_to_txn,
            m.API_END_TXN: t.end_txn,
            m.API_DESCRIBE_TRANSACTIONS: t.describe_transactions,
            m.API_LIST_TRANSACTIONS: t.list_transactions,
        }
        table = {
            m.API_JOIN_GROUP: g.join_group,
            m.API_SYNC_GROUP: g.sync_group,
            m.API_HEARTBEAT: g.heartbeat,
            m.API_LEAVE_GROUP: g.leave_group,
            m.API_OFFSET_COMMIT: g.offset_commit,
            m.API_OFFSET_FETCH: g.offset_fetch,
            m.API_OFFSET_DELETE: g.offset_delete,
            m.API_LIST_GROUPS: g.list_groups,
            m.API_DESCRIBE_GROUPS: g.describe_groups,
            m.API_DELETE_GROUPS: g.delete_groups,
            m.API_CONSUMER_GROUP_HEARTBEAT: g.consumer_group_heartbeat,
            m.API_CONSUMER_GROUP_DESCRIBE: g.consumer_group_describe,
        }

        def bind(handler: Any, shell: Callable[[], Any]) -> Callable[[m.RequestHeader, Any], Any]:
            return lambda header, request: handler(shell(), header, request)

        handlers = {key: bind(h, lambda: self.broker.groups) for key, h in table.items()}
        handlers.update({key: bind(h, lambda: self.broker.txns) for key, h in txn_table.items()})
        return handlers


# What ApiVersions advertises where it differs from what is served. As Apache Kafka 4 does
# (KAFKA-18659), Produce is advertised from v0 although only v3+ is decoded: librdkafka (kcat,
# confluent-kafka) enables gzip/snappy/lz4 only if the broker's Produce range overlaps v0, and
# otherwise silently sends those batches uncompressed. Clients use the highest common version,
# so v0-2 are never sent; one that is closes its connection like any unsupported version.
ADVERTISED_MIN_VERSIONS = {m.API_PRODUCE: 0}

# Fetch v13 names topics by id. Replica fetches use it so that a leader never serves one
# incarnation of a topic to a follower of another (KIP-516); the handler answers it correctly
# from anyone. Clients are offered v12 still: aiokafka 0.14 (v11) and kafka-python 3 (v12) never
# go higher, and librdkafka 2.16 (confluent-kafka, kcat), which would move to v13, was checked on
# plain round trips only, not on every consumer path (zone-aligned and forwarded diskless reads,
# read_committed, re-created topics). Offering v13 is this one line once those are covered.
ADVERTISED_MAX_VERSIONS = {m.API_FETCH: 12}


def api_version_entries() -> list[dict[str, int]]:
    return [
        {
            "api_key": k,
            "min_version": ADVERTISED_MIN_VERSIONS.get(k, lo),
            "max_version": ADVERTISED_MAX_VERSIONS.get(k, hi),
        }
        for k, (lo, hi) in sorted(m.SUPPORTED_VERSIONS.items())
    ]

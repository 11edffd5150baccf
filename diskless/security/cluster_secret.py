"""Where the cluster secret comes from: config, else etcd (created once), else a process's own.

``diskless.cluster.secret`` (file, ``DISKLESS_DISKLESS_CLUSTER_SECRET`` or an override) wins;
``diskless dev`` generates one into its cluster.json. Unset in a cluster, the first process to
start creates a random one in etcd, outside the metadata prefix brokers watch, and every broker
and the WAL manager read it there: reaching a broker's port is then not enough to send internal
requests, reaching etcd is (and etcd already holds the whole cluster's metadata). A standalone
broker has no peers: a random secret of its own locks everyone else out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from diskless.config import BrokerConfig


def security_prefix(cluster_id: str) -> str:
    """etcd prefix of the security records (cluster secret, SCRAM credentials, ACLs)."""
    return f"/diskless-security/{cluster_id}/"


def configured_secret(config: BrokerConfig) -> bytes | None:
    return config.diskless_cluster_secret.encode() if config.diskless_cluster_secret else None


async def load_cluster_secret(config: BrokerConfig, etcd_client: Any | None) -> bytes:
    """The secret this process proves and checks (``etcd_client``: a connected aetcd client)."""
    configured = configured_secret(config)
    if configured is not None:
        return configured
    if etcd_client is None:
        return os.urandom(32)
    key = (security_prefix(config.cluster_id) + "cluster-secret").encode()
    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(5),
        wait=wait_exponential(multiplier=0.2, max=2),
        retry=retry_if_exception_type(Exception),
        reraise=True,
    ):
        with attempt:
            tx = etcd_client.transactions
            # Create-if-absent: whichever process starts first decides it; everyone reads that one.
            await etcd_client.transaction(
                compare=[tx.version(key) == 0], success=[tx.put(key, secrets.token_hex(32).encode())], failure=[]
            )
            stored = await etcd_client.get(key)
            if stored is None or not stored.value:
                raise RuntimeError("cluster secret vanished from etcd")
            return bytes(stored.value)
    raise AssertionError("unreachable")


async def fetch_cluster_secret(config: BrokerConfig, timeout_s: float) -> bytes | None:
    """The secret as a job outside the brokers finds it (tiering job, Spark data source):
    ``diskless.cluster.secret``, else etcd's copy read with the configured etcd credentials;
    None when neither is given (internal requests will then be refused). Errors propagate."""
    configured = configured_secret(config)
    if configured is not None or not config.metadata_etcd_endpoints:
        return configured
    endpoint = config.metadata_etcd_endpoints.split(",")[0].strip().replace("http://", "")
    host, _, port = endpoint.rpartition(":")
    import aetcd

    user, password = config.etcd_credentials or (None, None)
    client = aetcd.Client(host=host or "127.0.0.1", port=int(port), timeout=timeout_s, username=user, password=password)
    try:
        await asyncio.wait_for(client.connect(), timeout_s)
        return await asyncio.wait_for(load_cluster_secret(config, client), timeout_s)
    finally:
        with contextlib.suppress(Exception):
            await client.close()

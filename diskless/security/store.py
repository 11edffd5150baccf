"""Where SCRAM credentials and ACLs live: etcd in a cluster, a JSON file for a standalone broker.

Keys sit under ``/diskless-security/<cluster id>/`` (outside the metadata prefix brokers watch):
``scram/<mechanism>/<user>`` holds a salted credential (JSON, never a password), ``acls/<id>`` one
ACL binding (its id is a hash of the binding, so creating it twice stores it once). Brokers
read credentials at each authentication and keep ACLs in memory, reloaded when the ``acls/``
prefix changes (a watch; bounded backoff when etcd is away).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any
from urllib.parse import quote, unquote

import structlog

from .acl import AclBinding
from .cluster_secret import security_prefix
from .scram import MECHANISMS, ScramCredential

log = structlog.get_logger(__name__)


class SecurityStore:
    """Key/value operations (bytes) under one prefix; subclasses pick etcd or a file."""

    async def get(self, path: str) -> bytes | None:
        raise NotImplementedError

    async def put(self, path: str, value: bytes) -> None:
        raise NotImplementedError

    async def delete(self, path: str) -> bool:
        raise NotImplementedError

    async def scan(self, prefix: str) -> dict[str, bytes]:
        raise NotImplementedError

    async def watch(self, prefix: str, on_change: Callable[[], Awaitable[None]]) -> None:
        """Call ``on_change`` whenever something under ``prefix`` changes (runs until cancelled)."""
        await asyncio.Event().wait()

    # --- SCRAM credentials ----------------------------------------------------------------------

    @staticmethod
    def _credential_path(user: str, mechanism: str) -> str:
        return f"scram/{mechanism}/{quote(user, safe='')}"

    async def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        raw = await self.get(self._credential_path(user, mechanism))
        return None if raw is None else ScramCredential.from_json(json.loads(raw))

    async def put_credential(self, user: str, credential: ScramCredential) -> None:
        await self.put(self._credential_path(user, credential.mechanism), json.dumps(credential.to_json()).encode())

    async def delete_credential(self, user: str, mechanism: str) -> bool:
        return await self.delete(self._credential_path(user, mechanism))

    async def credentials(self) -> dict[str, list[ScramCredential]]:
        """Every user's credentials (DescribeUserScramCredentials)."""
        out: dict[str, list[ScramCredential]] = {}
        for mechanism in MECHANISMS:
            for path, raw in (await self.scan(f"scram/{mechanism}/")).items():
                user = unquote(path.rsplit("/", 1)[1])
                out.setdefault(user, []).append(ScramCredential.from_json(json.loads(raw)))
        return out

    # --- ACLs -----------------------------------------------------------------------------------

    async def acls(self) -> list[AclBinding]:
        return [AclBinding(**json.loads(raw)) for raw in (await self.scan("acls/")).values()]

    async def add_acl(self, binding: AclBinding) -> None:
        await self.put(f"acls/{binding.key()}", json.dumps(asdict(binding)).encode())

    async def delete_acl(self, binding: AclBinding) -> bool:
        return await self.delete(f"acls/{binding.key()}")


class EtcdSecurityStore(SecurityStore):
    def __init__(self, client: Any, cluster_id: str) -> None:
        self.client = client  # a connected aetcd client (the metadata store's)
        self.prefix = security_prefix(cluster_id)

    def _key(self, path: str) -> bytes:
        return (self.prefix + path).encode()

    async def get(self, path: str) -> bytes | None:
        result = await self.client.get(self._key(path))
        return None if result is None else bytes(result.value)

    async def put(self, path: str, value: bytes) -> None:
        await self.client.put(self._key(path), value)

    async def delete(self, path: str) -> bool:
        return await self.client.delete(self._key(path)) is not None  # None: nothing was there

    async def scan(self, prefix: str) -> dict[str, bytes]:
        result = await self.client.get_prefix(self._key(prefix))
        return {kv.key.decode()[len(self.prefix) :]: bytes(kv.value) for kv in result}

    async def watch(self, prefix: str, on_change: Callable[[], Awaitable[None]]) -> None:
        backoff = 0.1
        while True:
            try:
                watch = await self.client.watch_prefix(self._key(prefix))
                await on_change()  # anything missed while no watch was open
                backoff = 0.1
                async for _event in watch:
                    await on_change()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("security watch lost; retrying", prefix=prefix, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


class LocalSecurityStore(SecurityStore):
    """A standalone broker's: one JSON file, rewritten atomically on each change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._data: dict[str, str] = {}
        with contextlib.suppress(FileNotFoundError), open(path) as f:
            self._data = json.load(f)
        self._changed = asyncio.Event()

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self._data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    async def get(self, path: str) -> bytes | None:
        value = self._data.get(path)
        return None if value is None else value.encode()

    async def put(self, path: str, value: bytes) -> None:
        self._data[path] = value.decode()
        self._save()

    async def delete(self, path: str) -> bool:
        existed = self._data.pop(path, None) is not None
        if existed:
            self._save()
        return existed

    async def scan(self, prefix: str) -> dict[str, bytes]:
        return {k: v.encode() for k, v in self._data.items() if k.startswith(prefix)}

"""A tiny in-memory etcd for driving EtcdMetadataStore without a server (review helper).

Implements what the store calls: get, get_prefix, put, transaction (compare on version/mod/create,
put/delete), lease, revoke_lease. Keys deleted with a revoked lease go away like in etcd."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import SimpleNamespace

from aetcd import transactions as T
from aetcd.rpc import rpc_pb2 as rpc


@dataclass
class KV:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int = 0


class Result(list):
    def __init__(self, items, revision):
        super().__init__(items)
        self.header = SimpleNamespace(revision=revision)


class Lease:
    _ids = itertools.count(1000)

    def __init__(self, etcd: FakeEtcd, ttl: int) -> None:
        self.id = next(self._ids)
        self.ttl = ttl
        self.etcd = etcd

    async def revoke(self) -> None:
        await self.etcd.revoke_lease(self.id)


class FakeEtcd:
    def __init__(self) -> None:
        self.kv: dict[bytes, KV] = {}
        self.revision = 1
        self.transactions = SimpleNamespace(
            value=T.Value, version=T.Version, create=T.Create, mod=T.Mod, put=T.Put, get=T.Get, delete=T.Delete
        )
        self.log: list[tuple[str, bytes, bytes | None]] = []  # (op, key, value)
        self.fail_after_commit = False  # raise after applying the next transaction (lost answer)
        self.fail_before_commit = 0  # raise without applying the next this many transactions (lost request)
        self.leases: set[int] = set()

    # --- writes -----------------------------------------------------------------------------
    def _put(self, key: bytes, value: bytes, lease: object = None) -> None:
        lease_id = 0 if lease is None else int(getattr(lease, "id", lease))
        old = self.kv.get(key)
        self.kv[key] = KV(
            key,
            value,
            self.revision,
            old.create_revision if old else self.revision,
            (old.version + 1) if old else 1,
            lease_id,
        )
        self.log.append(("put", key, value))

    def _delete(self, key: bytes, range_end: bytes | None) -> None:
        keys = ([key] if key in self.kv else []) if range_end is None else [k for k in self.kv if key <= k < range_end]
        for k in keys:
            del self.kv[k]
            self.log.append(("delete", k, None))

    async def put(self, key: bytes, value: bytes, lease: object = None):
        self.revision += 1
        self._put(key, value, lease)
        return SimpleNamespace(header=SimpleNamespace(revision=self.revision))

    async def get(self, key: bytes):
        return self.kv.get(key)

    async def get_prefix(self, prefix: bytes):
        return Result(
            sorted((kv for k, kv in self.kv.items() if k.startswith(prefix)), key=lambda kv: kv.key), self.revision
        )

    async def lease(self, ttl: int) -> Lease:
        lease = Lease(self, ttl)
        self.leases.add(lease.id)
        return lease

    async def revoke_lease(self, lease_id: int) -> None:
        self.leases.discard(lease_id)
        doomed = [k for k, kv in self.kv.items() if kv.lease == lease_id]
        if doomed:
            self.revision += 1
            for k in doomed:
                self._delete(k, None)

    def _check(self, cmp: T.BaseCompare) -> bool:
        kv = self.kv.get(cmp.key)
        if isinstance(cmp, T.Version):
            actual = kv.version if kv else 0
        elif isinstance(cmp, T.Mod):
            actual = kv.mod_revision if kv else 0
        elif isinstance(cmp, T.Create):
            actual = kv.create_revision if kv else 0
        else:
            actual = kv.value if kv else None
        return {
            rpc.Compare.EQUAL: actual == cmp.value,
            rpc.Compare.NOT_EQUAL: actual != cmp.value,
            rpc.Compare.LESS: actual < cmp.value,
            rpc.Compare.GREATER: actual > cmp.value,
        }[cmp.op]

    async def transaction(self, compare, success, failure):
        if self.fail_before_commit > 0:
            self.fail_before_commit -= 1
            raise ConnectionError("etcd unreachable (deadline exceeded); the transaction was not applied")
        ok = all(self._check(c) for c in compare)
        ops = success if ok else failure
        if ops:
            self.revision += 1
            for op in ops:
                if isinstance(op, T.Put):
                    self._put(op.key, op.value, op.lease)
                elif isinstance(op, T.Delete):
                    self._delete(op.key, op.range_end)
        if self.fail_after_commit:
            self.fail_after_commit = False
            raise ConnectionError("etcd answer lost (deadline exceeded) after the transaction was applied")
        return ok, []

    async def close(self) -> None:
        pass

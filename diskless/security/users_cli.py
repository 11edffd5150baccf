"""``diskless users add|delete|list``: SCRAM credentials straight in the security store.

What Kafka's ``kafka-storage format --add-scram`` is for: the first user (a super user) must
exist before any client can log in to a SASL listener and use AlterUserScramCredentials. Reads
the broker config (``--config``, ``DISKLESS_*``, ``--override``) for etcd's address and
credentials, or a standalone broker's ``log.dirs``. The password comes from
``DISKLESS_SCRAM_PASSWORD`` (or ``--password``, which other users of the machine can see).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from diskless.config import BrokerConfig, load_config

from .scram import MECHANISMS, MIN_ITERATIONS, credential_from_password
from .session import CLUSTER_USER
from .store import EtcdSecurityStore, LocalSecurityStore, SecurityStore

DEFAULT_ITERATIONS = 8192
PASSWORD_ENV = "DISKLESS_SCRAM_PASSWORD"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["add", "delete", "list"])
    parser.add_argument("--user", help="user name (add, delete)")
    parser.add_argument("--password", help=f"the password (default: ${PASSWORD_ENV})")
    parser.add_argument(
        "--mechanism", action="append", choices=sorted(MECHANISMS), help="repeatable; default SCRAM-SHA-256"
    )
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    parser.add_argument("--config", help="the brokers' properties file (etcd address and credentials)")
    parser.add_argument("--override", action="append", default=[], metavar="NAME=VALUE")


def main(args: argparse.Namespace) -> int:
    overrides = dict(item.split("=", 1) for item in args.override)
    config = load_config(args.config, overrides=overrides)
    try:
        return asyncio.run(_act(config, args))
    except _Refused as exc:
        print(f"diskless users: {exc}", file=sys.stderr)
        return 1


class _Refused(Exception):
    pass


async def _act(config: BrokerConfig, args: argparse.Namespace) -> int:
    mechanisms = args.mechanism or ["SCRAM-SHA-256"]
    client: Any = None
    if config.metadata_etcd_endpoints:
        import aetcd

        host, _, port = config.metadata_etcd_endpoints.split(",")[0].strip().replace("http://", "").rpartition(":")
        user, password = config.etcd_credentials or (None, None)
        client = aetcd.Client(host=host or "127.0.0.1", port=int(port), username=user, password=password)
        await client.connect()
        store: SecurityStore = EtcdSecurityStore(client, config.cluster_id)
    else:
        store = LocalSecurityStore(os.path.join(config.log_dirs, "security.json"))
    try:
        if args.action == "list":
            for name, credentials in sorted((await store.credentials()).items()):
                for c in sorted(credentials, key=lambda c: c.mechanism):
                    print(f"{name}  {c.mechanism}  iterations={c.iterations}")
            return 0
        if not args.user:
            raise _Refused("--user is required")
        if args.action == "add":
            password = args.password or os.environ.get(PASSWORD_ENV)
            if not password:
                raise _Refused(f"give the password in ${PASSWORD_ENV} (or --password)")
            if args.iterations < MIN_ITERATIONS:
                raise _Refused(f"--iterations must be at least {MIN_ITERATIONS}")
            if args.user == CLUSTER_USER:
                raise _Refused(f"{CLUSTER_USER} is reserved: the brokers' own principal")
            for mechanism in mechanisms:
                await store.put_credential(
                    args.user, credential_from_password(mechanism, password, None, args.iterations)
                )
                print(f"{args.user}: {mechanism} credential set")
            return 0
        for mechanism in mechanisms:
            if not await store.delete_credential(args.user, mechanism):
                raise _Refused(f"no {mechanism} credential for {args.user}")
            print(f"{args.user}: {mechanism} credential deleted")
        return 0
    finally:
        if client is not None:
            await client.close()

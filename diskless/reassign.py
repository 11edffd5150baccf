"""``diskless reassign``: scale-out and decommission as kafka-reassign-partitions does it.

    diskless reassign --bootstrap-server H:P generate [--topics a,b] [--brokers 0,1,2,3] > plan.json
    diskless reassign --bootstrap-server H:P execute --plan plan.json [--wait]
    diskless reassign --bootstrap-server H:P verify --plan plan.json       (progress; exit 0 when done)
    diskless reassign --bootstrap-server H:P cancel --plan plan.json
    diskless reassign --bootstrap-server H:P add-broker 3 [--wait]         (plan + execute)
    diskless reassign --bootstrap-server H:P remove-broker 2 [--wait]      (decommission)

Plans are balanced and rack-aware (``cluster/balance.py``) and use kafka-reassign-partitions' JSON
(``generate`` prints ``{"current": ..., "proposed": ...}``; ``execute`` takes either form). The
tool speaks the Kafka protocol to any broker: DescribeCluster, DescribeTopicPartitions (true
replicas, not zone-aligned leaders), AlterPartitionReassignments, ListPartitionReassignments.
Moving a diskless partition copies its pointer log only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diskless.cluster import balance
from diskless.protocol import messages as m
from diskless.protocol.client import KafkaClientConnection

PartitionKey = tuple[str, int]


@dataclass
class ClusterView:
    brokers: dict[int, str | None]
    assignment: dict[PartitionKey, list[int]]
    isr: dict[PartitionKey, list[int]]
    internal: set[str]


class ReassignClient:
    """A Kafka connection to one broker, for the few admin requests the tool sends."""

    def __init__(self, bootstrap: str) -> None:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.conn = KafkaClientConnection(host or "127.0.0.1", int(port), "diskless-reassign")

    async def __aenter__(self) -> ReassignClient:
        await self.conn.connect(timeout=10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def view(self) -> ClusterView:
        cluster = await self.conn.request(m.API_DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
        brokers = {int(b.broker_id): b.rack for b in cluster.brokers}
        assignment: dict[PartitionKey, list[int]] = {}
        isr: dict[PartitionKey, list[int]] = {}
        internal: set[str] = set()
        cursor = None
        while True:
            answer = await self.conn.request(
                m.API_DESCRIBE_TOPIC_PARTITIONS,
                0,
                {"topics": [], "response_partition_limit": 2000, "cursor": cursor},
            )
            for topic in answer.topics:
                if topic.is_internal:
                    internal.add(str(topic.name))
                for p in topic.partitions:
                    key = (str(topic.name), int(p.partition_index))
                    assignment[key] = [int(r) for r in p.replica_nodes]
                    isr[key] = [int(r) for r in p.isr_nodes]
            if answer.next_cursor is None:
                return ClusterView(brokers, assignment, isr, internal)
            cursor = {
                "topic_name": answer.next_cursor.topic_name,
                "partition_index": answer.next_cursor.partition_index,
            }

    async def alter(self, targets: Mapping[PartitionKey, Sequence[int] | None]) -> dict[PartitionKey, str | None]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), replicas in sorted(targets.items()):
            by_topic.setdefault(topic, []).append(
                {"partition_index": index, "replicas": None if replicas is None else list(replicas)}
            )
        answer = await self.conn.request(
            m.API_ALTER_PARTITION_REASSIGNMENTS,
            0,
            {"timeout": 60000, "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()]},
            timeout=90,
        )
        out: dict[PartitionKey, str | None] = {}
        for topic in answer.responses:
            for p in topic.partitions:
                out[(str(topic.name), int(p.partition_index))] = (
                    None if p.error_code == 0 else f"{p.error_code.name}: {p.error_message}"
                )
        return out

    async def ongoing(self) -> dict[PartitionKey, dict[str, list[int]]]:
        answer = await self.conn.request(m.API_LIST_PARTITION_REASSIGNMENTS, 0, {"timeout": 30000, "topics": None})
        return {
            (str(t.name), int(p.partition_index)): {
                "replicas": list(p.replicas),
                "adding": list(p.adding_replicas),
                "removing": list(p.removing_replicas),
            }
            for t in answer.topics
            for p in t.partitions
        }


def changed(current: Mapping[PartitionKey, Sequence[int]], proposed: Mapping[PartitionKey, Sequence[int]]) -> dict:
    return {k: list(v) for k, v in proposed.items() if list(current.get(k, [])) != list(v)}


@dataclass
class Progress:
    done: int
    moving: int
    failed: list[str]

    @property
    def complete(self) -> bool:
        return self.moving == 0 and not self.failed


async def progress(client: ReassignClient, targets: Mapping[PartitionKey, Sequence[int]]) -> Progress:
    """How far a plan has got: partitions at their target replicas (all in sync), still moving."""
    view = await client.view()
    ongoing = await client.ongoing()
    done = moving = 0
    failed: list[str] = []
    for key, target in targets.items():
        if key not in view.assignment:
            failed.append(f"{key[0]}-{key[1]}: no such partition")
        elif key not in ongoing and view.assignment[key] == list(target) and set(view.isr[key]) == set(target):
            done += 1
        else:
            moving += 1
    return Progress(done, moving, failed)


async def wait_done(client: ReassignClient, targets: Mapping[PartitionKey, Sequence[int]], timeout: float) -> Progress:
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    last = ""
    while True:
        state = await progress(client, targets)
        line = f"{state.done}/{len(targets)} partitions at their target replicas, {state.moving} moving"
        if line != last:
            print(f"[{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr)
            last = line
        if state.complete or state.failed or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.2)


def read_plan(path: str) -> dict[PartitionKey, list[int]]:
    with open(path) as f:
        data = json.load(f)
    return balance.from_json(data.get("proposed", data))


async def run(args: argparse.Namespace) -> int:
    async with ReassignClient(args.bootstrap_server) as client:
        if args.action == "generate":
            view = await client.view()
            wanted = set(args.topics.split(",")) if args.topics else None
            current = {k: v for k, v in view.assignment.items() if wanted is None or k[0] in wanted}
            ids = [int(b) for b in args.brokers.split(",")] if args.brokers else sorted(view.brokers)
            unknown = [b for b in ids if b not in view.brokers]
            if unknown:
                print(f"brokers {unknown} are not live", file=sys.stderr)
                return 2
            proposed = balance.plan(current, {b: view.brokers[b] for b in ids})
            print(json.dumps({"current": balance.to_json(current), "proposed": balance.to_json(proposed)}, indent=1))
            print(f"{balance.moves(current, proposed)} replicas move", file=sys.stderr)
            return 0
        if args.action in ("add-broker", "remove-broker"):
            view = await client.view()
            broker = int(args.broker)
            if args.action == "add-broker":
                if broker not in view.brokers:
                    print(f"broker {broker} is not live: start it first", file=sys.stderr)
                    return 2
                ids = sorted(view.brokers)
            else:
                ids = sorted(b for b in view.brokers if b != broker)
            proposed = balance.plan(view.assignment, {b: view.brokers[b] for b in ids})
            targets = changed(view.assignment, proposed)
            print(
                f"{balance.moves(view.assignment, proposed)} replicas of {len(targets)} partitions move",
                file=sys.stderr,
            )
        elif args.action in ("execute", "verify", "cancel"):
            targets = read_plan(args.plan)
            if args.action == "verify":
                state = await progress(client, targets)
                print(json.dumps({"done": state.done, "moving": state.moving, "failed": state.failed}))
                return 0 if state.complete else 1
            if args.action == "cancel":
                results = await client.alter(dict.fromkeys(targets))
                errors = {k: e for k, e in results.items() if e is not None and not e.startswith("no_reassignment")}
                for (t, p), e in sorted(errors.items()):
                    print(f"{t}-{p}: {e}", file=sys.stderr)
                return 1 if errors else 0
            view = await client.view()
            targets = changed(view.assignment, targets)
        else:
            raise SystemExit(f"unknown action {args.action}")
        if targets:
            results = await client.alter(targets)
            errors = {k: e for k, e in results.items() if e is not None}
            for (t, p), e in sorted(errors.items()):
                print(f"{t}-{p}: {e}", file=sys.stderr)
            if errors:
                return 1
        if not args.wait:
            print(json.dumps(balance.to_json(targets)))
            return 0
        state = await wait_done(client, targets, args.timeout)
        return 0 if state.complete else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", required=True, help="host:port of any broker")
    parser.add_argument("action", choices=["generate", "execute", "verify", "cancel", "add-broker", "remove-broker"])
    parser.add_argument("broker", nargs="?", help="the broker of add-broker / remove-broker")
    parser.add_argument("--topics", help="generate: comma-separated topics (default: all)")
    parser.add_argument("--brokers", help="generate: comma-separated target brokers (default: all live)")
    parser.add_argument("--plan", help="execute/verify/cancel: a plan file (generate's output or its 'proposed')")
    parser.add_argument("--wait", action="store_true", help="report progress until every partition moved")
    parser.add_argument("--timeout", type=float, default=600.0, help="--wait gives up after this many seconds")


def main(args: argparse.Namespace) -> int:
    if args.action in ("add-broker", "remove-broker") and args.broker is None:
        raise SystemExit(f"{args.action} needs a broker id")
    if args.action in ("execute", "verify", "cancel") and not args.plan:
        raise SystemExit(f"{args.action} needs --plan")
    return asyncio.run(run(args))

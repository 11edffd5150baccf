"""Leader CPU per quiet replica fetch at N partitions, with and without KIP-227 fetch sessions.

In one process, without sockets: a leader's real Fetch handler (FetchApis over a broker stand-in
from tests/unit/test_topic_identity.py) and a follower's real ReplicaFetcher, N partitions of one
topic led by broker 0 and followed by broker 1, every partition caught up. Each round goes
through the real codec (request encoded, decoded by the leader, answered, answer encoded, decoded
and applied by the fetcher), as ``ReplicaFetcher._run`` does, and the leader's share (decode,
handler, encode) and the follower's share are timed in CPU seconds.
``max.incremental.fetch.session.cache.slots=0`` is the sessionless fetch every round names every
partition (the behaviour before fetch sessions). ``--appends K`` appends a batch to K partitions
before each round (rotating), as a low produce rate does: each round then has news for a few.

    .venv/bin/python bench/fetch_sessions.py [--partitions 1000] [--rounds 200] [--appends 0]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import io
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_topic_identity import CONFIG, FetchingBroker, now_ms, produce_pointer

from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.protocol import internal
from diskless.protocol import messages as m
from diskless.replication.fetcher import FETCH_VERSION, ReplicaFetcher


async def measure(partitions: int, rounds: int, slots: int, appends: int = 0) -> tuple[float, float, int]:
    """Leader and follower CPU ms per fetch (the median round), and the partitions named by the last request."""
    with tempfile.TemporaryDirectory() as tmp:
        leader = FetchingBroker(Path(tmp) / "leader", 0)
        leader.config = dataclasses.replace(leader.config, max_incremental_fetch_session_cache_slots=slots)
        follower = FetchingBroker(Path(tmp) / "follower", 1)
        states = [PartitionState(replicas=[0, 1], leader=0, leader_epoch=0, isr=[0, 1]) for _ in range(partitions)]
        meta = TopicMetadata("t", str(uuid.uuid4()), states, {"diskless.enabled": "true"})
        leader.metadata.topics["t"] = follower.metadata.topics["t"] = meta
        fetcher = ReplicaFetcher(1, 0, lambda node: None, 0, 1 << 20, lambda: None)
        replicas = []
        for index in range(partitions):
            assert leader.replicas.apply(meta, index, CONFIG, now_ms()) is not None
            replica = follower.replicas.apply(meta, index, CONFIG, now_ms())
            assert replica is not None
            fetcher.add(replica)
            replicas.append(replica)
        header = m.RequestHeader(m.API_FETCH, FETCH_VERSION, 7, internal.broker_client_id(1, "replica-fetcher"))
        request_cls = m._request_type(m.API_FETCH, FETCH_VERSION)
        response_reader = m._reader(m._response_type(m.API_FETCH, FETCH_VERSION))
        leader_cpu: list[float] = []
        follower_cpu: list[float] = []
        named = 0
        try:
            for round_ in range(rounds + 5):  # 5 rounds to open the session and settle
                for i in range(appends):
                    produce_pointer(leader.replicas.partitions[("t", (round_ * appends + i) % partitions)], "wal/x")
                t0 = time.process_time()
                body = dataclasses.replace(fetcher._request(), max_wait=datetime.timedelta(0))
                out = io.BytesIO()
                m._writer(request_cls)(out, body)
                t1 = time.process_time()
                request, _ = m._reader(request_cls)(memoryview(out.getvalue()), 0)
                frame = m.encode_response(header, await leader.fetch_apis.fetch(header, request))
                t2 = time.process_time()
                response, _ = response_reader(memoryview(frame)[9:], 0)
                if fetcher.session.handle_response(response.error_code, response.session_id):
                    fetcher._handle(response)
                t3 = time.process_time()
                if round_ >= 5:
                    leader_cpu.append(t2 - t1)
                    follower_cpu.append((t1 - t0) + (t3 - t2))
                named = sum(len(t.partitions) for t in request.topics)
        finally:
            await leader.replicas.close()
            await follower.replicas.close()
        # The median round: a mean took in collections and preemption, ±40% between runs here.
        return statistics.median(leader_cpu) * 1000, statistics.median(follower_cpu) * 1000, named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--appends", type=int, default=0, help="partitions appended to before each round")
    args = parser.parse_args()
    for label, slots in (("sessionless", 0), ("fetch sessions", 1000)):
        leader_ms, follower_ms, named = asyncio.run(measure(args.partitions, args.rounds, slots, args.appends))
        print(
            f"{label:15s} {args.partitions} partitions, {args.appends} appended per round: leader {leader_ms:.3f} ms"
            f" CPU per fetch, follower {follower_ms:.3f} ms, request names {named} partitions"
        )


if __name__ == "__main__":
    main()

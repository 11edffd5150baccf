"""Broker CPU per sessionless consumer Fetch at N partitions, one of which has a new batch.

librdkafka's consumers open no KIP-227 fetch sessions: every Fetch names every partition the
consumer is assigned, and every answer carries every one of them. With a tail consumer long
polling (fetch.min.bytes=1), each append anywhere in its assignment ends its wait, so this cost
is paid once per append, per consumer. In one process, without sockets: the real Fetch handler
(FetchApis over the broker stand-in of tests/unit/test_topic_identity.py) leading N partitions of
one classic topic; each round appends one batch to the next partition, then a consumer's Fetch
(the version librdkafka sends) goes through the broker's path: decoded (header, length guard,
kio), handled, answer encoded.

    .venv/bin/python bench/consumer_fetch.py [--partitions 1000] [--rounds 200] [--version 12]
        [--diskless [--followers]] [--no-memo]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from batches import values_batch
from fetch_requests import consumer_fetch
from test_topic_identity import CONFIG, FetchingBroker, now_ms

from diskless.broker.idle_fetches import CURRENT_IDLE_FETCHES, IdleFetchMemo
from diskless.cluster.metadata import PartitionState, TopicMetadata
from diskless.logs import configure_logging
from diskless.protocol import messages as m


class ClassicBroker(FetchingBroker):
    @staticmethod
    def is_diskless(meta: TopicMetadata) -> bool:
        return False


async def measure(
    partitions: int, rounds: int, version: int, diskless: bool, followers: bool = False, memo: bool = True
) -> tuple[float, float, float, int]:
    """Broker CPU ms per fetch (decode, handler, encode), and the answer's size in bytes.

    ``diskless``: the topic is diskless and nothing is appended (every partition idle; the stand-in
    has no object storage to serve pointers from). ``followers``: this broker follows every
    partition (a diskless topic's consumers read from their AZ's replica, a follower for most).
    ``memo``: the fetches come over one connection, which keeps its idle partitions' answers
    (broker/idle_fetches.py), as a broker's connections do."""
    if memo:
        CURRENT_IDLE_FETCHES.set(IdleFetchMemo())
    with tempfile.TemporaryDirectory() as tmp:
        broker = (FetchingBroker if diskless else ClassicBroker)(Path(tmp) / "broker", 0)
        topic_id = uuid.uuid4()
        leader = 1 if followers else 0
        states = [
            PartitionState(replicas=[leader, 0], leader=leader, leader_epoch=0, isr=[leader, 0])
            for _ in range(partitions)
        ]
        meta = TopicMetadata("t", str(topic_id), states, {})
        broker.metadata.topics["t"] = meta
        replicas = []
        for index in range(partitions):
            replica = broker.replicas.apply(meta, index, CONFIG, now_ms())
            assert replica is not None and replica.log is not None
            replica.heard_from_leader_ms = now_ms() + 3_600_000  # fresh for the whole run
            replicas.append(replica)
        request_cls = m._request_type(m.API_FETCH, version)
        decode = handle = encode = 0.0
        size = 0
        offsets = [0] * partitions
        batch = memoryview(values_batch(1))
        try:
            for round_ in range(rounds + 5):
                index = round_ % partitions
                replica = replicas[index]
                if not diskless:
                    replica.log.append_as_leader([batch], 0, now_ms(), check_sequence=False)
                    replica.log.high_watermark = replica.log.log_end_offset
                out = io.BytesIO()
                out.write(struct.pack(">hhih", m.API_FETCH, version, 7, len(b"consumer")) + b"consumer")
                if request_cls.__flexible__:
                    out.write(b"\x00")  # no tagged fields in the header
                m._writer(request_cls)(out, consumer_fetch(version, "t", topic_id, offsets))
                frame = out.getvalue()
                t0 = time.process_time()
                # As the broker reads a request: header, the length guard, then kio.
                header, body_pos = m.parse_header(frame)
                request = m.decode_request(header, frame, body_pos)
                t1 = time.process_time()
                answer = await broker.fetch_apis.fetch(header, request)
                t2 = time.process_time()
                frame = m.encode_response(header, answer)
                t3 = time.process_time()
                offsets[index] = replica.log.log_end_offset
                size = len(frame)
                if round_ >= 5:
                    decode += t1 - t0
                    handle += t2 - t1
                    encode += t3 - t2
        finally:
            await broker.replicas.close()
        return decode / rounds * 1000, handle / rounds * 1000, encode / rounds * 1000, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--version", type=int, default=12)
    parser.add_argument("--diskless", action="store_true", help="a diskless topic, every partition idle")
    parser.add_argument("--followers", action="store_true", help="with --diskless: this broker follows them all")
    parser.add_argument("--no-memo", action="store_true", help="decide every partition afresh (no connection memo)")
    args = parser.parse_args()
    configure_logging("WARNING")
    decode, handle, encode, size = asyncio.run(
        measure(
            args.partitions,
            args.rounds,
            args.version,
            args.diskless,
            args.diskless and args.followers,
            memo=not args.no_memo,
        )
    )
    shape = "diskless, all idle" if args.diskless else "classic, one with a new batch"
    shape += ", followed here" if args.diskless and args.followers else ""
    shape += ", no connection memo" if args.no_memo else ""
    print(
        f"Fetch v{args.version}, {args.partitions} partitions ({shape}): broker CPU per fetch"
        f" {decode + handle + encode:.2f} ms (decode {decode:.2f}, handler {handle:.2f}, encode {encode:.2f}),"
        f" answer {size} bytes"
    )


if __name__ == "__main__":
    main()

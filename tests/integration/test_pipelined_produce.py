"""A client's pipelined diskless produce requests on one connection share one flush.

librdkafka puts one partition in each ProduceRequest; without idempotence it keeps up to 1,000,000
requests in flight, so at 1,000 partitions a producer has hundreds outstanding on one connection.
The broker read at most 64 requests per connection ahead of its answers, so such a producer's
requests were spread over flush after flush: at 1,000 partitions, 454 records/s against the 900
offered and 0.5 MB/s at maximum in ``diskless bench`` (838 records/s and 14 MB/s with 512).

Here 200 requests sent back to back on one connection, a diskless.wal.linger.ms apart from nothing
else, must be answered together: read before the first flush, they are all in it. Answers more
than a linger apart would mean two flushes (flushes are at least a linger apart).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from rawclient import RawClient, build_batch, encode_request, produce_request, response_class

pytestmark = pytest.mark.integration

TOPIC = "pipelined"
REQUESTS = 200
LINGER_MS = 1000


def test_pipelined_produce_requests_on_one_connection_share_a_flush(cluster_factory: Any) -> None:
    cluster = cluster_factory(brokers=1, azs=1, s3=True, overrides={"diskless.wal.linger.ms": str(LINGER_MS)})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config={"diskless.enabled": "true"})])[TOPIC].result(30)
    with RawClient(cluster.bootstrap, timeout=30) as client:
        # The topic's leader known and a first flush behind us: the next one is a linger away at most.
        first = client.request(produce_request(TOPIC, 0, build_batch([(None, b"warm-up")]), acks=1))
        assert first.responses[0].partition_responses[0].error_code == 0
        requests = [produce_request(TOPIC, 0, build_batch([(None, b"r%d" % i)]), acks=1) for i in range(REQUESTS)]
        ids = [client.correlation() for _ in requests]
        client.send_raw(b"".join(encode_request(r, cid) for r, cid in zip(requests, ids, strict=True)))
        answered: list[float] = []
        offsets: list[int] = []
        for request, cid in zip(requests, ids, strict=True):
            response = client.receive(response_class(request), 0, cid)
            answered.append(time.monotonic())
            (partition,) = response.responses[0].partition_responses
            assert partition.error_code == 0
            offsets.append(partition.base_offset)
    assert offsets == sorted(offsets) and len(set(offsets)) == REQUESTS  # in order, each once
    spread_ms = (answered[-1] - answered[0]) * 1000
    assert spread_ms < LINGER_MS / 2, f"answers {spread_ms:.0f} ms apart: more than one flush"

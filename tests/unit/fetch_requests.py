"""A consumer's Fetch request as librdkafka builds it, for tests and bench/consumer_fetch.py."""

from __future__ import annotations

import datetime
import sys
import uuid
from typing import Any

from diskless.protocol import messages as m


def consumer_fetch(version: int, topic: str, topic_id: uuid.UUID, offsets: list[int]) -> Any:
    """Fetch ``version`` of partitions 0..len(offsets)-1 at ``offsets``: every partition, no session,
    read_uncommitted, no wait (v11+: the fields librdkafka fills)."""
    cls = m._request_type(m.API_FETCH, version)
    module = sys.modules[cls.__module__]
    partitions = tuple(
        module.FetchPartition(
            partition=index,
            current_leader_epoch=0,
            fetch_offset=offset,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        for index, offset in enumerate(offsets)
    )
    fetch_topic = (
        module.FetchTopic(topic_id=topic_id, partitions=partitions)
        if version >= 13
        else module.FetchTopic(topic=topic, partitions=partitions)
    )
    return cls(
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=50 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(fetch_topic,),
        forgotten_topics_data=(),
        rack_id="",
    )

"""The __consumer_offsets topic is created by the first FindCoordinator; its client may close the
connection before the answer (librdkafka sends FindCoordinator on its bootstrap connection and
closes that connection at once). The creation went on in the request's task, cancelled with the
connection: the partitions not yet set up by then never got a coordinator, and every group hashed
to them got COORDINATOR_LOAD_IN_PROGRESS until the broker restarted. 500 partitions take longer
than one stretch of metadata application (APPLY_SLICE_S), as 50 do on a loaded machine."""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.describe_groups.v0.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
from rawclient import RawClient
from support import BrokerProcess, wait_until

from diskless.groups.records import partition_for

PARTITIONS = 500


def a_group_per_partition() -> list[str]:
    groups: dict[int, str] = {}
    n = 0
    while len(groups) < PARTITIONS:
        groups.setdefault(partition_for(f"g{n}", PARTITIONS), f"g{n}")
        n += 1
    return list(groups.values())


def test_every_offsets_partition_gets_a_coordinator_when_the_creating_client_hangs_up(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory({"offsets.topic.num.partitions": str(PARTITIONS)})
    with RawClient(broker.bootstrap) as client:
        client.send(FindCoordinatorRequest(key="first", key_type=0))
    groups = a_group_per_partition()

    def unloaded() -> list[str]:
        with RawClient(broker.bootstrap, timeout=30) as client:
            client.request(FindCoordinatorRequest(key="first", key_type=0))  # creates the topic if it has to
            answer = client.request(DescribeGroupsRequest(groups=tuple(groups)))
        return [g.group_id for g in answer.groups if g.error_code != ErrorCode.none]

    wait_until(lambda: not unloaded(), 20, 0.2, message="offsets partitions without a coordinator")

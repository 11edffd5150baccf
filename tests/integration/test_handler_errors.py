"""A request whose handler fails unexpectedly gets the API's error code; its connection lives on.

The failure is a real one: the cluster's etcd is gone when CreateTopics reaches the broker, so the
metadata write raises inside the handler. Requests pipelined behind it on the same connection are
answered, in order.
"""

from __future__ import annotations

import datetime

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.create_topics.v5.request import CreatableTopic, CreateTopicsRequest
from kio.schema.create_topics.v5.response import CreateTopicsResponse
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v9.response import MetadataResponse
from rawclient import Session, metadata_request
from support import wait_until

pytestmark = pytest.mark.integration


def create_topics(name: str, partitions: int) -> CreateTopicsRequest:
    return CreateTopicsRequest(
        topics=(
            CreatableTopic(name=name, num_partitions=partitions, replication_factor=1, assignments=(), configs=()),
        ),
        timeout=datetime.timedelta(seconds=30),
        validate_only=False,
    )


def test_failing_handler_answers_with_error_and_keeps_the_connection(cluster_factory) -> None:
    cluster = cluster_factory(brokers=1, azs=1)
    with Session(cluster.brokers[0].bootstrap, timeout=60) as session:
        assert session.request(create_topics("kept", 1)).topics[0].error_code == ErrorCode.none
        cluster.etcd.kill()
        # CreateTopics and a Metadata request pipelined behind it, on one connection.
        create_id = session.send(create_topics("refused", 3))
        metadata_id = session.send(metadata_request(["kept"]))
        answer = session.receive(CreateTopicsResponse, 19, create_id)
        assert [t.name for t in answer.topics] == ["refused"]
        assert answer.topics[0].error_code in (ErrorCode.unknown_server_error, ErrorCode.request_timed_out)
        metadata = session.receive(MetadataResponse, 3, metadata_id)
        assert [t.name for t in metadata.topics] == ["kept"]
        assert metadata.topics[0].error_code == ErrorCode.none
        # And the connection keeps serving afterwards.
        versions = session.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        assert versions.error_code == ErrorCode.none
    log = (cluster.root / "broker-0.log").read_text()
    wait_until(lambda: "request handler failed; answering with an error" in log, 1, message=log[-2000:])

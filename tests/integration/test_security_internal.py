"""Internal requests (CommitBatches, replica fetches, ...) are served only to connections that
proved the cluster secret at their start: an ordinary client connection that sends one gets
CLUSTER_AUTHORIZATION_FAILED and nothing changes. A broker says at the handshake that it serves
the compact replica fetch form; a version it did not list, or bytes that are none, close that
connection only.

Real processes: etcd, the embedded S3 server and one broker (a diskless topic with one replica),
driven by a raw internal-RPC connection as a hostile or confused client would open it.
"""

from __future__ import annotations

import datetime
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v13.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId
from kio.static.primitive import i32, i32Timedelta, i64
from rawclient import Session, build_batch
from support import wait_until

from diskless.protocol import internal, replica_fetch_wire
from diskless.protocol.client import ClientError, KafkaClientConnection
from diskless.security.internal_auth import ClusterSecret

pytestmark = pytest.mark.integration

TOPIC = "guarded"
CLUSTER_AUTHORIZATION_FAILED = 31
SECRET = "s3cr3t-for-this-test"


def topic_id_of(bootstrap: str) -> str:
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=TOPIC),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )

    def found() -> str | None:
        with Session(bootstrap, timeout=10) as session:
            (answer,) = session.request(request).topics
        ok = answer.error_code == 0 and answer.partitions and answer.partitions[0].leader_id >= 0
        return str(answer.topic_id) if ok else None

    return wait_until(found, 30, 0.05, f"{TOPIC} never got a leader")


def commit_body(topic_id: str) -> dict[str, object]:
    """A CommitBatches request naming a WAL object that does not exist, as the issue's new user sent."""
    import time

    header = build_batch([(b"k", b"forged")])[:61]
    return {
        "key": "wal/2026/01/01/00/0-az-1-0-forged.wal",
        "created_ms": int(time.time() * 1000),
        "entries": [
            {
                "topic": TOPIC,
                "topic_id": topic_id,
                "partition": 0,
                "header": header,
                "position": 0,
                "acks": 1,
                "leader_epoch": -1,
            }
        ],
    }


class CompactFetches:
    """Replica fetches of partition 0 from offset 0 in the compact form, on one connection (the
    follower's end of its state)."""

    def __init__(self, conn: KafkaClientConnection, topic_id: str) -> None:
        self.conn, self.request = conn, compact_replica_fetch(topic_id)
        self.state = replica_fetch_wire.ConnectionState()

    async def send(self, body: bytes | None = None, version: int = 0) -> replica_fetch_wire.FetchAnswer:
        if body is None:
            body = replica_fetch_wire.encode_request(self.request, self.state)
        return await self.conn.request_unnamed(
            internal.INTERNAL_REPLICA_FETCH,
            body,
            lambda view: replica_fetch_wire.decode_answer(view, self.state),
            version=version,
        )


def compact_replica_fetch(topic_id: str) -> FetchRequest:
    """A replica fetch of partition 0 from offset 0."""
    partition = FetchPartition(
        partition=i32(0),
        current_leader_epoch=i32(-1),
        fetch_offset=i64(0),
        last_fetched_epoch=i32(-1),
        log_start_offset=i64(-1),
        partition_max_bytes=i32(1 << 20),
    )
    request = FetchRequest(
        replica_id=BrokerId(5),
        max_wait=i32Timedelta.parse(datetime.timedelta(0)),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        topics=(FetchTopic(topic_id=uuid.UUID(topic_id), partitions=(partition,)),),
        forgotten_topics_data=(),
    )
    return request


def high_watermark(bootstrap: str) -> int:
    with Session(bootstrap, timeout=10) as session:
        partition = session.fetch(TOPIC, 0, 0)
    assert partition.error_code == 0
    return int(partition.high_watermark)


async def test_client_connection_cannot_commit_or_replicate(cluster_factory) -> None:
    cluster = cluster_factory(brokers=1, azs=1, s3=True, overrides={"diskless.cluster.secret": SECRET})
    broker = cluster.brokers[0]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config={"diskless.enabled": "true"})])[TOPIC].result(30)
    topic_id = topic_id_of(cluster.bootstrap)

    # A plain connection (no credentials), even one that names itself like a broker.
    for client_id in ("rawclient", internal.broker_client_id(7, "peer")):
        conn = KafkaClientConnection(broker.host, broker.port, client_id)
        await conn.connect()
        try:
            answer = await conn.wait(conn.send_internal(internal.INTERNAL_COMMIT_BATCHES, commit_body(topic_id)))
        finally:
            await conn.close()
        assert answer.get("error_code") == CLUSTER_AUTHORIZATION_FAILED, answer
        assert "results" not in answer
    assert high_watermark(cluster.bootstrap) == 0

    # Every internal RPC (tiering, transaction verification, ...) is refused the same way.
    conn = KafkaClientConnection(broker.host, broker.port, "rawclient")
    await conn.connect()
    try:
        for api in sorted(internal.INTERNAL_APIS - internal.AUTH_APIS):
            answer = await conn.wait(conn.send_internal(api, {}))
            assert answer == {"error_code": CLUSTER_AUTHORIZATION_FAILED}, (api, answer)
    finally:
        await conn.close()

    # A replica fetch (replica_id >= 0) from a client connection is refused too, per partition.
    conn = KafkaClientConnection(broker.host, broker.port, "rawclient")
    await conn.connect()
    try:
        replica_fetch = {
            "replica_id": 5,
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        }
        answer = await conn.request(1, 12, replica_fetch)
    finally:
        await conn.close()
    codes = [p.error_code for t in answer.responses for p in t.partitions]
    assert codes == [CLUSTER_AUTHORIZATION_FAILED], codes

    # So is one in the compact form (replica_fetch_wire), as a whole.
    conn = KafkaClientConnection(broker.host, broker.port, "rawclient")
    await conn.connect()
    try:
        refused = await CompactFetches(conn, topic_id).send()
    finally:
        await conn.close()
    assert refused.error_code == CLUSTER_AUTHORIZATION_FAILED and not refused.responses, refused

    # The same replica fetches on a connection that proved the secret are served; its handshake
    # said the broker serves the compact form.
    conn = KafkaClientConnection(broker.host, broker.port, "rawclient", credentials=ClusterSecret(SECRET.encode()))
    await conn.connect()
    try:
        answer = await conn.request(1, 12, replica_fetch)
        assert internal.INTERNAL_REPLICA_FETCH in conn.served_apis
        compact = CompactFetches(conn, topic_id)
        served = await compact.send()
        # Further requests on the connection name the topic by its alias, and answers too.
        again = await compact.send()
        assert len(compact.state.ids) == 1
    finally:
        await conn.close()
    codes = [p.error_code for t in answer.responses for p in t.partitions]
    assert codes == [0], codes
    for fetched in (served, again):
        codes = [p.error_code for t in fetched.responses for p in t.partitions]
        assert codes == [0] and str(fetched.responses[0].topic_id) == topic_id, fetched

    # A version the broker did not list, or bytes that are no compact request, close that
    # connection only (the next one is served).
    for body, version in ((None, 1), (b"\xff\xff", 0)):
        conn = KafkaClientConnection(broker.host, broker.port, "rawclient", credentials=ClusterSecret(SECRET.encode()))
        await conn.connect()
        try:
            with pytest.raises(ClientError):
                await CompactFetches(conn, topic_id).send(body, version)
        finally:
            await conn.close()
    conn = KafkaClientConnection(broker.host, broker.port, "rawclient", credentials=ClusterSecret(SECRET.encode()))
    await conn.connect()
    try:
        fine = await CompactFetches(conn, topic_id).send()
    finally:
        await conn.close()
    assert [p.error_code for t in fine.responses for p in t.partitions] == [0]

    # A connection proving a wrong secret is refused at the handshake.
    conn = KafkaClientConnection(broker.host, broker.port, "rawclient", credentials=ClusterSecret(b"not-the-secret"))
    with pytest.raises(Exception, match="authentication"):
        await conn.connect()
    await conn.close()
    assert high_watermark(cluster.bootstrap) == 0

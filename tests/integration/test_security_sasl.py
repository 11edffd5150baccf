"""SASL_SSL with SCRAM (and PLAIN) for real clients, SCRAM users and ACLs managed through the
Kafka admin APIs, and ACLs enforced on produce.

One broker with etcd: an inter-broker PLAINTEXT listener (brokers prove the cluster secret on
it) and a SASL_SSL client listener whose certificate comes from a throwaway CA
(``security/tls.py``). The first user (``admin``, a super user) is written into etcd as
``kafka-storage format --add-scram`` would; admin then creates the other users with
AlterUserScramCredentials and grants ACLs with CreateAcls, through confluent-kafka's AdminClient.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aetcd
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from rawclient import Session

from diskless.local.servers import BrokerServer, EtcdServer, S3Server
from diskless.security.scram import credential_from_password
from diskless.security.store import EtcdSecurityStore
from diskless.security.tls import make_dev_certs

pytestmark = pytest.mark.integration

TOPIC = "ledger"
CLUSTER_ID = "diskless-cluster-0000000"
ALLOW = AclPermissionType.ALLOW
TOPIC_AUTHORIZATION_FAILED = 29
HOST = "127.0.1.1"


class SecureBroker:
    def __init__(self, root: Path, s3: bool = False) -> None:
        self.root = root
        self.s3 = S3Server(root / "s3") if s3 else None
        self.certs = make_dev_certs(root / "certs", [HOST])
        self.etcd = EtcdServer(root / "etcd")
        overrides = {
            "listener.security.protocol.map": "BROKER:PLAINTEXT,AZ_1:SASL_SSL",
            "ssl.keystore.location": str(self.certs.keystore),
            "authorizer.class.name": "diskless",
            "super.users": "User:admin",
            "allow.everyone.if.no.acl.found": "false",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.num.partitions": "2",
            "offsets.topic.num.partitions": "2",
            "metrics.port": "0",
        }
        self.broker = BrokerServer(0, root / "broker-0", HOST, "az-1", None, overrides, client_azs=["az-1"])

    def start(self) -> SecureBroker:
        if self.s3 is not None:
            self.s3.start()
            self.broker.overrides["diskless.s3.endpoint"] = self.s3.endpoint
        self.etcd.start()
        asyncio.run(self._add_admin())
        self.broker.etcd = self.etcd.endpoint
        self.broker.start()
        return self

    async def _add_admin(self) -> None:
        host, _, port = self.etcd.endpoint.rpartition(":")
        client = aetcd.Client(host=host, port=int(port))
        await client.connect()
        try:
            store = EtcdSecurityStore(client, CLUSTER_ID)
            await store.put_credential("admin", credential_from_password("SCRAM-SHA-512", "admin-secret"))
        finally:
            await client.close()

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_for("az-1")

    def kill(self) -> None:
        self.broker.kill()
        self.etcd.kill()
        if self.s3 is not None:
            self.s3.kill()


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureBroker]:
    cluster = SecureBroker(tmp_path)
    try:
        yield cluster.start()
    finally:
        cluster.kill()


def client_config(secure: SecureBroker, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, Any]:
    return {
        "bootstrap.servers": secure.bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(secure.certs.ca),
    }


def produce(config: dict[str, Any], value: bytes) -> KafkaError | None:
    """One record; the delivery error (None on success)."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 15000, "enable.idempotence": False})
    producer.produce(TOPIC, value, on_delivery=lambda err, msg: outcome.append(err))
    assert producer.flush(30) == 0
    return outcome[0]


def end_offset(config: dict[str, Any]) -> int:
    consumer = Consumer({**config, "group.id": f"probe-{uuid.uuid4().hex[:6]}"})
    try:
        from confluent_kafka import TopicPartition as CTopicPartition

        return int(consumer.get_watermark_offsets(CTopicPartition(TOPIC, 0), timeout=15)[1])
    finally:
        consumer.close()


async def aiokafka_read(secure: SecureBroker, user: str, password: str, mechanism: str) -> list[bytes]:
    context = ssl.create_default_context(cafile=str(secure.certs.ca))
    consumer = AIOKafkaConsumer(
        bootstrap_servers=secure.bootstrap,
        security_protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_plain_username=user,
        sasl_plain_password=password,
        ssl_context=context,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        partition = TopicPartition(TOPIC, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        batch = await consumer.getmany(partition, timeout_ms=10000)
        return [record.value for record in batch.get(partition, [])]
    finally:
        await consumer.stop()


def kcat_read(secure: SecureBroker, user: str, password: str, mechanism: str) -> list[str]:
    command = [
        "kcat", "-b", secure.bootstrap, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-q", "-f", "%s\\n",
        "-X", "security.protocol=SASL_SSL", "-X", f"sasl.mechanisms={mechanism}",
        "-X", f"sasl.username={user}", "-X", f"sasl.password={password}",
        "-X", f"ssl.ca.location={secure.certs.ca}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_sasl_ssl_scram_clients_and_topic_acls(secure: SecureBroker) -> None:
    admin = AdminClient(client_config(secure, "admin", "admin-secret", "SCRAM-SHA-512"))
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    users = [
        UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"alice-pw"),
        UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"alice-pw"),
        UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"bob-pw"),
    ]
    for future in admin.alter_user_scram_credentials(users).values():
        future.result(30)
    described = admin.describe_user_scram_credentials(["alice"])["alice"].result(30)
    assert sorted(i.iterations for i in described.scram_credential_infos) == [4096, 8192]

    def grant(principal: str, operation: AclOperation) -> AclBinding:
        return AclBinding(
            ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, principal, "*", operation, AclPermissionType.ALLOW
        )

    acls = [grant("User:alice", AclOperation.WRITE), grant("User:alice", AclOperation.READ)]
    acls.append(grant("User:bob", AclOperation.READ))
    for future in admin.create_acls(acls).values():
        future.result(30)
    listed = admin.describe_acls(
        AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
        )
    ).result(30)
    assert sorted((a.principal, a.operation) for a in listed) == sorted((a.principal, a.operation) for a in acls)

    alice = client_config(secure, "alice", "alice-pw", "SCRAM-SHA-512")
    assert produce(alice, b"from-alice") is None
    # kcat (SCRAM-SHA-256), aiokafka (SCRAM-SHA-256 and PLAIN) read it back over SASL_SSL.
    assert kcat_read(secure, "alice", "alice-pw", "SCRAM-SHA-256") == ["from-alice"]
    assert asyncio.run(aiokafka_read(secure, "alice", "alice-pw", "SCRAM-SHA-256")) == [b"from-alice"]
    assert asyncio.run(aiokafka_read(secure, "bob", "bob-pw", "PLAIN")) == [b"from-alice"]

    # bob may read, not write: TOPIC_AUTHORIZATION_FAILED and nothing is written.
    error = produce(client_config(secure, "bob", "bob-pw"), b"from-bob")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert end_offset(alice) == 1
    assert kcat_read(secure, "alice", "alice-pw", "SCRAM-SHA-256") == ["from-alice"]

    # A wrong password never gets in: librdkafka reports an authentication error.
    errors: list[KafkaError] = []
    wrong = AdminClient({**client_config(secure, "alice", "not-it"), "error_cb": errors.append})
    with pytest.raises(Exception, match="transport failure"):
        wrong.list_topics(timeout=5)
    wrong.poll(1)  # error callbacks are served by poll
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_acls_on_reads_groups_metadata_and_admin(secure: SecureBroker) -> None:
    admin = AdminClient(client_config(secure, "admin", "admin-secret", "SCRAM-SHA-512"))
    admin.create_topics([NewTopic(TOPIC, 1, 1), NewTopic("hidden", 1, 1)])[TOPIC].result(30)
    users = [
        UserScramCredentialUpsertion(
            name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), f"{name}-pw".encode()
        )
        for name in ("bob", "carol")
    ]
    for future in admin.alter_user_scram_credentials(users).values():
        future.result(30)
    read = AclBinding(
        ResourceType.TOPIC,
        TOPIC,
        ResourcePatternType.LITERAL,
        "User:bob",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    readers = AclBinding(
        ResourceType.GROUP, "readers-", ResourcePatternType.PREFIXED, "User:bob", "*", AclOperation.READ, ALLOW
    )
    for future in admin.create_acls([read, readers]).values():
        future.result(30)
    assert produce(client_config(secure, "admin", "admin-secret", "SCRAM-SHA-512"), b"x") is None

    # Metadata: carol sees no topic; bob sees only the one he may read.
    carol = AdminClient(client_config(secure, "carol", "carol-pw"))
    assert set(carol.list_topics(timeout=15).topics) == set()
    bob = client_config(secure, "bob", "bob-pw")
    assert set(AdminClient(bob).list_topics(timeout=15).topics) == {TOPIC}

    # A consumer group bob has no ACL on: GROUP_AUTHORIZATION_FAILED.
    consumer = Consumer({**bob, "group.id": "bobs-group", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        error = None
        while error is None and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is not None:
                error = message.error()
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error
    finally:
        consumer.close()

    # Non-super users cannot change ACLs: CLUSTER_AUTHORIZATION_FAILED.
    grab = AclBinding(
        ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.ALL, AclPermissionType.ALLOW
    )
    bob_admin = AdminClient(bob)
    with pytest.raises(Exception, match="CLUSTER_AUTHORIZATION_FAILED"):
        bob_admin.create_acls([grab])[grab].result(30)

    # DeleteAcls takes bob's READ away: his reads are then refused.
    everything_of_bob = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None, AclOperation.ANY, AclPermissionType.ANY
    )
    deleted = admin.delete_acls([everything_of_bob])[everything_of_bob].result(30)
    expected = [(TOPIC, AclOperation.READ), ("readers-", AclOperation.READ)]
    assert sorted((b.name, b.operation) for b in deleted) == sorted(expected)
    admin.create_acls([readers])[readers].result(30)  # the group again: only the topic is denied now
    assert set(AdminClient(bob).list_topics(timeout=15).topics) == set()
    assert read_error(bob, 10) is None  # nothing read (librdkafka keeps waiting for the topic)
    # On the wire: a Fetch by a principal without READ (ANONYMOUS, on the PLAINTEXT listener).
    with Session(secure.broker.bootstrap, timeout=10) as session:
        assert session.fetch(TOPIC, 0, 0).error_code == TOPIC_AUTHORIZATION_FAILED
        (topic,) = session.metadata([TOPIC]).topics
        assert topic.error_code == TOPIC_AUTHORIZATION_FAILED


def read_error(config: dict[str, Any], seconds: float) -> int | None:
    """The error a consumer assigned TOPIC-0 gets within ``seconds`` (None: none, and nothing read)."""
    from confluent_kafka import TopicPartition as CTopicPartition

    consumer = Consumer({**config, "group.id": f"readers-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    try:
        consumer.assign([CTopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is not None:
                return int(message.error().code())
            assert message is None, "a denied consumer read a record"
        return None
    finally:
        consumer.close()


def test_transactional_ids_need_write(secure: SecureBroker) -> None:
    admin = AdminClient(client_config(secure, "admin", "admin-secret", "SCRAM-SHA-512"))
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    users = [
        UserScramCredentialUpsertion(name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password)
        for name, password in (("alice", b"alice-pw"), ("bob", b"bob-pw"))
    ]
    for future in admin.alter_user_scram_credentials(users).values():
        future.result(30)
    grants = [
        AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, p, "*", AclOperation.WRITE, ALLOW)
        for p in ("User:alice", "User:bob")
    ]
    txn = ResourceType.TRANSACTIONAL_ID
    grants.append(
        AclBinding(txn, "tx-alice", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.WRITE, ALLOW)
    )
    for future in admin.create_acls(grants).values():
        future.result(30)

    alice = Producer({**client_config(secure, "alice", "alice-pw"), "transactional.id": "tx-alice"})
    alice.init_transactions(30)
    alice.begin_transaction()
    alice.produce(TOPIC, b"in-a-transaction")
    alice.commit_transaction(30)

    bob = Producer({**client_config(secure, "bob", "bob-pw"), "transactional.id": "tx-alice"})
    with pytest.raises(Exception, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        bob.init_transactions(30)
    # bob may write the topic without a transaction (idempotent: WRITE on a topic suffices, KIP-679).
    assert produce({**client_config(secure, "bob", "bob-pw")}, b"plain") is None
    assert end_offset(client_config(secure, "admin", "admin-secret", "SCRAM-SHA-512")) == 3  # 2 records + a marker


@pytest.fixture
def secure_s3(tmp_path: Path) -> Iterator[SecureBroker]:
    cluster = SecureBroker(tmp_path, s3=True)
    try:
        yield cluster.start()
    finally:
        cluster.kill()


def puts(broker: BrokerServer) -> float:
    samples = broker.metrics()
    return sum(
        v
        for k, v in samples.items()
        if k.startswith("diskless_object_store_requests_total{") and 'operation="put"' in k
    )


def test_denied_diskless_produce_uploads_nothing(secure_s3: SecureBroker) -> None:
    admin = AdminClient(client_config(secure_s3, "admin", "admin-secret", "SCRAM-SHA-512"))
    admin.create_topics([NewTopic(TOPIC, 1, 1, config={"diskless.enabled": "true"})])[TOPIC].result(30)
    upsert = UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"bob-pw")
    admin.alter_user_scram_credentials([upsert])["bob"].result(30)
    read = AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.READ, ALLOW)
    admin.create_acls([read])[read].result(30)
    assert produce(client_config(secure_s3, "admin", "admin-secret", "SCRAM-SHA-512"), b"from-admin") is None
    before = puts(secure_s3.broker)
    assert before >= 1  # the admin's record went to a WAL object
    error = produce(client_config(secure_s3, "bob", "bob-pw"), b"from-bob")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert puts(secure_s3.broker) == before  # refused before the representative buffered anything
    assert end_offset(client_config(secure_s3, "admin", "admin-secret", "SCRAM-SHA-512")) == 1

"""Operations through real admin clients (issue 15): partition reassignment and its cancellation,
leader elections (preferred, unclean, automatic rebalancing), CreatePartitions with manual
assignments, DescribeTopicPartitions, DescribeLogDirs / AlterReplicaLogDirs.

Clusters are real (etcd, SeaweedFS for diskless topics, broker processes); kafka-python,
confluent-kafka and aiokafka admin clients drive them.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewPartitions as AioNewPartitions
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka import ElectionType, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    ResourceType,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType as KPConfigResourceType
from kafka.admin import NewTopic
from kafka.errors import KafkaConnectionError
from kafka.structs import TopicPartitionReplica
from kio.schema.describe_topic_partitions.v0.request import DescribeTopicPartitionsRequest, TopicRequest
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)
from kio.static.primitive import i8
from rawclient import Session
from support import LocalCluster, wait_until

from diskless.bench import reassign as reassign_bench
from diskless.local.servers import BrokerServer

pytestmark = pytest.mark.integration


# asyncio's report of a connection task cancelled while the broker stops (server.py, not a
# handler): left to its owner, noted in the report, and not what these tests check.
_SHUTDOWN_NOISE = "Exception in callback StreamReaderProtocol.connection_made"


@pytest.fixture(autouse=True)
def no_handler_crashes(tmp_path: Path):
    yield
    for log_file in tmp_path.rglob("broker-*.log"):
        lines = log_file.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "Traceback" in line and not any(_SHUTDOWN_NOISE in earlier for earlier in lines[max(0, i - 3) : i]):
                raise AssertionError(f"{log_file.name}:\n" + "\n".join(lines[max(0, i - 20) : i + 20]))


def kp_admin(cluster: LocalCluster) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)


def add_broker(cluster: LocalCluster) -> BrokerServer:
    """A new broker in the next AZ's turn (scale-out); stopped with the cluster."""
    node_id = len(cluster.brokers)
    azs = len({b.rack for b in cluster.brokers})
    az = node_id % azs
    broker = BrokerServer(
        node_id,
        cluster.root / f"broker-{node_id}",
        f"127.0.{az + 1}.{node_id // azs + 1}",
        f"az-{az + 1}",
        cluster.etcd.endpoint,
        dict(cluster.brokers[0].overrides),
    )
    cluster.brokers.append(broker)
    broker.start(timeout=120)  # generous: the machine may be loaded
    return broker


def partitions_of(admin: KafkaAdminClient, topic: str) -> dict[int, dict]:
    """True replicas, leader and ISR per partition (DescribeTopicPartitions: not zone-crafted).

    kafka-python's admin sends it to its least loaded node and raises if that is a broker the
    test has just killed (it marks the node down then, so a second try goes elsewhere)."""
    for attempt in range(3):
        try:
            answer = admin.describe_topic_partitions([topic])
            break
        except KafkaConnectionError:
            if attempt == 2:
                raise
    (entry,) = answer["topics"]
    assert entry["error_code"] == 0, entry
    return {p["partition_index"]: p for p in entry["partitions"]}


def partitions_from(broker: BrokerServer, topic: str) -> dict[int, dict]:
    """``partitions_of`` asked of one named broker: for tests that pause a broker, which
    kafka-python's admin might pick as its least loaded node and then wait out its timeout."""
    request = DescribeTopicPartitionsRequest(topics=(TopicRequest(name=topic),))
    with Session(broker.bootstrap) as session:
        (entry,) = session.request(request).topics
    assert entry.error_code == 0, entry
    return {
        int(p.partition_index): {
            "leader_id": int(p.leader_id),
            "replica_nodes": [int(n) for n in p.replica_nodes],
            "isr_nodes": [int(n) for n in p.isr_nodes],
        }
        for p in entry.partitions
    }


def produce(bootstrap: str, topic: str, values: range) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    for i in values:
        producer.send(topic, key=str(i % 7).encode(), value=str(i).encode())
    producer.flush(60)
    producer.close()


def consume_all(bootstrap: str, topic: str, count: int) -> list[int]:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None
    )
    values: list[int] = []
    try:
        wait_until(
            lambda: (
                values.extend(int(r.value) for batch in consumer.poll(500).values() for r in batch)
                or len(values) >= count
            ),
            timeout=60,
            message=f"consumed {len(values)} of {count}",
        )
        values.extend(int(r.value) for batch in consumer.poll(500).values() for r in batch)
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("diskless", [True, False], ids=["diskless", "classic"])
def test_reassign_every_partition_onto_a_new_broker_under_load(cluster_factory, diskless: bool) -> None:
    """Kafka's semantics: the new replica joins, catches up, enters the ISR, the removed one leaves
    and leadership moves with it; producers keep going and nothing is lost or duplicated."""
    cluster = cluster_factory(s3=diskless)
    admin = kp_admin(cluster)
    topic = "moving"
    configs = {"diskless.enabled": "true"} if diskless else {}
    admin.create_topics([NewTopic(topic, 3, 2, topic_configs=configs)])
    produce(cluster.bootstrap, topic, range(0, 300))
    add_broker(cluster)
    wait_until(lambda: len(admin.describe_cluster()["brokers"]) == 4, timeout=30)

    before = partitions_of(admin, topic)
    # Each partition's preferred replica (its leader) moves to broker 3.
    targets = {TopicPartition(topic, i): [3, *p["replica_nodes"][1:]] for i, p in before.items()}
    stop = threading.Event()
    sent: list[int] = []

    def keep_producing() -> None:
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", enable_idempotence=True)
        i = 300
        while not stop.is_set():
            producer.send(topic, key=str(i % 7).encode(), value=str(i).encode())
            sent.append(i)
            i += 1
            if i % 50 == 0:
                producer.flush(60)
        producer.flush(60)
        producer.close()

    writer = threading.Thread(target=keep_producing)
    writer.start()
    try:
        wait_until(lambda: len(sent) > 100, timeout=30)
        answer = admin.alter_partition_reassignments(targets)
        assert all(error is None for error in answer.values()), answer
        wait_until(lambda: not admin.list_partition_reassignments(), timeout=60, message="reassignment done")
        wait_until(lambda: len(sent) > 400, timeout=30)
    finally:
        stop.set()
        writer.join(60)
    after = partitions_of(admin, topic)
    for index, partition in after.items():
        assert partition["replica_nodes"] == targets[TopicPartition(topic, index)]
        assert sorted(partition["isr_nodes"]) == sorted(partition["replica_nodes"])
        assert partition["leader_id"] == 3
    total = 300 + len(sent)
    values = consume_all(cluster.bootstrap, topic, total)
    assert sorted(values) == list(range(total))
    # The removed replicas' brokers dropped their logs.
    left = [cluster.brokers[p["replica_nodes"][0]].data_dir / f"{topic}-{i}" for i, p in before.items()]
    wait_until(lambda: not any(path.exists() for path in left), timeout=15)
    admin.close()


def test_cancel_a_reassignment_in_progress(cluster_factory) -> None:
    """A reassignment whose new replica cannot catch up (its broker is paused) is listed with its
    adding/removing replicas, and cancelling it restores the original replicas."""
    cluster = cluster_factory(brokers=4, overrides={"broker.session.timeout.ms": "60000"})
    admin = kp_admin(cluster)
    topic = "cancelled"
    admin.create_topics([NewTopic(topic, -1, replica_assignments={0: [0, 1]})])
    produce(cluster.bootstrap, topic, range(50))
    paused = cluster.brokers[3]
    assert paused.pid is not None
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        tp = TopicPartition(topic, 0)
        assert admin.alter_partition_reassignments({tp: [3, 1]}) == {tp: None}
        ongoing = admin.list_partition_reassignments()
        assert ongoing == {tp: {"replicas": [3, 1, 0], "adding_replicas": [3], "removing_replicas": [0]}}
        assert partitions_from(cluster.brokers[0], topic)[0]["leader_id"] == 0
        assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
        assert admin.list_partition_reassignments() == {}
        state = partitions_from(cluster.brokers[0], topic)[0]
        assert sorted(state["replica_nodes"]) == [0, 1] and state["leader_id"] == 0
        # Nothing to cancel now: Kafka's NO_REASSIGNMENT_IN_PROGRESS.
        again = admin.alter_partition_reassignments({tp: None})
        assert again[tp] is not None and again[tp].errno == 85
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    admin.close()


def test_preferred_and_unclean_leader_elections(cluster_factory) -> None:
    cluster = cluster_factory()
    admin = kp_admin(cluster)
    confluent = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics(
        [
            NewTopic("pref", -1, replica_assignments={0: [0, 1, 2]}),
            NewTopic("lone", -1, replica_assignments={0: [1, 2]}),
        ]
    )
    # Leadership of "pref" leaves broker 0 while it restarts, then waits for an election.
    cluster.brokers[0].stop()
    wait_until(lambda: partitions_of(admin, "pref")[0]["leader_id"] == 1, timeout=30)
    cluster.brokers[0].start()
    wait_until(lambda: 0 in partitions_of(admin, "pref")[0]["isr_nodes"], timeout=60)
    assert partitions_of(admin, "pref")[0]["leader_id"] == 1
    # kafka-python's admin caches the controller and its brokers list from before the restart.
    admin.close()
    admin = kp_admin(cluster)
    result = admin.elect_leaders(0, {"pref": [0]})
    assert [p.error_code for r in result.replica_election_results for p in r.partition_result] == [0]
    # The answer comes once the election is stored; the broker asked next may learn it a moment later.
    wait_until(lambda: partitions_of(admin, "pref")[0]["leader_id"] == 0, timeout=30)
    # confluent-kafka: nothing to do now (ELECTION_NOT_NEEDED is reported per partition).
    answer = confluent.elect_leaders(ElectionType.PREFERRED, [CTopicPartition("pref", 0)]).result(timeout=30)
    (error,) = answer.values()
    assert error is not None and error.code() == 84

    # Unclean: "lone" loses its whole ISR except a broker that then dies; the other comes back.
    cluster.brokers[2].kill()
    wait_until(lambda: partitions_of(admin, "lone")[0]["isr_nodes"] == [1], timeout=30)
    cluster.brokers[1].kill()
    cluster.brokers[2].start()
    wait_until(lambda: partitions_of(admin, "lone")[0]["leader_id"] == -1, timeout=30)
    admin.close()
    admin = kp_admin(cluster)
    refused = admin.elect_leaders(0, {"lone": [0]}, raise_errors=False)
    assert [p.error_code for r in refused.replica_election_results for p in r.partition_result] == [80]
    # A fresh client too: librdkafka keeps waiting for the controller it knew (broker 1, now dead).
    confluent = AdminClient({"bootstrap.servers": cluster.bootstrap})
    answer = confluent.elect_leaders(ElectionType.UNCLEAN, [CTopicPartition("lone", 0)]).result(timeout=30)
    assert list(answer.values()) == [None]

    def elected() -> bool:
        state = partitions_of(admin, "lone")[0]
        return state["leader_id"] == 2 and state["isr_nodes"] == [2]

    wait_until(elected, timeout=30)
    admin.close()


def test_auto_leader_rebalance_returns_leadership_to_preferred_replicas(cluster_factory) -> None:
    cluster = cluster_factory(
        overrides={"auto.leader.rebalance.enable": "true", "leader.imbalance.check.interval.seconds": "1"}
    )
    admin = kp_admin(cluster)
    admin.create_topics([NewTopic("rebalanced", -1, replica_assignments={0: [0, 1, 2]})])
    cluster.brokers[0].stop()
    wait_until(lambda: partitions_of(admin, "rebalanced")[0]["leader_id"] == 1, timeout=30)
    cluster.brokers[0].start()
    wait_until(lambda: partitions_of(admin, "rebalanced")[0]["leader_id"] == 0, timeout=60)
    admin.close()


def test_create_partitions_with_manual_assignments(cluster_factory) -> None:
    cluster = cluster_factory()
    admin = kp_admin(cluster)
    admin.create_topics([NewTopic("grown", 1, 2)])
    admin.create_partitions({"grown": {"count": 2, "assignments": [[2, 0]]}})
    confluent = AdminClient({"bootstrap.servers": cluster.bootstrap})
    confluent.create_partitions([NewPartitions("grown", 3, [[1, 2]])])["grown"].result(timeout=30)

    async def with_aiokafka() -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await client.start()
        try:
            await client.create_partitions({"grown": AioNewPartitions(4, [[0, 1]])})
        finally:
            await client.close()

    asyncio.run(with_aiokafka())
    replicas = {i: p["replica_nodes"] for i, p in partitions_of(admin, "grown").items()}
    assert {i: replicas[i] for i in (1, 2, 3)} == {1: [2, 0], 2: [1, 2], 3: [0, 1]}
    # Kafka's checks: one replica list per new partition, as many replicas as the topic has.
    with pytest.raises(Exception, match=r"InvalidReplicationAssignment|39"):
        admin.create_partitions({"grown": {"count": 5, "assignments": [[0]]}})
    admin.close()


def test_describe_log_dirs_and_alter_replica_log_dirs(cluster_factory) -> None:
    cluster = cluster_factory(brokers=1, azs=1, s3=True)
    admin = kp_admin(cluster)
    admin.create_topics([NewTopic("dl", 1, 1, topic_configs={"diskless.enabled": "true"}), NewTopic("cl", 1, 1)])
    produce(cluster.bootstrap, "dl", range(200))
    produce(cluster.bootstrap, "cl", range(200))
    (broker,) = admin.describe_log_dirs()
    dirs = {d["log_dir"]: d for d in broker["log_dirs"]}
    local = str(cluster.brokers[0].data_dir)
    sizes = {
        (d_name, t["name"]): p["partition_size"]
        for d_name, d in dirs.items()
        for t in d["topics"]
        for p in t["partitions"]
    }
    # The classic log holds the records; the diskless log only pointers to bytes in object storage.
    assert sizes[(local, "cl")] > 2000
    remote = next(name for name in dirs if name.startswith("s3://"))
    assert sizes[(remote, "dl")] > 2000
    assert 0 < sizes[(local, "dl")] < sizes[(remote, "dl")] * 2
    assert dirs[local]["error_code"] == 0 and dirs[local]["total_bytes"] > 0
    replica = TopicPartitionReplica("cl", 0, 0)
    answer = admin.alter_replica_log_dirs({replica: local})
    assert answer[replica].errno == 0
    answer = admin.alter_replica_log_dirs({replica: "/nowhere"})
    assert answer[replica].errno == 57  # LOG_DIR_NOT_FOUND
    admin.close()


def incremental(name: str, value: str | None, op: AlterConfigOpType) -> ConfigResource:
    """An IncrementalAlterConfigs change of broker 0 (confluent-kafka)."""
    entry = ConfigEntry(name, value, incremental_operation=op)
    return ConfigResource(ResourceType.BROKER, "0", incremental_configs=[entry])


def test_broker_configs_types_sources_and_dynamic_changes(cluster_factory) -> None:
    """DescribeConfigs of a broker as Kafka answers it (types, read-only flags, sources, synonyms,
    null when unset, passwords hidden), and dynamic broker configs through IncrementalAlterConfigs
    on the broker and on the cluster default, which topics without overrides then follow."""
    cluster = cluster_factory(brokers=1, azs=1, overrides={"log.retention.ms": "3600000"})
    admin = kp_admin(cluster)
    confluent = AdminClient({"bootstrap.servers": cluster.bootstrap})
    broker = ConfigResource(ResourceType.BROKER, "0")

    def described() -> dict[str, ConfigEntry]:
        return confluent.describe_configs([broker])[broker].result(timeout=30)

    raw = admin.describe_configs([KPConfigResource(KPConfigResourceType.BROKER, "0")], config_filter="all")
    raw = raw["broker"]["0"]
    types = {name: raw[name]["config_type"] for name in raw}
    assert types["num.partitions"] == "INT"
    assert types["log.retention.ms"] == types["replica.lag.time.max.ms"] == "LONG"
    assert types["auto.create.topics.enable"] == "BOOLEAN"
    assert types["listeners"] == types["log.cleanup.policy"] == "LIST"
    assert types["diskless.s3.secret.key"] == "PASSWORD" and raw["diskless.s3.secret.key"]["value"] is None
    entries = described()
    assert entries["metrics.host"].value is None  # unset: null, not ''
    assert entries["num.partitions"].is_read_only and not entries["log.retention.ms"].is_read_only
    assert entries["log.retention.ms"].value == "3600000"
    assert entries["log.retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert entries["log.retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value

    admin.create_topics([NewTopic("follows", 1, 1)])
    topic = ConfigResource(ResourceType.TOPIC, "follows")

    def topic_entry(name: str) -> ConfigEntry:
        return confluent.describe_configs([topic])[topic].result(timeout=30)[name]

    # Per broker, kafka-python.
    admin.alter_configs(
        [KPConfigResource(KPConfigResourceType.BROKER, "0", configs={"log.retention.ms": ("SET", "7200000")})],
        incremental=True,
    )
    entry = described()["log.retention.ms"]
    assert (entry.value, entry.source) == ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    chain = admin.describe_configs(
        [KPConfigResource(KPConfigResourceType.BROKER, "0", configs={"log.retention.ms": None})], include_synonyms=True
    )["broker"]["0"]["log.retention.ms"]["synonyms"]
    assert [(c["value"], c["source"]) for c in chain] == [
        ("7200000", "DYNAMIC_BROKER_CONFIG"),
        ("3600000", "STATIC_BROKER_CONFIG"),
        ("604800000", "DEFAULT_CONFIG"),
    ]
    retention = topic_entry("retention.ms")
    assert (retention.value, retention.source) == ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)

    # Cluster-wide default (resource name "", which kafka-python and confluent-kafka refuse to
    # send; kafka-configs.sh --entity-default sends it): a raw request.
    cluster_default = IncrementalAlterConfigsRequest(
        resources=(
            AlterConfigsResource(
                resource_type=i8(4),
                resource_name="",
                configs=(AlterableConfig(name="log.retention.bytes", config_operation=i8(0), value="1048576"),),
            ),
        ),
        validate_only=False,
    )
    with Session(cluster.bootstrap) as session:
        (answer,) = session.request(cluster_default).responses
    assert answer.error_code == 0, answer
    retention_bytes = topic_entry("retention.bytes")
    assert (retention_bytes.value, retention_bytes.source) == (
        "1048576",
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
    )

    # Only what Kafka lets change at runtime: INVALID_REQUEST otherwise, as Kafka answers it
    # ("Cannot update these configs dynamically", KAFKA-13609).
    static = incremental("num.partitions", "3", AlterConfigOpType.SET)
    with pytest.raises(KafkaException) as info:
        confluent.incremental_alter_configs([static])[static].result(timeout=30)
    assert info.value.args[0].code() == 42

    # Deleting the dynamic value falls back to the static one.
    undo = incremental("log.retention.ms", None, AlterConfigOpType.DELETE)
    confluent.incremental_alter_configs([undo])[undo].result(timeout=30)
    assert topic_entry("retention.ms").value == "3600000"

    async def with_aiokafka() -> dict:
        client = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await client.start()
        try:
            return await client.describe_configs([AioConfigResource(AioConfigResourceType.BROKER, "0")])
        finally:
            await client.close()

    (response,) = asyncio.run(with_aiokafka())
    (result,) = response.resources
    configs = {c[0]: c for c in result[4]}
    assert configs["log.retention.ms"][1] == "3600000"
    admin.close()


def reassign_tool(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "diskless", "reassign", "--bootstrap-server", cluster.bootstrap, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def test_scale_out_and_decommission_with_the_reassign_tool(cluster_factory) -> None:
    """`diskless reassign`: a balanced rack-aware plan (kafka-reassign-partitions' JSON), add-broker
    and remove-broker with progress; decommissioning leaves no replica on the broker and no
    under-replicated partition, and nothing produced is lost."""
    cluster = cluster_factory(s3=True)
    admin = kp_admin(cluster)
    admin.create_topics([NewTopic("dk", 6, 2, topic_configs={"diskless.enabled": "true"}), NewTopic("ck", 6, 2)])
    produce(cluster.bootstrap, "dk", range(600))
    produce(cluster.bootstrap, "ck", range(600))
    add_broker(cluster)
    wait_until(lambda: len(admin.describe_cluster()["brokers"]) == 4, timeout=30)

    generated = reassign_tool(cluster, "generate", "--topics", "dk", "--brokers", "0,1,2,3")
    assert generated.returncode == 0, generated.stderr
    plan = json.loads(generated.stdout)
    proposed = {(p["topic"], p["partition"]): p["replicas"] for p in plan["proposed"]["partitions"]}
    assert set(proposed) == {("dk", i) for i in range(6)}
    assert any(3 in replicas for replicas in proposed.values())

    added = reassign_tool(cluster, "add-broker", "3", "--wait", "--timeout", "90")
    assert added.returncode == 0, added.stderr
    assert "partitions at their target replicas" in added.stderr
    load = {b: 0 for b in range(4)}
    for topic in ("dk", "ck"):
        for p in partitions_of(admin, topic).values():
            for b in p["replica_nodes"]:
                load[b] += 1
    assert load[3] >= 4, load  # 24 replicas over 4 brokers, brokers 0 and 3 share az-1

    removed = reassign_tool(cluster, "remove-broker", "1", "--wait", "--timeout", "90")
    assert removed.returncode == 0, removed.stderr
    for topic in ("dk", "ck"):
        for index, p in partitions_of(admin, topic).items():
            assert 1 not in p["replica_nodes"], (topic, index, p)
            assert sorted(p["isr_nodes"]) == sorted(p["replica_nodes"]), (topic, index, p)
    cluster.brokers[1].stop()
    for topic in ("dk", "ck"):
        assert sorted(consume_all(cluster.bootstrap, topic, 600)) == list(range(600))
    admin.close()


def test_reassign_benchmark_small(tmp_path: Path) -> None:
    """`python -m diskless.bench.reassign` at a small size: a diskless topic's move copies only its
    pointers (far less than the classic topic's records), and neither loses or duplicates data."""
    out = io.StringIO()
    diskless, classic = reassign_bench.run(3, 2, 16384, ["diskless", "classic"], tmp_path / "bench", out, 1.0)
    for result in (diskless, classic):
        assert result.lost == 0 and result.duplicated == 0 and not result.producer_errors, result
        assert result.acked_total >= 192 and result.read_back >= result.acked_total, result
        assert result.consumer_read_during > 0, result
    assert classic.copied_bytes > 3 * 1024 * 1024
    assert diskless.copied_bytes * 20 < classic.copied_bytes, (diskless, classic)


def test_classic_reassignment_is_throttled_by_leader_replication_throttled_rate(cluster_factory) -> None:
    """kafka-reassign-partitions --throttle: with the brokers' dynamic `leader.replication.throttled.rate`
    a leader serves a replica joining through a reassignment no faster than that; removing the
    throttle lets the move finish."""
    cluster = cluster_factory()
    admin = kp_admin(cluster)
    admin.create_topics([NewTopic("slow", -1, replica_assignments={0: [0]})])
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", batch_size=65536, linger_ms=20)
    for i in range(400):
        producer.send("slow", value=i.to_bytes(8, "big") + bytes(8192))
    producer.flush(60)
    producer.close()
    rate = 256 * 1024
    throttle = IncrementalAlterConfigsRequest(
        resources=(
            AlterConfigsResource(
                resource_type=i8(4),
                resource_name="",
                configs=(
                    AlterableConfig(name="leader.replication.throttled.rate", config_operation=i8(0), value=str(rate)),
                ),
            ),
        ),
        validate_only=False,
    )
    with Session(cluster.brokers[0].bootstrap) as session:
        (answer,) = session.request(throttle).responses
    assert answer.error_code == 0, answer
    tp = TopicPartition("slow", 0)
    started = time.monotonic()
    assert admin.alter_partition_reassignments({tp: [1, 0]}) == {tp: None}
    follower_log = cluster.brokers[1].data_dir / "slow-0"

    def copied() -> int:
        return sum(f.stat().st_size for f in follower_log.glob("*.log")) if follower_log.exists() else 0

    wait_until(lambda: copied() > 0, timeout=30)
    time.sleep(2.0)  # a measurement window, not a synchronisation
    elapsed = time.monotonic() - started
    assert admin.list_partition_reassignments() != {}, "3.3 MB moved at 256 KB/s within seconds"
    assert copied() <= rate * (elapsed + 1.5), (copied(), elapsed)  # one second's burst of slack
    admin.alter_configs(
        [
            KPConfigResource(
                KPConfigResourceType.BROKER, "0", configs={"leader.replication.throttled.rate": ("SET", str(1 << 40))}
            )
        ],
        incremental=True,
    )
    wait_until(lambda: not admin.list_partition_reassignments(), timeout=60, message="unthrottled move done")
    admin.close()


def test_dynamic_broker_config_on_a_standalone_broker_survives_restart(broker) -> None:
    """A broker without etcd keeps dynamic configs in its metadata file, as it keeps topics."""
    confluent = AdminClient({"bootstrap.servers": broker.bootstrap})
    change = incremental("log.segment.bytes", "2097152", AlterConfigOpType.SET)
    confluent.incremental_alter_configs([change])[change].result(timeout=30)
    resource = ConfigResource(ResourceType.BROKER, "0")

    def segment_bytes() -> ConfigEntry:
        return confluent.describe_configs([resource])[resource].result(timeout=30)["log.segment.bytes"]

    assert (segment_bytes().value, segment_bytes().source) == ("2097152", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    broker.stop()
    broker.start()
    confluent = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert segment_bytes().value == "2097152"

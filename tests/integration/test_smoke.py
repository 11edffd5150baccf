"""The broker starts, answers Metadata, and survives a clean stop."""

from aiokafka.admin import AIOKafkaAdminClient


async def test_broker_answers_metadata(broker):
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        assert cluster["cluster_id"]
        assert [b["node_id"] for b in cluster["brokers"]] == [0]
    finally:
        await admin.close()
    assert broker.stop() == 0

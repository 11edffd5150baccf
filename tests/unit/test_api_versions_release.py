"""ApiVersions advertises ranges of one Kafka release, 4.0, so a client that infers the broker's
version from them (kafka-python's table, librdkafka's feature checks) never expects something newer
than the version it meets. Lower bounds are Kafka 4.0's (KIP-896 removed older versions; Produce
is advertised from v0 as Kafka 4.0 does, KAFKA-18659); an upper bound may stay below 4.0's where a
newer version is not served yet."""

from __future__ import annotations

from diskless.broker.apis import api_version_entries

# Kafka 4.0's valid versions per API key (clients/src/main/resources/common/message/*Request.json).
KAFKA_4_0 = {
    0: (0, 12),  # Produce: 3-12 served, advertised from 0 (KAFKA-18659)
    1: (4, 17),  # Fetch
    2: (1, 10),  # ListOffsets
    3: (0, 13),  # Metadata
    8: (2, 9),  # OffsetCommit
    9: (1, 9),  # OffsetFetch
    10: (0, 6),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    23: (2, 4),  # OffsetForLeaderEpoch
    24: (0, 5),  # AddPartitionsToTxn
    25: (0, 4),  # AddOffsetsToTxn
    26: (0, 5),  # EndTxn
    27: (1, 1),  # WriteTxnMarkers
    28: (0, 5),  # TxnOffsetCommit
    29: (1, 3),  # DescribeAcls
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    34: (1, 2),  # AlterReplicaLogDirs
    35: (1, 4),  # DescribeLogDirs
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments (v1, KIP-860, is Kafka 4.1)
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    60: (0, 1),  # DescribeCluster
    61: (0, 0),  # DescribeProducers
    65: (0, 0),  # DescribeTransactions
    66: (0, 1),  # ListTransactions (v2, KIP-1152, is Kafka 4.1)
    68: (0, 1),  # ConsumerGroupHeartbeat
    69: (0, 1),  # ConsumerGroupDescribe
    75: (0, 0),  # DescribeTopicPartitions
}


def test_every_advertised_range_is_within_kafka_4_0() -> None:
    outside = {}
    for entry in api_version_entries():
        key, lo, hi = entry["api_key"], entry["min_version"], entry["max_version"]
        if key not in KAFKA_4_0:
            outside[key] = (lo, hi, "not a Kafka 4.0 API")
            continue
        ref_lo, ref_hi = KAFKA_4_0[key]
        if not ref_lo <= lo <= hi <= ref_hi:
            outside[key] = (lo, hi, KAFKA_4_0[key])
    assert outside == {}


def test_operations_apis_are_advertised() -> None:
    keys = {entry["api_key"] for entry in api_version_entries()}
    assert {34, 35, 43, 45, 46, 75} <= keys

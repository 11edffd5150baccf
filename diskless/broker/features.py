"""Feature flags (KIP-584) as ApiVersions v3+ reports them, which is all DescribeFeatures is.

Only features whose behaviour this broker really has are named, at the levels it really serves:

- ``group.version`` 1: the KIP-848 consumer rebalance protocol (ConsumerGroupHeartbeat) is always
  on, as in a Kafka 4.0 cluster formatted at 4.0 (GroupVersion.GV_1).
- ``transaction.version`` 0 only: KIP-890 part 2 (TV_2, an epoch bump per transaction, EndTxn and
  AddPartitionsToTxn v5) is not served. Kafka 4.0's Java producer turns TV_2 on from the finalized
  level it reads here, so finalizing anything above what EndTxn's advertised range allows would
  break its transactions. Level 0 is not finalized (Kafka leaves level-0 features out).

``metadata.version`` and ``kraft.version`` are left out: they version the KRaft metadata log and
its quorum, which this broker does not have (cluster metadata lives in etcd), and no client
decides anything from them. The finalized levels are fixed by the broker's software, so their
epoch never moves; UpdateFeatures is not served (not advertised), as by a broker without KIP-584's
controller.
"""

from __future__ import annotations

from typing import Any

# name -> (min, max) supported level; Kafka's own ranges start at 0 for these features.
SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {
    "group.version": (0, 1),
    "transaction.version": (0, 0),
}
FINALIZED_FEATURES: dict[str, int] = {"group.version": 1, "transaction.version": 0}
FINALIZED_FEATURES_EPOCH = 0


def api_versions_features(api_version: int) -> dict[str, Any]:
    """The feature fields of an ApiVersions response at ``api_version`` (tagged fields, v3+).

    Below v4 a feature whose minimum supported level is 0 is left out of the supported list,
    because older clients fail to read a 0 minimum (KAFKA-17492); Kafka's broker does the same.
    """
    if api_version < 3:
        return {}
    supported = [
        {"name": name, "min_version": lo, "max_version": hi}
        for name, (lo, hi) in sorted(SUPPORTED_FEATURES.items())
        if api_version >= 4 or lo != 0
    ]
    finalized = [
        {"name": name, "min_version_level": level, "max_version_level": level}
        for name, level in sorted(FINALIZED_FEATURES.items())
        if level != 0
    ]
    return {
        "supported_features": supported,
        "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
        "finalized_features": finalized,
    }

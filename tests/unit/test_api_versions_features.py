"""ApiVersions v3+ feature fields (DescribeFeatures, KIP-584) as Kafka 4.0's broker fills them:
group.version 1 finalized (KIP-848 is served), transaction.version held at 0 (KIP-890 part 2 is
not), min-0 features left out of the supported list below v4 (KAFKA-17492), level-0 features never
finalized. Encoded by the broker's codec and read back with kio, as a client reads them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from diskless.broker.apis import KafkaApis
from diskless.protocol import messages as m


def answer(version: int):
    request = SimpleNamespace(client_software_name="kafka-python", client_software_version="3.0.12")
    header = m.RequestHeader(m.API_API_VERSIONS, version, 7, "c")
    body = KafkaApis.api_versions(None, header, request)  # type: ignore[arg-type]
    frame = m.encode_response(header, body)
    # Size, correlation id, then the body: ApiVersions answers with response header v0 (KIP-511).
    entity, _ = entity_reader(load_response_schema(m.API_API_VERSIONS, version))(memoryview(frame)[8:], 0)
    return entity


def test_v4_reports_supported_and_finalized_features() -> None:
    entity = answer(4)
    assert entity.error_code == ErrorCode.none
    supported = {f.name: (f.min_version, f.max_version) for f in entity.supported_features}
    assert supported == {"group.version": (0, 1), "transaction.version": (0, 0)}
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in entity.finalized_features}
    assert finalized == {"group.version": (1, 1)}
    assert entity.finalized_features_epoch >= 0


def test_v3_leaves_min_zero_features_out_of_the_supported_list() -> None:
    entity = answer(3)
    assert entity.supported_features == ()
    assert {f.name for f in entity.finalized_features} == {"group.version"}
    assert entity.finalized_features_epoch >= 0


@pytest.mark.parametrize("version", [0, 1, 2])
def test_older_versions_have_no_feature_fields(version: int) -> None:
    entity = answer(version)
    assert not hasattr(entity, "supported_features")


def test_transaction_version_2_is_not_offered_while_end_txn_v5_is_not_served() -> None:
    # Kafka 4.0's Java producer uses EndTxn/AddPartitionsToTxn v5 once transaction.version >= 2.
    entity = answer(4)
    levels = {f.name: f.max_version_level for f in entity.finalized_features}
    assert levels.get("transaction.version", 0) < 2
    assert m.SUPPORTED_VERSIONS[m.API_END_TXN][1] < 5


def test_list_groups_v5_types_filter_is_advertised() -> None:
    # Kafka 4.0 serves ListGroups v5 (KIP-848 types filter); kafka-python's list_groups(types_filter=...)
    # and kafka-consumer-groups --list --type need it.
    assert m.is_supported(m.API_LIST_GROUPS, 5)

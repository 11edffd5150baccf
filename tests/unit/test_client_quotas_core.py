"""Client quotas' sans-IO cores: Kafka's sampled rate and throttle time, KIP-55 entity resolution,
AlterClientQuotas validation and DescribeClientQuotas filters, and the two API handlers on an
in-memory metadata store (their answers encoded at every version)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntityData, EntryData, OpData
from kio.schema.describe_client_quotas.v1.request import ComponentData, DescribeClientQuotasRequest
from kio.schema.errors import ErrorCode

from diskless.broker.operations import Operations
from diskless.broker.quota_apis import QuotaApis
from diskless.broker.throttle import LEVELS, ClientQuotaManager, SampledRate, resolve
from diskless.cluster import client_quotas as cq
from diskless.cluster.metadata import ClusterMetadata, LocalBackend
from diskless.config import BrokerConfig
from diskless.protocol import error_responses
from diskless.protocol import messages as m

P, C, R = cq.PRODUCER_BYTE_RATE, cq.CONSUMER_BYTE_RATE, cq.REQUEST_PERCENTAGE


def entity(user: Any = ..., client: Any = ...) -> cq.Entity:
    pairs = []
    if user is not ...:
        pairs.append((cq.USER, user))
    if client is not ...:
        pairs.append((cq.CLIENT_ID, client))
    return cq.entity_of(pairs)


# --- rates and throttle time -------------------------------------------------------------------


def test_young_rate_counts_at_least_samples_minus_one_windows() -> None:
    rate = SampledRate(11, 1000, now_ms=0)
    rate.record(10_000, 0)
    assert rate.window_size_ms(0) == 10_000
    assert rate.rate(0) == 1000.0
    rate.record(10_000, 15_000)  # the first sample is older than the whole window: forgotten
    assert rate.rate(15_000) == 1000.0


def test_samples_roll_over_and_expire() -> None:
    rate = SampledRate(3, 1000, now_ms=0)
    for t in range(0, 3000, 500):
        rate.record(100, t)
    assert sum(rate.values) == 600
    assert rate.window_size_ms(2999) == pytest.approx(2999)
    assert rate.rate(2999) == pytest.approx(600 / 2.999)
    rate.record(50, 3000)  # reuses the oldest sample
    assert len(rate.starts) == 3 and sum(rate.values) == 450
    assert rate.idle(3000 + 3000)
    assert not rate.idle(3000 + 2999)


def test_throttle_time_is_kafkas_formula() -> None:
    manager = ClientQuotaManager(11, 1.0)
    manager.update({entity(client="c"): {P: 1000.0}})
    assert manager.record(P, "ANONYMOUS", "c", 5_000, 0) == 0  # 500 B/s over the 10 s minimum window
    # 20,000 B over 10 s is 2,000 B/s: (2000 - 1000) / 1000 * 10 s
    assert manager.record(P, "ANONYMOUS", "c", 15_000, 0) == 10_000
    assert manager.record(P, "ANONYMOUS", "other", 15_000, 0) == 0  # no quota for that client id


def test_request_percentage_throttle_is_bounded_by_one_window() -> None:
    manager = ClientQuotaManager(11, 1.0)
    manager.update({entity(user=None): {R: 10.0}})
    assert manager.record(R, "u", "c", 1000.0, 0) == 1000  # 100% of a thread over 10 s would be 90 s


def test_no_enforced_quota_means_inactive_and_nothing_kept() -> None:
    manager = ClientQuotaManager()
    manager.update({entity(user="u"): {cq.CONTROLLER_MUTATION_RATE: 5.0}})
    assert not manager.active
    manager.update({entity(user="u"): {P: 5.0}})
    assert manager.active
    manager.record(P, "u", "c", 1, 0)
    assert manager._rates
    manager.update({})
    assert not manager.active and not manager._rates


def test_idle_rates_are_swept() -> None:
    manager = ClientQuotaManager(2, 1.0)
    manager.update({entity(client=None): {P: 10.0}})
    for i in range(50):
        manager.record(P, "u", f"c{i}", 1, 0)
    assert len(manager._rates) == 50
    manager.record(P, "u", "late", 1, 2000)  # sweep due: all others idle for the whole window
    assert list(manager._rates) == [(P, ("", "late"))]


def test_lookups_of_clients_without_a_quota_are_swept_too() -> None:
    """A quota for one user, and a stream of other clients (new client ids, as some clients make
    one per connection): each lookup is remembered, and was swept only when a client that has a
    quota recorded something, so the lookups of clients without one grew without bound."""
    manager = ClientQuotaManager(2, 1.0)
    manager.update({entity(user="u"): {P: 10.0}})
    for t in range(0, 60_000, 10):
        assert manager.record(P, "other", f"c{t}", 1, t) == 0
    assert len(manager._resolved) <= 2_000 // 10 + 1  # at most one sweep interval's lookups


@settings(max_examples=60, deadline=None)
@given(
    quota=st.integers(1_000, 1_000_000),
    share=st.floats(0.005, 1.0),  # a request a millisecond is then at least 5x the quota
    samples=st.integers(6, 12),
)
def test_a_client_that_honours_throttle_stays_near_its_quota(quota: int, share: float, samples: int) -> None:
    """A client sending requests of up to a second's quota back to back, waiting out every throttle
    (KIP-219), over 60 s, gets about its quota: Kafka's rate lets up to ~20% more through (a whole
    expiring sample leaves the measured window at once), and never starves the client."""
    request_size = max(1, int(quota * share))
    manager = ClientQuotaManager(samples, 1.0)
    manager.update({entity(user="u", client="c"): {P: float(quota)}})
    now, sent, end = 0.0, 0, 60_000.0
    while now < end:
        throttle = manager.record(P, "u", "c", request_size, now)
        sent += request_size
        now += max(throttle, 1)
    assert sent <= quota * end / 1000 * 1.25 + 2 * request_size
    assert sent >= quota * end / 1000 * 0.8


# --- KIP-55 resolution ----------------------------------------------------------------------------


def test_resolution_order_and_shared_rates() -> None:
    everything = {level_entity("u", "c"): float(i) for i, (_, level_entity, _, _) in enumerate(LEVELS)}
    for i, (level, _, _, _) in enumerate(LEVELS):
        quotas = {e: q for e, q in everything.items() if q >= i}
        found = resolve(quotas, "u", "c")
        assert found is not None and found[0] == float(i) and found[2] == level
    assert resolve({entity(user="u"): 5.0}, "u", "c") == (5.0, ("u", ""), "user")  # shared by u's clients
    assert resolve({entity(client=None): 5.0}, "u", "c") == (5.0, ("", "c"), "default_client")  # per client id
    assert resolve({entity(user="v"): 5.0}, "u", "c") is None


def test_each_quota_type_resolves_on_its_own() -> None:
    manager = ClientQuotaManager()
    manager.update({entity(user="u"): {C: 100.0}, entity(client="c"): {P: 100.0}})
    assert manager.record(P, "u", "c", 10_000, 0) > 0  # the client-id entity's producer quota
    assert manager.record(C, "u", "other", 10_000, 0) > 0  # the user entity's consumer quota
    assert manager.record(P, "u", "other", 10_000, 0) == 0


# --- validation and filters -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alteration", "message"),
    [
        (cq.Alteration((), [(P, 1.0)]), "Invalid empty client quota entity"),
        (cq.Alteration(entity(user=""), [(P, 1.0)]), "Empty user not supported"),
        (
            cq.Alteration((("ip", "1.2.3.4"),), [("connection_creation_rate", 1.0)]),
            "Unhandled client quota entity type: ip",
        ),
        (cq.Alteration((("group", "g"),), [(P, 1.0)]), "Unhandled client quota entity type: group"),
        (cq.Alteration((("user", "a"), ("user", "b")), [(P, 1.0)]), "duplicate entity entry user"),
        (cq.Alteration(entity(user="u"), [("bogus", 1.0)]), "Invalid configuration key bogus"),
        (cq.Alteration(entity(user="u"), [(P, 1.5)]), "Configuration producer_byte_rate must be a Long value"),
        (cq.Alteration(entity(user="u"), [(R, 0.0)]), "Configuration request_percentage must be positive"),
        (cq.Alteration(entity(user="u"), [(C, float("inf"))]), "Configuration consumer_byte_rate must be a Long value"),
        (cq.Alteration(entity(user="u"), [(R, float("nan"))]), "Configuration request_percentage must be positive"),
        (cq.Alteration(entity(user="u"), [(P, 1.0), (P, None)]), "Duplicate quota key producer_byte_rate"),
    ],
)
def test_refused_alterations(alteration: cq.Alteration, message: str) -> None:
    results, after = cq.plan_alterations({}, [alteration])
    code, text = results[alteration.entity]
    assert code == ErrorCode.invalid_request and text is not None and message in text
    assert after == {}


def test_alterations_merge_remove_and_are_independent() -> None:
    current = {entity(user="u"): {P: 10.0, C: 20.0}}
    results, after = cq.plan_alterations(
        current,
        [
            cq.Alteration(entity(user="u"), [(P, None), (R, 12.5)]),
            cq.Alteration(entity(client=None), [(C, 1e6)]),
            cq.Alteration(entity(user=""), [(C, 1.0)]),
            cq.Alteration(entity(client=None), [(C, 2.0)]),
        ],
    )
    assert after[entity(user="u")] == {C: 20.0, R: 12.5}
    assert results[entity(user="u")] == (ErrorCode.none, None)
    assert results[entity(client=None)][0] == ErrorCode.invalid_request  # named twice: ignored
    assert entity(client=None) not in after
    assert results[entity(user="")][0] == ErrorCode.invalid_request


QUOTAS = {
    entity(user="u"): {P: 1.0},
    entity(user=None): {P: 2.0},
    entity(user="u", client="c"): {P: 3.0},
    entity(user="u", client=None): {P: 4.0},
    entity(client="c"): {P: 5.0},
    entity(client=None): {P: 6.0},
}


def values_of(found: cq.Quotas) -> set[float]:
    return {v[P] for v in found.values()}


@pytest.mark.parametrize(
    ("components", "strict", "expected"),
    [
        ([], False, {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}),
        ([], True, set()),
        ([cq.Component("user", cq.MATCH_EXACT, "u")], False, {1.0, 3.0, 4.0}),
        ([cq.Component("user", cq.MATCH_EXACT, "u")], True, {1.0}),
        ([cq.Component("user", cq.MATCH_DEFAULT, None)], False, {2.0}),
        ([cq.Component("user", cq.MATCH_SPECIFIED, None)], True, {1.0, 2.0}),
        ([cq.Component("client-id", cq.MATCH_SPECIFIED, None)], False, {3.0, 4.0, 5.0, 6.0}),
        ([cq.Component("user", cq.MATCH_EXACT, "u"), cq.Component("client-id", cq.MATCH_DEFAULT, None)], True, {4.0}),
        ([cq.Component("ip", cq.MATCH_SPECIFIED, None)], False, set()),
    ],
)
def test_describe_filters(components: list[cq.Component], strict: bool, expected: set[float]) -> None:
    assert values_of(cq.describe(QUOTAS, components, strict)) == expected


@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        ([cq.Component("", 0, "x")], ErrorCode.invalid_request, "Invalid empty entity type."),
        ([cq.Component("user", 2, None), cq.Component("user", 0, "u")], ErrorCode.invalid_request, "more than once"),
        ([cq.Component("group", 0, "g")], ErrorCode.unsupported_version, "Unsupported entity type group"),
        ([cq.Component("user", 0, None)], ErrorCode.invalid_request, "MATCH_TYPE_EXACT, but set match string to null"),
        ([cq.Component("user", 1, "u")], ErrorCode.invalid_request, "MATCH_TYPE_DEFAULT, but also specified"),
        ([cq.Component("user", 7, None)], ErrorCode.invalid_request, "Unknown match type 7"),
        ([cq.Component("ip", 2, None), cq.Component("user", 2, None)], ErrorCode.invalid_request, "IP filter"),
    ],
)
def test_refused_filters(components: list[cq.Component], code: ErrorCode, message: str) -> None:
    with pytest.raises(cq.QuotaError) as refused:
        cq.describe(QUOTAS, components, False)
    assert refused.value.code == code and message in refused.value.message


def test_record_paths_round_trip_any_name() -> None:
    for e in (entity(user="a/b c%", client=None), entity(client="ü/\u0000"), entity(user=None)):
        path = cq.record_path(e)
        assert path.count("/") == 1 and cq.entity_from_path(path) == e


# --- the API handlers on a local metadata store ------------------------------------------------------


def quota_broker(tmp_path: Any) -> SimpleNamespace:
    metadata = ClusterMetadata("c")
    broker = SimpleNamespace(config=BrokerConfig(), metadata=metadata, node_id=0)
    broker.backend = LocalBackend(str(tmp_path / "meta.json"), metadata)
    broker.operations = Operations(broker)  # type: ignore[arg-type]
    return broker


def alter(
    *entries: tuple[list[tuple[str, str | None]], list[tuple[str, float, bool]]], validate_only: bool = False
) -> Any:
    return AlterClientQuotasRequest(
        entries=tuple(
            EntryData(
                entity=tuple(EntityData(entity_type=t, entity_name=n) for t, n in ents),
                ops=tuple(OpData(key=k, value=v, remove=r) for k, v, r in ops),
            )
            for ents, ops in entries
        ),
        validate_only=validate_only,
    )


def describe(*components: tuple[str, int, str | None], strict: bool = False) -> Any:
    return DescribeClientQuotasRequest(
        components=tuple(ComponentData(entity_type=t, match_type=mt, match=x) for t, mt, x in components), strict=strict
    )


def test_alter_then_describe_through_the_handlers(tmp_path: Any) -> None:
    broker = quota_broker(tmp_path)
    apis = QuotaApis(broker)  # type: ignore[arg-type]
    alter_header = m.RequestHeader(m.API_ALTER_CLIENT_QUOTAS, 1, 1, "admin")
    describe_header = m.RequestHeader(m.API_DESCRIBE_CLIENT_QUOTAS, 1, 2, "admin")

    async def run() -> None:
        dry = await apis.alter_client_quotas(
            alter_header, alter(([("user", "u")], [(P, 1024, False)]), validate_only=True)
        )
        assert dry["entries"][0]["error_code"] == ErrorCode.none and broker.metadata.client_quotas == {}
        answer = await apis.alter_client_quotas(
            alter_header,
            alter(
                ([("user", "u"), ("client-id", None)], [(P, 1024, False), (R, 50.5, False)]),
                ([("user", "")], [(P, 1, False)]),
            ),
        )
        assert [e["error_code"] for e in answer["entries"]] == [ErrorCode.none, ErrorCode.invalid_request]
        assert answer["entries"][1]["error_message"] == "Empty user not supported"
        assert answer["entries"][0]["entity"] == [
            {"entity_type": "user", "entity_name": "u"},
            {"entity_type": "client-id", "entity_name": None},
        ]
        for version in (0, 1):
            m.encode_response(m.RequestHeader(49, version, 1, "a"), answer)
        found = apis.describe_client_quotas(describe_header, describe(("user", 0, "u")))
        assert found["error_code"] == ErrorCode.none
        assert found["entries"] == [
            {
                "entity": [
                    {"entity_type": "client-id", "entity_name": None},
                    {"entity_type": "user", "entity_name": "u"},
                ],
                "values": [{"key": P, "value": 1024.0}, {"key": R, "value": 50.5}],
            }
        ]
        for version in (0, 1):
            m.encode_response(m.RequestHeader(48, version, 2, "a"), found)
        await apis.alter_client_quotas(
            alter_header, alter(([("user", "u"), ("client-id", None)], [(P, 0, True), (R, 0, True)]))
        )
        assert broker.metadata.client_quotas == {}
        refused = apis.describe_client_quotas(describe_header, describe(("group", 0, "g")))
        assert refused["error_code"] == ErrorCode.unsupported_version and refused["entries"] is None

    asyncio.run(run())
    # The standalone store keeps them across restarts.
    reloaded = ClusterMetadata("c")
    broker.metadata.client_quotas[entity(user="x")] = {C: 5.0}
    broker.backend._save()
    LocalBackend(str(tmp_path / "meta.json"), reloaded).load()
    assert reloaded.client_quotas == {entity(user="x"): {C: 5.0}}


def test_authorization_refusal_names_every_entity() -> None:
    request = alter(([("user", "u"), ("client-id", None)], [(P, 1, False)]))
    body = error_responses.error_response(49, 1, request, ErrorCode.cluster_authorization_failed)
    assert body["entries"] == [
        {
            "error_code": ErrorCode.cluster_authorization_failed,
            "entity": [{"entity_type": "user", "entity_name": "u"}, {"entity_type": "client-id", "entity_name": None}],
        }
    ]

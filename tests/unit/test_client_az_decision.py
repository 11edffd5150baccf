"""The per-connection client AZ decision (cluster/client_az.py): order of sources and stability."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diskless.cluster.client_az import (
    AzSource,
    ConnectionZone,
    ZonePolicy,
    parse_client_az_cidrs,
    parse_listener_az_map,
    parse_listeners,
)
from diskless.log.config import ConfigError

AZS = ["az-1", "az-2", "az-3"]
POLICY = ZonePolicy(
    local_az="az-1",
    listener_azs={"AZ1": "az-1", "AZ2": "az-2", "AZ3": "az-3"},
    cidrs=parse_client_az_cidrs("az-1:10.0.0.0/20,az-2:10.0.16.0/20,az-3:10.0.32.0/20,az-2:10.0.1.0/24"),
)


def test_parsing() -> None:
    assert [(s.name, s.host, s.port) for s in parse_listeners("az1://h:1, AZ2://[::1]:2,h3:3")] == [
        ("AZ1", "h", 1),
        ("AZ2", "::1", 2),
        ("PLAINTEXT", "h3", 3),
    ]
    assert parse_listener_az_map("az1:az-1, AZ2:az-2") == {"AZ1": "az-1", "AZ2": "az-2"}
    with pytest.raises(ConfigError):
        parse_listeners("A://h:1,a://h:2")
    with pytest.raises(ConfigError):
        parse_listener_az_map("AZ1")
    with pytest.raises(ConfigError):
        parse_client_az_cidrs("az-1:10.0.0.0/33")


def test_order_of_sources() -> None:
    def decide(**kw: str | None) -> tuple[str, AzSource]:
        base: dict[str, str | None] = {
            "client_id_az": None,
            "peer_broker_az": None,
            "listener": None,
            "source_host": None,
        }
        return POLICY.decide(**{**base, **kw})  # type: ignore[arg-type]

    assert decide(client_id_az="az-3", listener="AZ2", source_host="10.0.16.1") == ("az-3", AzSource.CLIENT_ID)
    assert decide(listener="AZ2", source_host="10.0.32.9") == ("az-2", AzSource.LISTENER)
    assert decide(listener="PLAINTEXT", source_host="10.0.32.9") == ("az-3", AzSource.SOURCE_ADDRESS)
    # The most specific network wins: 10.0.1.0/24 (az-2) inside 10.0.0.0/20 (az-1).
    assert decide(source_host="10.0.1.7") == ("az-2", AzSource.SOURCE_ADDRESS)
    assert decide(source_host="::ffff:10.0.1.7") == ("az-2", AzSource.SOURCE_ADDRESS)
    assert decide(source_host="192.168.0.1") == ("az-1", AzSource.RECEIVING_BROKER)
    assert decide(source_host="not an address") == ("az-1", AzSource.RECEIVING_BROKER)
    assert decide(peer_broker_az="az-3", client_id_az="az-2") == ("az-3", AzSource.BROKER)


def test_a_fetch_rack_refines_a_weak_decision_once() -> None:
    zone = ConnectionZone(POLICY, "PLAINTEXT", "192.168.0.1")
    assert zone.on_first_request(None, None) == ("az-1", AzSource.RECEIVING_BROKER)
    assert not zone.on_rack("eu-west-1a", AZS), "a rack no broker is in is ignored"
    assert zone.on_rack("az-2", AZS)
    assert (zone.az, zone.source) == ("az-2", AzSource.CLIENT_RACK)
    assert not zone.on_rack("az-3", AZS), "once decided by a rack, the decision stays"
    assert zone.on_first_request("az-3", None) == ("az-2", AzSource.CLIENT_RACK)


def test_client_id_beats_a_rack() -> None:
    zone = ConnectionZone(POLICY, "AZ3", None)
    zone.on_first_request("az-1", None)
    assert not zone.on_rack("az-2", AZS)
    assert (zone.az, zone.source) == ("az-1", AzSource.CLIENT_ID)


azs = st.sampled_from([*AZS, "az-9"])
maybe = st.none() | azs
hosts = st.none() | st.ip_addresses(v=4).map(str) | st.sampled_from(["10.0.1.7", "10.0.40.1", "10.0.20.2"])


@given(
    client_id_az=maybe,
    peer_broker_az=maybe,
    listener=st.none() | st.sampled_from(["AZ1", "AZ2", "AZ3", "PLAINTEXT", "az2"]),
    host=hosts,
    events=st.lists(st.tuples(st.sampled_from(["request", "rack"]), maybe, maybe), max_size=8),
)
def test_decisions_follow_the_order_and_change_at_most_once(
    client_id_az: str | None,
    peer_broker_az: str | None,
    listener: str | None,
    host: str | None,
    events: list[tuple[str, str | None, str | None]],
) -> None:
    zone = ConnectionZone(POLICY, listener, host)
    first = zone.on_first_request(client_id_az, peer_broker_az)
    # The first decision is the strongest source available, in the documented order.
    by_listener = POLICY.listener_azs.get(listener.upper()) if listener else None
    by_address = None
    if host is not None:
        matches = [(net.prefixlen, az) for net, az in POLICY.cidrs if ipaddress.ip_address(host) in net]
        by_address = max(matches)[1] if matches else None
    expected = (
        (peer_broker_az, AzSource.BROKER)
        if peer_broker_az
        else (client_id_az, AzSource.CLIENT_ID)
        if client_id_az
        else (by_listener, AzSource.LISTENER)
        if by_listener
        else (by_address, AzSource.SOURCE_ADDRESS)
        if by_address
        else ("az-1", AzSource.RECEIVING_BROKER)
    )
    assert first == expected
    history = [first]
    for kind, a, b in events:
        if kind == "request":
            assert zone.on_first_request(a, b) == (zone.az, zone.source)
        else:
            zone.on_rack(a, AZS)
        if (zone.az, zone.source) != history[-1]:
            history.append((zone.az, zone.source))  # type: ignore[arg-type]
    weak = (AzSource.LISTENER, AzSource.SOURCE_ADDRESS, AzSource.RECEIVING_BROKER)
    assert zone.may_take_rack == (zone.source in weak)
    # At most one change, only to a rack of a known AZ, and only from a weaker source.
    assert len(history) <= 2
    if len(history) == 2:
        assert history[1][1] is AzSource.CLIENT_RACK and history[1][0] in AZS
        assert history[0][1] in (AzSource.LISTENER, AzSource.SOURCE_ADDRESS, AzSource.RECEIVING_BROKER)


def test_metadata_answers_are_cached_per_listener_and_client_az() -> None:
    """Clients of different AZs often share a client.id (librdkafka's default "rdkafka"): each must
    get the answer built for its own listener and AZ, never another's from the cache."""
    from kio.index import load_request_schema

    from diskless.broker.metadata_cache import MetadataAnswerCache
    from diskless.protocol import messages as m

    request = m.build(load_request_schema(m.API_METADATA, 12), {"topics": [{"name": "t"}]})
    header = m.RequestHeader(m.API_METADATA, 12, 7, "rdkafka")
    body = {"brokers": [], "controller_id": 1, "topics": [{"error_code": 0, "name": "t", "partitions": []}]}
    cache = MetadataAnswerCache()
    cache.put(header, request, (1, 0), body, m.encode_response(header, body), ("AZ_1", "az-1"))
    assert cache.get(header, request, (1, 0), ("AZ_1", "az-1")) is not None
    assert cache.get(header, request, (1, 0), ("AZ_2", "az-2")) is None
    assert cache.get(header, request, (1, 0), ("AZ_1", "az-2")) is None  # same listener, rack said otherwise


def test_listener_settings() -> None:
    """Per-AZ listeners in the typed config: each advertises its own address; contradictions stop
    the broker at startup."""
    from diskless.config import Endpoint, load_config

    config = load_config(
        environ={},
        overrides={
            "listeners": "BROKER://0.0.0.0:9092,AZ_A://0.0.0.0:0,AZ_B://10.0.1.5:9292",
            "advertised.listeners": "BROKER://broker-1:9092,AZ_A://broker-1.az-a:9192",
            "inter.broker.listener.name": "broker",
            "diskless.listener.az.map": "AZ_A:az-a,az_b:az-b",
            "broker.rack": "az-a",
        },
    )
    assert config.listener == Endpoint("0.0.0.0", 9092)
    assert config.advertised(9092) == Endpoint("broker-1", 9092)
    assert config.advertised_endpoints({"AZ_A": 40000, "AZ_B": 9292}) == {
        "BROKER": Endpoint("broker-1", 9092),
        "AZ_A": Endpoint("broker-1.az-a", 9192),
        "AZ_B": Endpoint("10.0.1.5", 9292),
    }
    assert config.zone_policy().listener_azs == {"AZ_A": "az-a", "AZ_B": "az-b"}
    for bad in (
        {"listeners": "A://h:1", "inter.broker.listener.name": "B"},
        {"listeners": "A://h:1", "diskless.listener.az.map": "B:az-1"},
        {"diskless.client.az.cidrs": "az-1:nonsense"},
    ):
        with pytest.raises(ConfigError):
            load_config(environ={}, overrides=bad)

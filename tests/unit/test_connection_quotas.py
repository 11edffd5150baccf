"""Connection limits and idle expiry, sans-IO (diskless/broker/connection_quotas.py).

Kafka's ConnectionQuotas refuses a connection from an address at its max.connections.per.ip (or
its override) and, beyond max.connections, any but the inter-broker listener's; its Selector
closes connections idle for connections.max.idle.ms. Here a connection over max.connections on
the inter-broker listener is on probation until it proves itself a broker, and a connection with
a request being handled is never idle.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from diskless.broker.connection_quotas import (
    INT_MAX,
    Admission,
    ConnectionLimits,
    ConnectionQuotas,
    Expiry,
    LimitError,
    parse_overrides,
)
from diskless.broker.operations import Operations
from diskless.cluster import broker_configs as bc
from diskless.config import BrokerConfig, ConfigError, load_config


def quotas(**limits: object) -> ConnectionQuotas:
    return ConnectionQuotas(ConnectionLimits(**limits))  # type: ignore[arg-type]


def test_defaults_are_kafkas() -> None:
    config = BrokerConfig()
    assert (config.connections_max_idle_ms, config.max_connections, config.max_connections_per_ip) == (
        600000,
        INT_MAX,
        INT_MAX,
    )
    assert config.max_connections_per_ip_overrides == ""
    assert config.connection_limits() == ConnectionLimits()


def test_per_ip_limit_with_overrides() -> None:
    q = quotas(max_per_ip=2, per_ip_overrides=parse_overrides("10.0.0.9:0, 10.0.0.5:3"))
    assert [q.accept("10.0.0.1", False, 0)[0] for _ in range(3)] == [
        Admission.ADMITTED,
        Admission.ADMITTED,
        Admission.REFUSED_PER_IP,
    ]
    assert [q.accept("10.0.0.5", False, 0)[0] for _ in range(4)][-2:] == [Admission.ADMITTED, Admission.REFUSED_PER_IP]
    assert q.accept("10.0.0.9", False, 0)[0] is Admission.REFUSED_PER_IP
    # Every listener counts, the inter-broker one too (as Kafka).
    assert q.accept("10.0.0.1", True, 0)[0] is Admission.REFUSED_PER_IP
    assert q.total == 5 and q.per_ip == {"10.0.0.1": 2, "10.0.0.5": 3}


def test_a_closed_connection_frees_its_slot() -> None:
    q = quotas(max_per_ip=1)
    _, first = q.accept("10.0.0.1", False, 0)
    assert first is not None
    assert q.accept("10.0.0.1", False, 0)[0] is Admission.REFUSED_PER_IP
    q.close(first)
    q.close(first)  # twice (sweep, then the connection's end): counted once
    assert q.per_ip == {} and q.total == 0
    assert q.accept("10.0.0.1", False, 0)[0] is Admission.ADMITTED


def test_ipv4_mapped_addresses_count_as_ipv4() -> None:
    q = quotas(max_per_ip=1)
    q.accept("::ffff:10.0.0.1", False, 0)
    assert q.accept("10.0.0.1", False, 0)[0] is Admission.REFUSED_PER_IP
    assert parse_overrides("::1:4,[fe80::1]:2") == {"::1": 4, "fe80::1": 2}


def test_host_name_overrides_apply_once_resolved() -> None:
    limits = ConnectionLimits(max_per_ip=1, per_ip_overrides=parse_overrides("client.example:3,10.0.0.2:2"))
    resolved = limits.resolved({"client.example": ["10.0.0.1", "10.0.0.2"]})
    assert resolved.per_ip_overrides == {"10.0.0.1": 3, "10.0.0.2": 2}  # the literal wins


def test_broker_wide_limit_refuses_the_newest_client_connection() -> None:
    q = quotas(max_connections=2)
    admitted = [q.accept(f"10.0.0.{i}", False, 0) for i in range(2)]
    assert q.accept("10.0.0.3", False, 0) == (Admission.REFUSED_MAX, None)
    q.close(admitted[0][1])  # type: ignore[arg-type]
    assert q.accept("10.0.0.3", False, 0)[0] is Admission.ADMITTED


def test_inter_broker_connections_are_never_refused_by_max_connections() -> None:
    q = quotas(max_connections=1, max_idle_ms=-1)
    q.accept("10.0.0.1", False, 0)
    admission, broker = q.accept("10.0.0.2", True, 0)
    assert admission is Admission.PROBATION and broker is not None
    q.proved_broker(broker)
    # Proven: kept for good, and counted (clients stay refused while the total is over the limit).
    assert q.expired(q.probation_s * 10) == []
    assert q.total == 2
    assert q.accept("10.0.0.3", False, 0)[0] is Admission.REFUSED_MAX
    assert q.accept("10.0.0.4", True, 0)[0] is Admission.PROBATION


def test_a_connection_that_never_proves_itself_leaves_probation_refused() -> None:
    q = quotas(max_connections=0)
    _, sneaky = q.accept("10.0.0.1", True, 0)
    assert sneaky is not None
    assert q.expired(q.probation_s - 0.001) == []
    q.activity(sneaky, q.probation_s - 0.001)  # activity does not extend probation
    assert q.expired(q.probation_s) == [(sneaky, Expiry.PROBATION)]


def test_idle_deadline_moves_with_activity() -> None:
    q = quotas(max_idle_ms=1000)
    _, conn = q.accept("10.0.0.1", False, 0.0)
    assert conn is not None
    assert q.expired(0.999) == []
    q.activity(conn, 0.5)
    assert q.expired(1.2) == []
    assert q.expired(1.5) == [(conn, Expiry.IDLE)]
    # Named again until the edge closes it.
    assert q.expired(1.6) == [(conn, Expiry.IDLE)]
    q.close(conn)
    assert q.expired(100.0) == []


def test_not_idle_while_a_request_is_in_flight() -> None:
    q = quotas(max_idle_ms=1000)
    _, conn = q.accept("10.0.0.1", False, 0.0)
    assert conn is not None
    q.request_started(conn)  # a long-poll Fetch parked, a JoinGroup waiting for its rebalance
    q.request_started(conn)
    assert q.expired(50.0) == []
    q.request_finished(conn, 50.0)
    assert q.expired(60.0) == []  # one still in flight
    q.request_finished(conn, 60.0)  # the idle time starts when the last one is answered
    assert q.expired(60.9) == []
    assert q.expired(61.0) == [(conn, Expiry.IDLE)]


def test_a_proven_broker_connection_is_never_idled_out() -> None:
    """This broker's peer pools keep their connections (no client-side idle close, unlike Kafka's
    9 minutes before the broker's 10): idling one out could cut a commit on its way. A client
    connection beside it still expires."""
    q = quotas(max_idle_ms=1000)
    _, broker = q.accept("10.0.0.2", True, 0.0)
    _, client = q.accept("10.0.0.3", True, 0.0)
    assert broker is not None and client is not None
    q.proved_broker(broker)
    assert q.expired(5.0) == [(client, Expiry.IDLE)]
    assert q.deadline(broker) == float("inf")


def test_negative_idle_time_never_expires() -> None:
    q = quotas(max_idle_ms=-1)
    q.accept("10.0.0.1", False, 0.0)
    assert q.expired(1e9) == []


def test_sweeps_run_only_when_a_deadline_may_have_passed() -> None:
    q = quotas(max_idle_ms=10_000)
    conns = [q.accept(f"10.0.{i // 250}.{i % 250}", False, 0.0)[1] for i in range(1000)]
    assert q.next_check == 10.0
    for i, conn in enumerate(conns):
        q.activity(conn, 5.0 + i / 1000)  # type: ignore[arg-type]
    assert q.expired(10.0) == []
    # Nothing can expire before the oldest activity's deadline: no sweep until then.
    assert q.next_check == 15.0
    assert q.expired(14.9) == [] and q.next_check == 15.0
    expired = q.expired(15.2)
    assert len(expired) == 201  # activity at 5.000 .. 5.200 inclusive
    assert q.next_check >= 15.2 + q.sweep_interval


def test_limits_are_validated_as_kafka_does() -> None:
    with pytest.raises(LimitError):
        ConnectionLimits(max_per_ip=0)
    ConnectionLimits(max_per_ip=0, per_ip_overrides={"10.0.0.1": 5})
    with pytest.raises(LimitError):
        ConnectionLimits(max_connections=-1)
    for bad in ("10.0.0.1", "10.0.0.1:x", ":3", "10.0.0.1:-1"):
        with pytest.raises(LimitError):
            parse_overrides(bad)
    with pytest.raises(ConfigError, match=r"max\.connections\.per\.ip"):
        load_config(environ={}, overrides={"max.connections.per.ip": "0"})
    config = load_config(
        environ={"DISKLESS_MAX_CONNECTIONS": "100"},
        overrides={"max.connections.per.ip.overrides": "127.0.0.1:200", "connections.max.idle.ms": "-1"},
    )
    assert config.connection_limits() == ConnectionLimits(INT_MAX, {"127.0.0.1": 200}, 100, -1)


# --- dynamic: max.connections and max.connections.per.ip(.overrides) change at runtime, per broker
# or cluster-wide, as Kafka's SocketServer reconfigurables ---------------------------------------


def test_connection_limits_are_dynamic_broker_configs() -> None:
    assert bc.validate_dynamic(
        {"max.connections": " 100", "max.connections.per.ip": "5", "max.connections.per.ip.overrides": "10.0.0.1:50 "}
    ) == {"max.connections": "100", "max.connections.per.ip": "5", "max.connections.per.ip.overrides": "10.0.0.1:50"}
    for name, bad in (
        ("max.connections", "-1"),
        ("max.connections", str(INT_MAX + 1)),
        ("max.connections.per.ip", "many"),
        ("max.connections.per.ip.overrides", "10.0.0.1"),
    ):
        with pytest.raises(bc.BrokerConfigError):
            bc.validate_dynamic({name: bad})
    with pytest.raises(bc.BrokerConfigError, match="dynamically"):
        bc.validate_dynamic({"connections.max.idle.ms": "1000"})  # static in Kafka too

    dynamic = {"0": {"max.connections": "100"}, "default": {"max.connections": "50", "max.connections.per.ip": "7"}}
    entries = {e.name: e for e in bc.broker_entries(BrokerConfig(max_connections=10), dynamic, 0)}
    mc = entries["max.connections"]
    assert (mc.value, mc.source, mc.config_type, mc.read_only) == ("100", bc.SOURCE_DYNAMIC_BROKER, bc.TYPE_INT, False)
    assert [s for _, _, s in mc.synonyms] == [
        bc.SOURCE_DYNAMIC_BROKER,
        bc.SOURCE_DYNAMIC_DEFAULT,
        bc.SOURCE_STATIC_BROKER,
        bc.SOURCE_DEFAULT,
    ]
    assert (entries["max.connections.per.ip"].value, entries["max.connections.per.ip"].source) == (
        "7",
        bc.SOURCE_DYNAMIC_DEFAULT,
    )
    assert entries["max.connections.per.ip.overrides"].config_type == bc.TYPE_STRING
    assert (
        entries["connections.max.idle.ms"].config_type == bc.TYPE_LONG and entries["connections.max.idle.ms"].read_only
    )
    assert {e.name: e.config_type for e in bc.default_entries(dynamic)} == {
        "max.connections": bc.TYPE_INT,
        "max.connections.per.ip": bc.TYPE_INT,
    }


def test_the_server_takes_changed_connection_limits() -> None:
    given: list[ConnectionLimits] = []
    broker: Any = SimpleNamespace(
        config=BrokerConfig(max_connections=10, connections_max_idle_ms=5000),
        metadata=SimpleNamespace(broker_configs={}),
        node_id=0,
        server=SimpleNamespace(configure_connections=given.append),
    )
    operations = Operations(broker)
    operations.apply_dynamic_configs()
    assert given == [ConnectionLimits(INT_MAX, {}, 10, 5000)]
    broker.metadata.broker_configs = {
        "default": {"max.connections.per.ip": "3", "max.connections": "20"},
        "0": {"max.connections.per.ip.overrides": "10.0.0.1:30"},
        "1": {"max.connections": "99"},  # another broker's
    }
    operations.apply_dynamic_configs()
    assert given[-1] == ConnectionLimits(3, {"10.0.0.1": 30}, 20, 5000)
    operations.apply_dynamic_configs()  # nothing changed: not given again
    assert len(given) == 2
    # A combination Kafka refuses keeps the limits in force.
    broker.metadata.broker_configs = {"default": {"max.connections.per.ip": "0"}}
    operations.apply_dynamic_configs()
    assert len(given) == 2

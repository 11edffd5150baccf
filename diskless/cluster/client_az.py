"""Which AZ a connection's client is in, decided once per connection from what the broker can see.

Zone alignment (``zones.py``) is only as good as this answer, and it must be stable: clients send
Metadata to any broker they know, so "the AZ of the broker that was asked" flips the leaders a
client is told about every time it asks another broker. The sources, strongest first:

1. ``diskless_az=<az>`` in ``client.id`` (a convention some operators can impose on clients);
2. the ``rack_id`` a consumer sends in Fetch (KIP-392 ``client.rack``, already set by operators
   who use Kafka's follower fetching) - when it names an AZ that brokers are in;
3. the listener the connection arrived on, when listeners are mapped to AZs
   (``diskless.listener.az.map``): every broker listens once per AZ and each listener advertises
   its own addresses, so a client that bootstraps through its AZ's listener stays on it;
4. the client's source address, when subnets are per AZ (``diskless.client.az.cidrs``);
5. otherwise the AZ of the broker that accepted the connection (correct for a client that only
   ever talks to one broker, and what Kafka's own rack-unaware behaviour amounts to).

Sources 1, 3, 4 and 5 are all known at the connection's first request; the decision taken then
never changes, except once: the rack arrives only with the consumer's first Fetch, and a rack is
stronger than a listener, an address or the receiving broker, so it replaces them then. Metadata
answered on that connection before its first Fetch used the weaker decision; the client learns
the aligned leaders on its next Metadata refresh, and in the meantime Fetch itself sends it into
its AZ (KIP-392 ``preferred_read_replica``). Connections our own brokers open are "broker": their
AZ is the peer broker's rack.

Everything here is pure: the server feeds it what it saw and reads the answer.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from diskless.log.config import ConfigError


def ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a peer's host names, as counted and matched: an IPv4-mapped IPv6 address as its
    IPv4 one, a scope dropped; None if ``host`` is no IP literal."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AzSource(enum.StrEnum):
    """How a connection's AZ was decided (a metric label: keep the values stable)."""

    CLIENT_ID = "client_id"
    CLIENT_RACK = "client_rack"
    LISTENER = "listener"
    SOURCE_ADDRESS = "source_address"
    RECEIVING_BROKER = "receiving_broker"
    BROKER = "broker"


@dataclass(frozen=True)
class ListenerSpec:
    name: str
    host: str
    port: int


def parse_listeners(text: str) -> list[ListenerSpec]:
    """Kafka's ``listeners``/``advertised.listeners`` syntax: ``NAME://host:port`` comma-separated.

    A bare ``host:port`` is the PLAINTEXT listener. Names are upper-cased as Kafka does, and must be
    unique."""
    out: list[ListenerSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, rest = item.partition("://")
        if not sep:
            name, rest = "PLAINTEXT", item
        host, colon, port = rest.rpartition(":")
        if not colon or not port.isdigit():
            raise ConfigError(f"listener {item!r}: expected NAME://host:port")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        spec = ListenerSpec(name.upper(), host, int(port))
        if any(existing.name == spec.name for existing in out):
            raise ConfigError(f"listener name {spec.name} appears twice")
        out.append(spec)
    if not out:
        raise ConfigError("no listener given")
    return out


def parse_listener_az_map(text: str | None) -> dict[str, str]:
    """``diskless.listener.az.map``: ``LISTENER:az,...`` (as ``listener.security.protocol.map``)."""
    out: dict[str, str] = {}
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        name, sep, az = item.partition(":")
        if not sep or not name.strip() or not az.strip():
            raise ConfigError(f"diskless.listener.az.map entry {item!r}: expected LISTENER:az")
        out[name.strip().upper()] = az.strip()
    return out


def parse_client_az_cidrs(text: str | None) -> list[tuple[IpNetwork, str]]:
    """``diskless.client.az.cidrs``: ``az:cidr,...``; an AZ may appear with several networks."""
    out: list[tuple[IpNetwork, str]] = []
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        az, sep, cidr = item.partition(":")
        try:
            if not sep or not az.strip():
                raise ValueError("expected az:cidr")
            out.append((ipaddress.ip_network(cidr.strip(), strict=False), az.strip()))
        except ValueError as exc:
            raise ConfigError(f"diskless.client.az.cidrs entry {item!r}: {exc}") from None
    return out


@dataclass(frozen=True)
class ZonePolicy:
    """What a broker knows for deciding clients' AZs (from its configuration)."""

    local_az: str
    listener_azs: Mapping[str, str] = field(default_factory=dict)
    cidrs: Sequence[tuple[IpNetwork, str]] = ()

    def az_of_address(self, host: str | None) -> str | None:
        """The AZ of the most specific configured network holding ``host``."""
        if not host or not self.cidrs:
            return None
        address = ip_of(host)
        if address is None:
            return None
        best: tuple[int, str] | None = None
        for network, az in self.cidrs:
            fits = address.version == network.version and address in network
            if fits and (best is None or network.prefixlen > best[0]):
                best = (network.prefixlen, az)
        return None if best is None else best[1]

    def decide(
        self,
        *,
        client_id_az: str | None,
        peer_broker_az: str | None,
        listener: str | None,
        source_host: str | None,
    ) -> tuple[str, AzSource]:
        """The decision at a connection's first request (before any rack is known)."""
        if peer_broker_az:
            return peer_broker_az, AzSource.BROKER
        if client_id_az:
            return client_id_az, AzSource.CLIENT_ID
        by_listener = self.listener_azs.get(listener.upper()) if listener else None
        if by_listener:
            return by_listener, AzSource.LISTENER
        by_address = self.az_of_address(source_host)
        if by_address:
            return by_address, AzSource.SOURCE_ADDRESS
        return self.local_az, AzSource.RECEIVING_BROKER


# Sources a consumer's rack may replace (it is stronger than these, weaker than client.id).
_RACK_REPLACES = frozenset({AzSource.LISTENER, AzSource.SOURCE_ADDRESS, AzSource.RECEIVING_BROKER})


class ConnectionZone:
    """One connection's AZ decision: taken at its first request, refined once by a Fetch rack."""

    def __init__(self, policy: ZonePolicy, listener: str | None, source_host: str | None) -> None:
        self.policy = policy
        self.listener = listener
        self.source_host = source_host
        self.az: str | None = None
        self.source: AzSource | None = None

    @property
    def decided(self) -> bool:
        return self.az is not None

    def on_first_request(self, client_id_az: str | None, peer_broker_az: str | None) -> tuple[str, AzSource]:
        """Decide (once); later calls return the standing decision unchanged."""
        if self.az is None or self.source is None:
            self.az, self.source = self.policy.decide(
                client_id_az=client_id_az,
                peer_broker_az=peer_broker_az,
                listener=self.listener,
                source_host=self.source_host,
            )
        return self.az, self.source

    @property
    def may_take_rack(self) -> bool:
        """Whether a Fetch rack could still change the decision (saves looking at every Fetch)."""
        return self.source in _RACK_REPLACES

    def on_rack(self, rack: str | None, known_azs: Collection[str]) -> bool:
        """A consumer's Fetch ``rack_id``. Returns whether the decision changed.

        Taken only if it names an AZ some broker is in (a rack no broker shares would only turn
        zone alignment off) and only over the weaker sources; the rack a consumer sends is
        fixed for its lifetime, so this changes a decision at most once."""
        if not rack or rack not in known_azs or self.source not in _RACK_REPLACES:
            return False
        changed = rack != self.az
        self.az, self.source = rack, AzSource.CLIENT_RACK
        return changed

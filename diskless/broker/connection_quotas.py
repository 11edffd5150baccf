"""Connection limits and idle expiry of accepted connections (sans-IO; time is passed in).

Kafka's ``ConnectionQuotas`` (SocketServer.scala) and ``Selector`` idle expiry, decided here and
applied by ``server.py``:

- ``max.connections.per.ip`` / ``max.connections.per.ip.overrides``: a connection from an address
  that already has its limit is refused at accept, on every listener (Kafka counts the
  inter-broker listener too; an operator gives brokers' addresses an override).
- ``max.connections`` (broker-wide): beyond it a new connection is refused at accept. Kafka blocks
  its acceptor until a slot frees; here the newest is closed, which a client sees as the same
  refused connect and retries. Connections from other brokers are never refused by it: Kafka
  exempts the inter-broker listener (when there is another listener), but here clients may use
  that listener too, so a connection over the limit on it is kept *on probation* instead: a
  broker, the WAL manager or a pipeline job starts with the internal authentication challenge
  (``security/internal_auth.py``) and is exempt once it proved the cluster secret; any other
  first request, or none within ``PROBATION_S``, closes it. Exempt connections still count, so
  they can take the total over the limit; clients are then refused until it drops back (Kafka
  closes its least recently used client connection instead).
- ``connections.max.idle.ms``: a connection with no bytes read or written for that long is
  closed. Kafka's Selector measures only socket activity, so it closes a connection whose one
  request (a JoinGroup of a long rebalance) has been waiting longer than that; here a connection
  is not idle while a request read on it is being handled (a parked long-poll Fetch, a JoinGroup),
  and its idle time starts again when the handler is done.

Idle checks cost nothing per request (a float stored per read, write and finished request): a
sweep over every connection runs only when one may be due (``next_check``, a lower bound of every
deadline), at most about once per ``sweep_interval``. With every connection busy, that is once per
idle period.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from diskless.cluster.client_az import ip_of

INT_MAX = 2**31 - 1  # Kafka's Integer.MAX_VALUE: no limit
PROBATION_S = 10.0  # a connection over max.connections on the inter-broker listener proves itself by then
SWEEP_MIN_S, SWEEP_MAX_S = 0.01, 1.0  # how often the edge asks whether a sweep is due


class Admission(enum.Enum):
    ADMITTED = "admitted"
    PROBATION = "probation"  # over max.connections on the inter-broker listener: a broker proves itself
    REFUSED_PER_IP = "max_connections_per_ip"
    REFUSED_MAX = "max_connections"


class Expiry(enum.Enum):
    IDLE = "idle"
    PROBATION = "max_connections"  # never proved itself a broker: refused by max.connections after all


class LimitError(ValueError):
    pass


def normal_ip(host: str) -> str:
    """An address as counted (``client_az.ip_of``); not an IP literal: unchanged."""
    address = ip_of(host)
    return host if address is None else str(address)


def is_ip(host: str) -> bool:
    return ip_of(host) is not None


def parse_overrides(text: str | None) -> dict[str, int]:
    """``host:count,...`` (Kafka's max.connections.per.ip.overrides); the last colon splits, so an
    IPv6 literal may be given bare. Hosts may be names (the edge resolves them)."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        host = host.strip().strip("[]")
        try:
            value = int(count.strip()) if sep and host and "_" not in count else -1
        except ValueError:
            value = -1
        if value < 0:
            raise LimitError(f"max.connections.per.ip.overrides: expected host:count, got {item!r}")
        out[normal_ip(host)] = value
    return out


@dataclass(frozen=True)
class ConnectionLimits:
    max_per_ip: int = INT_MAX
    per_ip_overrides: Mapping[str, int] = field(default_factory=dict)  # normalised IP (or host name) -> limit
    max_connections: int = INT_MAX
    max_idle_ms: int = 600000  # negative: connections never expire

    def __post_init__(self) -> None:
        if self.max_per_ip < 0 or self.max_connections < 0:
            raise LimitError("max.connections and max.connections.per.ip must be at least 0")
        if self.max_per_ip == 0 and not self.per_ip_overrides:
            # As Kafka's KafkaConfig: 0 refuses everyone unless some address has an override.
            raise LimitError(
                "max.connections.per.ip can be set to zero only if max.connections.per.ip.overrides is set"
            )

    def limit_for(self, ip: str) -> int:
        return self.per_ip_overrides.get(ip, self.max_per_ip)

    def resolved(self, addresses: Mapping[str, Iterable[str]]) -> ConnectionLimits:
        """With host-name overrides replaced by the addresses they resolved to (an IP literal given
        explicitly wins over a name resolving to it)."""
        overrides: dict[str, int] = {}
        for host, count in self.per_ip_overrides.items():
            if not is_ip(host):
                for ip in addresses.get(host, ()):
                    overrides.setdefault(normal_ip(ip), count)
        overrides.update({h: c for h, c in self.per_ip_overrides.items() if is_ip(h)})
        return ConnectionLimits(self.max_per_ip, overrides, self.max_connections, self.max_idle_ms)


class Tracked:
    """One accepted connection, as the quotas see it."""

    __slots__ = ("exempt", "in_flight", "ip", "last_active", "probation_until")

    def __init__(self, ip: str, now: float, probation_until: float | None) -> None:
        self.ip = ip
        self.last_active = now
        self.in_flight = 0
        self.probation_until = probation_until
        self.exempt = False


class ConnectionQuotas:
    def __init__(self, limits: ConnectionLimits, probation_s: float = PROBATION_S) -> None:
        self.limits = limits
        self.probation_s = probation_s
        self.per_ip: dict[str, int] = {}
        self.total = 0
        self.open: set[Tracked] = set()
        self.next_check = float("inf")

    @property
    def idle_s(self) -> float | None:
        return None if self.limits.max_idle_ms < 0 else self.limits.max_idle_ms / 1000

    @property
    def sweep_interval(self) -> float:
        idle = self.idle_s
        interval = SWEEP_MAX_S if idle is None else idle / 10
        return min(max(interval, SWEEP_MIN_S), SWEEP_MAX_S, self.probation_s / 10)

    def reconfigure(self, limits: ConnectionLimits) -> None:
        """New limits apply to connections accepted from now on (Kafka does not close open ones
        either); a shorter idle time applies to open ones at the next sweep."""
        shorter = (limits.max_idle_ms >= 0) and (
            self.limits.max_idle_ms < 0 or limits.max_idle_ms < self.limits.max_idle_ms
        )
        self.limits = limits
        if shorter:
            self.next_check = 0.0

    def accept(self, host: str | None, inter_broker_listener: bool, now: float) -> tuple[Admission, Tracked | None]:
        """Decide on a new connection; an admitted one (or one on probation) is counted until ``close``."""
        ip = normal_ip(host) if host else "unknown"
        count = self.per_ip.get(ip, 0)
        if count >= self.limits.limit_for(ip):
            return Admission.REFUSED_PER_IP, None
        probation_until = None
        if self.total >= self.limits.max_connections:
            if not inter_broker_listener:
                return Admission.REFUSED_MAX, None
            probation_until = now + self.probation_s
            self.next_check = min(self.next_check, probation_until)
        elif self.idle_s is not None:
            self.next_check = min(self.next_check, now + self.idle_s)
        self.per_ip[ip] = count + 1
        self.total += 1
        tracked = Tracked(ip, now, probation_until)
        self.open.add(tracked)
        return (Admission.ADMITTED if probation_until is None else Admission.PROBATION), tracked

    def close(self, tracked: Tracked) -> None:
        if tracked not in self.open:
            return
        self.open.discard(tracked)
        self.total -= 1
        left = self.per_ip[tracked.ip] - 1
        if left:
            self.per_ip[tracked.ip] = left
        else:
            del self.per_ip[tracked.ip]

    def proved_broker(self, tracked: Tracked) -> None:
        """The connection proved the cluster secret: neither max.connections nor idleness closes it.

        Kafka idles inter-broker connections too, but its brokers' own clients close theirs first
        (connections.max.idle.ms 9 minutes on the client side); this broker's peer pools keep their
        connections, so closing one here could cut a commit or a pointer request on its way (an
        unknown outcome for the sender). Brokers are few and trusted: they are never idled out."""
        tracked.exempt = True
        tracked.probation_until = None

    # --- idle expiry: activity is a read, a write, or a handler finishing ------------------------

    @staticmethod
    def activity(tracked: Tracked, now: float) -> None:
        tracked.last_active = now

    @staticmethod
    def request_started(tracked: Tracked) -> None:
        tracked.in_flight += 1

    @staticmethod
    def request_finished(tracked: Tracked, now: float) -> None:
        tracked.in_flight -= 1
        tracked.last_active = now

    def deadline(self, tracked: Tracked) -> float:
        """When ``tracked`` expires if nothing happens on it (inf: not while a request is in flight)."""
        deadline = float("inf")
        if tracked.probation_until is not None:
            deadline = tracked.probation_until
        idle = self.idle_s
        if idle is not None and tracked.in_flight == 0 and not tracked.exempt:
            deadline = min(deadline, tracked.last_active + idle)
        return deadline

    def expired(self, now: float) -> list[tuple[Tracked, Expiry]]:
        """Connections to close now, and why; they stay counted (and are named again by a later
        sweep) until ``close``, which the edge calls as it closes them. O(1) unless a deadline may
        have passed. Every later deadline is at least ``next_check`` (a request finishing, or a
        new connection, starts a full idle period). A full sweep of 10,000 connections takes
        under 1 ms; re-arming a timer per connection at every request would cost ~5 us a request."""
        if now < self.next_check:
            return []
        idle = self.idle_s
        earliest = float("inf") if idle is None else now + idle
        out = []
        for tracked in self.open:
            if tracked.probation_until is None:  # the common case, inlined (~2x faster sweeps)
                if idle is None or tracked.in_flight or tracked.exempt:
                    continue
                deadline = tracked.last_active + idle
            else:
                deadline = self.deadline(tracked)
            if deadline <= now:
                on_probation = tracked.probation_until is not None and tracked.probation_until <= now
                out.append((tracked, Expiry.PROBATION if on_probation else Expiry.IDLE))
                earliest = now  # looked at again at the next sweep unless closed meanwhile
            elif deadline < earliest:
                earliest = deadline
        self.next_check = max(earliest, now + self.sweep_interval)
        return out

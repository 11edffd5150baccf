"""Client quota enforcement: rates per quota entity and the throttle time they call for (sans-IO;
time is passed in, in milliseconds).

Kafka's ClientQuotaManager (KIP-13, KIP-55, KIP-124, KIP-219), per broker:

- Each quota type (``producer_byte_rate`` on produce request bytes, ``consumer_byte_rate`` on
  consumer fetch response bytes, ``request_percentage`` on handler time as a percentage of one
  thread: its own steps, not its waits, ``aio.StepTimer``) resolves a client (user, client id) to
  the most specific entity that sets it, in KIP-55's order (``LEVELS``). Clients resolving to the
  same entity share one rate (Kafka's metric tags: a ``/users/u`` quota is shared by all of u's
  client ids, a ``/clients/default`` one is per client id).
- A rate is Kafka's ``Rate`` over a ``SampledStat``: ``quota.window.num`` samples of
  ``quota.window.size.seconds``, a sample starting at its first record, samples older than the
  whole window forgotten, and the elapsed time counted as at least ``num - 1`` windows.
- A record that takes the rate over the quota is answered with a throttle time of
  ``(rate - quota) / quota * window``; request_percentage's is at most one window, as Kafka bounds
  it. The edge (``server.py``) sends the answer at once with that throttle time and stops reading
  the connection for as long (KIP-219).

Nothing is kept while no quota is set: ``active`` is the only thing the edge reads per request.
Rates not recorded for the whole window carry nothing and are dropped at the next sweep.
"""

from __future__ import annotations

from collections.abc import Mapping

from diskless.cluster.client_quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    Entity,
)
from diskless.metrics import CLIENT_QUOTA_RATES, CLIENT_QUOTA_RECORDED, CLIENT_QUOTA_THROTTLE, child

ENFORCED = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)

# KIP-55's order, most specific first: the entity looked up for (user u, client id c), as a function
# of (u, c), and the rate's tags (user, client id) as Kafka's DefaultQuotaCallback names them.
_D = None  # a default entity's name
LEVELS = (
    ("user_client", lambda u, c: ((CLIENT_ID, c), (USER, u)), True, True),
    ("user_default_client", lambda u, c: ((CLIENT_ID, _D), (USER, u)), True, True),
    ("user", lambda u, c: ((USER, u),), True, False),
    ("default_user_client", lambda u, c: ((CLIENT_ID, c), (USER, _D)), True, True),
    ("default_user_default_client", lambda u, c: ((CLIENT_ID, _D), (USER, _D)), True, True),
    ("default_user", lambda u, c: ((USER, _D),), True, False),
    ("client", lambda u, c: ((CLIENT_ID, c),), False, True),
    ("default_client", lambda u, c: ((CLIENT_ID, _D),), False, True),
)


def resolve(quotas: Mapping[Entity, float], user: str, client_id: str) -> tuple[float, tuple[str, str], str] | None:
    """The quota that applies to (user, client_id), the tags of the rate it is counted in, and the
    KIP-55 level it came from; None when no entity sets it."""
    for level, entity, by_user, by_client in LEVELS:
        quota = quotas.get(entity(user, client_id))
        if quota is not None:
            return quota, (user if by_user else "", client_id if by_client else ""), level
    return None


class SampledRate:
    """Kafka's Rate over a SampledStat: a value per second over ``samples`` windows of ``window_ms``."""

    __slots__ = ("current", "samples", "starts", "values", "window_ms")

    def __init__(self, samples: int, window_ms: float, now_ms: float) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self.starts = [now_ms]
        self.values = [0.0]
        self.current = 0

    def record(self, value: float, now_ms: float) -> None:
        if now_ms - self.starts[self.current] >= self.window_ms:
            self.current = (self.current + 1) % self.samples
            if self.current == len(self.starts):
                self.starts.append(now_ms)
                self.values.append(0.0)
            else:
                self.starts[self.current] = now_ms
                self.values[self.current] = 0.0
        self.values[self.current] += value

    def _purge(self, now_ms: float) -> None:
        expire = self.samples * self.window_ms
        for i, start in enumerate(self.starts):
            if now_ms - start >= expire:
                self.starts[i] = now_ms
                self.values[i] = 0.0

    def window_size_ms(self, now_ms: float) -> float:
        """The time the rate is measured over: at least ``samples - 1`` windows (a young rate would
        otherwise be a few bytes over a few milliseconds)."""
        self._purge(now_ms)
        elapsed = now_ms - min(self.starts)
        full = int(elapsed // self.window_ms)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return elapsed

    def rate(self, now_ms: float) -> float:
        size = self.window_size_ms(now_ms)
        return sum(self.values) / (size / 1000.0)

    def idle(self, now_ms: float) -> bool:
        """Nothing recorded within the whole window: it measures nothing any more."""
        return now_ms - self.starts[self.current] >= self.samples * self.window_ms


class ClientQuotaManager:
    def __init__(self, window_num: int = 11, window_size_s: float = 1.0) -> None:
        if window_num < 1 or window_size_s <= 0:
            raise ValueError("quota.window.num and quota.window.size.seconds must be positive")
        self.samples = window_num
        self.window_ms = window_size_s * 1000.0
        self.active = False  # any enforced quota set: the one thing the edge reads per request
        self._by_type: dict[str, dict[Entity, float]] = {}
        self._resolved: dict[tuple[str, str, str], tuple[float, tuple[str, str], str] | None] = {}
        self._rates: dict[tuple[str, tuple[str, str]], SampledRate] = {}
        self._next_sweep = 0.0

    def update(self, quotas: Mapping[Entity, Mapping[str, float]]) -> None:
        """The cluster's quotas changed: lookups start afresh; rates go on (Kafka keeps its sensors
        and changes their bounds)."""
        by_type: dict[str, dict[Entity, float]] = {}
        for entity, values in quotas.items():
            for key, value in values.items():
                if key in ENFORCED:
                    by_type.setdefault(key, {})[entity] = value
        self._by_type = by_type
        self._resolved = {}
        self.active = bool(by_type)
        if not self.active:
            self._forget(list(self._rates))

    def record(self, quota_type: str, user: str, client_id: str, value: float, now_ms: float) -> int:
        """Count ``value`` for this client; the throttle time its answer carries (0: within quota)."""
        if now_ms >= self._next_sweep:
            # Before the lookup: clients no quota applies to are remembered too (as None), and
            # they alone may be all this broker sees (a quota for one user, many other clients).
            self._sweep(now_ms)
        found = self._lookup(quota_type, user, client_id)
        if found is None:
            return 0
        quota, tags, level = found
        rate = self._rates.get((quota_type, tags))
        if rate is None:
            rate = self._rates[(quota_type, tags)] = SampledRate(self.samples, self.window_ms, now_ms)
            child(CLIENT_QUOTA_RATES, quota_type).inc()
        rate.record(value, now_ms)
        child(CLIENT_QUOTA_RECORDED, quota_type).inc(value)
        throttle_ms = self.throttle_ms(rate, quota, quota_type, now_ms)
        if throttle_ms:
            child(CLIENT_QUOTA_THROTTLE, quota_type, level).observe(throttle_ms / 1000.0)
        return throttle_ms

    def max_value_in_window(self, quota_type: str, user: str, client_id: str) -> float | None:
        """What this client may take in a quota window without being throttled, had it taken
        nothing before (Kafka's getMaxValueInQuotaWindow): a consumer's fetch is cut to it, so
        one large answer does not mute its connection for hours. None: no quota applies."""
        found = self._lookup(quota_type, user, client_id)
        if found is None:
            return None
        return found[0] * (self.samples - 1) * self.window_ms / 1000.0

    def _lookup(self, quota_type: str, user: str, client_id: str) -> tuple[float, tuple[str, str], str] | None:
        key = (quota_type, user, client_id)
        found = self._resolved.get(key, False)
        if found is False:
            found = self._resolved[key] = resolve(self._by_type.get(quota_type, {}), user, client_id)
        return found

    def throttle_ms(self, rate: SampledRate, quota: float, quota_type: str, now_ms: float) -> int:
        observed = rate.rate(now_ms)
        if observed <= quota:
            return 0
        throttle = (observed - quota) / quota * rate.window_size_ms(now_ms)
        if quota_type == REQUEST_PERCENTAGE:
            throttle = min(throttle, self.window_ms)  # Kafka's ClientRequestQuotaManager bound
        return max(1, round(throttle))

    def _sweep(self, now_ms: float) -> None:
        """Forget rates idle for the whole window, and lookups of clients gone (bounded memory)."""
        self._next_sweep = now_ms + self.samples * self.window_ms
        self._forget([k for k, r in self._rates.items() if r.idle(now_ms)])
        self._resolved = {}

    def _forget(self, keys: list[tuple[str, tuple[str, str]]]) -> None:
        for key in keys:
            del self._rates[key]
            child(CLIENT_QUOTA_RATES, key[0]).dec()

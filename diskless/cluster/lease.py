"""Self-fencing: whether a broker may still act as a partition leader, judged from its etcd lease.

The controller elects a new leader for a broker's partitions once the broker's lease expires in
etcd. A broker cut off from etcd (network partition, long pause, etcd down) does not hear of that
election, so without fencing itself it would go on accepting commits and answering the WAL
manager from a log its successor no longer extends. The rule here: a broker acts as a leader only
while it knows its lease is alive, that is for at most the lease TTL after the *sending* of the
last keepalive (or grant) that succeeded. etcd starts that TTL when it processes the request,
which is later, so the broker always stops before etcd can expire the lease, hence before any
successor can be elected.

After the lease did expire (etcd answered TTL <= 0) the broker registers again under a new lease.
It resumes only once its metadata view has caught up with that registration (the watch delivered
a revision at least that of the put): every election made while it was away is then known, so a
replica that lost leadership has been told before it can act as a leader again.

A newer incarnation of the same node id (a restart, or a second copy started by a supervisor)
revokes our lease and registers itself. Then we are *superseded*: fenced for good, and we never
register again, or two processes would lead the same partitions at the same leader epoch.

The watch may deliver the registration's own put before the put's answer arrives, so the fence
remembers the highest revision the metadata reached: a registration at or below it is seen already.

Sans-IO: the etcd store reports what happened with monotonic milliseconds; ``fenced`` takes the
current time. Not registered at all means fenced. Keepalives are reported from the store's
keepalive thread (``lease_keeper.py``) and the rest from the event loop, so every method holds a lock.
"""

from __future__ import annotations

import threading


class LeaseFence:
    """The broker's own view of whether its etcd lease is alive (see module docstring)."""

    def __init__(self, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            raise ValueError("the lease TTL must be positive")
        self.ttl_ms = ttl_ms
        self._valid_until: int | None = None  # None: no lease known to be alive
        self._awaiting_revision: int | None = None  # registered again: metadata must reach this
        self._seen_revision = -1  # the highest revision the metadata view reflects
        self._superseded = False  # another incarnation holds our node id: fenced for good
        self._lock = threading.Lock()

    def on_registered(self, sent_ms: int, revision: int) -> None:
        """A lease was granted (its request sent at ``sent_ms``) and the broker key put under it at
        etcd ``revision``."""
        with self._lock:
            if self._superseded:
                return
            self._valid_until = sent_ms + self.ttl_ms
            self._awaiting_revision = revision if revision > self._seen_revision else None

    def on_refreshed(self, sent_ms: int) -> None:
        """A keepalive sent at ``sent_ms`` was answered with a positive TTL: the lease lives on."""
        with self._lock:
            if self._valid_until is not None:
                self._valid_until = max(self._valid_until, sent_ms + self.ttl_ms)

    def on_expired(self) -> None:
        """etcd answered that the lease no longer exists: fenced until registered again."""
        with self._lock:
            self._valid_until = None
            self._awaiting_revision = None

    def on_superseded(self) -> None:
        """Another incarnation of our node id registered: fenced, and no registration reopens it."""
        with self._lock:
            self._superseded = True
            self._valid_until = None
            self._awaiting_revision = None

    @property
    def superseded(self) -> bool:
        return self._superseded

    def on_metadata_revision(self, revision: int) -> None:
        """The metadata view now reflects everything up to etcd ``revision``."""
        with self._lock:
            self._seen_revision = max(self._seen_revision, revision)
            if self._awaiting_revision is not None and revision >= self._awaiting_revision:
                self._awaiting_revision = None

    def fenced(self, now_ms: int) -> bool:
        """Whether the broker must not act as a leader at ``now_ms``."""
        # Read without the lock (asked on every leader action): each field is read atomically, and
        # a read racing the keeper's update answers as just before or just after it.
        valid_until = self._valid_until
        return valid_until is None or now_ms >= valid_until or self._awaiting_revision is not None

    def remaining_ms(self, now_ms: int) -> int:
        """How long the broker may still act as a leader without another successful keepalive."""
        with self._lock:
            if self._valid_until is None or self._awaiting_revision is not None:
                return 0
            return max(0, self._valid_until - now_ms)

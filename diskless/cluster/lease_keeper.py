"""The broker's etcd lease keepalive, on a thread of its own with an etcd connection of its own.

A keepalive that needs turns of the broker's event loop loses the lease whenever the loop is busy
for longer than the TTL (applying the metadata of 10,000 partitions, a slow synchronous call):
the controller then moves every partition away from a healthy broker. This thread sends the
keepalives over a synchronous gRPC channel that no asyncio code touches, so only a stalled process
(or etcd) can stop them. The GIL still has to be taken, but a thread gets it at the next switch
interval (milliseconds) however busy the loop is.

What the thread learns goes to the fence (``lease.py``, which has a lock): a refresh answered with
a positive TTL extends it from the sending; one answered TTL <= 0 (the lease expired, e.g. the
whole process was paused) closes it and asks the event loop, through ``on_expired``, to register
again. The lease being kept is whatever ``keep`` named last: an answer about an earlier lease is
ignored, and no refresh is sent while no lease is set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import structlog
from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

from .lease import LeaseFence

log = structlog.get_logger(__name__)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class LeaseKeeper:
    """Refreshes one etcd lease every ``interval`` seconds from a daemon thread."""

    def __init__(
        self,
        target: str,
        fence: LeaseFence,
        interval: float,
        on_expired: Callable[[], None],
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.target = target  # host:port of etcd's gRPC endpoint
        self.credentials = credentials  # etcd user and password, when etcd has authentication on
        self._token: list[tuple[str, str]] | None = None  # gRPC metadata carrying etcd's auth token
        self.fence = fence
        self.interval = interval
        self.on_expired = on_expired  # called on the keeper's thread: hand it to the loop thread-safely
        self._lease_id: int | None = None
        self._expired_reported: int | None = None  # the lease whose expiry was reported (once per lease)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0  # successful keepalives (tests and logs read it)

    def keep(self, lease_id: int) -> None:
        """From now on refresh ``lease_id`` (a new registration's lease)."""
        with self._lock:
            self._lease_id = lease_id
            self._expired_reported = None

    def forget(self) -> None:
        """Stop refreshing (the lease is being revoked)."""
        with self._lock:
            self._lease_id = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="etcd-lease-keepalive", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _auth(self) -> list[tuple[str, str]] | None:
        """etcd's auth token as call metadata (fetched once, again after a failure), or None."""
        if self.credentials is None:
            return None
        if self._token is None:
            user, password = self.credentials
            answer = self._auth_stub.Authenticate(
                rpc_pb2.AuthenticateRequest(name=user, password=password), timeout=3 * self.interval
            )
            self._token = [("token", answer.token)]
        return self._token

    def _run(self) -> None:
        channel = grpc.insecure_channel(self.target)
        stub = rpc_pb2_grpc.LeaseStub(channel)
        self._auth_stub = rpc_pb2_grpc.AuthStub(channel)
        try:
            while not self._stop.wait(self.interval):
                try:
                    self._refresh_once(stub)
                except Exception:  # never let the thread die: no keepalive at all fences the broker
                    log.exception("lease keepalive failed")
        finally:
            channel.close()

    def _refresh_once(self, stub: rpc_pb2_grpc.LeaseStub) -> None:
        with self._lock:
            lease_id = self._lease_id
            if lease_id is None or self._expired_reported == lease_id:
                return  # nothing to keep, or waiting for the loop to register again
        sent = _monotonic_ms()
        try:
            # A refresh that hangs is given up after 3 intervals, well within the TTL, so the next
            # one is tried; a slow success still counts from its sending (lease.py).
            replies = stub.LeaseKeepAlive(
                iter([rpc_pb2.LeaseKeepAliveRequest(ID=lease_id)]), timeout=3 * self.interval, metadata=self._auth()
            )
            reply = next(iter(replies), None)
        except grpc.RpcError as exc:
            self._token = None  # an expired or revoked token: authenticate again next round
            log.warning("lease refresh failed", error=str(exc.code()) if hasattr(exc, "code") else repr(exc))
            return
        with self._lock:
            if self._lease_id != lease_id:
                return  # registered again meanwhile: this answer is about a lease no longer ours
            if reply is not None and reply.TTL > 0:
                self.fence.on_refreshed(sent)
                self.refreshes += 1
                return
            if reply is None:
                return
            self._expired_reported = lease_id
            # Expired (e.g. the whole process was paused): the controller moves our partitions
            # away; come back as a new incarnation, leading nothing until our metadata shows it.
            self.fence.on_expired()
        log.error("broker lease expired; registering again")
        self.on_expired()

    def registration_failed(self, lease_id: int) -> None:
        """Registering again after ``lease_id`` expired failed: report the expiry again next round."""
        with self._lock:
            if self._expired_reported == lease_id:
                self._expired_reported = None

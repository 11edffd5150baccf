"""Every broker still learns metadata changes after etcd restarts.

The WAL manager's etcd watch could go silent forever after an etcd restart (chaos testing found
it). A broker keeps its whole copy of the cluster metadata current by a watch on the prefix too
(cluster/etcd_store.py): if that watch died silently, a broker would never learn of a topic created
through another one. Here etcd is killed and restarted several times; after each restart a topic is
created through one broker and every broker must list it within a deadline.

A process restart resets every connection, so each watch fails loudly and resynchronises. An etcd
*host* reboot (or a NAT/firewall dropping its state) does not: the old TCP connections stay open on
the client side and only answer with a reset when the client sends something. A watch stream sends
nothing once created, so a broker that does not write to etcd itself would keep a dead watch for
ever. ``RebootingProxy`` reproduces that between the brokers and etcd.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from rawclient import Session, metadata_request
from support import LocalCluster, free_port, wait_until

pytestmark = pytest.mark.integration

RESTARTS = 3
DEADLINE_S = 20.0


def knows(bootstrap: str, topic: str) -> bool:
    try:
        with Session(bootstrap, timeout=5) as session:
            response = session.request(metadata_request([topic]))
    except OSError:
        return False
    return any(t.name == topic and int(t.error_code) == 0 and len(t.partitions) == 2 for t in response.topics)


def create_topic(bootstrap: str, topic: str) -> None:
    """Create ``topic`` through one broker. Right after an etcd restart the broker's etcd channel
    may still be backing off (CreateTopics then fails with an unknown server error): try again
    until the deadline."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    errors: list[str] = []

    def attempt() -> bool:
        try:
            admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" in str(exc):
                return True
            errors.append(str(exc))
            return False
        return True

    wait_until(attempt, DEADLINE_S, 0.5, message=f"could not create {topic}: {errors[-1:]}")


def test_every_broker_learns_new_topics_after_etcd_restarts(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(brokers=3, azs=1)
    wait_until(lambda: knows_all(cluster, None), DEADLINE_S, 0.2, message="cluster did not come up")
    for restart in range(RESTARTS):
        cluster.etcd.kill()
        time.sleep(1.0)  # etcd down for a while, as a crash and restart would have it
        cluster.etcd.start()
        began = time.monotonic()
        topic = f"after-restart-{restart}"
        creator = cluster.brokers[restart % len(cluster.brokers)]
        create_topic(creator.bootstrap, topic)
        for broker in cluster.brokers:
            wait_until(
                lambda broker=broker, topic=topic: knows(broker.bootstrap, topic),
                DEADLINE_S,
                0.2,
                message=f"broker {broker.node_id} never learned {topic} after etcd restart {restart + 1}",
            )
        print(f"etcd restart {restart + 1}: every broker knows {topic} after {time.monotonic() - began:.1f}s")


def knows_all(cluster: LocalCluster, _: object) -> bool:
    """Every broker answers Metadata listing all three brokers."""
    for broker in cluster.brokers:
        try:
            with Session(broker.bootstrap, timeout=5) as session:
                response = session.request(metadata_request(None))
        except OSError:
            return False
        if len(response.brokers) != len(cluster.brokers):
            return False
    return True


class RebootingProxy:
    """TCP proxy to etcd whose ``reboot`` turns every open connection into what a rebooted host's
    peer sees: silence while the client only listens, a reset as soon as it sends anything."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.lock = threading.Lock()
        self.generation = 0
        self.sockets: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self.lock:
                self.sockets += [client, server]
                generation = self.generation
            threading.Thread(target=self._upstream, args=(client, server, generation), daemon=True).start()
            threading.Thread(target=self._downstream, args=(client, server, generation), daemon=True).start()

    def _dead(self, generation: int) -> bool:
        return generation != self.generation

    def _upstream(self, client: socket.socket, server: socket.socket, generation: int) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if self._dead(generation) and data:
                # The rebooted host knows nothing of this connection: it answers with a reset.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                return
            if not data:
                if not self._dead(generation):
                    server.close()
                return
            try:
                server.sendall(data)
            except OSError:
                return

    def _downstream(self, client: socket.socket, server: socket.socket, generation: int) -> None:
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                data = b""
            if not data or self._dead(generation):
                if not self._dead(generation):
                    client.close()
                return  # after a reboot: nothing reaches the client, and nothing tells it
            try:
                client.sendall(data)
            except OSError:
                return

    def reboot(self) -> None:
        with self.lock:
            self.generation += 1

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                sock.close()


def test_every_broker_learns_new_topics_after_an_etcd_host_reboot(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", 3, 1, {"broker.session.timeout.ms": "3000", "metrics.port": "0"})
    proxy: RebootingProxy | None = None
    try:
        cluster.etcd.start()
        proxy = RebootingProxy(cluster.etcd.endpoint)
        for broker in cluster.brokers:
            broker.etcd = proxy.endpoint
            broker.start()
        wait_until(lambda: knows_all(cluster, None), DEADLINE_S, 0.2, message="cluster did not come up")
        proxy.reboot()
        cluster.etcd.kill()
        time.sleep(1.0)
        cluster.etcd.start()
        began = time.monotonic()
        topic = "after-host-reboot"
        create_topic(cluster.brokers[0].bootstrap, topic)
        for broker in cluster.brokers:
            wait_until(
                lambda broker=broker: knows(broker.bootstrap, topic),
                DEADLINE_S,
                0.2,
                message=f"broker {broker.node_id} never learned {topic} after the etcd host reboot",
            )
        print(f"etcd host reboot: every broker knows {topic} after {time.monotonic() - began:.1f}s")
    finally:
        cluster.kill_all()
        if proxy is not None:
            proxy.close()

"""``diskless dev``: a local cluster on loopback for trying diskless out, used by ``make run``.

Starts the embedded S3 server (SeaweedFS ``weed mini``, or MinIO when a ``minio`` binary is on
PATH) with a bucket named ``diskless``, one etcd, and N ``diskless broker`` processes assigned
round-robin to K availability zones ``az-1..az-K``. Each AZ has its own loopback network, so
traffic between AZs is visible by address: the brokers of ``az-1`` listen on 127.0.1.1, 127.0.1.2,
..., those of ``az-2`` on 127.0.2.x, and so on. Every broker also listens once per AZ
(``diskless.listener.az.map``), so a client that bootstraps through the addresses
``DIR/cluster.json`` lists for its AZ is zone-aligned with no client setting; that file describes
how to reach everything; a short demo (a replicated topic, 1000 records produced with acks=all and consumed
back) shows where each partition's replicas live.

The cluster stays up until Ctrl-C or SIGTERM. It supervises its processes: one that dies (a
broker, etcd, the S3 server, the WAL manager) is reported and restarted with backoff on the same
address while the others keep serving, and left down after repeated quick failures
(``local/supervisor.py`` decides; ``--no-restart`` keeps any dead process down). ``diskless dev
kill|stop|start|pause|resume|status [NAME] --data-dir DIR`` talks to the running launcher through
the Unix socket ``DIR/control.sock``: ``kill`` is SIGKILL (a crash, restarted as any other),
``stop`` is SIGTERM and keeps it down until ``start``, ``pause``/``resume`` are SIGSTOP/SIGCONT.
Shutdown is ordered: brokers first, one at a time with SIGTERM (controlled shutdown hands their
leaderships over), then etcd, then the S3 server. Children run in their own session, so a Ctrl-C
at the terminal reaches only this launcher; if the launcher itself is killed they get SIGTERM.

Everything lives under DIR and is reused by the next start: etcd keeps the cluster metadata
(topics, partition states) and each broker keeps its partition logs in ``DIR/broker-<id>``, so a
restart keeps topics and records. Delete DIR for a fresh cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import secrets
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from diskless.local.servers import BrokerServer, EtcdServer, ManagedProcess, S3Server, WalManagerServer, free_port
from diskless.local.supervisor import RestartPolicy, Supervisor
from diskless.logs import configure_logging
from diskless.security.tls import DevCerts, make_dev_certs

BUCKET = "diskless"
DEMO_TOPIC = "diskless-demo"
DEMO_PARTITIONS = 6
DEMO_RECORDS = 1000
SESSION_TIMEOUT_MS = 6000
# A broker hands its leaderships over in well under a second here; the last broker to stop has
# nobody to hand them to and would otherwise wait the full default (15 s).
CONTROLLED_SHUTDOWN_TIMEOUT_MS = 3000
# A broker still running this long after SIGTERM (controlled shutdown, then closing connections
# and logs) is stuck: it gets SIGKILL, which its logs recover from at the next start.
BROKER_STOP_TIMEOUT_S = 15.0
CONTROL_SOCKET = "control.sock"
MAX_PER_OCTET = 254


class _Stop(Exception):
    """Startup or the demo was cut short by a signal."""


@dataclass(frozen=True)
class BrokerSlot:
    """Where one broker of the dev cluster lives: its id, AZ and loopback address."""

    node_id: int
    az: str
    host: str


def layout(brokers: int, azs: int) -> list[BrokerSlot]:
    """Broker i (0-based) goes to AZ ``i % azs``; the AZ number and the rank inside it make the address."""
    slots = []
    for i in range(brokers):
        az = i % azs + 1
        slots.append(BrokerSlot(node_id=i + 1, az=f"az-{az}", host=f"127.0.{az}.{i // azs + 1}"))
    return slots


def port_free(host: str, port: int) -> bool:
    """Can a listener bind ``host:port``? SO_REUSEADDR as asyncio sets it, so TIME_WAIT does not count."""
    if not 0 < port <= 65535:
        return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class StopRequest:
    """Set by SIGINT/SIGTERM; a second signal while stopping asks to kill what is left."""

    signal: int | None = None
    force: bool = False
    stopping: bool = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal = signum
        elif self.stopping:
            self.force = True

    def check(self) -> None:
        if self.signal is not None:
            raise _Stop(signal.Signals(self.signal).name)


@dataclass
class DevCluster:
    root: Path
    slots: list[BrokerSlot]
    requested_port: int
    out: TextIO
    request: StopRequest
    s3: S3Server | None = None
    etcd: EtcdServer | None = None
    brokers: list[BrokerServer] = field(default_factory=list)
    wal_manager: WalManagerServer | None = None
    # Every broker listens once per AZ (diskless.listener.az.map): a client that bootstraps through
    # its AZ's addresses is zone-aligned without any client setting (README, "Client AZs").
    az_listeners: bool = True
    broker_overrides: dict[str, str] = field(default_factory=dict)  # more broker settings (tests)
    # The S3 endpoint brokers are given, from the server's: a fault proxy in front of it (bench --s3-slow).
    s3_front: Callable[[str], str] | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    supervisor: Supervisor | None = None  # from the end of start() on
    paused: set[str] = field(default_factory=set)
    _starting: dict[str, float] = field(default_factory=dict)  # broker being restarted -> ready deadline
    _control: socket.socket | None = None
    # Security defaults (issue 14): a fresh cluster secret for internal requests, a local CA whose
    # certificate every broker's SASL_SSL listener presents, and one SCRAM user to try it with.
    cluster_secret: str = field(default_factory=lambda: secrets.token_hex(32))
    sasl_user: tuple[str, str] = ("dev", "")
    certs: DevCerts | None = None

    # --- start -----------------------------------------------------------------------------------

    def say(self, line: str = "") -> None:
        # A closed stdout (piped into `head`, terminal gone) must not stop the shutdown sequence.
        with contextlib.suppress(OSError, ValueError):
            print(line, file=self.out, flush=True)

    def processes(self) -> list[ManagedProcess]:
        head: list[ManagedProcess] = [p for p in (self.s3, self.etcd) if p is not None]
        tail: list[ManagedProcess] = [self.wal_manager] if self.wal_manager is not None else []
        return [*head, *self.brokers, *tail]

    def start(self) -> None:
        """S3 (brokers check their bucket at startup), then etcd, then all brokers booting in parallel."""
        self.root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.s3 = S3Server(self.root / "s3")
        self.s3.detached = True
        self.s3.start()
        self.s3.create_bucket(BUCKET)
        self.say(f"  s3         {self.s3.endpoint}  ({self.s3.kind}, bucket '{BUCKET}')  pid {self.s3.pid}")
        self.request.check()
        self.etcd = self._start_etcd()
        self.say(f"  etcd       http://{self.etcd.endpoint}  pid {self.etcd.pid}")
        self.request.check()
        self.certs = make_dev_certs(self.root / "tls", sorted({slot.host for slot in self.slots}))
        self.sasl_user = ("dev", secrets.token_urlsafe(12))
        _add_scram_user(self.etcd.endpoint, *self.sasl_user)
        overrides = {
            "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "controlled.shutdown.timeout.ms": str(CONTROLLED_SHUTDOWN_TIMEOUT_MS),
            "default.replication.factor": str(min(3, len(self.slots))),
            "diskless.s3.endpoint": self.s3_front(self.s3.endpoint) if self.s3_front else self.s3.endpoint,
            "diskless.s3.bucket": BUCKET,
            "diskless.s3.access.key": self.s3.access_key,
            "diskless.s3.secret.key": self.s3.secret_key,
            "metrics.port": "0",
            "diskless.cluster.secret": self.cluster_secret,
            "ssl.keystore.location": str(self.certs.keystore),
            **self.broker_overrides,
        }
        azs = sorted({slot.az for slot in self.slots}) if self.az_listeners else []
        for index, slot in enumerate(self.slots):
            broker = BrokerServer(
                slot.node_id,
                self.root / f"broker-{slot.node_id}",
                slot.host,
                slot.az,
                self.etcd.endpoint,
                overrides,
                client_azs=azs,
            )
            broker.detached = True
            broker.port = self._broker_port(slot.host, index)
            # AZ k's listener: port + 100 k + the broker's index (9192, 9292, ... for --port 9092).
            for k, az in enumerate(azs, start=1):
                broker.az_ports[az] = self._broker_port(slot.host, index + 100 * k)
            broker.tls_port = self._broker_port(slot.host, index + 100 * (len(azs) + 1))
            self.brokers.append(broker)
            broker.spawn()
        for broker in self.brokers:
            self.request.check()
            self._wait_broker(broker)
            self.say(f"  broker {broker.node_id}   {broker.bootstrap:<16} {broker.rack}  pid {broker.pid}")
        self.request.check()
        manager_overrides = {
            k: v for k, v in overrides.items() if k.startswith(("diskless.s3.", "broker.session", "diskless.cluster."))
        }
        self.wal_manager = WalManagerServer("wal-manager", self.root, self.etcd.endpoint, self.s3.endpoint)
        self.wal_manager.overrides.update(manager_overrides)
        self.wal_manager.detached = True
        self.wal_manager.start()
        self.say(f"  wal-manager {self.wal_manager.host}:{self.wal_manager.port}  pid {self.wal_manager.pid}")
        self.say(f"  up in {time.monotonic() - started:.1f}s")

    def _start_etcd(self) -> EtcdServer:
        # Ports are chosen before etcd binds them; if another process took one meanwhile, retry.
        for attempt in range(3):
            etcd = EtcdServer(self.root / "etcd")
            etcd.detached = True
            try:
                return etcd.start()
            except RuntimeError:
                etcd.stop()
                if attempt == 2:
                    raise RuntimeError(f"etcd did not start; see {etcd.log_path}") from None
        raise AssertionError("unreachable")

    def _broker_port(self, host: str, index: int) -> int:
        if self.requested_port:
            wanted = self.requested_port + index
            if port_free(host, wanted):
                return wanted
        return free_port(host)

    def _wait_broker(self, broker: BrokerServer) -> None:
        try:
            broker.wait_ready()
        except RuntimeError:
            # Exited at startup: most likely its port was taken after we chose it. One more try.
            broker.stop()
            broker.port = free_port(broker.host)
            broker.az_ports = {az: free_port(broker.host) for az in broker.az_ports}
            broker.spawn()
            try:
                broker.wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}; see {broker.log_path}") from None
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}; see {broker.log_path}") from None

    # --- describe --------------------------------------------------------------------------------

    def bootstrap_by_az(self) -> dict[str, str]:
        """What a client in each AZ bootstraps from: its AZ's brokers, on its AZ's listener."""
        out: dict[str, list[str]] = {}
        for broker in self.brokers:
            az = broker.rack or ""
            out.setdefault(az, []).append(broker.bootstrap_for(az))
        return {az: ",".join(addresses) for az, addresses in sorted(out.items())}

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def rack_of(self) -> dict[int, str]:
        return {b.node_id: b.rack or "" for b in self.brokers}

    def description(self) -> dict[str, Any]:
        assert self.s3 is not None and self.etcd is not None
        processes: list[dict[str, Any]] = [
            {"role": "s3", "pid": self.s3.pid, "address": self.s3.endpoint, "log": str(self.s3.log_path)},
            {"role": "etcd", "pid": self.etcd.pid, "address": self.etcd.endpoint, "log": str(self.etcd.log_path)},
        ]
        processes += [
            {
                "role": "broker",
                "name": b.name,
                "node_id": b.node_id,
                "az": b.rack,
                "pid": b.pid,
                "address": b.bootstrap,
                "listeners": {az: b.bootstrap_for(az) for az in b.az_ports},
                "metrics": f"http://{b.host}:{b.metrics_port}/metrics",
                "data_dir": str(b.data_dir),
                "log": str(b.log_path),
            }
            for b in self.brokers
        ]
        if self.wal_manager is not None:
            processes.append(
                {
                    "role": "wal-manager",
                    "pid": self.wal_manager.pid,
                    "address": f"{self.wal_manager.host}:{self.wal_manager.port}",
                    "log": str(self.wal_manager.log_path),
                }
            )
        for entry, process in zip(processes, self.processes(), strict=True):
            entry["name"] = process.name
            entry["state"] = self._state_of(process.name)
        return {
            "bootstrap_servers": self.bootstrap_by_az(),
            "all_bootstrap_servers": self.bootstrap,
            "s3": {
                "kind": self.s3.kind,
                "endpoint": self.s3.endpoint,
                "bucket": BUCKET,
                "access_key": self.s3.access_key,
                "secret_key": self.s3.secret_key,
            },
            "etcd": {"endpoint": self.etcd.endpoint, "url": f"http://{self.etcd.endpoint}"},
            "cluster_secret": self.cluster_secret,
            "tls": {
                "ca": str(self.certs.ca) if self.certs is not None else None,
                "bootstrap_servers": ",".join(b.tls_bootstrap for b in self.brokers if b.tls_bootstrap),
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-256",
                "username": self.sasl_user[0],
                "password": self.sasl_user[1],
            },
            "brokers": {
                str(b.node_id): {
                    "az": b.rack,
                    "address": b.bootstrap,
                    "listeners": {az: b.bootstrap_for(az) for az in b.az_ports},
                    "metrics": f"http://{b.host}:{b.metrics_port}/metrics",
                }
                for b in self.brokers
            },
            "processes": processes,
            "launcher_pid": os.getpid(),
            "data_dir": str(self.root),
        }

    def write_description(self) -> Path:
        path = self.root / "cluster.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.description(), indent=2) + "\n")
        tmp.replace(path)  # atomic: a reader never sees half a file
        return path

    # --- run -------------------------------------------------------------------------------------

    def dead(self) -> list[ManagedProcess]:
        return [p for p in self.processes() if p.proc is not None and p.proc.poll() is not None]

    def by_name(self) -> dict[str, ManagedProcess]:
        return {p.name: p for p in self.processes()}

    def _state_of(self, name: str) -> str:
        if self.supervisor is None:
            return "running"
        state = self.supervisor.state(name).value
        return "paused" if name in self.paused and state == "running" else state

    def supervise(self) -> None:
        """Until a stop is requested: report deaths, restart what the supervisor says, obey commands."""
        self.supervisor = Supervisor([p.name for p in self.processes()], self.policy)
        now = time.monotonic()
        for name in self.supervisor.names():
            self.supervisor.started(name, now)
            self.supervisor.ready(name, now)
        self._open_control()
        self.write_description()
        while self.request.signal is None:
            self._reap()
            self._check_starting()
            for name in self.supervisor.due(time.monotonic()):
                if self.request.signal is None:
                    self._restart(name)
            wakeup = self.supervisor.next_wakeup()
            timeout = 0.2 if wakeup is None else max(0.0, min(0.2, wakeup - time.monotonic()))
            self._serve_control(timeout)

    def _reap(self) -> None:
        assert self.supervisor is not None
        for process in self.processes():
            if process.proc is None or process.proc.poll() is None:
                continue
            code = process.proc.returncode
            process.stop()  # reaps, and removes what the process leaves behind (S3 sockets)
            self.paused.discard(process.name)
            self._starting.pop(process.name, None)
            event = self.supervisor.exited(process.name, time.monotonic(), code)
            self.say(f"{event.message}; see {process.log_path}")
            self.write_description()

    def _check_starting(self) -> None:
        """Brokers restart in the background (a broker takes seconds to boot): are they ready yet?"""
        assert self.supervisor is not None
        for name, deadline in list(self._starting.items()):
            broker = self.by_name()[name]
            assert isinstance(broker, BrokerServer)
            if broker.ready_file.exists() and broker.ready_file.read_text().strip():
                del self._starting[name]
                broker.wait_ready(1.0)
                self._back(name)
            elif time.monotonic() > deadline:
                del self._starting[name]
                broker.kill()
                event = self.supervisor.start_failed(name, time.monotonic(), "not ready within 60s")
                self.say(f"{event.message}; see {broker.log_path}")

    def _back(self, name: str) -> None:
        assert self.supervisor is not None
        self.supervisor.ready(name, time.monotonic())
        self.say(f"{name} is back (pid {self.by_name()[name].pid})")
        self.write_description()

    def _restart(self, name: str) -> None:
        """Start a dead process again on its former address (clients and peers know it)."""
        assert self.supervisor is not None
        process = self.by_name()[name]
        self.supervisor.started(name, time.monotonic())
        if isinstance(process, BrokerServer):
            process.ready_file.unlink(missing_ok=True)
            process.spawn()
            self._starting[name] = time.monotonic() + 60.0
            return
        # etcd, S3 and the WAL manager come up in a few seconds: started in place.
        try:
            process.start()  # type: ignore[attr-defined]
        except (RuntimeError, TimeoutError, OSError) as exc:
            process.kill()
            event = self.supervisor.start_failed(name, time.monotonic(), str(exc))
            self.say(f"{event.message}; see {process.log_path}")
            return
        if isinstance(process, S3Server):
            with contextlib.suppress(Exception):
                process.create_bucket(BUCKET)
        self._back(name)

    # --- control socket (diskless dev kill|stop|start|pause|resume|status) -----------------------

    def _open_control(self) -> None:
        path = self.root / CONTROL_SOCKET
        path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with _in_dir(self.root):  # a relative name: Unix socket paths are limited to ~100 bytes
            sock.bind(CONTROL_SOCKET)
        sock.listen(8)
        sock.setblocking(False)
        self._control = sock

    def close_control(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
            (self.root / CONTROL_SOCKET).unlink(missing_ok=True)

    def _serve_control(self, timeout: float) -> None:
        if self._control is None:
            time.sleep(timeout)
            return
        with contextlib.suppress(InterruptedError):
            readable, _, _ = select.select([self._control], [], [], timeout)
            if not readable:
                return
        try:
            conn, _ = self._control.accept()
        except (BlockingIOError, InterruptedError):
            return
        with conn:
            conn.settimeout(5.0)
            try:
                line = conn.makefile("rb").readline(65536)
                request = json.loads(line)
                answer = self.command(str(request.get("command")), request.get("name"))
            except (OSError, ValueError, AttributeError) as exc:
                answer = {"ok": False, "message": f"bad control request: {exc}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer).encode() + b"\n")

    def command(self, command: str, name: str | None) -> dict[str, Any]:
        """One control command; the answer is what ``diskless dev <command>`` prints."""
        assert self.supervisor is not None
        if command == "status":
            rows = [{"name": p.name, "state": self._state_of(p.name), "pid": p.pid} for p in self.processes()]
            return {"ok": True, "processes": rows}
        process = self.by_name().get(name or "")
        if process is None:
            return {"ok": False, "message": f"no process named {name!r}; one of {', '.join(self.by_name())}"}
        name = process.name
        running = process.proc is not None and process.proc.poll() is None
        if command == "start":
            if running:
                self.supervisor.release(name, time.monotonic())
                return {"ok": True, "message": f"{name} is already running (pid {process.pid})"}
            self.supervisor.release(name, time.monotonic())
            self.say(f"{name}: start requested")
            return {"ok": True, "message": f"starting {name}"}
        if not running:
            return {"ok": False, "message": f"{name} is not running ({self._state_of(name)})"}
        assert process.proc is not None
        pid = process.pid
        if command == "kill":
            self.say(f"{name}: SIGKILL requested (pid {pid})")
            process.proc.kill()
            process.proc.wait(10)
            self._reap()
            return {"ok": True, "message": f"killed {name} (pid {pid})"}
        if command == "stop":
            self.supervisor.hold(name)
            self.paused.discard(name)
            proc = process.proc
            proc.send_signal(signal.SIGCONT)  # a paused process must run to stop
            self._stop_one(process, name, timeout=BROKER_STOP_TIMEOUT_S)
            event = self.supervisor.exited(name, time.monotonic(), proc.returncode)
            self._starting.pop(name, None)
            self.write_description()
            return {"ok": True, "message": event.message}
        if command in ("pause", "resume"):
            paused = command == "pause"
            process.proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)
            (self.paused.add if paused else self.paused.discard)(name)
            self.say(f"{name}: {'paused (SIGSTOP)' if paused else 'resumed (SIGCONT)'}")
            self.write_description()
            return {"ok": True, "message": f"{command}d {name} (pid {pid})"}
        return {"ok": False, "message": f"unknown command {command!r}"}

    # --- stop ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Brokers one at a time (controlled shutdown), then etcd, then S3; SIGKILL on a second signal."""
        self.request.stopping = True
        if self.wal_manager is not None:
            self._stop_one(self.wal_manager, "wal-manager", timeout=10.0)
        for broker in self.brokers:
            self._stop_one(broker, f"broker {broker.node_id}", timeout=BROKER_STOP_TIMEOUT_S)
        if self.etcd is not None:
            self._stop_one(self.etcd, "etcd", timeout=10.0)
        if self.s3 is not None:
            self._stop_one(self.s3, f"s3 ({self.s3.kind})", timeout=20.0)
        (self.root / "cluster.json").unlink(missing_ok=True)

    def _stop_one(self, process: ManagedProcess, name: str, timeout: float) -> None:
        proc = process.proc
        if proc is None:
            return
        started = time.monotonic()
        report = f"had already exited with code {proc.returncode}" if proc.poll() is not None else ""
        if not report:
            proc.send_signal(signal.SIGTERM)
            deadline = started + timeout
            while proc.poll() is None:
                if self.request.force or time.monotonic() > deadline:
                    proc.kill()
                    proc.wait(10)
                    break
                time.sleep(0.02)
            how = "killed" if proc.returncode == -signal.SIGKILL else "stopped"
            report = f"{how} in {time.monotonic() - started:.1f}s"
        process.stop()  # reaps, and removes what the process leaves behind (S3 sockets)
        if isinstance(process, BrokerServer):
            process.ready_file.unlink(missing_ok=True)
        self.say(f"  {name} {report}")


# --- demo --------------------------------------------------------------------------------------


def _demo(cluster: DevCluster) -> None:
    """Create (or reuse) the demo topic, produce DEMO_RECORDS with acks=all, read them back, show placement."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    say, check = cluster.say, cluster.request.check
    bootstrap = cluster.bootstrap
    racks = cluster.rack_of()
    # The demo's clients live in the first AZ: zone-aligned metadata keeps all their traffic there
    # (the diskless topic's data goes through S3, only pointers cross AZs). They bootstrap through
    # that AZ's listeners, which is all the brokers need to know their AZ.
    first_az = sorted(set(racks.values()))[0]
    client_id = "diskless-demo" if cluster.az_listeners else f"diskless-demo diskless_az={first_az}"
    zone = {"bootstrap.servers": cluster.bootstrap_by_az()[first_az], "client.id": client_id}
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": zone["client.id"]})
    _until(lambda: len(admin.list_topics(timeout=5).brokers) >= len(racks), 20, check, "brokers did not all register")
    replication = min(3, len(racks))
    created = True
    demo_topic = NewTopic(DEMO_TOPIC, DEMO_PARTITIONS, replication, config={"diskless.enabled": "true"})
    future = admin.create_topics([demo_topic], request_timeout=20)[DEMO_TOPIC]
    try:
        future.result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        created = False
    # The future holds the exception, whose traceback holds this frame: break the cycle, or the
    # clients (and their threads, logging connection errors) outlive the demo until a gc pass.
    del future

    def led_partitions() -> dict[int, Any] | None:
        """The demo topic's partitions by id, once every one has a leader."""
        topic = admin.list_topics(DEMO_TOPIC, timeout=5).topics[DEMO_TOPIC]
        if topic.error is not None or not topic.partitions:
            return None
        if any(p.leader < 0 for p in topic.partitions.values()):
            return None
        return {p.id: p for p in topic.partitions.values()}

    layout_now = _until(led_partitions, 20, check, "demo topic has partitions without a leader")
    first = next(iter(layout_now.values()))
    say(
        f"demo: topic '{DEMO_TOPIC}' {'created' if created else 'exists'}: "
        f"{len(layout_now)} partitions, replication factor {len(first.replicas)}, diskless.enabled=true "
        "(record data in S3, pointers in the partition logs)"
    )

    def who(node: int) -> str:
        return f"{node} ({racks.get(node, '?')})"

    for index in sorted(layout_now):
        p = layout_now[index]
        replicas = ", ".join(who(r) for r in p.replicas)
        say(f"  partition {index}: {first_az} clients use {who(p.leader)}  replicas {replicas}  isr {sorted(p.isrs)}")

    consumer = Consumer({**zone, "group.id": f"diskless-dev-{os.getpid()}", "enable.auto.commit": False})
    try:
        starts = {p: consumer.get_watermark_offsets(TopicPartition(DEMO_TOPIC, p), timeout=10)[1] for p in layout_now}
        producer = Producer({**zone, "acks": "all", "compression.type": "zstd", "linger.ms": 5})
        errors: list[str] = []
        delivered = 0

        def on_delivery(err: Any, msg: Any) -> None:
            nonlocal delivered
            if err is None:
                delivered += 1
            else:
                errors.append(str(err))

        began = time.monotonic()
        for i in range(DEMO_RECORDS):
            producer.produce(DEMO_TOPIC, key=f"key-{i}", value=f"hello diskless #{i}", on_delivery=on_delivery)
            producer.poll(0)
        _until(lambda: producer.flush(0.5) == 0, 30, check, "records not acknowledged within 30s")
        produced_in = time.monotonic() - began

        def ends_now() -> dict[int, int]:
            return {p: consumer.get_watermark_offsets(TopicPartition(DEMO_TOPIC, p), timeout=10)[1] for p in layout_now}

        # The broker asked may be a follower whose high watermark has not yet caught up with
        # the acks the producer got: wait until the ends cover every acknowledged record.
        ends = ends_now()
        end_deadline = time.monotonic() + 30
        while sum(ends[p] - starts[p] for p in layout_now) < DEMO_RECORDS and time.monotonic() < end_deadline:
            check()
            time.sleep(0.05)
            ends = ends_now()
        wanted = {p: ends[p] for p in layout_now if ends[p] > starts[p]}
        consumer.assign([TopicPartition(DEMO_TOPIC, p, starts[p]) for p in wanted])
        consumed = 0
        positions = dict(starts)
        deadline = time.monotonic() + 30
        while any(positions[p] < end for p, end in wanted.items()) and time.monotonic() < deadline:
            check()
            for msg in consumer.consume(num_messages=DEMO_RECORDS, timeout=0.5):
                if msg.error() is not None:
                    continue
                if msg.offset() < wanted.get(msg.partition(), -1):
                    consumed += 1
                    positions[msg.partition()] = msg.offset() + 1
        took = time.monotonic() - began
    finally:
        consumer.close()
    if errors:
        say(f"demo: {len(errors)} records failed: {errors[0]}")
    say(
        f"demo: produced {delivered} records (acks=all, zstd) in {produced_in:.2f}s "
        f"and consumed {consumed} back; {took:.2f}s in all"
    )


def _until(condition: Callable[[], Any], timeout: float, check: Callable[[], None], message: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        check()
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.1)


# --- entry point -------------------------------------------------------------------------------


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


COMMANDS = ("kill", "stop", "start", "pause", "resume", "status")


def control(data_dir: str, command: str, name: str | None, out: TextIO = sys.stdout) -> int:
    """``diskless dev <command> [name]``: ask the launcher running on ``data_dir``; 0 if it did it."""
    root = Path(data_dir).resolve()
    if command != "status" and not name:
        print(f"diskless dev {command}: which process? (e.g. broker-1, etcd, s3, wal-manager)", file=sys.stderr)
        return 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60.0)  # a stop waits for a broker's controlled shutdown
    try:
        with _in_dir(root):
            sock.connect(CONTROL_SOCKET)
        sock.sendall(json.dumps({"command": command, "name": name}).encode() + b"\n")
        answer = json.loads(sock.makefile("rb").readline())
    except (OSError, ValueError) as exc:
        print(f"diskless dev {command}: no running `diskless dev` on {root} ({exc})", file=sys.stderr)
        return 1
    finally:
        sock.close()
    if "processes" in answer:
        for row in answer["processes"]:
            pid = row["pid"] if row["pid"] is not None else "-"
            print(f"{row['name']:<12} {row['state']:<9} pid {pid}", file=out)
    else:
        print(answer.get("message", ""), file=out if answer.get("ok") else sys.stderr)
    return 0 if answer.get("ok") else 1


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[bool]:
    """One launcher per data directory: two would share etcd's and the brokers' data."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".dev.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _add_scram_user(etcd_endpoint: str, user: str, password: str) -> None:
    """The dev SCRAM user, written into etcd as ``kafka-storage format --add-scram`` would."""
    import asyncio

    import aetcd

    from diskless.config import BrokerConfig
    from diskless.security.scram import credential_from_password
    from diskless.security.store import EtcdSecurityStore

    async def add() -> None:
        host, _, port = etcd_endpoint.rpartition(":")
        client = aetcd.Client(host=host, port=int(port))
        await client.connect()
        try:
            store = EtcdSecurityStore(client, BrokerConfig().cluster_id)
            await store.put_credential(user, credential_from_password("SCRAM-SHA-256", password))
        finally:
            await client.close()

    asyncio.run(add())


def _connect_help(cluster: DevCluster) -> list[str]:
    assert cluster.s3 is not None and cluster.etcd is not None
    by_az = cluster.bootstrap_by_az()
    first = next(iter(by_az.values())).split(",")[0]
    tls_first = next((b.tls_bootstrap for b in cluster.brokers if b.tls_bootstrap), "")
    lines = ["", "Connect (bootstrap.servers):"]
    lines += [f"  {az}:  {servers}" for az, servers in by_az.items()]
    lines += [f"  all:   {cluster.bootstrap}  (inter-broker listener: clients get the AZ of the broker asked)"]
    lines += [
        "  A client in an AZ bootstraps from that AZ's addresses: every broker has a listener per AZ and"
        " shows a client the addresses of the listener it came in on, so its AZ is known without any"
        " client setting; the 127.0.<az>.x address shows the broker's AZ.",
        "",
        "Try:",
        f"  kcat -b {first} -L",
        f"  echo hello | kcat -b {first} -t my-topic -P",
        f"  kcat -b {first} -t {DEMO_TOPIC} -C -e -f '%p:%o %k=%s\\n'",
        "",
        f"S3:   {cluster.s3.endpoint}  bucket '{BUCKET}'  ({cluster.s3.kind}; "
        f"access key '{cluster.s3.access_key}', secret '{cluster.s3.secret_key}')",
        f"etcd: http://{cluster.etcd.endpoint}  (keys under /diskless/)",
        "",
        "TLS + SASL (SCRAM-SHA-256) listeners, certificates from a local CA:",
        f"  kcat -b {tls_first} -L -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-256 \\",
        f"    -X sasl.username={cluster.sasl_user[0]} -X sasl.password={cluster.sasl_user[1]}"
        f" -X ssl.ca.location={cluster.certs.ca if cluster.certs else ''}",
        "  Internal requests need the cluster secret (cluster.json: cluster_secret); clients cannot send them.",
        f"Described in {cluster.root / 'cluster.json'}; logs in {cluster.root}/*.log",
    ]
    return lines


def run_dev(
    data_dir: str,
    brokers: int = 3,
    azs: int = 3,
    port: int = 9092,
    demo: bool = True,
    az_listeners: bool = True,
    restart: bool = True,
) -> int:
    """Run the dev cluster until a signal or a process death; 0 after a requested stop, 1 on failure."""
    configure_logging("WARNING")
    out = sys.stdout
    if brokers < 1 or azs < 1:
        print("diskless dev: --brokers and --azs must be at least 1", file=sys.stderr)
        return 2
    if azs > brokers:
        print(f"diskless dev: {_count(brokers, 'broker')} cannot fill {azs} AZs; using --azs {brokers}", file=out)
        azs = brokers
    if azs > MAX_PER_OCTET or -(-brokers // azs) > MAX_PER_OCTET:
        print(f"diskless dev: at most {MAX_PER_OCTET} AZs and {MAX_PER_OCTET} brokers per AZ", file=sys.stderr)
        return 2
    if not 0 <= port <= 65535:
        print("diskless dev: --port must be 0..65535", file=sys.stderr)
        return 2
    root = Path(data_dir).resolve()
    request = StopRequest()
    previous = {sig: signal.signal(sig, request.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _exclusive(root) as mine:
            if not mine:
                print(f"diskless dev: another launcher is using {root}", file=sys.stderr)
                return 1
            cluster = DevCluster(
                root, layout(brokers, azs), port, out, request, az_listeners=az_listeners,
                policy=RestartPolicy(restart=restart),
            )  # fmt: skip
            return _run(cluster, demo)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(cluster: DevCluster, demo: bool) -> int:
    say = cluster.say
    (cluster.root / "cluster.json").unlink(missing_ok=True)
    azs = sorted({slot.az for slot in cluster.slots})
    say(f"diskless dev: {_count(len(cluster.slots), 'broker')} in {_count(len(azs), 'AZ')}, data in {cluster.root}")
    if (cluster.root / "broker-0" / "cluster-metadata.json").exists():
        say(f"  note: {cluster.root / 'broker-0'} is from the former single-broker `diskless dev`; it is not used")
    code = 0
    try:
        cluster.start()
        cluster.write_description()
        if demo:
            try:
                _demo(cluster)
            except _Stop:
                raise
            except Exception as exc:
                say(f"demo failed: {type(exc).__name__}: {exc}  (the cluster keeps running)")
            finally:
                gc.collect()  # no client of the demo may linger and log while brokers stop
        for line in _connect_help(cluster):
            say(line)
        cluster.request.check()
        say("")
        shape = f"{_count(len(cluster.slots), 'broker')} in {_count(len(azs), 'AZ')}"
        say(f"diskless dev cluster is running ({shape}). Ctrl-C stops it.")
        say(f"  faults: diskless dev kill|stop|start|pause|resume|status NAME --data-dir {cluster.root}")
        cluster.supervise()
    except _Stop:
        pass
    except Exception as exc:
        code = 1
        say(f"diskless dev: startup failed: {exc}")
        for process in cluster.dead():
            assert process.proc is not None
            say(f"  {process.name} (pid {process.pid}) exited, code {process.proc.returncode}; see {process.log_path}")
    finally:
        began = time.monotonic()
        say("\nstopping: brokers first (controlled shutdown), then etcd and S3")
        cluster.close_control()
        for name in list(cluster.paused):  # a stopped (SIGSTOP) process cannot shut down
            process = cluster.by_name()[name]
            if process.proc is not None:
                process.proc.send_signal(signal.SIGCONT)
        cluster.stop()
        say(f"diskless dev stopped in {time.monotonic() - began:.1f}s")
    return code

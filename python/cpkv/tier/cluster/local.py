"""A local Mooncake cluster: one ``mooncake_master`` (its HTTP metadata server on) and one store server
(``mooncake_client``) holding ``store_bytes``, for ``cpkv cluster serve``, the cluster bench and the
tests.

Both bind their service ports on loopback (Mooncake 0.3.13 binds its HTTP metadata server and the
TCP transfer engine's data port on every interface whatever it is told; nothing else is exposed).
Each child gets a parent-death signal, so a killed parent leaves no Mooncake process behind, and a
store server that contributes memory leaves nothing in /dev/shm (Mooncake maps it anonymously).
Ready means: the master's RPC and metadata ports and the store server's port accept connections (the
store server opens its port only after its memory is mounted at the master).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from cpkv.errors import ClusterUnavailableError, InvalidArgumentError
from cpkv.tier.cluster.mooncake import program

HOST = "127.0.0.1"
# The store server's memory: at least 16 MiB, at most what a machine could have.
MIN_STORE_BYTES = 16 << 20
MAX_STORE_BYTES = 1 << 50
START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def check_port(value: Any, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidArgumentError(f"{option} must be a TCP port in 1..65535, got {value!r}")
    return value


def check_store_bytes(value: Any, option: str = "--bytes") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_STORE_BYTES <= value <= MAX_STORE_BYTES:
        raise InvalidArgumentError(f"{option} must be a number of bytes in {MIN_STORE_BYTES}..{MAX_STORE_BYTES}, "
                                   f"got {value!r}")
    return value


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent goes (PR_SET_PDEATHSIG), and no signal
    blocked (``cluster serve`` blocks the ones it waits for)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def store_usage(metrics_port: int) -> tuple[int, int]:
    """(bytes allocated to objects, objects) in the store now, as the master on ``metrics_port``
    (its HTTP metrics, loopback) counts them."""
    with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=START_TIMEOUT_S) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("master_allocated_bytes", "master_key_count"):
            values[name] = int(float(value))
    return values["master_allocated_bytes"], values["master_key_count"]


@dataclass
class LocalCluster:
    """The two processes and their addresses (``master`` is ``HOST:PORT``, ``metadata`` a URL)."""

    port: int
    metadata_port: int
    store_bytes: int
    log_dir: Path
    metrics_port: int = field(default_factory=free_port)  # the master's HTTP metrics (loopback)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def master(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def metadata(self) -> str:
        return f"http://{HOST}:{self.metadata_port}/metadata"

    def start_master(self) -> subprocess.Popen:
        """Starts (or restarts, cold: Mooncake keeps no objects across a master restart) the master."""
        self._spawn("master", [program("mooncake_master"), f"--rpc_port={self.port}", f"--rpc_address={HOST}",
                               "--enable_http_metadata_server=true", f"--http_metadata_server_host={HOST}",
                               f"--http_metadata_server_port={self.metadata_port}", f"--metrics_host={HOST}",
                               f"--metrics_port={self.metrics_port}", "--rpc_thread_num=4"])
        self._wait_ready("master", [self.port, self.metadata_port])
        return self.processes["master"]

    def start_store(self) -> subprocess.Popen:
        """Starts (or restarts) the store server: ``store_bytes`` of memory mounted at the master."""
        port = free_port()
        self._spawn("store", [program("mooncake_client"), f"--master_server_address={self.master}",
                              f"--metadata_server={self.metadata}", f"--global_segment_size={self.store_bytes}",
                              f"--host={HOST}", f"--port={port}", "--protocol=tcp", "--threads=2"])
        self._wait_ready("store", [port])
        return self.processes["store"]

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                    preexec_fn=_die_with_parent, cwd=self.log_dir)

    def _wait_ready(self, name: str, ports: list[int]) -> None:
        child = self.processes[name]
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(_accepts(port) for port in ports):
            if child.poll() is not None:
                raise ClusterUnavailableError(f"Mooncake's {name} exited with code {child.returncode} at start: "
                                              f"{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise ClusterUnavailableError(f"Mooncake's {name} was not ready within {START_TIMEOUT_S:g} s: "
                                              f"{self.log_tail(name)}")
            time.sleep(0.05)  # polling a port: the condition is the connection, not the clock

    def log_tail(self, name: str) -> str:
        """The last error line the child logged (glog ``E...`` or ``F...``), else its last line."""
        try:
            lines = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        errors = [line for line in lines if line[:1] in ("E", "F")]
        return (errors or lines or ["no output"])[-1].strip()

    def stop(self) -> None:
        """SIGTERM to each child (store server first), SIGKILL to one that outlives a few seconds."""
        for name in ("store", "master"):
            child = self.processes.pop(name, None)
            if child is None or child.poll() is not None:
                continue
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(5.0)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextlib.contextmanager
def local_cluster(store_bytes: int, *, port: int | None = None, metadata_port: int | None = None) -> Iterator[LocalCluster]:
    """A running local cluster (ports: the given ones, else free ones), stopped on exit."""
    check_store_bytes(store_bytes)
    with tempfile.TemporaryDirectory(prefix="cpkv-cluster-") as logs:
        cluster = LocalCluster(check_port(port, "--port") if port is not None else free_port(),
                               check_port(metadata_port, "--metadata-port") if metadata_port is not None
                               else free_port(), store_bytes, Path(logs))
        for taken in {cluster.port, cluster.metadata_port}:
            if _accepts(taken):
                option = "--port" if taken == cluster.port else "--metadata-port"
                raise InvalidArgumentError(f"{option} {taken}: something already listens on {HOST}:{taken}")
        if cluster.port == cluster.metadata_port:
            raise InvalidArgumentError(f"--port and --metadata-port are both {cluster.port}")
        try:
            cluster.start_master()
            cluster.start_store()
            yield cluster
        finally:
            cluster.stop()

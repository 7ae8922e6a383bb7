"""A real ``cpkv cluster serve`` for the cluster tier's tests: started on free loopback ports, waited
on by its ready line, stopped by SIGTERM (checked to leave no Mooncake process and nothing in
/dev/shm). Its children's pids come from /proc, so a test can kill the master or the store server."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from waiting import process_alive, wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 60.0
STORE_BYTES = 64 << 20


@dataclass
class Served:
    process: subprocess.Popen
    master: str
    metadata: str

    def children(self) -> dict[str, int]:
        """``{"master": pid, "store": pid}`` of the Mooncake processes it started (alive ones)."""
        found = {}
        for pid in _children(self.process.pid):
            try:
                exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if exe.endswith("mooncake_master"):
                found["master"] = pid
            elif exe.endswith("mooncake_client"):
                found["store"] = pid
        return found

    def stop(self) -> int:
        """SIGTERM; its exit code, once it and its children are gone."""
        children = list(self.children().values())
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(30)
        for pid in children:
            wait_gone(pid)
        return code


def restart_serve(old: Served, timeout_s: float = 30.0) -> Served:
    """A new ``cpkv cluster serve`` on ``old``'s master and metadata ports, once ``old`` (whose master
    was killed: it then stops its store server and exits) and its children are gone. Cold: a new
    master and store server hold no objects."""
    children = list(old.children().values())
    wait_for(lambda: old.process.poll() is not None, timeout_s, "the old cluster serve to exit")
    for pid in children:
        wait_gone(pid, timeout_s)
    port = old.master.rpartition(":")[2]
    metadata_port = old.metadata.rpartition(":")[2].split("/")[0]
    return start_serve("--port", port, "--metadata-port", metadata_port)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Returns once ``pid`` is no longer running; fails past ``timeout_s``."""
    wait_for(lambda: not process_alive(pid), timeout_s, f"process {pid} to end")


def start_serve(*args: str, store_bytes: int = STORE_BYTES) -> Served:
    """``cpkv cluster serve`` on free ports, returned once its ready line is printed."""
    process = subprocess.Popen([sys.executable, "-m", "cpkv", "cluster", "serve", "--bytes", str(store_bytes), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    line = ""
    while "ready" not in line:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(left, 0))
        if not ready:
            process.kill()
            raise AssertionError(f"cluster serve printed no ready line in {READY_TIMEOUT_S:g} s")
        line = process.stdout.readline()
        if not line:
            process.wait()
            raise AssertionError(f"cluster serve exited {process.returncode}: {process.stderr.read()}")  # type: ignore[union-attr]
    words = line.split()
    return Served(process, words[words.index("--cluster-master") + 1], words[words.index("--cluster-metadata") + 1])


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """One ``cluster serve`` per test module (every suite's conftest offers it), stopped cleanly after."""
    cluster = start_serve()
    yield cluster
    assert cluster.stop() == 0

"""``cpkv cluster serve``: a real Mooncake master and store server on loopback, ready when it says
so, stopped cleanly by SIGTERM, gone with a killed parent, every bad value one line and exit 2."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from cluster_serve import shm_names, start_serve, wait_gone
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_ready_line_means_a_put_and_get_work_and_sigterm_leaves_nothing() -> None:
    from cpkv.tier.cluster.mooncake import BoundedStore

    shm_before = shm_names()
    served = start_serve()
    children = served.children()
    assert set(children) == {"master", "store"}
    store = BoundedStore(served.master, served.metadata, 10.0)
    page = np.arange(4096, dtype=np.uint8)
    back = np.zeros_like(page)
    store.register(page.ctypes.data, page.nbytes)
    store.register(back.ctypes.data, back.nbytes)
    assert store.put_from(["serve-test"], [page.ctypes.data], [page.nbytes]) == [0]
    assert store.get_into(["serve-test"], [back.ctypes.data], [back.nbytes]) == [page.nbytes]
    assert np.array_equal(page, back)
    store.close()
    assert served.stop() == 0
    for pid in children.values():
        wait_gone(pid)
    assert shm_names() == shm_before, "cluster serve left something in /dev/shm"


def test_children_die_with_a_killed_serve() -> None:
    served = start_serve()
    children = served.children()
    served.process.send_signal(signal.SIGKILL)
    served.process.wait(30)
    for pid in children.values():
        wait_gone(pid)


def _listening() -> socket.socket:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken


@pytest.mark.parametrize("args, named", [
    (["--port", "0"], "--port"),
    (["--port", "x"], "--port"),
    (["--metadata-port", "70000"], "--metadata-port"),
    (["--bytes", "12"], "--bytes"),
    (["--bytes", "1e9"], "--bytes"),
    (["--bytes", str(1 << 60)], "--bytes"),
    (["--port", "{busy}"], "--port"),
    (["--metadata-port", "{busy}"], "--metadata-port"),
])
def test_a_bad_value_is_one_line_and_exit_2(args: list[str], named: str) -> None:
    with _listening() as taken:
        busy = str(taken.getsockname()[1])
        done = subprocess.run([sys.executable, "-m", "cpkv", "cluster", "serve",
                               *[a.replace("{busy}", busy) for a in args]],
                              capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpkv: error:") and named in lines[0], done.stderr
    assert "ready" not in done.stdout

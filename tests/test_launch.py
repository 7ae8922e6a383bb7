"""The rank launcher: ranks die with their launcher, quietly, and a rank's death is named as such.

The launcher dies in a driver process (its own session), with every rank stuck where no Python
signal handler can run: inside a gloo barrier or a lock wait. Waits are on states (a pid file
written, a process gone), each with a time limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import default_sigint, process_alive, wait_for
from cpkv.runtime.launch import LaunchError, death_text, run_ranks

pytestmark = pytest.mark.slow

DRIVER = textwrap.dedent(
    """
    import os, sys, threading
    from cpkv.runtime.launch import run_ranks
    from cpkv.runtime.segment import SharedSegment

    def rank_main(rank, world, out):
        import torch.distributed as dist

        # A registration window: a segment whose run id carries another process's pid, as every
        # rank but 0 creates them (pid 1: no rank's pid, so only the creator's own record can remove it).
        segment = SharedSegment(f"cpkv-1-{os.path.basename(out)}-r{rank}", 4096, create=True)
        with open(os.path.join(out, f"rank{rank}.pid.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(out, f"rank{rank}.pid.tmp"), os.path.join(out, f"rank{rank}.pid"))
        if rank == 0:
            threading.Event().wait()  # never joins the barrier
        dist.barrier()  # the others block in gloo, in C++, with no timeout for 10 minutes

    if __name__ == "__main__":
        run_ranks(rank_main, int(sys.argv[2]), sys.argv[1], timeout_s=600, collective_timeout_s=600)
    """
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_ranks_die_with_their_launcher_quietly(tmp_path: Path, sig: int) -> None:
    world = 3
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        driver = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(world)], start_new_session=True,
                                  stdout=err, stderr=err)
    try:
        pid_files = wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == world
                             and sorted(tmp_path.glob("rank*.pid")), 180, "every rank to start")
        ranks = [int(p.read_text()) for p in pid_files]
        assert all(process_alive(pid) for pid in ranks)
        driver.send_signal(sig)
        driver.wait(timeout=30)
        started = time.monotonic()
        wait_for(lambda: not any(process_alive(pid) for pid in ranks), 10, f"ranks {ranks} to exit")
        gone_after = time.monotonic() - started
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # whatever is left of the session, if the test failed
        except ProcessLookupError:
            pass
    assert gone_after < 10
    left = [name for name in os.listdir("/dev/shm") if name.startswith(f"cpkv-1-{tmp_path.name}-")]
    assert left == []  # each rank removed the names it created before it exited
    text = err_path.read_text()
    assert text == "", text  # no BrokenPipeError, no traceback, nothing


INTERRUPTED_DRIVER = textwrap.dedent(
    """
    import os, sys, threading
    from datetime import timedelta
    from cpkv.runtime.launch import run_ranks

    def rank_main(rank, world, out):
        import torch.distributed as dist

        def started():
            with open(os.path.join(out, f"rank{rank}.pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(out, f"rank{rank}.pid.tmp"), os.path.join(out, f"rank{rank}.pid"))

        if rank == 0:
            started()
            dist.monitored_barrier(timeout=timedelta(seconds=600))  # in C++, waiting for rank 1
        started()
        while True:  # in Python: a stop request is acted on at once
            threading.Event().wait(0.01)

    if __name__ == "__main__":
        try:
            run_ranks(rank_main, 2, sys.argv[1], timeout_s=600, collective_timeout_s=600)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
    """
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("to_group", [False, True], ids=["launcher", "terminal"])
def test_an_interrupted_launch_ends_its_ranks_silently(tmp_path: Path, to_group: bool) -> None:
    """Rank 0 waits inside a gloo barrier for rank 1, which runs Python: stopped one by one, rank 1
    would end first and rank 0 would log the broken barrier from C++. A Ctrl-C at a terminal goes
    to the whole process group, ranks included."""
    script = tmp_path / "driver.py"
    script.write_text(INTERRUPTED_DRIVER)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True,
                                  stdout=err, stderr=err, preexec_fn=default_sigint)
    try:
        pid_files = wait_for(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2
                             and sorted(tmp_path.glob("rank*.pid")), 180, "both ranks to start")
        ranks = [int(p.read_text()) for p in pid_files]
        if to_group:
            os.killpg(driver.pid, signal.SIGINT)
        else:
            driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=60) == 130
        wait_for(lambda: not any(process_alive(pid) for pid in ranks), 10, f"ranks {ranks} to exit")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = err_path.read_text()
    assert text == "interrupted\n", text


def _one_dies(rank: int, world: int, how: str) -> str:
    import threading

    import torch.distributed as dist

    if rank == world - 1:
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)
    if how == "sigkill":
        dist.barrier()  # fails at once: the dead rank's connection closes
        return "passed"
    threading.Event().wait(600)  # waits on nothing the dead rank holds: stopped after the grace
    return "waited"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how, death", [("sigkill", "killed by SIGKILL"),
                                        ("exit", "exited with status 3 before reporting a result")])
def test_a_dead_rank_is_named_within_seconds(how: str, death: str) -> None:
    started = time.monotonic()
    with pytest.raises(LaunchError) as caught:
        run_ranks(_one_dies, 3, how, timeout_s=600, collective_timeout_s=60)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith(f"rank 2 died: {death}"), message
    assert "within 600 s" not in message and "within 60 s" not in message, message
    assert elapsed < 60, elapsed  # the peers' grace is 12 s here, not the 600 s launch limit
    if how == "sigkill":  # the peers' barrier failed on the closed connection and said so
        assert "rank 0: RuntimeError" in message and "Connection" in message, message
    else:  # the peers waited on nothing the dead rank held: stopped after the grace
        assert "ranks [0, 1] stopped 12 s after a peer died, without a result" in message, message


def test_death_texts() -> None:
    assert death_text(1, -9) == "rank 1 died: killed by SIGKILL"
    assert death_text(0, -15) == "rank 0 died: killed by SIGTERM"
    assert death_text(2, 1) == "rank 2 died: exited with status 1 before reporting a result"
    assert death_text(3, None).startswith("rank 3 died: ")

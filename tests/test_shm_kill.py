"""A stop or kill of a whole multi-process ShmGroup run leaves nothing in /dev/shm.

A driver process (its own session, so its own process group) launches cp ranks through
:func:`cpkv.runtime.launch.run_ranks`; each rank registers two ShmGroup payloads and a HostSlab,
reports, then composes forever. The test then signals the whole process group (SIGTERM: the usual
service stop; SIGKILL: nothing gets to clean up) and checks:

- before the signal: every /dev/shm file any process of the run has mapped (segments, slab
  regions, POSIX semaphores, which live in /dev/shm as sem.*) has no name any more ("(deleted)"
  in /proc/<pid>/maps), and the ranks do map the run's segments (the check is not vacuous);
- after it: no process of the group is left, no /dev/shm entry carries the run's ids, none of the
  files the run mapped has reappeared, and no new sem.* entry exists that was not there before and
  that no live process holds (other workers on the machine may create their own names meanwhile).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SHM = "/dev/shm"

DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from cpkv.compose import ComposePlan, ShmGroup
    from cpkv.runtime.launch import run_ranks
    from cpkv.compose.workload import uniform_batch
    from cpkv.tier import HostSlab, SlabSpec

    def rank_main(rank, cp, out):
        batch = uniform_batch(cp, requests=2, prefix_pages=3, current_pages=2)
        plan = ComposePlan(cp, 16, batch.requests, batch.num_slots)
        group = ShmGroup(timeout_s=60)
        pools = [group.register_pool(name, batch.pool_rows, (64,), torch.uint8, batch.max_current_pages)
                 for name in ("k", "v")]
        slab = HostSlab.create({"kv": SlabSpec((16, 8), torch.float16)}, num_pages=32, num_layers=2, pin=False)
        current = torch.full((plan.num_current(rank), 64), rank, dtype=torch.uint8)
        reported = False
        while True:  # compose until stopped
            for layer in range(4):
                for name in ("k", "v"):
                    group.compose(plan, name, current, layer=layer)
            if not reported:  # after a first round of composes, so the test acts mid-run
                path = os.path.join(out, f"rank{rank}.json")
                with open(path + ".tmp", "w") as f:
                    json.dump({"pid": os.getpid(), "group": group.run_id, "slab": slab.run_id}, f)
                os.rename(path + ".tmp", path)  # whole or absent, never half written
                reported = True
            time.sleep(0.01)

    if __name__ == "__main__":
        run_ranks(rank_main, int(sys.argv[2]), sys.argv[1], timeout_s=600, collective_timeout_s=60)
    """
)


def _mapped_shm(pid: int) -> set[str]:
    """Lines of /proc/<pid>/maps that map a /dev/shm file (path plus a " (deleted)" mark)."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    return {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6
            and line.split(None, 5)[5].startswith(SHM + "/")}


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return bool([p for p in _group_pids(pgid) if not _is_zombie(p)])


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_or_killing_the_whole_group_leaves_nothing_in_dev_shm(tmp_path, sig):
    cp = 3
    before = set(os.listdir(SHM))
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(cp)], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pgid = driver.pid
    try:
        deadline = time.monotonic() + 150
        reports = []
        while time.monotonic() < deadline:
            reports = sorted(tmp_path.glob("rank*.json"))
            if len(reports) == cp or driver.poll() is not None:
                break
            time.sleep(0.2)
        assert len(reports) == cp, f"ranks did not come up: {driver.poll()} {driver.stderr.read().decode()[-2000:]}"
        ranks = [json.loads(r.read_text()) for r in reports]
        run_ids = {r["group"] for r in ranks} | {r["slab"] for r in ranks}
        pids = _group_pids(pgid)
        mapped = set().union(*(_mapped_shm(pid) for pid in pids))
        # Not vacuous: each rank maps the run's segments (k and v of every rank) and its slab.
        for r in ranks:
            own = _mapped_shm(r["pid"])
            assert sum(f"cpkv-{r['group']}-" in line for line in own) >= 2 * cp, own
        # Nothing the run maps still has a name: segments, slab regions and any semaphore.
        assert mapped and all(line.endswith(" (deleted)") for line in mapped), sorted(mapped)
        os.killpg(pgid, sig)
        driver.wait(timeout=60)
        deadline = time.monotonic() + 60
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(pgid), f"processes left in the group: {_group_pids(pgid)}"
    finally:
        if driver.poll() is None or _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            driver.wait(timeout=30)
        driver.stderr.close()
    after = set(os.listdir(SHM))
    ours = {name for name in after if any(run_id in name for run_id in run_ids)}
    assert ours == set(), ours
    names_mapped = {line.removesuffix(" (deleted)").rsplit("/", 1)[1] for line in mapped}
    assert names_mapped & after == set()
    # A semaphore someone still holds open is another live process's (workers share the machine);
    # a leaked one is held by nobody.
    new_semaphores = {name for name in after - before if name.startswith("sem.")}
    held = set().union(*(_mapped_shm(int(pid)) for pid in os.listdir("/proc") if pid.isdigit()))
    leaked = {name for name in new_semaphores if not any(f"/{name}" in line for line in held)}
    assert leaked == set(), leaked

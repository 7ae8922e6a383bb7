"""kill -9 of a vLLM engine with L3 at seeded points, then a restart on the same directory: every
chunk the killed engine acknowledged (its log entry synced) comes back unless a later acknowledged
chunk took its slot, and every block the restarted engine serves is exact. The engine runs in a
child process (the same real Scheduler and worker-side connector as the other tests) that prints
its acknowledged entries after each request; the parent kills it when the chosen line arrives."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine import BLOCK_TOKENS, Engine, cpkv_extra, prompt
from test_l3 import serve_many

HERE = Path(__file__).resolve().parent
LINE_TIMEOUT_S = 180.0
CAP = 24576 + 6 * 16480 + 100  # 6 slots (see test_l3)

CHILD = textwrap.dedent("""
    import json, logging, random, sys
    logging.disable(logging.WARNING)
    sys.path.insert(0, sys.argv[1])
    from engine import BLOCK_TOKENS, Engine, cpkv_extra, prompt
    eng = Engine(cpkv_extra(cpkv_host_blocks=4, cpkv_l3_dir=sys.argv[2], cpkv_l3_bytes=int(sys.argv[3])))
    rng = random.Random(int(sys.argv[4]))
    catalog = eng.manager.l3
    for n in range(10**6):
        base = prompt(rng.randrange(8), blocks=5)[: rng.randint(1, 5) * BLOCK_TOKENS]
        eng.add(f"r{n}", base + prompt(10**6 + n, blocks=1))
        for _ in range(100):
            eng.step()
            catalog.wait_idle(60)
            if not eng.scheduler.requests and not eng.scheduler.has_requests() and not eng.manager.num_pins:
                break
        acked = [e for e in catalog.index.entries() if e[0] not in catalog._uncommitted]
        print(json.dumps(acked), flush=True)
""")


def run_until_killed(directory: Path, seed: int, kill_after: int) -> list[tuple[int, int, int]]:
    """Starts the child, reads ``kill_after`` lines (waiting on each, bounded), kills it -9 and
    returns the acknowledged entries of the last line read."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(HERE), str(directory), str(CAP), str(seed)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    last: list = []
    try:
        for _ in range(kill_after):
            line = _readline(child, LINE_TIMEOUT_S)
            last = json.loads(line)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=LINE_TIMEOUT_S)
        assert child.stdout is not None
        child.stdout.close()
    return [(int(k), int(s), int(q)) for k, s, q in last]


def _readline(child: subprocess.Popen, timeout_s: float) -> str:
    import selectors

    assert child.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise AssertionError(f"the engine printed nothing in {timeout_s} s")
    line = child.stdout.readline()
    if not line:
        raise AssertionError(f"the engine exited with {child.wait(timeout=timeout_s)} before the kill")
    return line


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_then_restart_keeps_every_acknowledged_chunk_and_serves_exact_bytes(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    acked: list[tuple[int, int, int]] = []
    for kill in range(2):  # two kills on one directory: the second run starts from the first's state
        acked = run_until_killed(tmp_path, seed * 10 + kill, kill_after=rng.randint(3, 12))
        eng = Engine(cpkv_extra(cpkv_host_blocks=4, cpkv_l3_dir=str(tmp_path), cpkv_l3_bytes=CAP))
        catalog = eng.manager.l3
        recovered = {key: (slot, sequence) for key, slot, sequence in catalog.index.entries()}
        by_slot = dict(recovered.values())  # slot -> sequence
        for key, slot, sequence in acked:
            if by_slot.get(slot, -1) > sequence:
                continue  # a chunk acknowledged after the last line read took its slot
            assert recovered.get(key) == (slot, sequence), f"acknowledged chunk {key:#x} lost"
        # Every block the restarted engine has when a request first computes is exact.
        requests = {f"k{kill}r{i}": prompt(rng.randrange(8), blocks=5)[: rng.randint(1, 5) * BLOCK_TOKENS]
                    + prompt(10**7 + i, blocks=1) for i in range(3)}
        serve_many(eng, requests)
        eng.close()
    assert acked, "the killed engine acknowledged chunks"

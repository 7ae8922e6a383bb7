"""Determinism across real processes: one seeded stream, 8 processes, 8 equal digests;
one extra operation in one process is detected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SEED, STEPS, EXTRA_AT = 20261202, 150, 75


def launch(index: int, *extra: int) -> subprocess.Popen:
    # A different hash seed per process: nothing may depend on hash order. So fresh interpreters, not
    # cpkv.runtime.launch.run_ranks, whose ranks fork from one interpreter and share its seed.
    env = {**os.environ, "PYTHONHASHSEED": str(index * 7919 + 1)}
    cmd = [sys.executable, str(HERE / "alloc_replay.py"), str(SEED), str(STEPS), *map(str, extra)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_eight_processes_agree_and_one_extra_op_is_detected():
    procs = [launch(i) for i in range(8)] + [launch(8, EXTRA_AT)]
    results = [result(p) for p in procs]
    honest, divergent = results[:8], results[8]
    assert honest[0]["objects"] > 100 and honest[0]["stats"]["splits"] > 0
    assert len({r["digest"] for r in honest}) == 1
    assert len({r["canonical"] for r in honest}) == 1
    assert all(r["stats"] == honest[0]["stats"] for r in honest)
    # The divergent process reserved one extra page: both digests say so.
    assert divergent["digest"] != honest[0]["digest"]
    assert divergent["canonical"] != honest[0]["canonical"]

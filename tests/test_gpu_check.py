"""``make gpu-check`` (``python -m cpkv.gpu_check``): the no-GPU line here, and the verdict logic
with a stand-in for the commands as a GPU machine would run them."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import wait_for
from cpkv import gpu_check
from cpkv.gpu_check import FAIL, NA, PASS, SKIP, Ran

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "cpkv.gpu_check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("cpkv gpu-check: no CUDA GPU on this machine")
    assert done.stderr == ""


def test_the_makefile_target_runs_the_module():
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^gpu-check:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target and "-m cpkv.gpu_check" in target.group(1)


def test_every_named_cuda_test_exists():
    for test in gpu_check.CUDA_TESTS:
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text()
        assert not name or f"def {name}(" in source, test


class FakeMachine:
    """Answers each command as a GPU machine would, writing the files the real ones write."""

    def __init__(self, **changes) -> None:
        self.changes = changes
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> Ran:
        self.calls.append((argv, timeout_s))
        if "pytest" in argv:
            return self._pytest(argv)
        out = Path(argv[argv.index("--json") + 1])
        if "compose-gpu" in argv:
            rows = [{"cp": cp, "path": path, "byte-exact": cp not in self.changes.get("inexact", ()),
                     "speedup vs all-reduce": 1.0 if path.startswith("all") else 3.0}
                    for cp in (1, 2, 4) for path in ("all-reduce (baseline)", "staged single gather")]
            out.write_text(json.dumps({"tables": [{"rows": rows}]}))
            return Ran(0, "", "", 12.0)
        if "tier" in argv:
            if self.changes.get("tier_timeout"):
                return Ran(None, "", "", timeout_s)
            wrong = self.changes.get("wrong_bytes", 0)
            copies = [{"label": "K+V, 2 x 32 KB rows", "layer_bytes": 1e6, "backup_s": 1e-4, "load_s": 2e-4,
                       "plain_backup_s": 1e-4, "plain_load_s": 1e-4, "bytes_checked": 1000, "bytes_wrong": wrong}]
            out.write_text(json.dumps({"copies": copies}))
            return Ran(1 if wrong else 0, "", "cpkv bench tier: bytes differ" if wrong else "", 8.0)
        if "replay" in argv:
            if self.changes.get("replay_crash"):
                return Ran(1, "", "cpkv: replay failed: rank 1: CollectiveTimeoutError: compose barrier\n", 5.0)
            wrong = self.changes.get("replay_wrong", 0)
            report = {"verification failures (pages)": wrong, "final digest": "0x00000000000000ab",
                      "composed_bytes": 4096, "verified_bytes": 4096 - 32 * wrong, "ms per forward (slowest rank)": 1.5,
                      "ms in compose barriers per forward (slowest rank)": 0.5,
                      "compose GB/s per rank": 100.0, "backup GB/s per rank": 20.0, "load-back GB/s per rank": 18.0}
            out.write_text(json.dumps({"report": report}))
            return Ran(1 if wrong else 0, "", "", 5.0)
        raise AssertionError(argv)

    def _pytest(self, argv: list[str]) -> Ran:
        report = Path(next(a for a in argv if a.startswith("--junitxml=")).split("=", 1)[1])
        skip = self.changes.get("skip", "needs 2 GPUs, this machine has 1")
        report.write_text(
            '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
            '<testcase classname="tests.test_tier_cuda" name="test_cuda_pools[one-1-1]" time="3.5"/>'
            f'<testcase classname="tests.test_tier_cuda" name="test_cuda_pools[nccl-2-2]" time="0.0">'
            f'<skipped type="pytest.skip" message="{skip}">x</skipped></testcase>'
            + ('<testcase classname="tests.test_compose_cuda" name="test_x" time="1.0">'
               '<failure message="AssertionError: wrong bytes&#10;more">tb</failure></testcase>'
               if self.changes.get("test_fails") else "")
            + "</testsuite></testsuites>")
        return Ran(1 if self.changes.get("test_fails") else 0, "", "", 30.0)


def _verdicts(rows) -> dict[str, str]:
    return {r.check: r.verdict for r in rows}


def test_a_healthy_gpu_machine_passes_with_one_table(capsys):
    machine = FakeMachine()
    assert gpu_check.main([], run=machine, cuda=lambda: True) == 0
    out = capsys.readouterr().out
    assert "gpu-check: PASS (4 passed, 0 failed, 1 skipped or not available)" in out
    assert re.search(r"test_tier_cuda::test_cuda_pools\[nccl-2-2\]\s+skip\s+0.0\s+skipped: needs 2 GPUs", out)
    assert re.search(r"replay --device cuda \(short\)\s+PASS\s+5.0\s+4,096 composed bytes verified, digests equal; "
                     r"1.50 ms/forward \(0.50 in barriers\); GB/s per rank: compose 100.00, backup 20.00, load-back 18.00", out)
    assert "K+V, 2 x 32 KB rows: backup 10.0 GB/s (1.00 of plain), load 5.0 GB/s (0.50 of plain)" in out
    assert "byte-exact; staged vs all-reduce cp 1: 3.00x, cp 2: 3.00x, cp 4: 3.00x" in out
    assert sum(limit for _, limit in machine.calls) <= 600  # the whole check fits ten minutes


@pytest.mark.parametrize("change, check, detail", [
    ({"inexact": (2,)}, "bench compose-gpu (cp 1,2,4)", "not byte-exact at cp [2]"),
    ({"wrong_bytes": 7}, "bench tier --device cuda", "exit 1: cpkv bench tier: bytes differ"),
    ({"tier_timeout": True}, "bench tier --device cuda", "killed at its limit of 90 s"),
    ({"test_fails": True}, "test_compose_cuda::test_x", "AssertionError: wrong bytes"),
    ({"skip": "needs a CUDA GPU"}, "test_tier_cuda::test_cuda_pools[nccl-2-2]", "skipped: needs a CUDA GPU"),
    ({"replay_wrong": 1}, "replay --device cuda (short)", "1 wrong pages, 4,064 of 4,096 composed bytes verified"),
    ({"replay_crash": True}, "replay --device cuda (short)", "exit 1: cpkv: replay failed: rank 1"),
])
def test_any_failed_check_fails_the_whole(change, check, detail, capsys):
    rows = gpu_check.check(FakeMachine(**change), root=ROOT)
    row = next(r for r in rows if r.check == check)
    assert row.verdict == FAIL and detail in row.detail, row
    assert gpu_check.main([], run=FakeMachine(**change), cuda=lambda: True) == 1
    assert "gpu-check: FAIL" in capsys.readouterr().out


def test_the_replay_runs_on_cuda_and_a_spent_budget_is_a_failure():
    machine = FakeMachine()
    rows = gpu_check.check(machine, root=ROOT)
    assert _verdicts(rows)["replay --device cuda (short)"] == PASS
    replay = next(argv for argv, _ in machine.calls if "replay" in argv)
    assert replay[replay.index("--device") + 1] == "cuda"
    rows = gpu_check.check(FakeMachine(), root=ROOT, budget_s=1.0)
    assert {r.verdict for r in rows} == {FAIL} and all("budget was spent" in r.detail for r in rows)
    assert SKIP != NA  # both count as neither passed nor failed


def test_a_command_past_its_limit_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child"
    # A hung command with a child: the shell starts in milliseconds, so its child's pid is written
    # long before the limit even on a loaded machine (an interpreter's start-up may not be).
    script = f"sleep 600 & echo $! > {shlex.quote(str(pid_file))}; wait"
    started = time.monotonic()
    ran = gpu_check.run_command(["sh", "-c", script], 3.0)
    assert ran.rc is None and time.monotonic() - started < 30
    child = int(pid_file.read_text())
    # The kill was sent before run_command returned; a loaded machine may run the child once more
    # before it acts on it. Dead means a zombie waiting for whoever adopted it, or gone.
    wait_for(lambda: not _alive(child), 10, f"the command's child {child} to die")


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False

"""``make gpu-check`` (``python -m cpkv.gpu_check``): cpkv's CUDA paths on this machine, one verdict.

For a maintainer on a GPU machine, from a checkout with ``.venv`` built. It runs, each under its
own time limit and all within ten minutes on one GPU:

1. every CUDA test (``CUDA_TESTS``: the transports, the controller with CUDA pools, the pinned slab,
   ``bench tier --device cuda``, ``replay --device cuda``; tests that need more GPUs than the
   machine has skip and say so);
2. ``cpkv bench compose-gpu`` at a small size, every cp byte-exact;
3. ``cpkv bench tier --device cuda``, every loaded-back byte compared, each row's backup and
   load-back against a plain pinned copy (the 4 KB-row load-back among them);
4. a short ``cpkv replay --device cuda`` of 32 KB pages, ranks sharing the first GPU: every
   composed byte checked, digests equal, its time per forward and rates reported.

It prints one table (check, verdict, seconds, detail) and exits 1 when any check failed. Without a
GPU it says so in one line and exits 0: there is nothing to check.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# Every test that runs CUDA code (it skips without a GPU). Kept here, by name, so a maintainer sees
# what "every CUDA test" means; tests/test_gpu_check.py checks each still exists.
CUDA_TESTS = [
    "tests/test_compose_cuda.py",
    "tests/test_tier_cuda.py",
    "tests/test_host_slab.py::test_regions_are_pinned_for_cuda",
    "tests/test_bench_tier.py::test_bench_tier_on_cuda_checks_every_byte",
    "tests/test_replay_cuda.py",
]
BUDGET_S = 570.0  # the whole check; each step also has its own limit below

PASS, FAIL, SKIP, NA = "PASS", "FAIL", "skip", "n/a"


@dataclass
class Ran:
    """What one command did."""

    rc: int | None  # None: killed at its time limit
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Row:
    check: str
    verdict: str
    seconds: float
    detail: str


Runner = Callable[[list[str], float], Ran]


def run_command(argv: list[str], timeout_s: float) -> Ran:
    """Runs ``argv`` in its own session, so a timeout takes its rank processes down with it."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return Ran(proc.returncode, out, err, time.monotonic() - started)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        return Ran(None, out or "", err or "", time.monotonic() - started)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _failed_run(name: str, ran: Ran, limit_s: float) -> Row | None:
    if ran.rc is None:
        return Row(name, FAIL, ran.seconds, f"killed at its limit of {limit_s:.0f} s")
    if ran.rc != 0:
        return Row(name, FAIL, ran.seconds, f"exit {ran.rc}: {_last_line(ran.stderr) or _last_line(ran.stdout)}")
    return None


# -- the steps -------------------------------------------------------------------------------------


def _pytest_rows(run: Runner, work: Path, root: Path, limit_s: float) -> list[Row]:
    missing = [t for t in CUDA_TESTS if not (root / t.split("::")[0]).is_file()]
    if missing:
        return [Row("CUDA tests", FAIL, 0.0, f"not found under {root}: {', '.join(missing)} (run from a checkout)")]
    report = work / "cuda-tests.xml"
    ran = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={root}",
               f"--junitxml={report}", *(str(root / t) for t in CUDA_TESTS)], limit_s)
    if not report.is_file():
        failed = _failed_run("CUDA tests", ran, limit_s)
        return [failed or Row("CUDA tests", FAIL, ran.seconds, "pytest wrote no report")]
    rows = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{Path(case.get('file') or case.get('classname', '').replace('.', '/')).stem}::{case.get('name')}"
        seconds = float(case.get("time") or 0.0)
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            rows.append(Row(name, FAIL, seconds, (failure.get("message") or "").splitlines()[0][:200]
                            if failure.get("message") else "failed"))
        elif skipped is not None:
            reason = skipped.get("message") or ""
            # On a GPU machine the only acceptable skip is for more GPUs than it has.
            verdict = SKIP if "GPUs, this machine has" in reason else FAIL
            rows.append(Row(name, verdict, seconds, f"skipped: {reason[:180]}"))
        else:
            rows.append(Row(name, PASS, seconds, ""))
    if not rows:
        rows.append(Row("CUDA tests", FAIL, ran.seconds, "no test ran"))
    if ran.rc is None:
        rows.append(Row("CUDA tests", FAIL, ran.seconds, f"killed at its limit of {limit_s:.0f} s"))
    return rows


def _compose_gpu_row(run: Runner, work: Path, limit_s: float) -> Row:
    name = "bench compose-gpu (cp 1,2,4)"
    out = work / "compose-gpu.json"
    ran = run([sys.executable, "-m", "cpkv", "bench", "compose-gpu", "--cp", "1,2,4", "--requests", "8",
               "--prefix-pages", "64", "--current-pages", "8", "--page-bytes", "65536", "--layers", "4",
               "--json", str(out)], limit_s)
    failed = _failed_run(name, ran, limit_s)
    if failed:
        return failed
    rows = json.loads(out.read_text())["tables"][0]["rows"]
    inexact = sorted({r["cp"] for r in rows if r["byte-exact"] is not True})
    if inexact:
        return Row(name, FAIL, ran.seconds, f"not byte-exact at cp {inexact}")
    staged = {r["cp"]: r["speedup vs all-reduce"] for r in rows if r["path"].startswith("staged")}
    return Row(name, PASS, ran.seconds, "byte-exact; staged vs all-reduce " +
               ", ".join(f"cp {cp}: {x:.2f}x" for cp, x in sorted(staged.items())))


def _tier_row(run: Runner, work: Path, limit_s: float) -> Row:
    name = "bench tier --device cuda"
    out = work / "tier.json"
    ran = run([sys.executable, "-m", "cpkv", "bench", "tier", "--device", "cuda", "--pages", "512",
               "--repeats", "2", "--requests", "500", "--json", str(out)], limit_s)
    failed = _failed_run(name, ran, limit_s)
    if failed:
        return failed
    copies = json.loads(out.read_text())["copies"]
    checked = sum(c["bytes_checked"] for c in copies)
    wrong = sum(c["bytes_wrong"] for c in copies)
    if wrong or not checked:
        return Row(name, FAIL, ran.seconds, f"{wrong:,} of {checked:,} loaded-back bytes differ")
    # Each rate against the plain pinned copy of the same bytes (the load-back target is >= 0.8).
    rates = "; ".join(f"{c['label']}: backup {c['layer_bytes'] / c['backup_s'] / 1e9:.1f} GB/s "
                      f"({c['plain_backup_s'] / c['backup_s']:.2f} of plain), load {c['layer_bytes'] / c['load_s'] / 1e9:.1f}"
                      f" GB/s ({c['plain_load_s'] / c['load_s']:.2f} of plain)" for c in copies)
    return Row(name, PASS, ran.seconds, f"{checked:,} bytes checked; {rates}")


REPLAY_ARGS = ["--ranks", "2", "--requests", "200", "--layers", "4", "--payloads", "kv:2x8x1024:bfloat16",
               "--device-pages", "96", "--host-pages", "2048"]  # 32 KB pages, both ranks on GPU 0


def _replay_row(run: Runner, work: Path, limit_s: float) -> Row:
    name = "replay --device cuda (short)"
    out = work / "replay.json"
    ran = run([sys.executable, "-m", "cpkv", "replay", "--device", "cuda", *REPLAY_ARGS, "--quiet",
               "--json", str(out)], limit_s)
    if not out.is_file():  # exit 1 with a report is a wrong byte or a digest apart: said below
        return _failed_run(name, ran, limit_s) or Row(name, FAIL, ran.seconds, "the replay wrote no report")
    report = json.loads(out.read_text())["report"]
    wrong = report["verification failures (pages)"]
    if wrong or "ranks differ" in report["final digest"] or not report["composed_bytes"] \
            or report["verified_bytes"] != report["composed_bytes"]:
        return Row(name, FAIL, ran.seconds, f"{wrong} wrong pages, {report['verified_bytes']:,} of "
                   f"{report['composed_bytes']:,} composed bytes verified, digest {report['final digest']}")
    failed = _failed_run(name, ran, limit_s)
    return failed or Row(name, PASS, ran.seconds, (
        f"{report['composed_bytes']:,} composed bytes verified, digests equal; "
        f"{report['ms per forward (slowest rank)']:.2f} ms/forward "
        f"({report['ms in compose barriers per forward (slowest rank)']:.2f} in barriers); GB/s per rank: compose "
        f"{report['compose GB/s per rank']:.2f}, backup {report['backup GB/s per rank']:.2f}, "
        f"load-back {report['load-back GB/s per rank']:.2f}"))


# -- the whole check -------------------------------------------------------------------------------


def check(run: Runner = run_command, root: Path | None = None, budget_s: float = BUDGET_S) -> list[Row]:
    """Every step in order, each under min(its limit, what is left of the budget)."""
    root = root or Path(__file__).resolve().parents[2]
    deadline = time.monotonic() + budget_s
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="cpkv-gpu-check-") as tmp:
        work = Path(tmp)
        steps: list[tuple[str, float, Callable[[float], list[Row]]]] = [
            ("CUDA tests", 300.0, lambda s: _pytest_rows(run, work, root, s)),
            ("bench compose-gpu", 90.0, lambda s: [_compose_gpu_row(run, work, s)]),
            ("bench tier --device cuda", 90.0, lambda s: [_tier_row(run, work, s)]),
            ("replay --device cuda", 90.0, lambda s: [_replay_row(run, work, s)]),
        ]
        for name, limit_s, step in steps:
            left = deadline - time.monotonic()
            if left < 5:
                rows.append(Row(name, FAIL, 0.0, f"not run: the {budget_s:.0f} s budget was spent"))
                continue
            rows.extend(step(min(limit_s, left)))
    return rows


def render(rows: list[Row]) -> str:
    columns = ("check", "verdict", "seconds", "detail")
    cells = [(r.check, r.verdict, f"{r.seconds:.1f}", r.detail) for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join("-" * w for w in widths)
    out = [line, "  ".join(c.ljust(w) for c, w in zip(columns, widths)), line]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    failed = sum(r.verdict == FAIL for r in rows)
    passed = sum(r.verdict == PASS for r in rows)
    out.append(line)
    out.append(f"gpu-check: {'FAIL' if failed else 'PASS'} ({passed} passed, {failed} failed, "
               f"{sum(r.verdict in (SKIP, NA) for r in rows)} skipped or not available)")
    return "\n".join(out)


def main(argv: list[str] | None = None, *, run: Runner = run_command, cuda: Callable[[], Any] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cpkv.gpu_check",
                                     description="cpkv's CUDA paths on this machine (make gpu-check), one verdict.")
    parser.parse_args(argv)
    import torch

    available = cuda() if cuda is not None else torch.cuda.is_available()
    if not available:
        print(f"cpkv gpu-check: no CUDA GPU on this machine (torch {torch.__version__}, "
              f"torch.cuda.is_available() is False); nothing to check")
        return 0
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda is None else ["(given)"]
    print(f"cpkv gpu-check on {len(names)} GPU(s): {', '.join(sorted(set(names)))}", flush=True)
    started = time.monotonic()
    rows = check(run)
    print(render(rows))
    print(f"gpu-check took {time.monotonic() - started:.0f} s")
    return 1 if any(r.verdict == FAIL for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

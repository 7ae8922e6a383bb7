"""``cpkv bench cluster`` at a tiny size where SGLang is not installed (the core .venv): one line says
SGLang's column is skipped, and both halves run with cpkv alone, its hits exactly what the trace
allows. Structure and counts only: no timing is asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here"),
              pytest.mark.skipif(importlib.util.find_spec("mooncake") is None, reason="needs Mooncake Store")]

REQUESTS = 12


def test_bench_cluster_without_sglang_says_so_in_one_line_and_runs_cpkv(tmp_path: Path) -> None:
    from cpkv.bench.cluster_share import trace, trace_hits

    out = tmp_path / "b.json"
    done = subprocess.run([sys.executable, "-m", "cpkv", "bench", "cluster", "--batch", "4", "--batches", "1",
                           "--requests", str(REQUESTS), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stdout.splitlines() if "SGLang" in line and "skipped" in line]
    assert len(notes) == 1 and notes[0].startswith("cpkv bench cluster: SGLang is not importable"), done.stdout
    report = json.loads(out.read_text())
    shared = report["figures"]["shared"]
    expected = trace_hits(trace(REQUESTS, 0))
    assert sum(expected) > 0 and shared["cpkv"]["hits"] == expected
    assert "sglang" not in shared
    assert [row["backend"] for row in report["tables"][1]["rows"]] == ["cpkv cluster tier"]

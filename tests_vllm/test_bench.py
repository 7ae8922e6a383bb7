"""``cpkv bench vllm`` in .venv-vllm: the table's shape on a small generated workload (a real
``python -m cpkv`` process), and bad command lines ending in one line, exit 2 (through
``cpkv.cli.main`` in this process: each interpreter start re-imports vLLM, about a minute here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, trace_dir


def cpkv(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpkv", "bench", "vllm", *argv], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)


def test_bench_vllm_table(tmp_path) -> None:
    from cpkv import DEFAULT_POLICY

    out = tmp_path / "bench.json"
    done = cpkv("--requests", "300", "--capacities", "20,60,200", "--repeat", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    ours = f"cpkv ({DEFAULT_POLICY})"
    rows = report["tables"][0]["rows"]
    assert [(r["host blocks"], r["manager"]) for r in rows] == [
        (c, m) for c in (20, 60, 200) for m in (ours, "vLLM CPU (lru)", "vLLM CPU (arc)", "floor")]
    for row in rows:
        assert row["us per lookup+prepare_store"] > 0
        if row["manager"] != "floor":
            assert 0.0 <= row["host hit rate"] <= 1.0
    by = {(r["host blocks"], r["manager"]): r["host hit rate"] for r in rows}
    assert by[(200, ours)] >= by[(20, ours)], "more host room cannot hit less here"
    summary = report["tables"][-1]["rows"]
    assert [r["host blocks"] for r in summary] == [20, 60, 200]
    for r in summary:
        assert r["cpkv hit rate"] == by[(r["host blocks"], ours)]
        assert r["best vLLM hit rate"] == max(by[(r["host blocks"], m)] for m in ("vLLM CPU (lru)", "vLLM CPU (arc)"))
    assert report["vllm"] == "0.33.0" and report["policy"] == DEFAULT_POLICY


def test_bench_vllm_policies_side_by_side(tmp_path) -> None:
    """``--policy lru,ghost``: one cpkv manager per policy in the same interleaved replays, each
    with its own summary row against the same vLLM managers."""
    from cpkv.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "vllm", "--requests", "200", "--capacities", "20,60", "--repeat", "1",
                 "--policy", "lru,ghost", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["tables"][0]["rows"]
    assert [(r["host blocks"], r["manager"]) for r in rows] == [
        (c, m) for c in (20, 60) for m in ("cpkv (lru)", "cpkv (ghost)", "vLLM CPU (lru)", "vLLM CPU (arc)", "floor")]
    by = {(r["host blocks"], r["manager"]): r["host hit rate"] for r in rows}
    summary = report["tables"][-1]["rows"]
    assert [(r["host blocks"], r["cpkv policy"]) for r in summary] == [
        (20, "lru"), (20, "ghost"), (60, "lru"), (60, "ghost")]
    for r in summary:
        assert r["cpkv hit rate"] == by[(r["host blocks"], f"cpkv ({r['cpkv policy']})")]
    for capacity in (20, 60):  # the same LRU decisions as vLLM's own manager (the README's table)
        assert by[(capacity, "cpkv (lru)")] == by[(capacity, "vLLM CPU (lru)")]
    assert report["policy"] == "lru,ghost"


@pytest.mark.parametrize("argv, words", [
    (["--requests", "0"], "--requests"),
    (["--repeat", "0"], "--repeat"),
    (["--capacities", "nan"], "not finite"),
    (["--capacities", "0,5"], "--capacities"),
    (["--policy", "mru"], "mru"),
    (["--trace", "/nonexistent/trace.jsonl"], "trace.jsonl"),
    (["--json", "/nonexistent/dir/out.json"], "does not exist"),
])
def test_bench_vllm_bad_input_is_one_line(argv: list[str], words: str, capsys) -> None:
    from cpkv.cli import main

    assert main(["bench", "vllm", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpkv: error:") and words in lines[0], captured.err
    assert captured.out == ""


def test_bench_vllm_on_a_shared_trace(capsys) -> None:
    from cpkv.cli import main

    found = trace_dir()
    if found is None:
        pytest.skip("Mooncake traces not found (set CPKV_TRACES)")
    from cpkv import DEFAULT_POLICY

    assert main(["bench", "vllm", "--trace", str(found / "synthetic_trace.jsonl"), "--requests", "200",
                 "--capacities", "50", "--repeat", "1", "--generated"]) == 0
    out = capsys.readouterr().out
    assert f"cpkv ({DEFAULT_POLICY})" in out and "vLLM CPU (arc)" in out and "floor" in out
    assert "synthetic_trace.jsonl" in out and "cpkv.workload(seed=0)" in out

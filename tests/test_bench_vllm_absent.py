"""``cpkv bench vllm`` needs vLLM (.venv-vllm); in the core .venv it fails with one line, exit 2,
and ``import cpkv`` never imports vLLM."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_bench_vllm_without_vllm_is_one_line_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "cpkv", "bench", "vllm"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpkv: error:") and "vllm==0.33.0" in lines[0]
    assert done.stdout == ""


def test_import_cpkv_does_not_import_vllm() -> None:
    code = "import sys, cpkv, cpkv.integrations; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)

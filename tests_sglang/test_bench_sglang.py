"""``cpkv bench sglang`` run as the README shows it, ``.venv-sglang/bin/python -m cpkv bench sglang``,
without the venv's bin directory on PATH: SGLang builds its native page hash on first use with the
``ninja`` installed next to the interpreter, and the run must find it (before, every hash query of
part 3 failed inside SGLang's threads with a traceback while the run exited 0). A failure is one
line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

QUICK = ["--cp", "2", "--requests", "4", "--page-kb", "4", "--reps", "1", "--no-copy-dsa", "--dsa-cp", "2",
         "--dsa-requests", "2"]


def _path_without_ninja() -> str:
    """PATH less the interpreter's bin directory and any other directory holding a ninja."""
    tools = Path(sys.executable).parent
    kept = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p) != tools and not (Path(p) / "ninja").exists()]
    return os.pathsep.join(kept)


def _bench(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpkv", "bench", "sglang", *QUICK, "--json", str(tmp_path / "b.json")],
                          capture_output=True, text=True, timeout=1500, cwd=tmp_path,
                          env={**os.environ, "PATH": _path_without_ninja(), **env})


@pytest.mark.timeout(1800)
def test_bench_sglang_runs_as_the_readme_shows_without_the_venv_on_path(tmp_path: Path) -> None:
    done = _bench(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "rror" not in done.stderr, done.stderr
    tables = json.loads((tmp_path / "b.json").read_text())["tables"]
    assert len(tables) == 3  # part 3, SGLang's DSA stack, ran through both backends
    assert [row["storage"] for row in tables[2]["rows"]] == ["cpkv (one slab per node)", "SGLang file, unbounded"]


@pytest.mark.timeout(600)
def test_a_native_hash_that_cannot_be_built_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    done = _bench(tmp_path, TORCH_EXTENSIONS_DIR=str(tmp_path / "a-file" / "ext"))  # under a file: no build
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpkv: error: SGLang's native page hash"), done.stderr

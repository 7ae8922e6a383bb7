"""``cpkv replay --l3-dir`` serves a page only under the KV format it was written in (the payload
dtypes of ``--payloads``): one run fills a directory with float8_e4m3fn KV pages; runs on copies of
it are warm under the same payloads and start cold under float8_e5m2 or a 16-bit bfloat16 KV of the
same bytes per page. Two real rank processes per run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_replay_l3 import SIZES, _check_run

pytestmark = pytest.mark.slow

INDEX = "index:32:bfloat16"
WRITTEN = f"kv:8x16:float8_e4m3fn,{INDEX}"


def _replay(directory: Path, out: Path, payloads: str, limit: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "cpkv", "replay", "--quiet", "--json", str(out), "--l3-dir",
                           str(directory), *SIZES, "--payloads", payloads, "--limit", str(limit)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return _check_run(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("l3-fp8")
    first = _replay(directory, directory.parent / "fill.json", WRITTEN, 150)
    assert first["l3_pages_written"] > 0
    return directory


def _reopened(filled: Path, tmp_path: Path, payloads: str) -> dict:
    shutil.copytree(filled, tmp_path / "l3")
    return _replay(tmp_path / "l3", tmp_path / "run.json", payloads, 24)


def test_the_same_format_starts_warm(filled: Path, tmp_path: Path) -> None:
    report = _reopened(filled, tmp_path, WRITTEN)
    assert report["l3_recovered_pages"] > 0 and report["hit_rate_l3"] > 0


@pytest.mark.parametrize("kv", ["kv:8x16:float8_e5m2", "kv:8x8:bfloat16"])
def test_another_format_of_the_same_bytes_starts_cold(filled: Path, tmp_path: Path, kv: str) -> None:
    report = _reopened(filled, tmp_path, f"{kv},{INDEX}")
    assert report["l3_recovered_pages"] == 0 and report["hit_rate_l3"] == 0

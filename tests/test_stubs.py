"""`_cpkv.pyi` describes the extension as built: every class, method and signature."""

import subprocess
import sys

from conftest import REPO_ROOT


def test_stub_matches_the_extension():
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "cpkv._cpkv"],
        cwd=REPO_ROOT / "python",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""The README runs as written: its Python example, and the table `make run` prints."""

import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

# Rows of the replay's table that are measured, not computed: the README leaves them out.
TIMED_ROWS = {"wall time (s)", "requests / s", "tokens / s", "ms per forward (slowest rank)",
              "compose GB/s per rank", "ms in compose barriers per forward (slowest rank)",
              "backup GB/s per rank", "load-back GB/s per rank"}


def test_readme_python_blocks_run(capsys):
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "[10 11]" in out


def _table(lines: list[str]) -> tuple[str, dict[str, str]]:
    """(title, {metric: value}) of a replay table as printed (right-aligned, 2+ spaces apart)."""
    rows = {}
    for line in lines[1:]:
        if set(line.strip()) <= {"-", " "}:
            continue  # a rule
        metric, value = re.split(r"\s{2,}", line.strip())
        rows[metric] = value
    return lines[0].strip(), rows


@pytest.mark.slow
def test_readme_make_run_table_is_what_the_replay_prints():
    # `make run` is `cpkv replay` on its defaults, and every number it prints but the timings is a
    # pure function of them: the README's copy must be the real output, digits and digest included.
    text = (REPO_ROOT / "README.md").read_text()
    found = re.search(r"`make run` \(`cpkv replay` on defaults[^\n]*\n\n```\n(.*?)```", text, flags=re.S)
    assert found, "README has no `make run` output block"
    readme_title, readme_rows = _table(found.group(1).splitlines())
    done = subprocess.run([sys.executable, "-m", "cpkv", "replay", "--quiet"], cwd=REPO_ROOT, text=True,
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr
    title, rows = _table(done.stdout.splitlines())
    assert readme_title == title
    measured = {metric: value for metric, value in rows.items() if metric not in TIMED_ROWS}
    assert readme_rows == measured, "README.md's `make run` table is stale; paste the output of `make run`"

"""The README's Python example runs as written."""

import re

from conftest import REPO_ROOT


def test_readme_python_blocks_run(capsys):
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "[10 11]" in out

"""cpkv.runtime is the room below compose and tier: they import it, it imports neither of them (nor any
other room above it), so each can be read and tested on its own."""

from __future__ import annotations

import ast

from conftest import REPO_ROOT

RUNTIME = REPO_ROOT / "python" / "cpkv" / "runtime"
# What runtime may build on: the package's leaves (settings, errors, the Rust core), the standard library, torch.
ALLOWED_CPKV = {"cpkv.config", "cpkv.errors", "cpkv._cpkv"}


def _cpkv_imports(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "cpkv" or name.startswith("cpkv.")}


def test_runtime_imports_no_room_above_it():
    modules = sorted(RUNTIME.glob("*.py"))
    assert {m.name for m in modules} >= {"launch.py", "layout.py", "segment.py", "shm.py", "timeouts.py"}
    above = {m.name: sorted(name for name in _cpkv_imports(m)
                            if not name.startswith("cpkv.runtime") and name not in ALLOWED_CPKV)
             for m in modules}
    assert all(not names for names in above.values()), above


def test_the_check_sees_an_import_from_compose(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from cpkv.compose.config import invalidate_config\nimport cpkv.tier\n")
    assert _cpkv_imports(module) == {"cpkv.compose.config", "cpkv.tier"}

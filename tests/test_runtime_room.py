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
    module.write_text("from cpkv.compose.plan import plan_digest\nimport cpkv.tier\n")
    assert _cpkv_imports(module) == {"cpkv.compose.plan", "cpkv.tier"}


def test_the_tier_room_imports_nothing_from_compose():
    # The cache shares with compose only what lives in runtime (the gloo group, the agreement).
    tier = REPO_ROOT / "python" / "cpkv" / "tier"
    compose = {m.name: sorted(name for name in _cpkv_imports(m) if name.startswith("cpkv.compose"))
               for m in sorted(tier.glob("*.py"))}
    assert compose and all(not names for names in compose.values()), compose


def test_one_digest_agreement_implementation():
    # Only runtime/agree.py issues a MIN or MAX all-reduce (the agreement and the commit frontier's MIN),
    # besides the SGLang benchmark's replay of SGLang's own hit-sync MIN (the engine's, not cpkv's).
    # The SGLang backend's checker switches to agree() at merge (the lead's step); until then it is listed.
    package = REPO_ROOT / "python" / "cpkv"
    found = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                   if "ReduceOp.MIN" in p.read_text() or "ReduceOp.MAX" in p.read_text())
    found.remove("bench/sglang.py")
    assert found in (["runtime/agree.py"], ["integrations/sglang/backend.py", "runtime/agree.py"]), found

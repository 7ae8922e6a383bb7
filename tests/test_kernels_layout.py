"""The kernel sources live once, in the top-level kernels/ folder; python/cpkv/kernels/ mirrors them
with one symlink per file, which is how the wheel carries them inside cpkv (make test-wheel checks the
wheel's side)."""

from __future__ import annotations

import os

from conftest import REPO_ROOT

SOURCES = REPO_ROOT / "kernels"
PACKAGE = REPO_ROOT / "python" / "cpkv" / "kernels"


def test_every_kernel_source_is_one_symlink_in_the_package_and_nothing_else_is_there():
    sources = sorted(p.name for p in SOURCES.glob("*.py"))
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert "gather.py" in sources and entries == sources, (entries, sources)
    for name in entries:
        link = PACKAGE / name
        assert link.is_symlink(), f"{link} is a copy, not a symlink to kernels/{name}"
        assert os.readlink(link) == f"../../../kernels/{name}"  # relative: the checkout may move
        assert link.resolve() == (SOURCES / name).resolve()


def test_the_package_imports_from_the_checkout():
    import cpkv.kernels.gather

    assert cpkv.kernels.gather.RUN_COLUMNS == 6
    assert os.path.dirname(cpkv.kernels.__file__) == str(PACKAGE)

"""The SGLang integration suite: runs in .venv-sglang (`make test-sglang`), never in the core .venv.

Without SGLang 0.5.23 every module here except test_absent.py is skipped (not collected: they
import SGLang at the top), so running this folder with the core .venv's pytest reports a skip,
not errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "tests"))  # helpers every suite shares (small_fs)

from cluster_serve import served  # noqa: E402,F401 (one `cluster serve` per module, for the cluster tier's tests)
from small_fs import small_disk  # noqa: E402,F401 (the small tmpfs fixture of the disk tests)


def sglang_ready() -> str | None:
    """Why the suite cannot run here, or None when SGLang 0.5.23 is installed."""
    from importlib import metadata

    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "sglang is not installed (use .venv-sglang: make test-sglang)"
    if version.split("+", 1)[0] != "0.5.23":
        return f"sglang {version} installed, the integration needs 0.5.23"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = sglang_ready()
    if reason is None:
        return
    for item in items:
        if item.path.name != "test_absent.py":
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if (sglang_ready() is not None and collection_path.name.startswith("test_")
            and collection_path.name != "test_absent.py"):
        return True
    return None

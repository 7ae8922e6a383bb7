"""The vLLM integration suite: runs in .venv-vllm (`make test-vllm`), never in the core .venv.

Without vLLM 0.33.0 every module here is skipped, so running this folder with the core .venv's
pytest reports skips, not errors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "tests"))  # helpers every suite shares (small_fs)

from cluster_serve import served  # noqa: E402,F401 (one `cluster serve` per module, for the cluster tier's tests)
from small_fs import small_disk  # noqa: E402,F401 (the small tmpfs fixture of the disk tests)


def vllm_ready() -> str | None:
    """Why the suite cannot run here, or None when vLLM 0.33.0 is installed."""
    from importlib import metadata

    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "vllm is not installed (use .venv-vllm: make test-vllm)"
    if version.split("+", 1)[0] != "0.33.0":
        return f"vllm {version} installed, the integration needs 0.33.0"
    return None


def trace_dir() -> Path | None:
    for candidate in (os.environ.get("CPKV_TRACES"), REPO_ROOT.parent / "shared" / "traces"):
        if candidate and (Path(candidate) / "conversation_trace.jsonl").exists():
            return Path(candidate)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = vllm_ready()
    if reason is None:
        return
    for item in items:
        if item.path.name == "test_absent.py":
            continue
        item.add_marker(pytest.mark.skip(reason=reason))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The other test modules import vLLM at the top: without it they are not collected at all.
    if vllm_ready() is not None and collection_path.name.startswith("test_") and collection_path.name != "test_absent.py":
        return True
    return None

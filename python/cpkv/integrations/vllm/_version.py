"""The one vLLM release this adapter is written against, checked before vLLM is imported.

vLLM's offloading interface changes between releases (``submit_store``'s arguments differ between
0.33 and 0.34), so a different version is refused with one clear error instead of failing later
inside a transfer.
"""

from __future__ import annotations

from importlib import metadata

from cpkv.errors import EngineVersionError

REQUIRED_VLLM = "0.33.0"


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version, or None when vLLM is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def check_vllm_version(found: str | None = None) -> str:
    """Returns the installed version; raises :class:`EngineVersionError` unless it is exactly
    :data:`REQUIRED_VLLM`. ``found`` overrides the installed version (for tests)."""
    version = installed_vllm_version() if found is None else found
    if version is None:
        raise EngineVersionError(
            f"cpkv.integrations.vllm needs vllm=={REQUIRED_VLLM}, but vllm is not installed "
            f"(make test-vllm builds .venv-vllm with it)")
    if version.split("+", 1)[0] != REQUIRED_VLLM:
        raise EngineVersionError(
            f"cpkv.integrations.vllm needs vllm=={REQUIRED_VLLM}, found vllm {version}: "
            "its offloading interface differs between releases")
    return version

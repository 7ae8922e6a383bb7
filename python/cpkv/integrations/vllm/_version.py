"""The one vLLM release this adapter is written against (``submit_store``'s arguments, for one,
differ between 0.33 and 0.34), checked before vLLM is imported."""

from __future__ import annotations

from cpkv.integrations._engine_version import check_engine_version

REQUIRED_VLLM = "0.33.0"


def check_vllm_version(found: str | None = None) -> str:
    """The installed vLLM version; :class:`~cpkv.errors.EngineVersionError` unless it is exactly
    :data:`REQUIRED_VLLM`. ``found`` overrides the installed version (for tests)."""
    return check_engine_version("vllm", REQUIRED_VLLM, "offloading interface", found)

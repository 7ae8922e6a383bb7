"""The one SGLang release this backend is written against (the v1 zero-copy and v2 pool-transfer
calls, the host pools' page buffer meta and the controller's threads all change between releases),
checked before SGLang is imported."""

from __future__ import annotations

from cpkv.integrations._engine_version import check_engine_version

REQUIRED_SGLANG = "0.5.23"


def check_sglang_version(found: str | None = None) -> str:
    """The installed SGLang version; :class:`~cpkv.errors.EngineVersionError` unless it is exactly
    :data:`REQUIRED_SGLANG`. ``found`` overrides the installed version (for tests)."""
    return check_engine_version("sglang", REQUIRED_SGLANG, "HiCache storage interface", found)

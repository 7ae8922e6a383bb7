"""The one SGLang release this backend is written against, checked before SGLang is imported.

SGLang's HiCache storage interface (the v1 zero-copy and v2 pool-transfer calls, the host pools'
page buffer meta, the controller's threads) changes between releases, so any other version is
refused with one clear error instead of failing later inside a transfer.
"""

from __future__ import annotations

from importlib import metadata

from cpkv.errors import EngineVersionError

REQUIRED_SGLANG = "0.5.23"


def installed_sglang_version() -> str | None:
    """The installed SGLang distribution's version, or None when SGLang is not installed."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def check_sglang_version(found: str | None = None) -> str:
    """Returns the installed version; raises :class:`EngineVersionError` unless it is exactly
    :data:`REQUIRED_SGLANG`. ``found`` overrides the installed version (for tests)."""
    version = installed_sglang_version() if found is None else found
    if version is None:
        raise EngineVersionError(
            f"cpkv.integrations.sglang needs sglang=={REQUIRED_SGLANG}, but sglang is not installed "
            f"(make test-sglang builds .venv-sglang with it)")
    if version.split("+", 1)[0] != REQUIRED_SGLANG:
        raise EngineVersionError(
            f"cpkv.integrations.sglang needs sglang=={REQUIRED_SGLANG}, found sglang {version}: "
            "its HiCache storage interface differs between releases")
    return version

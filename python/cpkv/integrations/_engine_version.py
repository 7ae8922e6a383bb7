"""The exact-release check every engine adapter runs before it imports its engine.

Engines change their plug-in interfaces between releases, so an adapter written against one release
refuses any other with one clear error instead of failing later inside a transfer.
"""

from __future__ import annotations

from importlib import metadata

from cpkv.errors import EngineVersionError


def check_engine_version(engine: str, required: str, interface: str, found: str | None = None) -> str:
    """Returns the installed version of distribution ``engine``; raises :class:`EngineVersionError`
    unless it is exactly ``required`` (a local ``+suffix`` is ignored). ``interface`` names what
    differs between releases; ``found`` overrides the installed version (for tests)."""
    version = found
    if version is None:
        try:
            version = metadata.version(engine)
        except metadata.PackageNotFoundError:
            raise EngineVersionError(
                f"cpkv.integrations.{engine} needs {engine}=={required}, but {engine} is not installed "
                f"(make test-{engine} builds .venv-{engine} with it)") from None
    if version.split("+", 1)[0] != required:
        raise EngineVersionError(
            f"cpkv.integrations.{engine} needs {engine}=={required}, found {engine} {version}: "
            f"its {interface} differs between releases")
    return version

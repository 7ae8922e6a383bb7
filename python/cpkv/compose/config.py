"""The compose path's configuration, read from the environment once.

``CPKV_DEBUG_COMPOSE=1`` turns on the plan and staging checks of
:mod:`cpkv.compose.debug`. The hot path reads the cached :class:`ComposeConfig`
(never ``os.environ``); tests and tools change it with :func:`override_config`
and go back to the environment with :func:`invalidate_config`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEBUG_ENV = "CPKV_DEBUG_COMPOSE"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class ComposeConfig:
    debug: bool = False

    @classmethod
    def from_env(cls) -> "ComposeConfig":
        raw = os.environ.get(DEBUG_ENV, "").strip().lower()
        if raw not in _TRUE | _FALSE:
            raise ValueError(f"{DEBUG_ENV}={raw!r}: expected one of {sorted(_TRUE | _FALSE)}")
        return cls(debug=raw in _TRUE)


_current: ComposeConfig | None = None


def compose_config() -> ComposeConfig:
    """The active configuration (read from the environment on first use only)."""
    global _current
    if _current is None:
        _current = ComposeConfig.from_env()
    return _current


def override_config(config: ComposeConfig) -> None:
    """Replaces the active configuration until :func:`invalidate_config`."""
    global _current
    _current = config


def invalidate_config() -> None:
    """Forgets the active configuration; the next use re-reads the environment."""
    global _current
    _current = None

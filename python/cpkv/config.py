"""cpkv's one configuration: a typed, frozen object read from ``CPKV_*`` variables once.

The hot paths read the cached :class:`CpkvConfig` (never ``os.environ``); tests and tools
replace it with :func:`override_config` and go back to the environment with
:func:`invalidate_config`.

==============================  ===========================================================
variable                        setting
==============================  ===========================================================
``CPKV_DEBUG_COMPOSE``          compose plan and staging checks (``debug``), off
``CPKV_COLLECTIVE_TIMEOUT_S``   every barrier and all-reduce of the tier, 30
``CPKV_TRANSFER_TIMEOUT_S``     a backup or load-back older than this is aborted, 30
``CPKV_CHECK_EVERY``            forwards between digest agreement checks, 16
``CPKV_HOST_FREE_TARGET``       host room admission evicts toward, fraction of the slab, 0.05
``CPKV_WARN_INTERVAL_S``        one fallback warning per kind per interval, 10
==============================  ===========================================================

Both timeouts follow the one rule of :mod:`cpkv.runtime.timeouts` (its range and default).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from cpkv.errors import InvalidArgumentError
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, checked_timeout_s

DEBUG_ENV = "CPKV_DEBUG_COMPOSE"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class CpkvConfig:
    debug: bool = False
    collective_timeout_s: float = DEFAULT_TIMEOUT_S
    transfer_timeout_s: float = DEFAULT_TIMEOUT_S
    check_every: int = 16
    host_free_target: float = 0.05
    warn_interval_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("collective_timeout_s", "transfer_timeout_s"):  # the one timeout rule
            checked_timeout_s(getattr(self, name), f"config {name}")
        value = self.warn_interval_s
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidArgumentError(f"config warn_interval_s must be a finite number > 0, got {value!r}")
        if isinstance(self.check_every, bool) or not isinstance(self.check_every, int) or self.check_every < 1:
            raise InvalidArgumentError(f"config check_every must be an int >= 1, got {self.check_every!r}")
        frac = self.host_free_target
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
            raise InvalidArgumentError(f"config host_free_target must be in [0, 1], got {frac!r}")

    @classmethod
    def from_env(cls) -> CpkvConfig:
        values: dict[str, Any] = {}
        raw = os.environ.get(DEBUG_ENV, "").strip().lower()
        if raw not in _TRUE | _FALSE:
            raise InvalidArgumentError(f"{DEBUG_ENV}={raw!r}: expected one of {sorted(_TRUE | _FALSE)}")
        values["debug"] = raw in _TRUE
        for field in fields(cls):
            if field.name == "debug":
                continue
            env = f"CPKV_{field.name.upper()}"
            text = os.environ.get(env)
            if text is None or not text.strip():
                continue
            kind = int if field.type in ("int", int) else float
            try:
                values[field.name] = kind(text)
            except ValueError:
                raise InvalidArgumentError(f"{env}={text!r}: not a valid {kind.__name__}") from None
        try:
            return cls(**values)
        except InvalidArgumentError as err:
            raise InvalidArgumentError(f"{err} (from the CPKV_* environment)") from None


_current: CpkvConfig | None = None


def config() -> CpkvConfig:
    """The active configuration (read from the environment on first use only)."""
    global _current
    if _current is None:
        _current = CpkvConfig.from_env()
    return _current


def override_config(new: CpkvConfig | None = None, **changes: Any) -> CpkvConfig:
    """Replaces the active configuration (a whole object, or fields of the current one)."""
    global _current
    _current = replace(new if new is not None else config(), **changes)
    return _current


def invalidate_config() -> None:
    """Forgets the active configuration; the next use re-reads the environment."""
    global _current
    _current = None

"""The compose path's view of :mod:`cpkv.config` (one mechanism for every setting).

``CPKV_DEBUG_COMPOSE=1`` turns on the plan and staging checks of :mod:`cpkv.compose.debug`.
"""

from __future__ import annotations

from cpkv.config import DEBUG_ENV, CpkvConfig, invalidate_config, override_config
from cpkv.config import config as compose_config

ComposeConfig = CpkvConfig

__all__ = ["DEBUG_ENV", "ComposeConfig", "compose_config", "invalidate_config", "override_config"]

"""The adapter's settings, read once from vLLM's ``kv_connector_extra_config``.

Keys (every other key belongs to vLLM and is left alone):

- ``cpkv_host_blocks`` (required): host capacity in offloaded blocks (vLLM chunks), an int in
  ``[1, cpkv.MAX_PAGES]`` (the host allocator's one limit);
- ``cpkv_policy``: the prefix tree's eviction policy, one of ``PrefixTree.POLICIES`` (default ``cpkv.DEFAULT_POLICY``);
- ``cpkv_slab``: ``"shared"`` (default) puts the host copy in a :class:`~cpkv.tier.HostSlab`
  (huge pages or /dev/shm, mappable by every worker process of the node); ``"private"`` in this
  process's own memory.

Every value is checked here, at construction, and a bad one raises a typed error that names the key
and the value.
"""

from __future__ import annotations

from cpkv._cpkv import DEFAULT_POLICY

import math
from dataclasses import dataclass
from typing import Any, Mapping

from cpkv._cpkv import MAX_PAGES
from cpkv.errors import InvalidArgumentError, UnknownPolicyError

HOST_BLOCKS_KEY = "cpkv_host_blocks"
POLICY_KEY = "cpkv_policy"
SLAB_KEY = "cpkv_slab"
SLAB_KINDS = ("shared", "private")
# One host block is one page of the host allocator, so its limit is the allocator's.
MAX_HOST_BLOCKS = MAX_PAGES


@dataclass(frozen=True)
class CpkvOffloadConfig:
    host_blocks: int
    policy: str = DEFAULT_POLICY
    slab: str = "shared"

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> CpkvOffloadConfig:
        if extra is None or not isinstance(extra, Mapping):
            raise InvalidArgumentError(
                f"kv_connector_extra_config must be a mapping with {HOST_BLOCKS_KEY!r}, got {extra!r}")
        if HOST_BLOCKS_KEY not in extra:
            raise InvalidArgumentError(
                f"kv_connector_extra_config needs {HOST_BLOCKS_KEY!r} (host capacity in offloaded blocks, "
                "an int >= 1)")
        return cls(
            host_blocks=_host_blocks(extra[HOST_BLOCKS_KEY]),
            policy=_policy(extra.get(POLICY_KEY, DEFAULT_POLICY)),
            slab=_slab(extra.get(SLAB_KEY, "shared")),
        )


def _host_blocks(value: Any) -> int:
    what = f"kv_connector_extra_config[{HOST_BLOCKS_KEY!r}]"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgumentError(f"{what} must be an int >= 1, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise InvalidArgumentError(f"{what} must be an int >= 1, got {value!r}")
    try:
        blocks = int(value)
    except ValueError:
        raise InvalidArgumentError(f"{what} must be an int >= 1, got {value!r}") from None
    if isinstance(value, str) and value.strip() != str(blocks):
        raise InvalidArgumentError(f"{what} must be an int >= 1, got {value!r}")
    if not 1 <= blocks <= MAX_HOST_BLOCKS:
        raise InvalidArgumentError(f"{what} must be in [1, {MAX_HOST_BLOCKS}], got {value!r}")
    return blocks


def _policy(value: Any) -> str:
    from cpkv import PrefixTree

    if not isinstance(value, str) or value not in PrefixTree.POLICIES:
        raise UnknownPolicyError(
            f"kv_connector_extra_config[{POLICY_KEY!r}]: unknown eviction policy {value!r} "
            f"(known: {', '.join(PrefixTree.POLICIES)})")
    return value


def _slab(value: Any) -> str:
    if value not in SLAB_KINDS:
        raise InvalidArgumentError(
            f"kv_connector_extra_config[{SLAB_KEY!r}] must be one of {', '.join(SLAB_KINDS)}, got {value!r}")
    return value

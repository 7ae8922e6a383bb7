"""The adapter's settings, read once from vLLM's ``kv_connector_extra_config``.

Keys (every key not starting with ``cpkv_`` belongs to vLLM and is left alone; an unknown ``cpkv_``
key, a typo such as ``cpkv_polcy``, is refused naming it and the known ones):

- ``cpkv_host_blocks`` (required): host capacity in offloaded blocks (vLLM chunks), an int in
  ``[1, OffloadIndex.MAX_ROWS]`` (the core index's one limit: rows are int32);
- ``cpkv_policy``: the eviction policy, one of ``PrefixTree.POLICIES`` (default ``cpkv.DEFAULT_POLICY``);
- ``cpkv_slab``: ``"shared"`` (default) puts the host copy in a :class:`~cpkv.tier.HostSlab`
  (huge pages or /dev/shm, mappable by every worker process of the node); ``"private"`` in this
  process's own memory;
- ``cpkv_timeout_s``: seconds a worker waits for its peers while the shared slab is set up, by the
  one timeout rule of :mod:`cpkv.runtime.timeouts` (default 30).

Every value is checked here, at construction, and a bad one raises a typed error that names the key
and the value. The slab's size is checked against this machine's memory by the worker, which knows
the bytes per block, before it allocates anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from cpkv._cpkv import DEFAULT_POLICY, OffloadIndex
from cpkv.errors import InvalidArgumentError, UnknownPolicyError
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, checked_timeout_s

PREFIX = "cpkv_"
HOST_BLOCKS_KEY = "cpkv_host_blocks"
POLICY_KEY = "cpkv_policy"
SLAB_KEY = "cpkv_slab"
TIMEOUT_KEY = "cpkv_timeout_s"
KNOWN_KEYS = (HOST_BLOCKS_KEY, POLICY_KEY, SLAB_KEY, TIMEOUT_KEY)
SLAB_KINDS = ("shared", "private")
# One host block is one row of the core's index, so its limit is the index's.
MAX_HOST_BLOCKS = OffloadIndex.MAX_ROWS


@dataclass(frozen=True)
class CpkvOffloadConfig:
    host_blocks: int
    policy: str = DEFAULT_POLICY
    slab: str = "shared"
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> CpkvOffloadConfig:
        if extra is None or not isinstance(extra, Mapping):
            raise InvalidArgumentError(
                f"kv_connector_extra_config must be a mapping with {HOST_BLOCKS_KEY!r}, got {extra!r}")
        unknown = sorted(k for k in extra if isinstance(k, str) and k.startswith(PREFIX) and k not in KNOWN_KEYS)
        if unknown:
            raise InvalidArgumentError(
                f"kv_connector_extra_config: unknown cpkv key {unknown[0]!r} (known: {', '.join(KNOWN_KEYS)})")
        if HOST_BLOCKS_KEY not in extra:
            raise InvalidArgumentError(
                f"kv_connector_extra_config needs {HOST_BLOCKS_KEY!r} (host capacity in offloaded blocks, "
                f"an int in [1, {MAX_HOST_BLOCKS}])")
        return cls(
            host_blocks=_host_blocks(extra[HOST_BLOCKS_KEY]),
            policy=_policy(extra.get(POLICY_KEY, DEFAULT_POLICY)),
            slab=_slab(extra.get(SLAB_KEY, "shared")),
            timeout_s=checked_timeout_s(extra.get(TIMEOUT_KEY, DEFAULT_TIMEOUT_S),
                                        f"kv_connector_extra_config[{TIMEOUT_KEY!r}]"),
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
        raise InvalidArgumentError(f"{what} must be in [1, {MAX_HOST_BLOCKS}] (OffloadIndex.MAX_ROWS), got {value!r}")
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

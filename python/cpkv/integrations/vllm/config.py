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
  one timeout rule of :mod:`cpkv.runtime.timeouts` (default 30);
- ``cpkv_l3_dir`` / ``cpkv_l3_bytes`` (both or neither): the durable disk tier below the host
  (:mod:`cpkv.integrations.vllm.l3`): an existing directory and its cap in bytes, an int >= 1.
  Refused (naming ``cpkv_l3_dir``) when vLLM's block-hash root changes across restarts
  (:func:`check_stable_block_hashes`).

Every value is checked here, at construction, and a bad one raises a typed error that names the key
and the value. The slab's size is checked against this machine's memory by the worker, which knows
the bytes per block, before it allocates anything.
"""

from __future__ import annotations

import math
import os
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
L3_DIR_KEY = "cpkv_l3_dir"
L3_BYTES_KEY = "cpkv_l3_bytes"
KNOWN_KEYS = (HOST_BLOCKS_KEY, POLICY_KEY, SLAB_KEY, TIMEOUT_KEY, L3_DIR_KEY, L3_BYTES_KEY)
SLAB_KINDS = ("shared", "private")
# One host block is one row of the core's index, so its limit is the index's.
MAX_HOST_BLOCKS = OffloadIndex.MAX_ROWS


@dataclass(frozen=True)
class CpkvOffloadConfig:
    host_blocks: int
    policy: str = DEFAULT_POLICY
    slab: str = "shared"
    timeout_s: float = DEFAULT_TIMEOUT_S
    l3_dir: str | None = None
    l3_bytes: int | None = None

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
            **_l3(extra),
        )


def _l3(extra: Mapping[str, Any]) -> dict[str, Any]:
    directory, cap = extra.get(L3_DIR_KEY), extra.get(L3_BYTES_KEY)
    if (directory is None) != (cap is None):
        given, missing = (L3_DIR_KEY, L3_BYTES_KEY) if directory is not None else (L3_BYTES_KEY, L3_DIR_KEY)
        raise InvalidArgumentError(f"kv_connector_extra_config[{given!r}] needs {missing!r} too (both or neither)")
    if directory is None:
        return {}
    if not isinstance(directory, (str, os.PathLike)) or not os.path.isdir(directory):
        raise InvalidArgumentError(
            f"kv_connector_extra_config[{L3_DIR_KEY!r}] must be an existing directory, got {directory!r}")
    what = f"kv_connector_extra_config[{L3_BYTES_KEY!r}]"
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise InvalidArgumentError(f"{what} must be an int >= 1 (bytes), got {cap!r}")
    return {"l3_dir": os.fspath(directory), "l3_bytes": cap}


def check_stable_block_hashes(hash_algo: str | None) -> None:
    """L3 outlives the process, so its keys must too: vLLM derives every block hash from a root
    (``NONE_HASH``) seeded by ``resolve_none_hash_seed``: ``PYTHONHASHSEED`` when set, else a fixed
    seed for the cryptographic algorithms (sha256, sha256_cbor) and fresh random bytes for the
    others (xxhash, xxhash_cbor). vLLM's own rule decides here: two resolutions that differ mean
    a random root. ``hash_algo`` None (vLLM's config not in reach): only ``PYTHONHASHSEED`` proves
    a stable root."""
    if hash_algo is None:
        if os.environ.get("PYTHONHASHSEED") is None:
            raise InvalidArgumentError(
                f"kv_connector_extra_config[{L3_DIR_KEY!r}]: vLLM's prefix_caching_hash_algo is not known here and "
                "PYTHONHASHSEED is not set, so block hashes may change across restarts; set PYTHONHASHSEED")
        return
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import resolve_none_hash_seed

    hash_fn = get_hash_fn_by_name(hash_algo)
    if resolve_none_hash_seed(hash_fn) != resolve_none_hash_seed(hash_fn):
        raise InvalidArgumentError(
            f"kv_connector_extra_config[{L3_DIR_KEY!r}]: prefix_caching_hash_algo={hash_algo!r} without "
            "PYTHONHASHSEED seeds vLLM's block-hash root with random bytes, so a restart would change every "
            "key on disk; set PYTHONHASHSEED or use sha256 / sha256_cbor")


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

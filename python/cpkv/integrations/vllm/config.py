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
  (:mod:`cpkv.integrations.vllm.l3`): an existing directory and its cap in bytes, an int in [1, 2**63)
  (checked by :mod:`cpkv.integrations._adapter`, as every engine's shared keys).
  Refused (naming ``cpkv_l3_dir``) when vLLM's block-hash root changes across restarts
  (:func:`check_stable_block_hashes`).
- ``cpkv_cluster_master`` / ``cpkv_cluster_metadata`` (both or neither) and ``cpkv_cluster_bytes``
  (only with them): the cluster tier below the host tier and L3 (:mod:`cpkv.integrations.vllm.cluster`),
  by the cluster tier's one rule; a master down at start is refused naming ``cpkv_cluster_master``,
  and so is a block-hash root that changes across restarts (the keys are shared by every instance).

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
from cpkv.errors import InvalidArgumentError
from cpkv.integrations._adapter import (
    CLUSTER_KEYS,
    L3_BYTES_KEY,
    L3_DIR_KEY,
    POLICY_KEY,
    TIMEOUT_KEY,
    CpkvKeys,
)
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S

HOST_BLOCKS_KEY = "cpkv_host_blocks"
SLAB_KEY = "cpkv_slab"
KNOWN_KEYS = (HOST_BLOCKS_KEY, POLICY_KEY, SLAB_KEY, TIMEOUT_KEY, L3_DIR_KEY, L3_BYTES_KEY, *CLUSTER_KEYS)
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
    cluster_master: str | None = None
    cluster_metadata: str | None = None
    cluster_bytes: int = 0

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> CpkvOffloadConfig:
        if extra is None or not isinstance(extra, Mapping):
            raise InvalidArgumentError(
                f"kv_connector_extra_config must be a mapping with {HOST_BLOCKS_KEY!r}, got {extra!r}")
        keys = CpkvKeys(extra, KNOWN_KEYS, _label)
        if HOST_BLOCKS_KEY not in extra:
            raise InvalidArgumentError(
                f"kv_connector_extra_config needs {HOST_BLOCKS_KEY!r} (host capacity in offloaded blocks, "
                f"an int in [1, {MAX_HOST_BLOCKS}])")
        l3_dir, l3_bytes = keys.l3()
        cluster_master, cluster_metadata, cluster_bytes = keys.cluster()
        return cls(host_blocks=_host_blocks(extra[HOST_BLOCKS_KEY]), policy=keys.policy(),
                   slab=_slab(extra.get(SLAB_KEY, "shared")), timeout_s=keys.timeout_s(), l3_dir=l3_dir,
                   l3_bytes=l3_bytes, cluster_master=cluster_master, cluster_metadata=cluster_metadata,
                   cluster_bytes=cluster_bytes)


def _label(key: str) -> str:
    return f"kv_connector_extra_config[{key!r}]"


def check_stable_block_hashes(hash_algo: str | None, setting: str = f"kv_connector_extra_config[{L3_DIR_KEY!r}]") -> None:
    """L3 outlives the process, so its keys must too: vLLM derives every block hash from a root
    (``NONE_HASH``) seeded by ``resolve_none_hash_seed``: ``PYTHONHASHSEED`` when set, else a fixed
    seed for the cryptographic algorithms (sha256, sha256_cbor) and fresh random bytes for the
    others (xxhash, xxhash_cbor). vLLM's own rule decides here: two resolutions that differ mean
    a random root. ``hash_algo`` None (vLLM's config not in reach): only ``PYTHONHASHSEED`` proves
    a stable root. ``setting``: the key that needs stable keys (an L3 directory, a cluster tier)."""
    if hash_algo is None:
        if os.environ.get("PYTHONHASHSEED") is None:
            raise InvalidArgumentError(
                f"{setting}: vLLM's prefix_caching_hash_algo is not known here and "
                "PYTHONHASHSEED is not set, so block hashes may change across restarts; set PYTHONHASHSEED")
        return
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import resolve_none_hash_seed

    hash_fn = get_hash_fn_by_name(hash_algo)
    if resolve_none_hash_seed(hash_fn) != resolve_none_hash_seed(hash_fn):
        raise InvalidArgumentError(
            f"{setting}: prefix_caching_hash_algo={hash_algo!r} without "
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


def _slab(value: Any) -> str:
    if value not in SLAB_KINDS:
        raise InvalidArgumentError(
            f"kv_connector_extra_config[{SLAB_KEY!r}] must be one of {', '.join(SLAB_KINDS)}, got {value!r}")
    return value

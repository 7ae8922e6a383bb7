"""The backend's settings, read once from SGLang's ``--hicache-storage-backend-extra-config``.

cpkv's own keys start with ``cpkv_``; every other key belongs to SGLang (``backend_name``,
``module_path``, ``class_name``, ``interface_v1``, ...) and is left alone. A ``cpkv_`` key this
module does not know, or a bad value, fails at construction with a typed error naming the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from cpkv._cpkv import DEFAULT_POLICY, OffloadIndex
from cpkv.errors import InvalidArgumentError, UnknownPolicyError
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, MIN_TIMEOUT_S, checked_timeout_s

# SGLang 0.5.23 holds every page replicated on the ranks of a store group (see README: "What SGLang
# holds"): per-rank slices come only from --enable-kv-cache-sharding, which refuses storage backends.
LAYOUTS = ("replicated",)

KEYS = {
    "cpkv_pages": "slab rows per node (one row holds one SGLang page of every rank that shares it), int >= 1; required",
    "cpkv_policy": "eviction policy, one of cpkv.PrefixTree.POLICIES (default cpkv.DEFAULT_POLICY)",
    "cpkv_layout": "replicated, the only layout SGLang 0.5.23 produces (every rank of a store group holds the same page bytes)",
    "cpkv_ranks_per_node": "CP ranks per slab (default: the ranks on one machine); set it to simulate several nodes on one",
    "cpkv_check_every": "compare the replicated index's digest across the CP ranks every N stores, int >= 1 (default 64)",
    "cpkv_l3_dir": ("an existing directory on a node-local disk for the durable third tier below the slab "
                    "(with cpkv_l3_bytes; needs interface_v1: 1)"),
    "cpkv_l3_bytes": ("the most bytes the L3 tier keeps on disk per store group and node, all pools together, "
                      "int >= 1 (with cpkv_l3_dir)"),
    "cpkv_l3_staging_pages": ("entries of each pool's L3 read-staging area on the node (one L3 record each, shared memory), "
                              "int from 1 to cpkv._cpkv.L3Staging.MAX_ENTRIES (default: 256 MiB of records, at "
                              "least 64, at most the L3 slots; with cpkv_l3_dir)"),
    "cpkv_timeout_s": (f"seconds any rank waits for its peers in a collective, {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} "
                       f"(cpkv.runtime.timeouts' one rule; default {DEFAULT_TIMEOUT_S:g})"),
}


@dataclass(frozen=True)
class CpkvStorageSettings:
    pages: int
    policy: str = DEFAULT_POLICY
    layout: str = "replicated"
    ranks_per_node: int | None = None
    check_every: int = 64
    timeout_s: float = DEFAULT_TIMEOUT_S
    interface_v1: bool = False
    l3_dir: str | None = None
    l3_bytes: int | None = None
    l3_staging_pages: int | None = None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> CpkvStorageSettings:
        if extra is None:
            extra = {}
        if not isinstance(extra, Mapping):
            raise InvalidArgumentError(f"hicache storage extra config must be a JSON object, got {extra!r}")
        for key in extra:
            if isinstance(key, str) and key.startswith("cpkv_") and key not in KEYS:
                known = ", ".join(KEYS)
                raise InvalidArgumentError(f"extra config key {key!r} is not a cpkv setting (known: {known})")
        if "cpkv_pages" not in extra:
            raise InvalidArgumentError("extra config key 'cpkv_pages' is required: " + KEYS["cpkv_pages"])
        pages = _int(extra, "cpkv_pages", 1)
        if pages > OffloadIndex.MAX_ROWS:
            raise InvalidArgumentError(
                f"extra config key 'cpkv_pages': {pages} is out of range (at most {OffloadIndex.MAX_ROWS})")
        policy = extra.get("cpkv_policy", DEFAULT_POLICY)
        from cpkv import PrefixTree

        if not isinstance(policy, str) or policy not in PrefixTree.POLICIES:
            raise UnknownPolicyError(
                f"extra config key 'cpkv_policy': unknown eviction policy {policy!r} "
                f"(known: {', '.join(PrefixTree.POLICIES)})")
        layout = extra.get("cpkv_layout", "replicated")
        if layout not in LAYOUTS:
            raise InvalidArgumentError(
                f"extra config key 'cpkv_layout': {layout!r} is not one of {', '.join(LAYOUTS)} (SGLang 0.5.23 "
                "holds every page replicated on the ranks that share it)")
        ranks_per_node = _int(extra, "cpkv_ranks_per_node", 1) if extra.get("cpkv_ranks_per_node") is not None else None
        check_every = _int(extra, "cpkv_check_every", 1) if "cpkv_check_every" in extra else 64
        timeout_s = checked_timeout_s(extra.get("cpkv_timeout_s", DEFAULT_TIMEOUT_S), "extra config key 'cpkv_timeout_s'")
        v1 = extra.get("interface_v1", 0)
        if v1 not in (0, 1, True, False):
            raise InvalidArgumentError(f"extra config key 'interface_v1' must be 0 or 1, got {v1!r}")
        l3_dir, l3_bytes = _l3(extra, bool(v1))
        staging = _staging_pages(extra, l3_dir)
        return cls(pages, policy, layout, ranks_per_node, check_every, timeout_s, bool(v1), l3_dir, l3_bytes, staging)


def _staging_pages(extra: Mapping[str, Any], l3_dir: str | None) -> int | None:
    """``cpkv_l3_staging_pages``: entries of the L3 read-staging area, with ``cpkv_l3_dir`` only."""
    if "cpkv_l3_staging_pages" not in extra:
        return None
    value = extra["cpkv_l3_staging_pages"]
    if l3_dir is None:
        raise InvalidArgumentError("extra config key 'cpkv_l3_staging_pages' needs 'cpkv_l3_dir' (it sizes the L3 "
                                   "tier's read-staging area)")
    from cpkv._cpkv import L3Staging  # the one limit, in the core

    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= L3Staging.MAX_ENTRIES:
        raise InvalidArgumentError(f"extra config key 'cpkv_l3_staging_pages' must be an int in "
                                   f"[1, {L3Staging.MAX_ENTRIES}], got {value!r}")
    return value


def _l3(extra: Mapping[str, Any], interface_v1: bool) -> tuple[str | None, int | None]:
    """``cpkv_l3_dir`` and ``cpkv_l3_bytes``: both or neither, an existing directory, a positive size,
    and SGLang's v1 calls (the store path that spills the slab's victims)."""
    directory, cap = extra.get("cpkv_l3_dir"), extra.get("cpkv_l3_bytes")
    if (directory is None) != (cap is None):
        given, missing = ("cpkv_l3_dir", "cpkv_l3_bytes") if directory is not None else ("cpkv_l3_bytes", "cpkv_l3_dir")
        raise InvalidArgumentError(f"extra config key {given!r} needs {missing!r} too")
    if directory is None:
        return None, None
    if not isinstance(directory, str) or not directory or not os.path.isdir(directory):
        raise InvalidArgumentError(f"extra config key 'cpkv_l3_dir': {directory!r} is not an existing directory")
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap < 1 << 63:
        raise InvalidArgumentError(f"extra config key 'cpkv_l3_bytes' must be an int in [1, 2**63), got {cap!r}")
    if not interface_v1:
        raise InvalidArgumentError("extra config key 'cpkv_l3_dir' needs 'interface_v1': 1 (the v1 store calls are "
                                   "where the slab's victims are copied out to L3)")
    return directory, cap


def _int(extra: Mapping[str, Any], key: str, minimum: int) -> int:
    value = extra.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"extra config key {key!r} must be an int >= {minimum}, got {value!r}")
    from cpkv import MAX_PAGES  # the one page limit of the core

    if value > MAX_PAGES:
        raise InvalidArgumentError(f"extra config key {key!r}: {value} is out of range (at most {MAX_PAGES})")
    return value

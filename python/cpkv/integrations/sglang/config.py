"""The backend's settings, read once from SGLang's ``--hicache-storage-backend-extra-config``.

cpkv's own keys start with ``cpkv_``; every other key belongs to SGLang (``backend_name``,
``module_path``, ``class_name``, ``interface_v1``, ...) and is left alone. A ``cpkv_`` key this
module does not know, or a bad value, fails at construction with a typed error naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cpkv._cpkv import DEFAULT_POLICY, OffloadIndex
from cpkv.errors import InvalidArgumentError
from cpkv.integrations._adapter import CLUSTER_KEYS, CpkvKeys
from cpkv.integrations._digest_checks import CHECK_EVERY, CHECK_EVERY_HELP, CHECK_EVERY_KEY
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, MIN_TIMEOUT_S

# SGLang 0.5.23 holds every page replicated on the ranks of a store group (see README: "What SGLang
# holds"): per-rank slices come only from --enable-kv-cache-sharding, which refuses storage backends.
LAYOUTS = ("replicated",)

KEYS = {
    "cpkv_pages": "slab rows per node (one row holds one SGLang page of every rank that shares it), int >= 1; required",
    "cpkv_policy": "eviction policy, one of cpkv.PrefixTree.POLICIES (default cpkv.DEFAULT_POLICY)",
    "cpkv_layout": "replicated, the only layout SGLang 0.5.23 produces (every rank of a store group holds the same page bytes)",
    "cpkv_ranks_per_node": "CP ranks per slab (default: the ranks on one machine); set it to simulate several nodes on one",
    CHECK_EVERY_KEY: CHECK_EVERY_HELP,
    "cpkv_l3_dir": ("an existing directory on a node-local disk for the durable third tier below the slab "
                    "(with cpkv_l3_bytes; needs interface_v1: 1)"),
    "cpkv_l3_bytes": ("the most bytes the L3 tier keeps on disk per store group and node, all pools together, "
                      "int >= 1 (with cpkv_l3_dir)"),
    "cpkv_l3_staging_pages": ("entries of each pool's L3 read-staging area on the node (one L3 record each, shared memory), "
                              "int from 1 to cpkv._cpkv.L3Staging.MAX_ENTRIES (default: 256 MiB of records, at "
                              "least 64, at most the L3 slots; with cpkv_l3_dir)"),
    "cpkv_timeout_s": (f"seconds any rank waits for its peers in a collective, {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} "
                       f"(cpkv.runtime.timeouts' one rule; default {DEFAULT_TIMEOUT_S:g}); bounds every cluster "
                       "tier call too"),
    **CLUSTER_KEYS,
}


@dataclass(frozen=True)
class CpkvStorageSettings:
    pages: int
    policy: str = DEFAULT_POLICY
    layout: str = "replicated"
    ranks_per_node: int | None = None
    check_every: int = CHECK_EVERY
    timeout_s: float = DEFAULT_TIMEOUT_S
    interface_v1: bool = False
    l3_dir: str | None = None
    l3_bytes: int | None = None
    l3_staging_pages: int | None = None
    cluster_master: str | None = None
    cluster_metadata: str | None = None
    cluster_bytes: int = 0

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> CpkvStorageSettings:
        if extra is None:
            extra = {}
        if not isinstance(extra, Mapping):
            raise InvalidArgumentError(f"hicache storage extra config must be a JSON object, got {extra!r}")
        keys = CpkvKeys(extra, KEYS, _label)
        if "cpkv_pages" not in extra:
            raise InvalidArgumentError("extra config key 'cpkv_pages' is required: " + KEYS["cpkv_pages"])
        from cpkv import MAX_PAGES  # the one page limit of the core

        pages = keys.int_in("cpkv_pages", 1, min(OffloadIndex.MAX_ROWS, MAX_PAGES))
        policy = keys.policy()
        layout = extra.get("cpkv_layout", "replicated")
        if layout not in LAYOUTS:
            raise InvalidArgumentError(
                f"extra config key 'cpkv_layout': {layout!r} is not one of {', '.join(LAYOUTS)} (SGLang 0.5.23 "
                "holds every page replicated on the ranks that share it)")
        ranks_per_node = None if extra.get("cpkv_ranks_per_node") is None else keys.int_in("cpkv_ranks_per_node", 1,
                                                                                            MAX_PAGES)
        check_every = keys.int_in(CHECK_EVERY_KEY, 1, MAX_PAGES, CHECK_EVERY)
        timeout_s = keys.timeout_s()
        v1 = extra.get("interface_v1", 0)
        if v1 not in (0, 1, True, False):
            raise InvalidArgumentError(f"extra config key 'interface_v1' must be 0 or 1, got {v1!r}")
        l3_dir, l3_bytes = keys.l3()
        if l3_dir is not None and not v1:
            raise InvalidArgumentError("extra config key 'cpkv_l3_dir' needs 'interface_v1': 1 (the v1 store calls "
                                       "are where the slab's victims are copied out to L3)")
        staging = _staging_pages(keys, l3_dir)
        master, metadata, cluster_bytes = keys.cluster()
        if master is not None and not v1:
            raise InvalidArgumentError("extra config key 'cpkv_cluster_master' needs 'interface_v1': 1 (the v1 store "
                                       "calls are where the slab's victims are put in the cluster)")
        return cls(pages, policy, layout, ranks_per_node, check_every, timeout_s, bool(v1), l3_dir, l3_bytes, staging,
                   master, metadata, cluster_bytes)


def _staging_pages(keys: CpkvKeys, l3_dir: str | None) -> int | None:
    """``cpkv_l3_staging_pages``: entries of the L3 read-staging area, with ``cpkv_l3_dir`` only."""
    if "cpkv_l3_staging_pages" not in keys.extra:
        return None
    if l3_dir is None:
        raise InvalidArgumentError("extra config key 'cpkv_l3_staging_pages' needs 'cpkv_l3_dir' (it sizes the L3 "
                                   "tier's read-staging area)")
    from cpkv._cpkv import L3Staging  # the one limit, in the core

    return keys.int_in("cpkv_l3_staging_pages", 1, L3Staging.MAX_ENTRIES)


def _label(key: str) -> str:
    return f"extra config key {key!r}"

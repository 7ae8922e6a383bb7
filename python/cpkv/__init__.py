"""cpkv: context-parallel ranks sharing one KV cache without talking on the hot path.

Identical inputs give identical decisions on every rank, so no broadcast,
gather or vote is needed to agree on where KV goes. The package, by concept:

- shared host (L2) page allocator (``crates/allocator``): :class:`PageAllocator`, the deterministic first fit
  that places the host tier's slab rows for the main job and both engines;
- replicated prefix tree and eviction (``crates/evict``): :class:`PrefixTree`;
- the CP compose path (:mod:`cpkv.compose`, kernels in :mod:`cpkv.kernels`);
- batch admission for CP prefill (:mod:`cpkv.scheduling`);
- the two-tier cache (``crates/tier`` + :mod:`cpkv.tier`): :class:`CacheController` over a shared
  :class:`HostSlab`, its decisions in :class:`TierCache`; settings in :mod:`cpkv.config`;
- what those rooms share (timeouts, shared-memory hygiene, the rank launcher): :mod:`cpkv.runtime`;
- ``cpkv replay`` (:mod:`cpkv.replay`): the whole system on a trace, every byte verified;
- the exception hierarchy (:mod:`cpkv.errors`) and the ``cpkv`` command line (:mod:`cpkv.cli`).

``import cpkv`` does not import torch; the compose groups import it when used.
"""

from cpkv import scheduling
from cpkv._cpkv import (
    DEFAULT_POLICY,
    MAX_CP_SIZE,
    MAX_PAGE_SIZE,
    MAX_PAGES,
    DeviceVictim,
    HostVictim,
    InsertResult,
    MatchResult,
    PageAllocator,
    Placement,
    PlacementBatch,
    PrefixTree,
    TierCache,
    TreeEvent,
    __version__,
)
from cpkv.compose import ComposePlan, CudaIpcGroup, LocalGroup, PlanCache, ShmGroup, SlotSpans
from cpkv.errors import *  # noqa: F403  (the exception hierarchy is public API)
from cpkv.errors import __all__ as _error_names
from cpkv.runtime.layout import CpLayout
from cpkv.tier import CacheController, HostSlab, SlabSpec

__all__ = [
    "__version__",
    # the one eviction policy every part of cpkv starts with (README: "Default policy")
    "DEFAULT_POLICY",
    # size limits, one number each, shared by the cores, the binding and the engine configs
    "MAX_PAGES",
    "MAX_PAGE_SIZE",
    "MAX_CP_SIZE",
    # allocator
    "PageAllocator",
    "Placement",
    "PlacementBatch",
    # prefix tree
    "PrefixTree",
    "MatchResult",
    "InsertResult",
    "DeviceVictim",
    "HostVictim",
    "TreeEvent",
    # compose
    "CpLayout",
    "SlotSpans",
    "ComposePlan",
    "PlanCache",
    "LocalGroup",
    "ShmGroup",
    "CudaIpcGroup",
    # the two-tier cache
    "TierCache",
    "CacheController",
    "HostSlab",
    "SlabSpec",
    # batch admission
    "scheduling",
    *_error_names,
]

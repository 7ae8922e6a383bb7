"""cpkv: context-parallel ranks sharing one KV cache without talking on the hot path.

Identical inputs give identical decisions on every rank, so no broadcast,
gather or vote is needed to agree on where KV goes.
"""

from cpkv._cpkv import __version__
from cpkv.errors import *  # noqa: F403  (the exception hierarchy is public API)
from cpkv.errors import __all__ as _error_names

# Shared host (L2) page allocator -- crates/allocator
from cpkv._cpkv import PageAllocator, Placement, PlacementBatch  # noqa: E402,F401
# Replicated prefix tree and eviction -- crates/evict
from cpkv._cpkv import PrefixTree, MatchResult, InsertResult, DeviceVictim, HostVictim, TreeEvent  # noqa: E402,F401,E501
# CP compose path -- cpkv.compose
from cpkv.compose import CpLayout, SlotSpans, ComposePlan, PlanCache, LocalGroup, ShmGroup, CudaIpcGroup  # noqa: E402,F401,E501
# Batch admission -- cpkv.scheduling
from cpkv import scheduling  # noqa: E402,F401  (form_batch, AffinityPolicy, BudgetConfig, backup_range)

__all__ = ["__version__", *_error_names]

"""The two-tier cache's bytes, processes and time around the Rust decisions (``crates/tier``).

- :class:`HostSlab`: the node's shared host (L2) region, one per payload, mapped by every rank;
- :class:`CacheController`: one rank's engine-facing cache (lookup, load-back, insert,
  write-through backup, the MIN commit and the digest agreement check); its module docstring
  walks through one forward and says which calls are collective;
- :mod:`cpkv.tier.copy`: the one copy of rows between a pool and the slab (:class:`RowCopy`,
  :class:`SlabCopier`), used by the controller and the engine adapters;
- :class:`RateLimitedLog`: one fallback warning per kind per interval.
"""

from cpkv.tier.controller import CacheController, LoadHandle
from cpkv.tier.copy import RowCopy, SlabCopier
from cpkv.tier.slab import HostSlab, SlabSpec
from cpkv.tier.warnings import RateLimitedLog

__all__ = ["CacheController", "HostSlab", "LoadHandle", "RateLimitedLog", "RowCopy", "SlabCopier", "SlabSpec"]

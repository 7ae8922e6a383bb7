"""The durable third tier (L3): one store per node on a local directory, below the host slab.

:class:`L3Store` holds pages leaving the host slab in preallocated data files as self-describing,
checksummed 4 KiB-aligned records, and keeps an index log per rank from which a restart rebuilds
the index without reading page data. Every decision (slot, victim, writer rank, sequence) is made
by :class:`cpkv._cpkv.L3Index` from the replicated call sequence; this package moves the bytes.
"""

from cpkv.tier.l3.store import L3Namespace, L3Store, disk_bytes
from cpkv.tier.l3.tier import L3Found, L3Tier

__all__ = ["L3Found", "L3Namespace", "L3Store", "L3Tier", "disk_bytes"]

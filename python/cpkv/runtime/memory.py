"""The one limit on host memory a cpkv buffer may ask for: this machine's physical memory.

Checked before anything is allocated, so a size that cannot be had is a typed error naming what
asked for it, never an abort or an untyped allocator error after a long zero-fill.
"""

from __future__ import annotations

import os

from cpkv.errors import InvalidArgumentError


def physical_memory_bytes() -> int:
    """Bytes of physical memory on this machine (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 0


def check_host_bytes(num_bytes: int, what: str) -> None:
    """Raises :class:`InvalidArgumentError` naming ``what`` when ``num_bytes`` exceed this machine's
    physical memory (unknown: no limit but the address space)."""
    limit = physical_memory_bytes()
    if limit and num_bytes > limit:
        raise InvalidArgumentError(
            f"{what}: {num_bytes:,} bytes is more than this machine's {limit:,} bytes of memory")

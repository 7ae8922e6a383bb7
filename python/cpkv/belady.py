"""Belady's offline optimum for block-level prefix caching: the ceiling for
``cpkv hitrate``.

Precisely: the cache holds single blocks (512-token pages, one per hash id).
For each request in order, the hit is its longest run of leading cached
blocks; then all of its blocks are admitted and, while the cache is over
capacity, the cached block whose next request is farthest in the future is
dropped (never-again blocks first; ties go to the deeper block, then the
larger id). Because a block's next use is never before its prefix's next use,
this keeps the cache prefix-closed; admitting then dropping a block at once
is a bypass. Block granularity and bypass make it at least as strong as
Belady over the tree's whole leaves, so it is a ceiling for every online
policy there.
"""

from __future__ import annotations

import heapq
from typing import Sequence

NEVER = 1 << 62


def next_uses(requests: Sequence[Sequence[int]]) -> list[list[int]]:
    """For request i and block position j: the next request after i holding that block."""
    seen: dict[int, int] = {}
    out: list[list[int]] = [[] for _ in requests]
    for i in range(len(requests) - 1, -1, -1):
        row = []
        for block in requests[i]:
            row.append(seen.get(block, NEVER))
            seen[block] = i
        out[i] = row
    return out


def belady_hits(requests: Sequence[Sequence[int]], capacity: int) -> tuple[int, int]:
    """(hit blocks, total blocks) of Belady's policy at ``capacity`` blocks."""
    nexts = next_uses(requests)
    cached: dict[int, int] = {}  # block -> its next use (heap entries are lazy)
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, -block)
    hits = total = 0
    for blocks, upcoming in zip(requests, nexts):
        matched = 0
        while matched < len(blocks) and blocks[matched] in cached:
            matched += 1
        hits += matched
        total += len(blocks)
        for depth, (block, nxt) in enumerate(zip(blocks, upcoming)):
            cached[block] = nxt
            heapq.heappush(heap, (-nxt, -depth, -block))
        while len(cached) > capacity:
            nxt, _, block = heapq.heappop(heap)
            if cached.get(-block) == -nxt:
                del cached[-block]
    return hits, total

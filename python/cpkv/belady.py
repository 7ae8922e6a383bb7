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
from typing import Callable, Sequence

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
    # The farthest next use leaves first (never-again blocks before all), then the deeper block.
    return _offline_hits(requests, capacity, lambda request, depth, block, nxt: (-nxt, -depth, -block))


def one_shot_oracle_hits(requests: Sequence[Sequence[int]], capacity: int) -> tuple[int, int]:
    """(hit blocks, total blocks) of LRU told which blocks are never used again: those leave
    first (oldest first), then the least recently used (the deeper block on a tie).

    It knows *whether* each block returns, not *when*: what recognising one-shot content
    (documents, last turns, unique tails) adds to recency alone. It bounds no online policy (one
    that weighs frequency can beat it where content returns often), but where it closes little of
    the lru -> Belady gap, the rest of Belady's lead comes from knowing when blocks return. The
    never-again set holds the descendants of its blocks, so the cache stays prefix-closed.
    """
    return _offline_hits(
        requests, capacity, lambda request, depth, block, nxt: (nxt != NEVER, request, -depth, -block)
    )


def _offline_hits(
    requests: Sequence[Sequence[int]], capacity: int, rank: Callable[[int, int, int, int], tuple]
) -> tuple[int, int]:
    """The block cache both offline policies share: per request, the hit is its longest run of
    leading cached blocks, then all its blocks are admitted (ranked by ``rank(request, depth,
    block, next_use)``) and the lowest-ranked cached block leaves until the cache fits."""
    nexts = next_uses(requests)
    cached: dict[int, tuple] = {}  # block -> its rank (heap entries are lazy)
    heap: list[tuple] = []
    hits = total = 0
    for request, (blocks, upcoming) in enumerate(zip(requests, nexts)):
        matched = 0
        while matched < len(blocks) and blocks[matched] in cached:
            matched += 1
        hits += matched
        total += len(blocks)
        for depth, (block, nxt) in enumerate(zip(blocks, upcoming)):
            key = rank(request, depth, block, nxt)
            cached[block] = key
            heapq.heappush(heap, (key, block))
        while len(cached) > capacity:
            key, block = heapq.heappop(heap)
            if cached.get(block) == key:
                del cached[block]
    return hits, total

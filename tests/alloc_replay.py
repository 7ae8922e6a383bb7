"""Replays one seeded allocator stream in this process and prints its digests as JSON.

Usage: python alloc_replay.py SEED STEPS [EXTRA_AT_STEP]
Beyond the stream's reserves and releases, every 7th placed object is committed
and every 14th split, so commit and split state is covered too. With
EXTRA_AT_STEP, one extra one-page reserve happens at that step: a single
divergent operation that the digests must expose.
"""

from __future__ import annotations

import json
import sys

import cpkv
from cpkv.bench._alloc_stream import DEFAULT_POOLS, make_stream


def run(seed: int, steps: int, extra_at: int | None = None) -> dict:
    alloc = cpkv.PageAllocator(DEFAULT_POOLS)
    stream = make_stream(seed, steps)
    placed = 0
    for index, step in enumerate(stream):
        if index == extra_at:
            alloc.reserve(1 << 63, 1)  # the divergent operation; never released
        for placement in alloc.reserve_many(step.reserves, step.payloads):
            if placement is None:
                continue
            placed += 1
            if placed % 7 == 0:
                alloc.mark_committed(placement.key)
                if placed % 14 == 0 and placement.num_pages > 1:
                    # The halves stay live (the stream only knows the original key).
                    halves = (placement.key | 1 << 62, placement.key | 1 << 61)
                    alloc.split(placement.key, placement.num_pages // 2, *halves)
        alloc.release_many([k for k in step.releases if k in alloc])
    return {
        "digest": alloc.digest(),
        "canonical": alloc.canonical_digest().hex(),
        "objects": len(alloc),
        "stats": alloc.stats(),
    }


if __name__ == "__main__":
    seed, steps = int(sys.argv[1]), int(sys.argv[2])
    extra = int(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(run(seed, steps, extra)))

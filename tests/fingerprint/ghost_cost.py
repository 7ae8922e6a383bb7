"""What ghost costs against lru, the figures issue 36 asks for, measured side by side in one process.

    .venv/bin/python tests/fingerprint/ghost_cost.py cpu       # us per request of cpkv.hitrate.replay, least of 3
    .venv/bin/python tests/fingerprint/ghost_cost.py memory    # RSS growth per live node, 200,002 live nodes
    .venv/bin/python tests/fingerprint/ghost_cost.py snapshot  # snapshot bytes after each replay
    .venv/bin/python tests/fingerprint/ghost_cost.py requests N POLICY  # N requests of seed 0 (for callgrind)

A benchmark, not a test: it prints figures and asserts nothing. ``requests`` replays the first N requests of
the generated workload (seed 0) at 774 blocks, so that two callgrind runs with different N give the
instructions of one request by difference, free of the interpreter's start.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

TRACES = Path(os.environ.get("CPKV_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces"))
POLICIES = ("lru", "ghost")


def workloads() -> list[tuple[str, int, list[tuple[int, ...]]]]:
    from cpkv.traces import load_trace
    from cpkv.workload import generate

    def trace(name: str) -> list[tuple[int, ...]]:
        return [tuple(r.hash_ids) for r in load_trace(TRACES / name)]

    return [
        ("synthetic", 2708, trace("synthetic_trace.jsonl")),
        ("conversation", 8545, trace("conversation_trace.jsonl")),
        ("generated seed 0", 774, [tuple(r.hash_ids) for r in generate(4000, 0)]),
    ]


def cpu() -> None:
    from cpkv.hitrate import replay

    for name, capacity, requests in workloads():
        best = {}
        for _ in range(3):
            for policy in POLICIES:
                start = time.process_time()
                replay(requests, capacity, policy)
                us = (time.process_time() - start) / len(requests) * 1e6
                best[policy] = min(best.get(policy, us), us)
        print(f"{name} at {capacity}: " + ", ".join(f"{p} {best[p]:.2f} us/request" for p in POLICIES)
              + f", ghost/lru {best['ghost'] / best['lru']:.2f}")


def snapshot() -> None:
    from cpkv import PrefixTree
    from cpkv.hitrate import drive

    for name, capacity, requests in workloads():
        sizes = {}
        for policy in POLICIES:
            tree = PrefixTree(1, policy)
            drive(tree, requests, capacity)
            sizes[policy] = len(tree.snapshot())
        print(f"{name} at {capacity}: " + ", ".join(f"{p} {sizes[p]:,} B" for p in POLICIES)
              + f", ghost/lru {sizes['ghost'] / sizes['lru']:.2f}")


def memory_one(policy: str, live: int = 100_000, ops: int = 400_000) -> None:
    """Child process: the tree-memory churn of ``cpkv bench tree-memory`` under ``policy``."""
    import numpy as np

    from cpkv import PrefixTree
    from cpkv.bench.tree_memory import rss_mib

    tree = PrefixTree(page_size=4, policy=policy)
    free = list(range(2 * live + 4))
    base = rss_mib()
    marks = []
    for i in range(ops):
        tokens = np.array([i % 97, 0, 0, 0, i, 1, 2, 3], dtype=np.int64)
        if tree.device_pages + 2 > 2 * live:
            for victim in tree.evict(2):
                free.extend(victim.pages.tolist())
        pages = [free.pop(), free.pop()]
        cached = tree.insert(tokens, pages, namespace=i % 3).cached
        free.extend(pages[:cached])
        if (i + 1) % (ops // 4) == 0:
            marks.append((rss_mib() - base) * 2**20 / len(tree))
    print(f"{policy}: {len(tree):,} live nodes, bytes per live node at each quarter: "
          + ", ".join(f"{b:,.0f}" for b in marks) + f"; policy memory {tree.policy_memory()}")


def memory() -> None:
    import subprocess

    for policy in POLICIES:
        subprocess.run([sys.executable, __file__, "memory-one", policy], check=True)


def requests(n: int, policy: str) -> None:
    from cpkv import PrefixTree
    from cpkv.hitrate import drive
    from cpkv.workload import generate

    tree = PrefixTree(1, policy)
    drive(tree, [tuple(r.hash_ids) for r in generate(4000, 0)][:n], 774)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("cpu", "memory", "snapshot", "memory-one", "requests"):
        sys.exit("usage: ghost_cost.py cpu | memory | snapshot | memory-one POLICY | requests N POLICY")
    what = sys.argv[1]
    if what == "memory-one":
        memory_one(sys.argv[2])
    elif what == "requests":
        requests(int(sys.argv[2]), sys.argv[3])
    else:
        {"cpu": cpu, "memory": memory, "snapshot": snapshot}[what]()

"""What ghost costs against lru, the figures issues 36 and 47 ask for, measured side by side in one process.

    .venv/bin/python tests/fingerprint/ghost_cost.py cpu       # us per request of cpkv.hitrate.replay, least of 3
    .venv/bin/python tests/fingerprint/ghost_cost.py memory    # RSS growth and snapshot per live node, 100,002 and 200,002 live nodes
    .venv/bin/python tests/fingerprint/ghost_cost.py snapshot  # snapshot bytes after each replay
    .venv/bin/python tests/fingerprint/ghost_cost.py requests N POLICY  # N requests of seed 0 (for callgrind)

``ghost-exact`` is ghost with its candidates as full-size replicas fed every request (what ghost was before
sampling, issue 47); at or below the sampling floor (16,384 pages) it decides as ghost does, so the two
larger points of each trace are where the two differ. ``ghost-unsampled`` samples at 2^-20 with a floor of one
page, so its candidates see next to nothing: the part of ghost sampling cannot shrink (its ranking, history and
tree), the floor of what any rate reaches.

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
POLICIES = ("lru", "ghost-exact", "ghost", "ghost-unsampled")


def make_tree(page_size: int, policy: str):
    from cpkv import PrefixTree

    if policy == "ghost-exact":
        return PrefixTree._ghost_sampled(page_size, 0, 0)
    if policy == "ghost-unsampled":  # rate 2^-20, floor 1 page: the candidates see next to nothing
        return PrefixTree._ghost_sampled(page_size, 20, 1)
    return PrefixTree(page_size, policy)


def workloads() -> list[tuple[str, int, list[tuple[int, ...]]]]:
    from cpkv.traces import load_trace
    from cpkv.workload import generate

    def trace(name: str) -> list[tuple[int, ...]]:
        return [tuple(r.hash_ids) for r in load_trace(TRACES / name)]

    synthetic, conversation = trace("synthetic_trace.jsonl"), trace("conversation_trace.jsonl")
    return [
        ("synthetic", 2708, synthetic),
        ("synthetic", 14450, synthetic),
        ("conversation", 8545, conversation),
        ("conversation", 39563, conversation),
        ("generated seed 0", 774, [tuple(r.hash_ids) for r in generate(4000, 0)]),
    ]


def cpu() -> None:
    from cpkv.device_sim import drive

    for name, capacity, requests in workloads():
        best = {}
        for _ in range(3):
            for policy in POLICIES:
                tree = make_tree(1, policy)
                start = time.process_time()
                drive(tree, requests, capacity)
                us = (time.process_time() - start) / len(requests) * 1e6
                best[policy] = min(best.get(policy, us), us)
        print(f"{name} at {capacity}: " + ", ".join(f"{p} {best[p]:.2f} us/request" for p in POLICIES)
              + "".join(f", {p}/lru {best[p] / best['lru']:.2f}" for p in POLICIES[1:]), flush=True)


def snapshot() -> None:
    from cpkv.device_sim import drive

    for name, capacity, requests in workloads():
        sizes = {}
        for policy in POLICIES:
            tree = make_tree(1, policy)
            drive(tree, requests, capacity)
            sizes[policy] = len(tree.snapshot())
        print(f"{name} at {capacity}: " + ", ".join(f"{p} {sizes[p]:,} B" for p in POLICIES)
              + "".join(f", {p}/lru {sizes[p] / sizes['lru']:.2f}" for p in POLICIES[1:]), flush=True)


def memory_one(policy: str, live: int, ops: int) -> None:
    """Child process: the tree-memory churn of ``cpkv bench tree-memory`` under ``policy``."""
    import numpy as np

    from cpkv.bench.tree_memory import rss_mib

    tree = make_tree(4, policy)
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
    snapshot = len(tree.snapshot())  # after the last mark: its buffer is not in the RSS figures
    print(f"{policy}: {len(tree):,} live nodes, bytes per live node at each quarter: "
          + ", ".join(f"{b:,.0f}" for b in marks) + f"; snapshot {snapshot / len(tree):,.0f} B per live node"
          + f"; policy memory {tree.policy_memory()}", flush=True)


def memory() -> None:
    import subprocess

    # 1,200,000 operations: the history (4x the most pages held) is full by the last quarter at both sizes.
    for live in (50_000, 100_000):
        for policy in POLICIES:
            subprocess.run([sys.executable, __file__, "memory-one", policy, str(live), "1200000"], check=True)


def requests(n: int, policy: str) -> None:
    from cpkv.device_sim import drive
    from cpkv.workload import generate

    tree = make_tree(1, policy)
    drive(tree, [tuple(r.hash_ids) for r in generate(4000, 0)][:n], 774)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("cpu", "memory", "snapshot", "memory-one", "requests"):
        sys.exit("usage: ghost_cost.py cpu | memory | snapshot | memory-one POLICY LIVE OPS | requests N POLICY")
    what = sys.argv[1]
    if what == "memory-one":
        memory_one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif what == "requests":
        requests(int(sys.argv[2]), sys.argv[3])
    else:
        {"cpu": cpu, "memory": memory, "snapshot": snapshot}[what]()

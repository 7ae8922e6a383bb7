"""``cpkv bench tree-memory``: RSS of a PrefixTree under insert + evict churn at a fixed live size.

A server's tree sees millions of inserts and evictions while its live size stays
put; its memory must follow the live contents, not the history. Each operation
inserts one new two-page prefix (under one of 97 shared stems, so paths split and
merge, in one of three namespaces) and evicts two pages once the tree is full.
RSS is read from /proc/self/statm after a warm-up (a tenth of the run, at most
100k operations) and at the end; the growth between them is the figure.
"""

from __future__ import annotations

import argparse
import os
import time


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path

    parser.add_argument("--ops", type=integer(1), default=10_000_000, help="insert+evict operations (default 10M)")
    parser.add_argument("--live", type=integer(1, 10_000_000), default=1000,
                        help="live prefixes kept in the tree (default 1000)")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the table as JSON")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def churn(ops: int, live: int) -> dict:
    """Runs the churn in this process; returns RSS marks (MiB) and the tree's sizes."""
    import numpy as np

    import cpkv

    tree = cpkv.PrefixTree(page_size=4, policy="lru", event_limit=1024)
    free = list(range(2 * live + 4))
    marks: dict[str, float] = {}
    warm = max(1, min(ops // 10, 100_000))
    start = time.perf_counter()
    for i in range(ops):
        tokens = np.array([i % 97, 0, 0, 0, i, 1, 2, 3], dtype=np.int64)
        if tree.device_pages + 2 > 2 * live:
            for victim in tree.evict(2):
                free.extend(victim.pages.tolist())
        pages = [free.pop(), free.pop()]
        cached = tree.insert(tokens, pages, namespace=i % 3).cached
        free.extend(pages[:cached])  # already cached: the tree did not adopt these
        if i + 1 == warm:
            marks["rss_warm_mib"] = rss_mib()
    seconds = time.perf_counter() - start
    marks["rss_end_mib"] = rss_mib()
    tree.check_invariants()
    return {**marks, "nodes": len(tree), "node_slots": tree.node_slots, "ops": ops, "seconds": seconds}


def run(args: argparse.Namespace) -> int:
    from cpkv._report import Table, emit

    r = churn(args.ops, args.live)
    table = Table(f"PrefixTree insert+evict churn: {args.ops:,} operations, {args.live:,} live prefixes "
                  "(RSS after warm-up and at the end)",
                  ["operations", "live nodes", "node slots", "RSS warm MiB", "RSS end MiB", "growth MiB", "ops/s"])
    table.add(r["ops"], r["nodes"], r["node_slots"], r["rss_warm_mib"], r["rss_end_mib"],
              r["rss_end_mib"] - r["rss_warm_mib"], r["ops"] / r["seconds"])
    emit("bench tree-memory", [table], args.json, **r)
    return 0

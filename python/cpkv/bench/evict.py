"""``cpkv bench evict``: one victim from a 41k-leaf tree, cpkv against a heap
rebuilt over all leaves per call.

The baseline is the upstream approach: on every eviction call, collect every
evictable leaf, build a heap keyed by (last access, id) and pop the victim
(here in Python with ``heapq``, over the same leaves and keys). cpkv keeps an
ordered index updated per access, so a victim is one O(log n) step. Both run
in this process, on the same leaf set, one victim per call.
"""

from __future__ import annotations

import argparse
import heapq
import time

from cpkv.errors import InvalidArgumentError


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path

    parser.add_argument("--leaves", type=integer(1, 10_000_000), default=41_000,
                        help="evictable leaves (default %(default)s)")
    parser.add_argument("--page-size", type=integer(1, 4096), default=16, help="tokens per page (default %(default)s)")
    parser.add_argument("--calls", type=integer(1), default=2_000, help="cpkv eviction calls timed (default %(default)s)")
    parser.add_argument(
        "--baseline-calls", type=integer(1), default=40, help="heap-rebuild eviction calls timed (default %(default)s)"
    )
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the table as JSON")


def build_tree(leaves: int, page_size: int):
    """A tree whose ``leaves`` two-page leaves hang under 64 shared one-page
    prefixes, each leaf accessed once in a scrambled order."""
    from cpkv import PrefixTree

    tree = PrefixTree(page_size, "lru")
    next_page = 0
    for i in range(leaves):
        j = (i * 7919) % leaves  # scrambles access order against insertion order
        tokens = [j % 64] * page_size + [1_000 + j] * page_size + [2_000_000 + j] * page_size
        m = tree.match(tokens)
        new = 3 - m.length // page_size
        pages = list(m.device_pages) + list(range(next_page, next_page + new))
        next_page += new
        tree.insert(tokens, pages)
    tree.take_events()
    return tree


def run(args: argparse.Namespace) -> int:
    from cpkv._report import Table, emit

    if args.leaves < args.calls + args.baseline_calls:
        raise InvalidArgumentError(f"--calls {args.calls} plus --baseline-calls {args.baseline_calls} need at least "
                                   f"as many --leaves, got {args.leaves}")
    tree = build_tree(args.leaves, args.page_size)
    leaves = tree.evictable_device
    if leaves < args.calls + args.baseline_calls:
        raise InvalidArgumentError(f"need more leaves ({leaves}) than eviction calls")

    # Baseline state: every evictable leaf with the key upstream would heap on.
    # The eviction order cpkv reports *is* that key order for lru, so rank = key.
    order = tree.eviction_order()
    baseline_leaves = {node: rank for rank, node in enumerate(order)}

    started = time.perf_counter()
    for _ in range(args.baseline_calls):
        heap = [(key, node) for node, key in baseline_leaves.items()]
        heapq.heapify(heap)
        _, victim = heapq.heappop(heap)
        del baseline_leaves[victim]
    baseline_s = (time.perf_counter() - started) / args.baseline_calls

    started = time.perf_counter()
    victims = [tree.evict(1)[0].node for _ in range(args.calls)]
    cpkv_s = (time.perf_counter() - started) / args.calls

    if victims[: args.baseline_calls] != order[: args.baseline_calls]:
        raise SystemExit("cpkv and the baseline disagree on the victims")
    table = Table(
        f"evict one victim from a {leaves:,}-leaf tree (lru; baseline = heapq rebuilt over all leaves per call)",
        ["implementation", "calls", "us per victim", "speedup"],
    )
    table.add("heap rebuilt per call (Python heapq)", args.baseline_calls, baseline_s * 1e6, 1.0)
    table.add("cpkv PrefixTree.evict(1)", args.calls, cpkv_s * 1e6, baseline_s / cpkv_s)
    emit("bench evict", [table], args.json, leaves=leaves, page_size=args.page_size)
    return 0

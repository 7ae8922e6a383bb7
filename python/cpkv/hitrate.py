"""``cpkv hitrate TRACE``: replay a Mooncake trace through ``PrefixTree``.

One hash id is one page (``page_size=1``, the ids are the tokens). Per
request, as an engine does it: ``match`` (the hit is the matched blocks),
``lock`` the matched node, evict just enough device pages that the request's
new blocks fit (``evict`` frees whole leaves, so it may free more), ``insert``
the request (truncated only if even that does not fit, i.e. the rest is
locked), ``unlock``. The block-level prefix hit ratio is matched blocks over
all blocks. Next to the online policies: Belady's offline optimum
(``cpkv.belady``), the ceiling, and how much of the lru -> Belady gap each
policy closes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

DEFAULT_CAPACITIES = (1000, 5859, 10000, 30000)


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv import PrefixTree

    parser.add_argument("trace", nargs="+", help="Mooncake-format JSONL trace(s)")
    parser.add_argument(
        "--capacity",
        default=",".join(map(str, DEFAULT_CAPACITIES)),
        help="device capacities in pages (512-token blocks), comma separated (default %(default)s)",
    )
    parser.add_argument(
        "--policy",
        default=",".join(PrefixTree.POLICIES),
        help="policies to replay, comma separated (default: all: %(default)s)",
    )
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--no-belady", action="store_true", help="skip the offline optimum")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")


def replay(requests: list[tuple[int, ...]], capacity: int, policy: str) -> tuple[int, int]:
    """(hit blocks, total blocks) of ``policy`` at ``capacity`` pages."""
    import numpy as np

    from cpkv import PrefixTree

    tree = PrefixTree(1, policy)
    hits = total = 0
    next_page = 0
    for blocks in requests:
        m = tree.match(blocks)
        hits += m.length
        total += len(blocks)
        tree.lock(m.node)
        new = len(blocks) - m.length
        if new > capacity - tree.device_pages:
            tree.evict(new - (capacity - tree.device_pages))
        keep = m.length + min(new, capacity - tree.device_pages)
        fresh = np.arange(next_page, next_page + keep - m.length, dtype=np.int64)
        next_page += len(fresh)
        tree.insert(blocks[:keep], np.concatenate([m.device_pages, fresh]))
        tree.unlock(m.node)
        tree.take_events()
    return hits, total


def run(args: argparse.Namespace) -> int:
    from cpkv import PrefixTree
    from cpkv._args import output_file, policy_list, positive_int, positive_ints
    from cpkv._report import Table, emit
    from cpkv.belady import belady_hits
    from cpkv.traces import load_trace

    capacities = positive_ints(args.capacity, "--capacity")
    policies = policy_list(args.policy, PrefixTree.POLICIES)
    positive_int(args.limit, "--limit")
    output_file(args.json, "--json")
    # Every trace is read (and checked) before any replay, so a bad last one fails at once.
    loaded = [(path, [r.hash_ids for r in load_trace(path, limit=args.limit)]) for path in args.trace]
    tables = []
    for path, requests in loaded:
        columns = ["capacity", *policies]
        if not args.no_belady:
            columns += ["belady", *(f"{p} gap closed" for p in policies if p != "lru" and "lru" in policies)]
        title = (
            f"{Path(path).name}: block prefix hit ratio, {len(requests):,} requests "
            f"(belady = offline, block-granular, evicts the block used farthest in the future)"
        )
        table = Table(title, columns)
        started = time.perf_counter()
        for capacity in capacities:
            ratios = {}
            for policy in policies:
                hits, total = replay(requests, capacity, policy)
                ratios[policy] = hits / total
            row = [capacity, *(ratios[p] for p in policies)]
            if not args.no_belady:
                hits, total = belady_hits(requests, capacity)
                best = hits / total
                row.append(best)
                if "lru" in policies:
                    gap = best - ratios["lru"]
                    row += [(ratios[p] - ratios["lru"]) / gap if gap > 0 else 0.0 for p in policies if p != "lru"]
            table.add(*row)
        tables.append(table)
        print(f"# {Path(path).name}: replayed in {time.perf_counter() - started:.1f} s")
    emit("hitrate", tables, args.json, capacities=capacities, policies=policies)
    return 0

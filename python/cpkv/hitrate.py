"""``cpkv hitrate TRACE``: replay a Mooncake trace through ``PrefixTree``.

One hash id is one page (``page_size=1``, the ids are the tokens). Per
request, as an engine does it: ``match`` (the hit is the matched blocks),
``lock`` the matched node, evict just enough device pages that the request's
new blocks fit (``evict`` frees whole leaves, so it may free more; ``ghost``
takes only the tail of a victim at least twice what is needed), ``insert``
the request (truncated only if even that does not fit, i.e. the rest is
locked), ``unlock``. The block-level prefix hit ratio is matched blocks over
all blocks. Next to the online policies: Belady's offline optimum
(``cpkv.belady``), the ceiling, and how much of the lru -> Belady gap each
policy closes.

``--grid`` replaces the capacities by a grid per trace: ``GRID_POINTS``
capacities log-spaced from 0.5% to 50% of the trace's distinct blocks. Its
summary gives, per policy, the grid points where it is the best online
policy, the median and worst fraction of the lru -> Belady gap it closes,
and its worst margin against the best classic policy (lru, lfu, fifo, slru,
arc, s3fifo) at any point; the recommended default is ``DEFAULT_POLICY``.
Beside Belady it prints the one-shot oracle (``cpkv.belady.one_shot_oracle_hits``):
LRU told which blocks never return, what recognising one-shot content adds to
recency; where it closes little of the gap, Belady's lead comes from knowing
when blocks return.
``--generate N`` replays N requests of a generated workload
(``cpkv.workload``, ``--mix``, ``--seed``) instead of a trace file.
``--instances N[,N...]`` splits the requests over N instances sharing one cluster tier of
``--cluster-pages`` pages, each with the device tier above and a host tier of ``--host-pages``
(``cpkv.cluster_sim``): hit rates per tier instead of per policy against Belady.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cpkv.device_sim import drive

DEFAULT_CAPACITIES = (1000, 5859, 10000, 30000)
GRID_POINTS = 12
GRID_LOW, GRID_HIGH = 0.005, 0.5
CLASSIC = ("lru", "lfu", "fifo", "slru", "arc", "s3fifo")
DEFAULT_POLICY = "ghost"


def grid_capacities(distinct_blocks: int, points: int = GRID_POINTS) -> list[int]:
    """``points`` capacities log-spaced from 0.5% to 50% of ``distinct_blocks`` (at least 1, no repeats)."""
    ratio = GRID_HIGH / GRID_LOW
    return sorted({max(1, round(distinct_blocks * GRID_LOW * ratio ** (i / (points - 1)))) for i in range(points)})


def gap_closed(ratio: float, lru: float, belady: float) -> float:
    """The fraction of the lru -> Belady gap that a hit ratio closes (0 where there is no gap)."""
    return (ratio - lru) / (belady - lru) if belady > lru else 0.0


def grid_summary(rows: dict[int, dict[str, float]], belady: dict[int, float]) -> dict[str, dict[str, float | int]]:
    """Per policy: grid points won (best online, ties count for each), median and worst gap closed,
    and the worst margin against the best classic policy other than itself (needs lru)."""
    import statistics

    out: dict[str, dict[str, float | int]] = {}
    policies = list(next(iter(rows.values())))
    for policy in policies:
        gaps = [gap_closed(r[policy], r["lru"], belady[c]) for c, r in rows.items()]
        won = sum(1 for r in rows.values() if r[policy] >= max(r.values()))
        margins = [
            (r[policy] - max(r[q] for q in CLASSIC if q in r and q != policy), c)
            for c, r in rows.items()
            if any(q in r and q != policy for q in CLASSIC)
        ]
        worst_margin, at = min(margins) if margins else (0.0, 0)
        out[policy] = {
            "won": won,
            "median_gap_closed": statistics.median(gaps),
            "worst_gap_closed": min(gaps),
            "worst_margin_vs_best_classic": worst_margin,
            "worst_margin_at": at,
        }
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv import PrefixTree
    from cpkv.workload import MIXES

    parser.add_argument("trace", nargs="*", help="Mooncake-format JSONL trace(s)")
    parser.add_argument(
        "--capacity",
        default=None,
        help="device capacities in pages (512-token blocks), comma separated "
        f"(default {','.join(map(str, DEFAULT_CAPACITIES))})",
    )
    parser.add_argument(
        "--grid",
        action="store_true",
        help=f"{GRID_POINTS} capacities per trace, log-spaced from 0.5%% to 50%% of its distinct blocks, "
        "and a summary per policy (instead of --capacity)",
    )
    parser.add_argument("--generate", type=int, metavar="N", help="replay N requests of a generated workload")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated workload (default %(default)s)")
    parser.add_argument("--mix", default="default", help=f"generated workload mix: {', '.join(MIXES)} (default %(default)s)")
    parser.add_argument(
        "--policy",
        default=",".join(PrefixTree.POLICIES),
        help="policies to replay, comma separated (default: all: %(default)s)",
    )
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--no-belady", action="store_true", help="skip the offline optimum")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")
    _configure_instances(parser)


def _configure_instances(parser: argparse.ArgumentParser) -> None:
    from cpkv import MAX_PAGES
    from cpkv._args import integer, integer_list
    from cpkv.cluster_sim import DEFAULT_ROOT_BLOCKS, MAX_INSTANCES, SPLITS

    group = parser.add_argument_group("past one machine (cpkv.cluster_sim)")
    group.add_argument(
        "--instances", type=integer_list(1, MAX_INSTANCES), metavar="N[,N...]",
        help="split the trace over N instances, each with the device tier of --capacity and a host tier of "
        "--host-pages, sharing one cluster tier of --cluster-pages; per-tier hit rates per N",
    )
    group.add_argument("--cluster-pages", type=integer(0, MAX_PAGES), metavar="P",
                       help="pages of the cluster tier all instances share, LRU (default 0: none)")
    group.add_argument("--host-pages", type=integer(0, MAX_PAGES), metavar="H",
                       help="pages of each instance's host tier, write-through, LRU (default 0: none)")
    group.add_argument("--split", choices=SPLITS,
                       help="how requests go to instances: prefix (by prefix root, default) or request (round robin)")
    group.add_argument("--root-blocks", type=integer(1, MAX_PAGES), metavar="K",
                       help=f"blocks that make a prefix root for --split prefix (default {DEFAULT_ROOT_BLOCKS})")


def replay(requests: list[tuple[int, ...]], capacity: int, policy: str) -> tuple[int, int]:
    """(hit blocks, total blocks) of ``policy`` at ``capacity`` pages."""
    from cpkv import PrefixTree

    return drive(PrefixTree(1, policy), requests, capacity)


def run(args: argparse.Namespace) -> int:
    from cpkv import PrefixTree
    from cpkv._args import output_file, policy_list, positive_int, positive_ints
    from cpkv.errors import InvalidArgumentError
    from cpkv.traces import load_trace
    from cpkv.workload import MIXES, generate

    if args.grid and args.capacity is not None:
        raise InvalidArgumentError("--grid and --capacity exclude each other (the grid chooses the capacities)")
    if args.grid and args.no_belady:
        raise InvalidArgumentError("--grid needs Belady (the gap closed is measured against it): drop --no-belady")
    if (args.generate is None) == (not args.trace):
        raise InvalidArgumentError("give trace file(s) or --generate N, not both and not neither")
    _check_instances(args)
    capacities = positive_ints(args.capacity or ",".join(map(str, DEFAULT_CAPACITIES)), "--capacity")
    policies = policy_list(args.policy, PrefixTree.POLICIES)
    positive_int(args.limit, "--limit")
    output_file(args.json, "--json")
    if args.generate is not None:
        positive_int(args.generate, "--generate")
        if args.seed < 0:
            raise InvalidArgumentError(f"--seed must be a non-negative integer, got {args.seed}")
        if args.mix not in MIXES:
            raise InvalidArgumentError(f"--mix: unknown workload mix {args.mix!r} (known: {', '.join(MIXES)})")
        name = f"generated {args.mix} workload (seed {args.seed})"
        loaded = [(name, [r.hash_ids for r in generate(args.generate, args.seed, args.mix)[: args.limit]])]
    else:
        # Every trace is read (and checked) before any replay, so a bad last one fails at once.
        loaded = [(path, [r.hash_ids for r in load_trace(path, limit=args.limit)]) for path in args.trace]
    if args.instances is not None:
        return _run_instances(loaded, capacities, policies, args)
    if args.grid:
        return _run_grid(loaded, policies, args.json)
    return _run_capacities(loaded, capacities, policies, args)


def _check_instances(args: argparse.Namespace) -> None:
    """The cluster simulation's options: each needs --instances, and none goes with --grid."""
    from cpkv.errors import InvalidArgumentError

    given = [name for name, value in (("--cluster-pages", args.cluster_pages), ("--host-pages", args.host_pages),
                                      ("--split", args.split), ("--root-blocks", args.root_blocks))
             if value is not None]
    if args.instances is None and given:
        raise InvalidArgumentError(f"{given[0]} needs --instances (it configures the multi-instance simulation)")
    if args.instances is not None and args.grid:
        raise InvalidArgumentError("--grid and --instances exclude each other (the simulation uses --capacity)")
    if args.root_blocks is not None and args.split == "request":
        raise InvalidArgumentError("--root-blocks applies to --split prefix only (--split request is round robin)")


def _run_instances(loaded, capacities: list[int], policies: list[str], args: argparse.Namespace) -> int:
    from cpkv._report import Table, emit
    from cpkv.cluster_sim import DEFAULT_ROOT_BLOCKS, simulate

    cluster, host = args.cluster_pages or 0, args.host_pages or 0
    split = args.split or "prefix"
    root = args.root_blocks or DEFAULT_ROOT_BLOCKS
    how = f"by prefix root ({root} blocks)" if split == "prefix" else "round robin"
    columns = ["instances", "capacity", "policy", "device", "host", "cluster", "total"]
    if cluster:
        columns.append("total, no cluster")
    tables = []
    for path, requests in loaded:
        name = Path(path).name if Path(path).exists() else path
        table = Table(
            f"{name}: block prefix hit ratio per tier, {len(requests):,} requests split {how}; per instance: "
            f"device = capacity, host {host:,} pages; one cluster tier of {cluster:,} pages (LRU)",
            columns,
        )
        started = time.perf_counter()
        for n in args.instances:
            for capacity in capacities:
                for policy in policies:
                    ratios = simulate(requests, n, capacity, host, cluster, policy, split, root).ratios()
                    row = [n, capacity, policy, *(ratios[t] for t in ("device", "host", "cluster", "total"))]
                    if cluster:
                        row.append(simulate(requests, n, capacity, host, 0, policy, split, root).ratios()["total"])
                    table.add(*row)
        tables.append(table)
        print(f"# {name}: simulated in {time.perf_counter() - started:.1f} s")
    emit("hitrate", tables, args.json, instances=args.instances, capacities=capacities, policies=policies,
         cluster_pages=cluster, host_pages=host, split=split, root_blocks=root)
    return 0


def _run_capacities(loaded, capacities: list[int], policies: list[str], args: argparse.Namespace) -> int:
    from cpkv._report import Table, emit
    from cpkv.belady import belady_hits

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


def grid_rows(
    requests: list[tuple[int, ...]], policies: list[str]
) -> tuple[list[int], dict[int, dict[str, float]], dict[int, float]]:
    """The grid of ``requests``: capacities, hit ratio per capacity and policy, Belady per capacity."""
    from cpkv.belady import belady_hits

    capacities = grid_capacities(len({b for blocks in requests for b in blocks}))
    rows: dict[int, dict[str, float]] = {}
    belady: dict[int, float] = {}
    for capacity in capacities:
        rows[capacity] = {}
        for policy in policies:
            hits, total = replay(requests, capacity, policy)
            rows[capacity][policy] = hits / total
        hits, total = belady_hits(requests, capacity)
        belady[capacity] = hits / total
    return capacities, rows, belady


def _run_grid(loaded, policies: list[str], json_path: str | None) -> int:
    from cpkv._report import Table, emit
    from cpkv.errors import InvalidArgumentError

    if "lru" not in policies:
        raise InvalidArgumentError("--grid measures the gap closed from lru: include lru in --policy")
    import statistics

    from cpkv.belady import one_shot_oracle_hits

    tables = []
    summaries = {}
    for path, requests in loaded:
        started = time.perf_counter()
        capacities, rows, belady = grid_rows(requests, policies)
        oracle_counts = {c: one_shot_oracle_hits(requests, c) for c in capacities}
        oracle = {c: hits / total for c, (hits, total) in oracle_counts.items()}
        name = Path(path).name if Path(path).exists() else path
        table = Table(
            f"{name}: block prefix hit ratio on the grid, {len(requests):,} requests (offline: belady, and "
            f"one-shot oracle = lru told which blocks never return)",
            ["capacity", *policies, "one-shot oracle", "belady"],
        )
        for c in capacities:
            table.add(c, *(f"{rows[c][p]:.4f}" for p in policies), f"{oracle[c]:.4f}", f"{belady[c]:.4f}")
        summary = grid_summary(rows, belady)
        oracle_gaps = [gap_closed(oracle[c], rows[c]["lru"], belady[c]) for c in capacities]
        best_classic = [p for p in CLASSIC if p in policies]
        table_s = Table(
            f"{name}: per policy over {len(capacities)} grid points (gap = lru -> belady; "
            f"margin = worst hit-ratio difference to the best classic policy: {', '.join(best_classic)})",
            ["policy", "points won", "median gap closed", "worst gap closed", "worst margin", "at capacity"],
        )
        for p in policies:
            s = summary[p]
            table_s.add(
                p, s["won"], f"{s['median_gap_closed']:.3f}", f"{s['worst_gap_closed']:.3f}",
                f"{s['worst_margin_vs_best_classic']:+.4f}", s["worst_margin_at"],
            )
        # What recognising one-shot content adds to recency alone (offline: it is told).
        table_s.add("one-shot oracle (offline)", "-", f"{statistics.median(oracle_gaps):.3f}",
                    f"{min(oracle_gaps):.3f}", "-", "-")
        tables += [table, table_s]
        summaries[name] = {"capacities": capacities, "rows": rows, "belady": belady, "one_shot_oracle": oracle,
                           "summary": summary}
        if DEFAULT_POLICY in summary:
            s = summary[DEFAULT_POLICY]
            print(
                f"# {name}: default {DEFAULT_POLICY}: worst margin vs best classic "
                f"{s['worst_margin_vs_best_classic']:+.4f} (capacity {s['worst_margin_at']}), "
                f"median gap closed {s['median_gap_closed']:.3f}; replayed in {time.perf_counter() - started:.1f} s"
            )
    emit("hitrate", tables, json_path, grid=summaries, policies=policies)
    return 0

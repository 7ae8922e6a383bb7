"""``cpkv sweep TRACE``: prefix hit rate over a dense grid of capacities x policies.

A policy tuned at a few cache sizes can lose to plain LRU at the next one,
so policies are compared over a whole curve: by default 12
capacities log-spaced from 0.5% to 50% of the trace's distinct blocks, every
``PrefixTree`` policy, and Belady's offline optimum as the ceiling. The
replay is ``cpkv.hitrate.replay`` and the ceiling ``cpkv.belady.belady_hits``,
so the numbers are the ones ``cpkv hitrate`` prints at the same points. Hit
rates only (one hash id is one page); no KV bytes move.

``--generate N --seed S`` sweeps the synthetic workload of ``cpkv.workload``
instead of a trace file: data no policy was tuned on. ``--out-png`` plots hit
ratio against capacity (log x) per policy with Belady dashed on top;
``--out-csv`` writes ``capacity,policy,hit_ratio`` rows (Belady as policy
``belady``); ``--json`` writes the printed table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Sequence

GRID_POINTS = 12
GRID_LOW, GRID_HIGH = 0.005, 0.5  # fractions of the trace's distinct blocks


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv import PrefixTree
    from cpkv.workload import MIXES

    parser.add_argument("trace", nargs="?", help="Mooncake-format JSONL trace (or use --generate)")
    parser.add_argument("--generate", type=int, metavar="N", help="sweep N requests of the synthetic workload instead")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload (default %(default)s)")
    parser.add_argument(
        "--mix", default="default", help=f"synthetic workload mix: {', '.join(MIXES)} (default %(default)s)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--capacities", metavar="C1,C2,...", help="capacities in pages (512-token blocks)")
    where.add_argument(
        "--grid",
        type=int,
        metavar="K",
        # argparse %-formats help strings, so the percent signs are doubled.
        help=f"K capacities log-spaced from {GRID_LOW * 100:g}%% to {GRID_HIGH * 100:g}%% of the distinct blocks "
        f"(default {GRID_POINTS})",
    )
    parser.add_argument(
        "--policy",
        default=",".join(PrefixTree.POLICIES),
        help="policies, comma separated (default: all: %(default)s)",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests")
    parser.add_argument("--out-png", metavar="PATH", help="plot: hit ratio vs capacity per policy, Belady on top")
    parser.add_argument("--out-csv", metavar="PATH", help="capacity,policy,hit_ratio rows")
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")


def grid(distinct_blocks: int, points: int) -> list[int]:
    """``points`` integer capacities log-spaced over [0.5%, 50%] of ``distinct_blocks``, deduplicated, >= 1."""
    low, high = GRID_LOW * distinct_blocks, GRID_HIGH * distinct_blocks
    raw = [low] if points == 1 else [low * (high / low) ** (i / (points - 1)) for i in range(points)]
    return sorted({max(1, round(c)) for c in raw})


def sweep(
    requests: list[tuple[int, ...]], capacities: Sequence[int], policies: Sequence[str]
) -> list[tuple[int, str, float]]:
    """(capacity, policy, hit ratio) for every point, Belady last per capacity as policy ``belady``."""
    from cpkv.belady import belady_hits
    from cpkv.hitrate import replay

    out = []
    for capacity in capacities:
        for policy in policies:
            hits, total = replay(requests, capacity, policy)
            out.append((capacity, policy, hits / total))
        hits, total = belady_hits(requests, capacity)
        out.append((capacity, "belady", hits / total))
    return out


def write_csv(points: Sequence[tuple[int, str, float]], path: str | Path) -> None:
    """``capacity,policy,hit_ratio`` rows; ``repr`` keeps every float exact."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("capacity,policy,hit_ratio\n")
        for capacity, policy, ratio in points:
            f.write(f"{capacity},{policy},{ratio!r}\n")


def plot(points: Sequence[tuple[int, str, float]], title: str, path: str | Path) -> None:
    """Hit ratio vs capacity (log x), one line per policy, Belady as the dashed ceiling."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    policies = list(dict.fromkeys(p for _, p, _ in points))
    markers = "osD^v<>ph*"
    for i, policy in enumerate(policies):
        xs = [c for c, p, _ in points if p == policy]
        ys = [r for _, p, r in points if p == policy]
        if policy == "belady":
            ax.plot(xs, ys, "k--", linewidth=2, label="belady (offline optimum)", zorder=3)
        else:
            # Policies often coincide (lru/fifo on chat traces): hollow markers of shrinking
            # size keep every one of them visible where the lines overlap.
            ax.plot(xs, ys, marker=markers[i % len(markers)], markersize=max(3.0, 9.0 - 1.5 * i),
                    markerfacecolor="none", linewidth=1.2, alpha=0.9, label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("capacity (512-token blocks)")
    ax.set_ylabel("block prefix hit ratio")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


def run(args: argparse.Namespace) -> int:
    from cpkv import PrefixTree
    from cpkv._args import output_file, policy_list, positive_int, positive_ints
    from cpkv._report import Table, emit
    from cpkv.errors import CpkvError, InvalidArgumentError
    from cpkv.workload import MIXES, generate

    # Everything is checked before the first replay: a bad option costs nothing.
    if (args.trace is None) == (args.generate is None):
        raise InvalidArgumentError("give either a TRACE file or --generate N, not both or neither")
    positive_int(args.generate, "--generate")
    if args.generate is not None:
        if args.seed < 0:
            raise InvalidArgumentError(f"--seed must be a non-negative integer, got {args.seed}")
        if args.mix not in MIXES:
            raise InvalidArgumentError(f"--mix: unknown workload mix {args.mix!r} (known: {', '.join(MIXES)})")
    capacities = None
    if args.capacities is not None:
        capacities = list(dict.fromkeys(positive_ints(args.capacities, "--capacities")))  # once each, in order
    points = GRID_POINTS if args.grid is None else args.grid
    positive_int(points, "--grid")
    policies = policy_list(args.policy, PrefixTree.POLICIES)
    positive_int(args.limit, "--limit")
    for option, path in (("--out-png", args.out_png), ("--out-csv", args.out_csv), ("--json", args.json)):
        output_file(path, option)
    if args.out_png is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise CpkvError(f"--out-png needs matplotlib ({exc}); pip install matplotlib") from exc

    if args.trace is not None:
        from cpkv.traces import load_trace

        requests = [r.hash_ids for r in load_trace(args.trace, limit=args.limit)]
        source = Path(args.trace).name
    else:
        requests = [r.hash_ids for r in generate(args.generate, args.seed, args.mix)][: args.limit]
        source = f"generated {args.mix} workload (seed {args.seed})"
    distinct = len({h for blocks in requests for h in blocks})
    if capacities is None:
        capacities = grid(distinct, points)

    started = time.perf_counter()
    results = sweep(requests, capacities, policies)
    elapsed = time.perf_counter() - started

    names = [*policies, "belady"]
    by_point = {(c, p): r for c, p, r in results}
    table = Table(
        f"{source}: block prefix hit ratio, {len(requests):,} requests, {distinct:,} distinct blocks "
        f"(belady = offline optimum)",
        ["capacity", "% distinct", *names],
    )
    for c in capacities:
        table.add(c, 100.0 * c / distinct, *(by_point[c, p] for p in names))
    print(f"# {source}: {len(capacities)} capacities x {len(names)} policies in {elapsed:.1f} s")
    emit("sweep", [table], args.json, source=source, capacities=capacities, policies=names)
    if args.out_csv is not None:
        write_csv(results, args.out_csv)
        print(f"wrote {args.out_csv}")
    if args.out_png is not None:
        title = f"{source}: {len(requests):,} requests, {distinct:,} distinct blocks"
        plot(results, title, args.out_png)
        print(f"wrote {args.out_png}")
    return 0


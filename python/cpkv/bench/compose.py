"""``cpkv bench compose``: the staged single-gather compose against the dense all-reduce compose.

cp real processes (gloo + /dev/shm, one torch thread each) compose the same
batch layer after layer both ways, in the same launch, on the same pools:

- staged: write this rank's current rows into its staging, one barrier, one
  gather through the 2 * cp source table;
- all-reduce: zero the dense buffer, write the slots this rank owns, all-reduce
  (uint8 SUM) the whole buffer.

Time per layer is the slowest rank's (the step waits for it). Barriers and
collectives per layer are counted from what the group actually issued. Bytes
per rank: staged = rows read from other ranks' pools/stagings + rows staged;
all-reduce = 2 (cp - 1) / cp of the dense buffer sent and as much received
(ring all-reduce volume).

Then the gather alone, in this process on one thread: both CPU strategies
(strided copy runs; one indexed copy per source) over 2 * cp separate sources
against one contiguous copy of the same bytes (the memory bound; target >=
70%), on the default batch and on a small-page batch where runs are short.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, integer_list, output_path

    parser.add_argument("--cp", type=integer_list(1, 16), default="2,4,8", help="cp sizes to run (default %(default)s)")
    parser.add_argument("--requests", type=integer(1), default=8, help="requests per batch (default %(default)s)")
    parser.add_argument("--prefix-pages", type=integer(0), default=48, help="cached pages per request (default %(default)s)")
    parser.add_argument("--current-pages", type=integer(0), default=4, help="new pages per request (default %(default)s)")
    parser.add_argument("--page-bytes", type=integer(1), default=32768, help="bytes per page and layer (default %(default)s)")
    parser.add_argument("--layers", type=integer(1), default=40, help="timed layers per path (default %(default)s)")
    parser.add_argument("--gather-reps", type=integer(1), default=20, help="timed gathers per cp (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the tables as JSON")


def _rank_worker(rank: int, cp: int, args: dict) -> dict:
    import torch

    from cpkv.compose import ComposePlan, ShmGroup
    from cpkv.compose.workload import uniform_batch

    batch = uniform_batch(cp, args["requests"], args["prefix_pages"], args["current_pages"])
    plan = ComposePlan(cp, 64, batch.requests, batch.num_slots, pool_rows=batch.pool_rows)
    row_bytes = args["page_bytes"]
    with ShmGroup(timeout_s=120) as group:
        pool = group.register_pool("kv", batch.pool_rows, (row_bytes,), torch.uint8, batch.max_current_pages)
        pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(rank)))
        current = torch.randint(0, 256, (plan.num_current(rank), row_bytes), dtype=torch.uint8)
        out = torch.empty(plan.num_slots, row_bytes, dtype=torch.uint8)
        group.barrier("pool fill")
        result: dict[str, Any] = {}
        for name, compose in (("staged", group.compose), ("allreduce", group.compose_allreduce)):
            for layer in range(2):  # warm-up: first touch of every mapped page
                compose(plan, "kv", current, layer=layer, out=out)
            group.barrier("timing start")
            before = (group.stats.barriers, group.stats.collectives, group.stats.barrier_s)
            started = time.perf_counter()
            for layer in range(args["layers"]):
                compose(plan, "kv", current, layer=layer, out=out)
            elapsed = time.perf_counter() - started
            result[name] = {
                "s_per_layer": elapsed / args["layers"],
                "barriers": (group.stats.barriers - before[0]) / args["layers"],
                "collectives": (group.stats.collectives - before[1]) / args["layers"],
                "barrier_s": (group.stats.barrier_s - before[2]) / args["layers"],
            }
        staged_bytes = (plan.remote_slots(rank) + plan.num_current(rank)) * row_bytes
        result["staged"]["bytes"] = staged_bytes
        result["allreduce"]["bytes"] = int(2 * (cp - 1) / cp * plan.num_slots * row_bytes)
        result["dense_bytes"] = plan.num_slots * row_bytes
    return result


def _gather_vs_copy(cp: int, requests: int, prefix: int, current: int, row_bytes: int, reps: int) -> dict:
    """Seconds per gather (both CPU strategies) and per contiguous copy of the same bytes, one thread."""
    import torch

    from cpkv.compose import ComposePlan
    from cpkv.compose.workload import uniform_batch
    from cpkv.kernels.gather import gather_indexed, gather_runs, prefer_runs

    batch = uniform_batch(cp, requests, prefix, current)
    plan = ComposePlan(cp, 64, batch.requests, batch.num_slots)
    sources = [torch.randint(0, 256, (batch.pool_rows, row_bytes), dtype=torch.uint8) for _ in range(cp)]
    sources += [torch.randint(0, 256, (plan.staging_rows(r), row_bytes), dtype=torch.uint8) for r in range(cp)]
    runs = plan.copy_runs(0).tolist()
    groups = plan.index_groups(0)
    out = torch.empty(plan.num_slots, row_bytes, dtype=torch.uint8)
    flat = torch.randint(0, 256, (plan.num_slots, row_bytes), dtype=torch.uint8)

    def median(fn: Any) -> float:
        fn()
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return sorted(times)[len(times) // 2]  # robust to the other processes on the machine

    return {
        "runs": len(runs),
        "bytes": plan.num_slots * row_bytes,
        "runs_s": median(lambda: gather_runs(out, sources, runs)),
        "indexed_s": median(lambda: gather_indexed(out, sources, groups)),
        "copy_s": median(lambda: out.copy_(flat)),
        "chosen": "runs" if prefer_runs(len(runs), plan.num_slots, row_bytes) else "indexed",
    }


def _plan_costs(cp: int, requests: int, prefix: int, current: int) -> tuple[float, float, float, int]:
    """Seconds to build a plan, to derive one rank's descriptors/runs/index groups, and per cache hit."""
    from cpkv.compose import ComposePlan, PlanCache
    from cpkv.compose.workload import uniform_batch

    batch = uniform_batch(cp, requests, prefix, current)
    started = time.perf_counter()
    plan = ComposePlan(cp, 64, batch.requests, batch.num_slots)
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    plan.copy_runs(0)
    plan.index_groups(0)
    views_s = time.perf_counter() - started
    cache = PlanCache()
    cache.get(cp, 64, batch.requests, batch.num_slots)
    started = time.perf_counter()
    for _ in range(100):
        cache.get(cp, 64, batch.requests, batch.num_slots)
    return build_s, views_s, (time.perf_counter() - started) / 100, batch.num_slots


def run(args: argparse.Namespace) -> int:
    import torch

    from cpkv._report import Table, emit
    from cpkv.compose.launch import run_ranks

    cps = args.cp
    params = {k: getattr(args, k) for k in ("requests", "prefix_pages", "current_pages", "page_bytes", "layers")}
    slots = args.requests * (args.prefix_pages + args.current_pages)
    compose = Table(
        f"compose per layer, CPU processes (gloo + /dev/shm): {args.requests} requests x "
        f"({args.prefix_pages} prefix + {args.current_pages} current) pages = {slots} slots of {args.page_bytes:,} B",
        ["cp", "path", "ms/layer (slowest rank)", "MB moved/rank", "barriers/layer", "collectives/layer",
         "barrier wait ms/layer (max rank)", "speedup vs all-reduce"],
    )
    for cp in cps:
        results = run_ranks(_rank_worker, cp, params, timeout_s=600, collective_timeout_s=120)
        slowest = {p: max(r[p]["s_per_layer"] for r in results) for p in ("staged", "allreduce")}
        for path in ("allreduce", "staged"):
            r0 = results[0][path]
            compose.add(cp, "all-reduce (baseline)" if path == "allreduce" else "staged single gather",
                        slowest[path] * 1e3, max(r[path]["bytes"] for r in results) / 1e6,
                        r0["barriers"], r0["collectives"], max(r[path]["barrier_s"] for r in results) * 1e3,
                        slowest["allreduce"] / slowest[path])

    torch.set_num_threads(1)
    gather = Table(
        "gather alone, one thread: 2*cp separate sources vs one contiguous copy of the same bytes "
        "(target >= 70%); the compose uses the strategy marked chosen",
        ["cp", "workload", "dense MB", "runs", "KB/run", "runs ms", "indexed ms", "copy ms", "chosen",
         "chosen GB/s", "chosen fraction of copy"],
    )
    workloads = [
        ("default", args.requests, args.prefix_pages, args.current_pages, args.page_bytes),
        ("small pages", 64, 8, 2, 4096),
    ]
    for name, requests, prefix, current, row_bytes in workloads:
        for cp in cps:
            g = _gather_vs_copy(cp, requests, prefix, current, row_bytes, args.gather_reps)
            chosen_s = g[f"{g['chosen']}_s"]
            gather.add(cp, f"{name}: {requests} x ({prefix}+{current}) x {row_bytes // 1024} KB", g["bytes"] / 1e6,
                       g["runs"], g["bytes"] / max(g["runs"], 1) / 1024, g["runs_s"] * 1e3, g["indexed_s"] * 1e3,
                       g["copy_s"] * 1e3, g["chosen"], g["bytes"] / chosen_s / 1e9, g["copy_s"] / chosen_s)
    plans = Table(
        "plan: built once per batch on the CPU (vectorised numpy) and reused by every layer; cache lookups after",
        ["cp", "batch", "slots", "build ms", "per-rank views ms", "cache hit us"],
    )
    for cp in cps:
        for requests, prefix, current in ((args.requests, args.prefix_pages, args.current_pages), (64, 200, 8)):
            build_s, views_s, hit_s, slots_n = _plan_costs(cp, requests, prefix, current)
            plans.add(cp, f"{requests} x ({prefix}+{current})", slots_n, build_s * 1e3, views_s * 1e3, hit_s * 1e6)
    emit("bench compose", [compose, gather, plans], args.json, **params, cp=cps)
    return 0

"""``cpkv bench compose``: the staged single-gather compose against the dense all-reduce compose.

cp real processes (gloo + /dev/shm, one torch thread each) compose the same
batch layer after layer both ways, in the same launch, on the same pools:

- staged: write this rank's current rows into its staging, one barrier, one
  gather through the 2 * cp source table;
- all-reduce over gloo: zero the dense buffer, write the slots this rank owns,
  all-reduce (uint8 SUM) the whole buffer over gloo's TCP transport;
- all-reduce over shared memory (the same transport as the staged path, so the
  design is compared on one transport): write the owned slots into a zeroed
  contribution in /dev/shm, barrier, each rank sums its 1/cp chunk of every
  rank's contribution (a reduce-scatter), barrier, each rank copies every
  chunk (an all-gather); double-buffered, two barriers per layer.

Time per layer is the slowest rank's (the step waits for it). Barriers and
collectives per layer are counted from what the group actually issued. Bytes
per rank: staged = rows read from other ranks' pools/stagings + rows staged;
all-reduce = 2 (cp - 1) / cp of the dense buffer sent and as much received
(ring all-reduce volume).

Then the gather alone, in this process on one thread: the native copy (what
the compose runs on CPU) and the two numpy strategies it replaced (strided copy
runs; one indexed copy per source), over 2 * cp separate sources, against one
contiguous copy of the same bytes (the memory bound; target >= 0.9), at 4 KB
and 32 KB pages, with a dense buffer of 2 MB (in cache: sources + dense fit a
32 MB last-level cache) and of 256 MB (out of cache: 8x that cache).
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def add_batch_arguments(parser: argparse.ArgumentParser, *, cp: str, requests: int, prefix_pages: int,
                        current_pages: int, page_bytes: int, layers: int) -> None:
    """The batch shape both compose benches take (CPU and GPU), with each bench's defaults."""
    from cpkv._args import integer, integer_list

    parser.add_argument("--cp", type=integer_list(1, 16), default=cp, help="cp sizes to run (default %(default)s)")
    parser.add_argument("--requests", type=integer(1), default=requests, help="requests per batch (default %(default)s)")
    parser.add_argument("--prefix-pages", type=integer(0), default=prefix_pages,
                        help="cached pages per request (default %(default)s)")
    parser.add_argument("--current-pages", type=integer(0), default=current_pages,
                        help="new pages per request (default %(default)s)")
    parser.add_argument("--page-bytes", type=integer(1), default=page_bytes,
                        help="bytes per page and layer (default %(default)s)")
    parser.add_argument("--layers", type=integer(1), default=layers, help="timed layers per path (default %(default)s)")


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path

    add_batch_arguments(parser, cp="2,4,8", requests=8, prefix_pages=48, current_pages=4, page_bytes=32768,
                        layers=40)
    parser.add_argument("--gather-reps", type=integer(1), default=400,
                        help="timed rounds per in-cache gather row, best kept (default %(default)s: a 50 us copy needs "
                             "hundreds to settle)")
    parser.add_argument("--out-of-cache-reps", type=integer(1), default=15,
                        help="timed rounds per out-of-cache gather row, best kept (default %(default)s: memory "
                             "bandwidth shared with other processes can slow a 20 ms gather about 2x)")
    parser.add_argument("--out-of-cache-mb", type=integer(0), default=256,
                        help="dense MB of the out-of-cache gather rows (default %(default)s; 0 skips them)")
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
        shm_reduce = _ShmReduce(group, plan, row_bytes)
        paths = (("staged", group.compose), ("allreduce", group.compose_allreduce), ("shm_reduce", shm_reduce))
        for name, compose in paths:
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
        # The baselines compose the same bytes as the staged path (checked, not assumed).
        want = group.compose(plan, "kv", current, layer=0, out=torch.empty_like(out)).clone()
        for name, compose in paths[1:]:
            if not torch.equal(compose(plan, "kv", current, layer=0, out=out), want):
                raise RuntimeError(f"rank {rank}: the {name} baseline composed different bytes")
        staged_bytes = (plan.remote_slots(rank) + plan.num_current(rank)) * row_bytes
        result["staged"]["bytes"] = staged_bytes
        result["allreduce"]["bytes"] = int(2 * (cp - 1) / cp * plan.num_slots * row_bytes)
        # Contribution written, cp chunks of 1/cp read and one written, every chunk read back.
        result["shm_reduce"]["bytes"] = int((3 + 1 / cp) * plan.num_slots * row_bytes)
        result["dense_bytes"] = plan.num_slots * row_bytes
        shm_reduce.close()
    return result


class _ShmReduce:
    """The dense all-reduce baseline over /dev/shm (reduce-scatter then all-gather), so it runs
    on the staged path's transport; byte-exact like the gloo all-reduce (one contributor per slot).

    Each rank's segment holds, per parity, its contribution and its reduced chunk; names are
    unlinked as soon as every rank has mapped them."""

    def __init__(self, group: Any, plan: Any, row_bytes: int) -> None:
        from cpkv.runtime.segment import SharedSegment

        self.group, self.plan, self.rank, cp = group, plan, group.rank, group.cp_size
        self.dense_bytes = plan.num_slots * row_bytes
        self.row_bytes, self.layer = row_bytes, 0
        names = [f"cpkv-{group.run_id}-reduce-r{r}" for r in range(cp)]
        own = SharedSegment(names[self.rank], 4 * self.dense_bytes, create=True)
        group.barrier("reduce segments")
        self.segments = [own if r == self.rank else SharedSegment(names[r], 4 * self.dense_bytes, create=False)
                         for r in range(cp)]
        group.barrier("reduce segments")
        own.unlink()
        rows = plan.num_slots
        views = [s.tensor.view(4, rows, row_bytes) for s in self.segments]
        self.contribution = [[v[parity] for v in views] for parity in (0, 1)]
        self.reduced = [[v[2 + parity] for v in views] for parity in (0, 1)]
        bounds = [rows * r // cp for r in range(cp + 1)]
        self.chunks = list(zip(bounds, bounds[1:]))

    def __call__(self, plan: Any, payload: str, current: Any, *, layer: int = 0, out: Any = None) -> Any:
        from cpkv.compose.groups.base import check_current_rows, check_pool
        from cpkv.kernels.gather import gather_runs

        group, rank, parity = self.group, self.rank, self.layer % 2
        self.layer += 1
        pool = check_pool(plan, rank, group.pool(payload), payload)
        rows = check_current_rows(plan, rank, current, self.row_bytes, plan.staging_rows(rank))
        mine = self.contribution[parity][rank].zero_()
        gather_runs(mine, [pool, rows], plan.owned_runs(rank))
        group.barrier("shm reduce: contributions", layer=layer)
        lo, hi = self.chunks[rank]
        reduced = self.reduced[parity][rank][lo:hi]
        reduced.copy_(self.contribution[parity][0][lo:hi])
        for r in range(1, group.cp_size):
            reduced.add_(self.contribution[parity][r][lo:hi])  # uint8: exact, one contributor per slot
        group.barrier("shm reduce: chunks", layer=layer)
        for r, (lo, hi) in enumerate(self.chunks):
            out[lo:hi].copy_(self.reduced[parity][r][lo:hi])
        group.stats.composes += 1
        return out

    def close(self) -> None:
        self.contribution = self.reduced = []
        for segment in self.segments:
            segment.close()


def _gather_vs_copy(cp: int, requests: int, prefix: int, current: int, row_bytes: int, reps: int) -> dict:
    """Seconds per gather (native as the compose runs it, and with each kind of stores forced; the
    numpy runs and indexed strategies) and per contiguous copy of the same bytes (``Tensor.copy_``
    and ``np.copyto``, a glibc memcpy), one thread, best of ``reps`` interleaved rounds."""
    import numpy as np
    import torch

    from cpkv._cpkv import RowSources, copy_rows, streaming_threshold
    from cpkv.compose import ComposePlan
    from cpkv.compose.workload import uniform_batch
    from cpkv.kernels.gather import as_run_table, gather_indexed, gather_runs, gather_runs_numpy

    batch = uniform_batch(cp, requests, prefix, current)
    plan = ComposePlan(cp, 64, batch.requests, batch.num_slots)
    sources = [torch.randint(0, 256, (batch.pool_rows, row_bytes), dtype=torch.uint8) for _ in range(cp)]
    sources += [torch.randint(0, 256, (plan.staging_rows(r), row_bytes), dtype=torch.uint8) for r in range(cp)]
    table = RowSources(sources)  # as ShmGroup holds its mapped sources
    runs = plan.copy_runs(0)
    out = torch.empty(plan.num_slots, row_bytes, dtype=torch.uint8)
    flat = torch.randint(0, 256, (plan.num_slots, row_bytes), dtype=torch.uint8)

    groups = plan.index_groups(0)
    out_rows, flat_rows, run_table = out.numpy(), flat.numpy(), as_run_table(runs)
    paths = {
        # As ShmGroup.compose runs it: into the numpy array its fresh dense tensor shares.
        "native_s": lambda: gather_runs(out_rows, table, runs),
        "cached_s": lambda: copy_rows(out_rows, table, run_table, "cached"),
        "streaming_s": lambda: copy_rows(out_rows, table, run_table, "streaming"),
        "copy_s": lambda: out.copy_(flat),
        "memcpy_s": lambda: np.copyto(out_rows, flat_rows),
        "runs_s": lambda: gather_runs_numpy(out, sources, runs),
        "indexed_s": lambda: gather_indexed(out, sources, groups),
    }
    gather_runs(out, table, runs)
    native = out.clone()
    gather_runs_numpy(out, sources, runs)
    if not torch.equal(out, native):
        raise RuntimeError("the native gather and the numpy runs gather disagree")
    # Interleaved repetitions, best of each: every path sees the same machine (the other
    # processes on it only ever add time). Each timed call follows an untimed one of the same
    # path, so none inherits the cache state another path left (streaming stores evict `out`).
    best = {name: float("inf") for name in paths}
    for _ in range(reps):
        for name, fn in paths.items():
            fn()
            started = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - started)
    moved = int(run_table[:, 2].sum()) * row_bytes
    return {"runs": len(runs), "bytes": plan.num_slots * row_bytes,
            "chosen": "streaming" if moved >= streaming_threshold() else "cached", **best}


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
    from cpkv.runtime.launch import run_ranks

    cps = args.cp
    params = {k: getattr(args, k) for k in ("requests", "prefix_pages", "current_pages", "page_bytes", "layers")}
    slots = args.requests * (args.prefix_pages + args.current_pages)
    compose = Table(
        f"compose per layer, CPU processes (gloo + /dev/shm): {args.requests} requests x "
        f"({args.prefix_pages} prefix + {args.current_pages} current) pages = {slots} slots of {args.page_bytes:,} B",
        ["cp", "path", "ms/layer (slowest rank)", "MB moved/rank", "barriers/layer", "collectives/layer",
         "barrier wait ms/layer (max rank)", "speedup vs gloo all-reduce", "speedup vs shm all-reduce"],
    )
    labels = {"allreduce": "all-reduce over gloo TCP (baseline)",
              "shm_reduce": "all-reduce over /dev/shm (baseline, same transport)",
              "staged": "staged single gather (/dev/shm)"}
    for cp in cps:
        results = run_ranks(_rank_worker, cp, params, timeout_s=600, collective_timeout_s=120)
        slowest = {p: max(r[p]["s_per_layer"] for r in results) for p in labels}
        for path in ("allreduce", "shm_reduce", "staged"):
            r0 = results[0][path]
            compose.add(cp, labels[path], slowest[path] * 1e3, max(r[path]["bytes"] for r in results) / 1e6,
                        r0["barriers"], r0["collectives"], max(r[path]["barrier_s"] for r in results) * 1e3,
                        slowest["allreduce"] / slowest[path], slowest["shm_reduce"] / slowest[path])

    torch.set_num_threads(1)
    gather = Table(
        "gather alone, one thread: 2*cp separate sources vs one contiguous copy of the same bytes, the faster "
        "of Tensor.copy_ and numpy's memcpy (target: native >= 0.9 of it); the compose runs the native copy on CPU, which picks "
        "streaming stores from 3/4 of the last-level cache up (both kinds timed beside it)",
        ["cp", "data", "workload", "dense MB", "runs", "KB/run", "native ms", "native stores", "cached stores ms",
         "streaming stores ms", "picked the faster", "numpy runs ms", "numpy indexed ms", "Tensor.copy_ ms",
         "memcpy ms", "native fraction of the faster copy", "fastest"],
    )
    workloads = [  # (data, requests, prefix pages, current pages, page bytes): 2 MB and N MB dense buffers
        ("in cache", 8, 60, 4, 4096),
        ("in cache", 4, 14, 2, 32768),
    ]
    if args.out_of_cache_mb:
        slots_4k, slots_32k = args.out_of_cache_mb * 256, args.out_of_cache_mb * 32
        workloads += [("out of cache", max(1, slots_4k // 256), 248, 8, 4096),
                      ("out of cache", max(1, slots_32k // 128), 120, 8, 32768)]
    fractions = []
    for data, requests, prefix, current, row_bytes in workloads:
        big = data == "out of cache"
        for cp in cps:
            reps = args.out_of_cache_reps if big else args.gather_reps
            g = _gather_vs_copy(cp, requests, prefix, current, row_bytes, reps)
            times = {"native": g["native_s"], "numpy runs": g["runs_s"], "numpy indexed": g["indexed_s"]}
            fraction = min(g["copy_s"], g["memcpy_s"]) / g["native_s"]
            fractions.append(fraction)
            faster = "cached" if g["cached_s"] <= g["streaming_s"] else "streaming"
            gather.add(cp, data, f"{requests} x ({prefix}+{current}) x {row_bytes // 1024} KB", g["bytes"] / 1e6,
                       g["runs"], g["bytes"] / max(g["runs"], 1) / 1024, g["native_s"] * 1e3, g["chosen"],
                       g["cached_s"] * 1e3, g["streaming_s"] * 1e3, "yes" if g["chosen"] == faster else "no",
                       g["runs_s"] * 1e3, g["indexed_s"] * 1e3, g["copy_s"] * 1e3, g["memcpy_s"] * 1e3, fraction,
                       min(times, key=times.__getitem__))
    plans = Table(
        "plan: built once per batch on the CPU (vectorised numpy) and reused by every layer; cache lookups after",
        ["cp", "batch", "slots", "build ms", "per-rank views ms", "cache hit us"],
    )
    for cp in cps:
        for requests, prefix, current in ((args.requests, args.prefix_pages, args.current_pages), (64, 200, 8)):
            build_s, views_s, hit_s, slots_n = _plan_costs(cp, requests, prefix, current)
            plans.add(cp, f"{requests} x ({prefix}+{current})", slots_n, build_s * 1e3, views_s * 1e3, hit_s * 1e6)
    emit("bench compose", [compose, gather, plans], args.json, **params, cp=cps,
         out_of_cache_mb=args.out_of_cache_mb, gather_fraction_min=min(fractions) if fractions else None)
    return 0

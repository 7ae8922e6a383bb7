"""``cpkv bench compose-gpu`` (or ``python -m cpkv.bench.compose_gpu``): the compose on one GPU.

For machines with a GPU; a few minutes end to end. cp = 1..8 processes share
GPU 0 (NCCL refuses two ranks on one device, so the group's collectives run on
gloo and the barrier synchronises the rank's stream first; the pools and
stagings are shared by CUDA IPC and the gather is the Triton kernel reading
through the 2 * cp address table):

1. staged single gather against the all-reduce compose, per layer (slowest
   rank), with barriers/collectives per layer and bytes per rank, and a
   byte-exactness check of the two paths on every rank;
2. the Triton gather alone against a device-to-device copy of the same bytes
   (about 4.3 TB/s on an H200).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import output_path
    from cpkv.bench.compose import add_batch_arguments

    # cp sizes are processes on GPU 0.
    add_batch_arguments(parser, cp="1,2,4,8", requests=16, prefix_pages=240, current_pages=16, page_bytes=65536,
                        layers=10)
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the tables as JSON")


def _rank_worker(rank: int, cp: int, args: dict) -> dict:
    import torch

    from cpkv.compose import ComposePlan, CudaIpcGroup
    from cpkv.compose.workload import uniform_batch

    torch.cuda.set_device(0)
    batch = uniform_batch(cp, args["requests"], args["prefix_pages"], args["current_pages"])
    plan = ComposePlan(cp, 64, batch.requests, batch.num_slots, pool_rows=batch.pool_rows, device="cuda:0")
    row_bytes = args["page_bytes"]
    group = CudaIpcGroup(timeout_s=300)
    pool = group.register_pool("kv", batch.pool_rows, (row_bytes,), torch.uint8, batch.max_current_pages)
    gen = torch.Generator(device="cuda").manual_seed(rank)
    pool.copy_(torch.randint(0, 256, pool.shape, dtype=torch.uint8, device="cuda", generator=gen))
    current = torch.randint(
        0, 256, (plan.num_current(rank), row_bytes), dtype=torch.uint8, device="cuda", generator=gen
    )
    outs = {name: torch.empty(plan.num_slots, row_bytes, dtype=torch.uint8, device="cuda") for name in ("a", "b")}
    torch.cuda.synchronize()
    group.barrier("pool fill")
    staged = group.compose(plan, "kv", current, out=outs["a"])
    dense = group.compose_allreduce(plan, "kv", current, out=outs["b"])
    exact = bool(torch.equal(staged, dense))
    result: dict[str, Any] = {"exact": exact}
    for name, compose in (("staged", group.compose), ("allreduce", group.compose_allreduce)):
        for layer in range(2):
            compose(plan, "kv", current, layer=layer, out=outs["a"])
        torch.cuda.synchronize()
        group.barrier("timing start")
        before = (group.stats.barriers, group.stats.collectives)
        started = time.perf_counter()
        for layer in range(args["layers"]):
            compose(plan, "kv", current, layer=layer, out=outs["a"])
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        result[name] = {
            "s_per_layer": elapsed / args["layers"],
            "barriers": (group.stats.barriers - before[0]) / args["layers"],
            "collectives": (group.stats.collectives - before[1]) / args["layers"],
        }
    result["staged"]["bytes"] = (plan.remote_slots(rank) + plan.num_current(rank)) * row_bytes
    result["allreduce"]["bytes"] = int(2 * (cp - 1) / cp * plan.num_slots * row_bytes)
    group.close()
    return result


def _timer(device: Any) -> Any:
    """``timed(fn, reps)``: seconds per call, after 3 warm-up calls. CUDA events on a GPU (the calls are
    asynchronous), the wall clock elsewhere (the CPU check of this bench runs the kernel interpreted)."""
    import torch

    def timed(fn: Any, reps: int) -> float:
        for _ in range(3):
            fn()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end) / 1e3 / reps
        started = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - started) / reps

    return timed


def _gather_vs_copy(cp: int, args: argparse.Namespace, device: Any = "cuda", reps: int = 50) -> tuple[float, float, int]:
    """Seconds per Triton gather and per device-to-device copy of the same bytes.

    The gather is checked (every slot against its source row) before anything else writes: the copy
    it is timed against fills a buffer of its own.
    """
    import numpy as np
    import torch

    from cpkv.compose import ComposePlan
    from cpkv.compose.workload import uniform_batch
    from cpkv.kernels.gather import gather_triton

    device = torch.device(device)
    batch = uniform_batch(cp, args.requests, args.prefix_pages, args.current_pages)
    plan = ComposePlan(cp, 64, batch.requests, batch.num_slots)
    rows = args.page_bytes
    gen = torch.Generator(device=device).manual_seed(cp)
    sources = [torch.randint(0, 256, (batch.pool_rows, rows), dtype=torch.uint8, device=device, generator=gen)
               for _ in range(cp)]
    # Staging rows are random too (row 0 is the zero dummy), so a slot read from the wrong row shows.
    for r in range(cp):
        staging = torch.randint(0, 256, (plan.staging_rows(r), rows), dtype=torch.uint8, device=device, generator=gen)
        staging[0].zero_()
        sources.append(staging)
    addresses = [s.data_ptr() for s in sources]
    table = torch.tensor(addresses, dtype=torch.int64, device=device)
    source, row = plan.descriptors(0)
    source_t = torch.from_numpy(source.astype(np.int32)).to(device)
    row_t = torch.from_numpy(row.copy()).to(device)
    out = torch.empty(plan.num_slots, rows, dtype=torch.uint8, device=device)
    copied = torch.empty_like(out)
    flat = torch.randint(0, 256, (plan.num_slots, rows), dtype=torch.uint8, device=device, generator=gen)
    timed = _timer(device)
    gather_s = timed(lambda: gather_triton(out, table, source_t, row_t, addresses=addresses), reps)
    want = torch.stack([sources[int(s)][int(r)] for s, r in zip(source.tolist(), row.tolist())]) \
        if plan.num_slots else out
    differ = (out != want).any(dim=1).nonzero().flatten().tolist()
    if differ:
        raise SystemExit(f"cp {cp}: gathered slot {differ[0]} differs from its source row "
                         f"({len(differ)} of {plan.num_slots} slots differ)")
    copy_s = timed(lambda: copied.copy_(flat), reps)
    return gather_s, copy_s, plan.num_slots


def run(args: argparse.Namespace) -> int:
    import torch

    from cpkv._report import Table, emit
    from cpkv.runtime.launch import run_ranks

    if not torch.cuda.is_available():
        from cpkv.errors import InvalidArgumentError

        raise InvalidArgumentError("bench compose-gpu needs a CUDA GPU; none is available here")
    cps = args.cp
    params = {k: getattr(args, k) for k in ("requests", "prefix_pages", "current_pages", "page_bytes", "layers")}
    slots = args.requests * (args.prefix_pages + args.current_pages)
    compose = Table(
        f"compose per layer on one {torch.cuda.get_device_name(0)} (CUDA IPC + Triton gather; gloo barrier): "
        f"{args.requests} requests x ({args.prefix_pages} prefix + {args.current_pages} current) pages = "
        f"{slots} slots of {args.page_bytes:,} B",
        ["cp", "path", "ms/layer (slowest rank)", "MB moved/rank", "barriers/layer", "collectives/layer",
         "speedup vs all-reduce", "byte-exact"],
    )
    inexact = []
    for cp in cps:
        results = run_ranks(_rank_worker, cp, params, timeout_s=420, collective_timeout_s=300)
        slowest = {p: max(r[p]["s_per_layer"] for r in results) for p in ("staged", "allreduce")}
        exact = all(r["exact"] for r in results)
        if not exact:
            inexact.append(cp)
        for path in ("allreduce", "staged"):
            r0 = results[0][path]
            compose.add(cp, "all-reduce (baseline)" if path == "allreduce" else "staged single gather",
                        slowest[path] * 1e3, max(r[path]["bytes"] for r in results) / 1e6, r0["barriers"],
                        r0["collectives"], slowest["allreduce"] / slowest[path], exact)
    gather = Table(
        "Triton gather (2*cp address table) vs device-to-device copy of the same bytes",
        ["cp", "dense MB", "gather us", "copy us", "gather TB/s", "copy TB/s", "fraction of copy"],
    )
    for cp in cps:
        gather_s, copy_s, num_slots = _gather_vs_copy(cp, args)
        nbytes = num_slots * args.page_bytes
        # A copy reads and writes every byte; so does the gather: both count bytes read + written.
        gather.add(cp, nbytes / 1e6, gather_s * 1e6, copy_s * 1e6, 2 * nbytes / gather_s / 1e12,
                   2 * nbytes / copy_s / 1e12, copy_s / gather_s)
    emit("bench compose-gpu", [compose, gather], args.json, **params, cp=cps)
    if inexact:
        print(f"bench compose-gpu: the staged compose differs from the all-reduce at cp {inexact}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m cpkv.bench.compose_gpu",
                                     description="The compose on one GPU, as cpkv bench compose-gpu runs it.")
    configure(parser)
    sys.exit(run(parser.parse_args()))

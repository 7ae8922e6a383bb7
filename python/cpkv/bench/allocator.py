"""``cpkv bench allocator``: one seeded stream through ``cpkv.PageAllocator`` and
through a fair pure-Python first-fit allocator, in this process.

The stream (``_alloc_stream``) reserves batches of objects of 1..64 pages in
every payload (10% of batches in the first payload only) and releases random
live objects back to a target occupancy, which leaves the pools fragmented
into hundreds to thousands of free extents, the regime first-fit must serve.
cpkv runs it twice: one call per operation, and one ``reserve_many`` plus one
``release_many`` per batch; the reference loops over the same operations
(it has no batch form to amortise). Every run's placements are recorded and
hashed: all three must be identical, or the command fails, so the ratio
compares equal work.
"""

from __future__ import annotations

import argparse
import time


def _pools(text: str) -> dict[str, int]:
    pools = {}
    for item in text.split(","):
        name, _, capacity = item.partition("=")
        pools[name.strip()] = int(capacity)
    return pools


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="stream seed (default %(default)s)")
    parser.add_argument("--steps", type=int, default=600, help="batches in the stream (default %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="reserves per batch (default %(default)s)")
    parser.add_argument(
        "--pools", type=_pools, default="kv=65536,index=65536", help="payload=pages,... (default %(default)s)"
    )
    parser.add_argument(
        "--occupancy", type=float, default=0.9, help="used fraction releases return to (default %(default)s)"
    )
    parser.add_argument("--max-pages", type=int, default=64, help="largest object in pages (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per row; the best counts (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")


def _best(repeat: int, run_once):
    """Runs ``run_once`` ``repeat`` times; returns (best seconds, last result)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run_once()
        best = min(best, time.perf_counter() - started)
    return best, result


def run(args: argparse.Namespace) -> int:
    import cpkv
    from cpkv._report import Table, emit
    from cpkv.bench import _alloc_stream as stream_mod
    from cpkv.bench._reference_allocator import ReferenceAllocator

    pools = args.pools
    names = list(pools)
    stream = stream_mod.make_stream(
        args.seed, args.steps, pools, batch=args.batch, occupancy=args.occupancy, max_pages=args.max_pages
    )
    reserves = sum(len(s.reserves) for s in stream)
    releases = sum(len(s.releases) for s in stream)
    ops = reserves + releases

    rows = {}
    reference = None

    def reference_once():
        nonlocal reference
        reference = ReferenceAllocator(pools)
        return stream_mod.replay_reference(reference, stream)

    allocs = {}

    def cpkv_once(batched: bool):
        def once():
            allocs[batched] = cpkv.PageAllocator(pools)
            return stream_mod.replay(allocs[batched], stream, batched=batched)

        return once

    rows["reference"] = _best(args.repeat, reference_once)
    rows["single"] = _best(args.repeat, cpkv_once(False))
    rows["batched"] = _best(args.repeat, cpkv_once(True))

    # Same placements, op for op, or the comparison is meaningless.
    keys = [key for step in stream for key, _ in step.reserves]
    ref_sum = stream_mod.checksum(stream_mod.reference_record(k, p) for k, p in zip(keys, rows["reference"][1]))
    checksums = {"reference": ref_sum}
    for mode in ("single", "batched"):
        records = (stream_mod.placement_record(k, p, names) for k, p in zip(keys, rows[mode][1]))
        checksums[mode] = stream_mod.checksum(records)
        for name in names:
            if allocs[mode == "batched"].free_extents(name) != reference.free_extents(name):
                print(f"error: cpkv ({mode}) and the reference disagree on the free extents of {name!r}")
                return 1
    if len(set(checksums.values())) != 1:
        print(f"error: placements differ between cpkv and the reference: {checksums}")
        return 1

    ref_seconds = rows["reference"][0]
    speed = Table(
        "bench allocator: one seeded stream, cpkv.PageAllocator vs pure-Python first fit",
        ["calls", "implementation", "ops", "seconds", "ops/s", "speedup"],
    )
    speed.add("single", "reference (Python, bisect + first-fit scan)", ops, ref_seconds, ops / ref_seconds, 1.0)
    speed.add("single", "cpkv reserve/release", ops, rows["single"][0], ops / rows["single"][0],
              ref_seconds / rows["single"][0])
    speed.add("batched", "reference (loop; no batch form)", ops, ref_seconds, ops / ref_seconds, 1.0)
    speed.add("batched", "cpkv reserve_many/release_many", ops, rows["batched"][0], ops / rows["batched"][0],
              ref_seconds / rows["batched"][0])

    alloc = allocs[False]
    stats = alloc.stats()
    workload = Table("workload", ["payload", "capacity", "reserves", "misses", "releases", "used at end", "free extents at end"])
    for name in names:
        p = stats["payloads"][name]
        workload.add(name, pools[name], reserves, stats["misses"], releases, p["used"], p["free_extents"])

    agreement = Table("agreement (every placement, op for op)", ["run", "placements sha256"])
    for run_name, digest in checksums.items():
        agreement.add(run_name, digest[:16])

    emit(
        "bench allocator",
        [speed, workload, agreement],
        args.json,
        seed=args.seed,
        steps=args.steps,
        batch=args.batch,
        occupancy=args.occupancy,
        max_pages=args.max_pages,
        pools=pools,
        repeat=args.repeat,
        placements_checksum=ref_sum,
        speedup_single=ref_seconds / rows["single"][0],
        speedup_batched=ref_seconds / rows["batched"][0],
        targets={"single": 20.0, "batched": 50.0},
        final_digest=alloc.digest(),
    )
    return 0

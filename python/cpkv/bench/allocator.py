"""``cpkv bench allocator``: one seeded stream through ``cpkv.PageAllocator`` and
through a fair pure-Python first-fit allocator, in this process.

The stream (``_alloc_stream``) reserves batches of objects of 1..64 pages in
every payload (10% of batches in the first payload only) and releases random
live objects back to a target occupancy, which leaves the pools fragmented
into hundreds to thousands of free extents, the regime first fit must serve.
Two workloads by default: a serving-sized pool (2 x 65,536 pages; a few hundred
free extents) and a large host pool (2 x 1,048,576 pages, e.g. 64 GiB of
64 KiB pages; thousands of free extents, where a first-fit scan is long).

cpkv runs each stream three times: one call per operation; one
``reserve_many`` (a list of ``Placement``) plus one ``release_many`` per
batch, from the stream's tuples; and the lean batched form, one
``reserve_batch`` plus one ``release_many`` per batch from numpy arrays (as a
batching scheduler holds them, built before timing like the tuples are),
which returns one ``PlacementBatch`` per batch and builds a ``Placement`` only
when one is read. The reference loops over the same operations (it has no
batch form to amortise). Every run's placements are recorded and hashed (the
batches' after timing, read back from the returned batches): all must be
identical, or the command fails, so the ratio compares equal work.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

# The cpkv runs: single calls, reserve_many with tuples, reserve_batch with arrays.
MODES = ("single", "batched", "arrays")

# name -> (pools, steps): steps enough to reach the target occupancy and churn.
WORKLOADS = {
    "pool64k": ({"kv": 65_536, "index": 65_536}, 600),
    "pool1m": ({"kv": 1_048_576, "index": 1_048_576}, 1_500),
}


def _pools(text: str) -> dict[str, int]:
    """``payload=pages,...``: each name given once, each capacity a positive integer."""
    pools = {}
    for item in text.split(","):
        name, eq, capacity = (part.strip() for part in item.partition("="))
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not payload=pages")
        try:
            pages = int(capacity)
        except ValueError:
            pages = 0
        if pages < 1:
            raise argparse.ArgumentTypeError(f"{item.strip()!r}: pages must be a positive integer")
        if name in pools:
            raise argparse.ArgumentTypeError(f"payload {name!r} is given twice")
        pools[name] = pages
    return pools


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, output_path, real

    parser.add_argument(
        "--workload", action="append", choices=sorted(WORKLOADS),
        help="built-in workload(s) to run (default: all)",
    )
    parser.add_argument("--pools", type=_pools, help="a custom workload instead: payload=pages,...")
    parser.add_argument("--steps", type=integer(1), help="batches per stream (default: per workload)")
    parser.add_argument("--seed", type=integer(0), default=0, help="stream seed (default %(default)s)")
    parser.add_argument("--batch", type=integer(1), default=32, help="reserves per batch (default %(default)s)")
    parser.add_argument(
        "--occupancy", type=real(above=0, maximum=1), default=0.9,
        help="used fraction releases return to, in (0, 1] (default %(default)s)"
    )
    parser.add_argument("--max-pages", type=integer(1), default=64, help="largest object in pages (default %(default)s)")
    parser.add_argument("--repeat", type=integer(1), default=5,
                        help="timed runs per row; the best counts (default %(default)s)")
    parser.add_argument(
        "--call-path-live", type=integer(1), nargs="*", default=list(CALL_PATH_LIVE), metavar="N",
        help="live objects for the call-path table (default: %(default)s; none: skip it)",
    )
    parser.add_argument("--json", metavar="PATH", type=output_path, help="also write the tables as JSON")


def _best(repeat: int, runs: dict) -> dict:
    """Runs every ``runs[name]()`` ``repeat`` times, round by round (one run of
    each per round, so a slow phase of the machine costs every implementation
    alike); returns name -> (best seconds, last result).

    The cyclic garbage collector is paused while a run is timed (as ``timeit``
    does), for every implementation alike: its passes over the results kept
    so far would otherwise land on whichever run happens to trigger them."""
    timed = {name: (float("inf"), None) for name in runs}
    for _ in range(repeat):
        for name, run_once in runs.items():
            gc.collect()
            gc.disable()
            try:
                started = time.perf_counter()
                result = run_once()
                elapsed = time.perf_counter() - started
            finally:
                gc.enable()
            timed[name] = (min(timed[name][0], elapsed), result)
    return timed


def _measure(args: argparse.Namespace, pools: dict[str, int], steps: int) -> dict:
    """Times the reference, cpkv single and cpkv batched on one stream and
    checks that all three placed every object identically."""
    import cpkv
    from cpkv.bench import _alloc_stream as stream_mod
    from cpkv.bench._reference_allocator import ReferenceAllocator

    names = list(pools)
    stream = stream_mod.make_stream(
        args.seed, steps, pools, batch=args.batch, occupancy=args.occupancy, max_pages=args.max_pages
    )
    keys = [key for step in stream for key, _ in step.reserves]
    ops = len(keys) + sum(len(s.releases) for s in stream)
    finals: dict[str, Any] = {}

    def reference_once():
        finals["reference"] = ReferenceAllocator(pools)
        return stream_mod.replay(finals["reference"], stream)

    def cpkv_once(mode: str):
        def once():
            finals[mode] = cpkv.PageAllocator(pools)
            return stream_mod.replay(finals[mode], stream, batched=mode == "batched")

        return once

    array_steps = stream_mod.as_arrays(stream)

    def arrays_once():
        finals["arrays"] = cpkv.PageAllocator(pools)
        return stream_mod.replay_arrays(finals["arrays"], array_steps)

    timed = _best(args.repeat, {
        "reference": reference_once,
        "single": cpkv_once("single"),
        "batched": cpkv_once("batched"),
        "arrays": arrays_once,
    })
    results = {mode: timed[mode][1] for mode in ("single", "batched")}
    results["arrays"] = stream_mod.placements(timed["arrays"][1])
    checksums = {"reference": stream_mod.checksum(
        stream_mod.reference_record(k, p) for k, p in zip(keys, timed["reference"][1]))}
    for mode in MODES:
        checksums[mode] = stream_mod.checksum(
            stream_mod.placement_record(k, p, names) for k, p in zip(keys, results[mode]))
        for name in names:
            if finals[mode].free_extents(name) != finals["reference"].free_extents(name):
                raise SystemExit(f"error: cpkv ({mode}) and the reference disagree on the free extents of {name!r}")
    if len(set(checksums.values())) != 1:
        raise SystemExit(f"error: placements differ between cpkv and the reference: {checksums}")
    return {
        "ops": ops,
        "reserves": len(keys),
        "releases": ops - len(keys),
        "seconds": {mode: t for mode, (t, _) in timed.items()},
        "checksums": checksums,
        "stats": finals["single"].stats(),
    }


# Live objects for the call-path table: a busy server's count, and ten times it.
CALL_PATH_LIVE = (10_000, 100_000)


def _fragmented(live: int):
    """An allocator with `live` objects of 1..8 pages in two payloads and a
    free hole after every 10th (the criterion benches' shape): `live / 10`
    free extents of 1..8 pages, so a 5-page reserve is a real first-fit."""
    import cpkv

    total = live + live // 10
    sizes = [1 + (i * 7 + i // 3) % 8 for i in range(total)]
    capacity = sum(sizes) + 64
    alloc = cpkv.PageAllocator({"kv": capacity, "index": capacity})
    alloc.reserve_batch(list(range(total)), sizes)
    alloc.release_many([i for i in range(total) if i % 11 == 5])
    return alloc


def _best_per_call(run_chunk, chunk: int, chunks: int) -> float:
    """Seconds per iteration: the best of `chunks` timed runs of `chunk`
    iterations (short runs, so a run the scheduler interrupted is dropped)."""
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(chunks):
            started = time.perf_counter()
            run_chunk(chunk)
            best = min(best, time.perf_counter() - started)
    finally:
        gc.enable()
    return best / chunk


def _call_path(live: int, chunk: int = 20_000, chunks: int = 25) -> dict:
    """One reserve(5 pages)+release cycle from Python against its floor, two
    empty calls into the same object with the same arguments, and against the
    cheapest pair of real calls with the cycle's binding work and no allocation
    (a key lookup that returns a `Placement`, a key lookup that returns a
    bool), interleaved chunk by chunk so all see the same machine."""
    alloc = _fragmented(live)
    reserve, release, noop = alloc.reserve, alloc.release, alloc._noop
    placement, is_committed = alloc.placement, alloc.is_committed
    key = 1 << 62
    kv = ["kv"]
    held = 1 << 61  # a live object for the lookup pair
    reserve(held, 5)

    def cycle(n):
        for _ in range(n):
            reserve(key, 5)
            release(key)

    def cycle_kv(n):
        for _ in range(n):
            reserve(key, 5, kv)
            release(key)

    def floor(n):
        for _ in range(n):
            noop(key, 5)
            noop(key)

    def lookups(n):
        for _ in range(n):
            placement(held)
            is_committed(held)

    times = {name: float("inf") for name in ("floor", "lookups", "cycle", "cycle_kv")}
    for _ in range(5):
        for name, fn in (("floor", floor), ("lookups", lookups), ("cycle", cycle), ("cycle_kv", cycle_kv)):
            times[name] = min(times[name], _best_per_call(fn, chunk, max(1, chunks // 5)))
    release(held)
    if len(alloc) != live or key in alloc:
        raise SystemExit("error: the call-path cycle changed the allocator")
    return times


def run(args: argparse.Namespace) -> int:
    from cpkv._args import positive_int
    from cpkv._report import Table, emit

    for live in args.call_path_live:
        positive_int(live, "--call-path-live")

    if args.pools:
        workloads = {"custom": (args.pools, args.steps or 600)}
    else:
        chosen = args.workload or list(WORKLOADS)
        workloads = {name: (WORKLOADS[name][0], args.steps or WORKLOADS[name][1]) for name in chosen}

    speed = Table(
        "bench allocator: one seeded stream, cpkv.PageAllocator vs pure-Python first fit",
        ["workload", "calls", "implementation", "ops", "seconds", "ops/s", "speedup"],
    )
    shape = Table(
        "workload (state at the end of the stream)",
        ["workload", "payload", "capacity", "reserves", "misses", "releases", "used", "free extents"],
    )
    agreement = Table("agreement (every placement, op for op)", ["workload", "run", "placements sha256"])
    call_path = Table(
        "call path: one reserve(key, 5)+release(key) from Python vs its floor (two empty calls into the same "
        "object) and vs the binding's own floor (placement(key) + is_committed(key): two argument parses, "
        "two locks, two lookups, one Placement returned, no allocation work)",
        ["live objects", "payloads", "floor ns", "lookup pair ns", "lookup pair / floor", "cycle ns",
         "cycle / floor", "target"],
    )
    call_path_json = {}
    for live in args.call_path_live:
        times = _call_path(live)
        call_path_json[live] = {k: v * 1e9 for k, v in times.items()}
        for label, cycle in (("all", times["cycle"]), ('["kv"]', times["cycle_kv"])):
            call_path.add(live, label, times["floor"] * 1e9, times["lookups"] * 1e9,
                          times["lookups"] / times["floor"], cycle * 1e9, cycle / times["floor"], "<= 2")
    speedups = {}
    for name, (pools, steps) in workloads.items():
        result = _measure(args, pools, steps)
        ops, secs = result["ops"], result["seconds"]
        ref = secs["reference"]
        for calls, mode, label in (
            ("single", "single", "cpkv reserve/release"),
            ("batched", "batched", "cpkv reserve_many/release_many (tuples)"),
            ("batched", "arrays", "cpkv reserve_batch/release_many (arrays)"),
        ):
            if mode != "arrays":
                baseline = ("reference (Python, bisect + first-fit scan)" if calls == "single"
                            else "reference (loop; no batch form)")
                speed.add(name, calls, baseline, ops, ref, ops / ref, 1.0)
            speed.add(name, calls, label, ops, secs[mode], ops / secs[mode], ref / secs[mode])
        speedups[name] = {mode: ref / secs[mode] for mode in MODES}
        stats = result["stats"]
        for payload, capacity in pools.items():
            p = stats["payloads"][payload]
            shape.add(name, payload, capacity, result["reserves"], stats["misses"], result["releases"],
                      p["used"], p["free_extents"])
        for run_name, digest in result["checksums"].items():
            agreement.add(name, run_name, digest[:16])

    emit(
        "bench allocator",
        [speed, shape, agreement, call_path],
        args.json,
        seed=args.seed,
        batch=args.batch,
        occupancy=args.occupancy,
        max_pages=args.max_pages,
        repeat=args.repeat,
        workloads={name: {"pools": pools, "steps": steps} for name, (pools, steps) in workloads.items()},
        speedups=speedups,
        call_path_ns=call_path_json,
        targets={"single": 20.0, "batched": 50.0, "arrays": 50.0},
    )
    return 0

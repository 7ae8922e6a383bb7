"""``cpkv bench vllm``: cpkv's vLLM offloading manager against vLLM's own CPU managers (LRU, ARC).

One trace (a Mooncake JSONL file, or a seeded ``cpkv.workload`` when no ``--trace`` is given) is
replayed through vLLM's ``OffloadingManager`` interface, identically for every manager: per request,
a ``ReqContext`` with each block's end position; ``lookup`` of the request's blocks in order until
the first miss (a hit never covers the whole prompt: vLLM computes at least one token);
``prepare_load`` of the hits; ``prepare_store`` of the blocks after them (what vLLM offers once it
has computed them); then ``complete_load``, ``complete_store`` and ``on_request_finished``. The
trace's ``hash_ids`` are the block keys (one 512-token block = one offloaded chunk).

Reported per manager and host capacity (in blocks): the host hit rate (blocks found / full prompt
blocks) and the time per request of its ``lookup`` calls plus its ``prepare_store``. Needs vLLM
(``.venv-vllm``); without it the command fails with one line.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

DEFAULT_FRACTIONS = (0.05, 0.15, 0.4)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", metavar="PATH", help="Mooncake JSONL trace (default: a seeded cpkv.workload)")
    parser.add_argument("--requests", type=int, default=None,
                        help="replay the first N requests (default: all of a trace, 3000 generated)")
    parser.add_argument("--capacities", metavar="N,N,N",
                        help="host capacities in blocks (default: 5%%, 15%%, 40%% of the trace's distinct blocks)")
    parser.add_argument("--policy", default="lru", help="cpkv's eviction policy (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed without --trace (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")


def _requests(args: argparse.Namespace) -> tuple[str, list[Any]]:
    from cpkv._args import positive_int
    from cpkv.traces import load_trace

    positive_int(args.requests, "--requests")
    if args.trace:
        return args.trace, load_trace(args.trace, limit=args.requests)
    from cpkv.workload import generate

    return f"cpkv.workload(seed={args.seed})", generate(args.requests or 3000, args.seed)


def replay(manager: Any, requests: list[Any]) -> tuple[float, float, int]:
    """(host hit rate, seconds per request of lookups + prepare_store, evicted blocks)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

    from cpkv.traces import BLOCK_TOKENS

    hits = blocks = evicted = 0
    timed = 0.0
    for number, request in enumerate(requests):
        full = request.input_length // BLOCK_TOKENS
        if full == 0:
            continue
        ctx = ReqContext(req_id=str(number))
        keys = [make_offload_key(h.to_bytes(8, "big"), 0) for h in request.hash_ids[:full]]
        for i, key in enumerate(keys):
            ctx.set_offload_key_position(key, (i + 1) * BLOCK_TOKENS)
        manager.on_new_request(ctx)
        # At least one prompt token is computed, so a prompt of whole blocks can hit all but its last.
        reachable = full if request.input_length > full * BLOCK_TOKENS else full - 1
        started = time.perf_counter()
        found = 0
        for key in keys[:reachable]:
            if manager.lookup(key, ctx) is not LookupResult.HIT:
                break
            found += 1
        middle = time.perf_counter()
        if found:
            manager.prepare_load(keys[:found], ctx)
        resumed = time.perf_counter()
        out = manager.prepare_store(keys[found:], ctx) if found < full else None
        timed += (middle - started) + (time.perf_counter() - resumed)
        if found:
            manager.complete_load(keys[:found], ctx)
        if out is not None:
            evicted += len(out.evicted_keys)
            manager.complete_store(out.keys_to_store, ctx)
        manager.on_request_finished(ctx)
        hits += found
        blocks += full
    return hits / max(blocks, 1), timed / max(len(requests), 1), evicted


def run(args: argparse.Namespace) -> int:
    from cpkv._args import output_file, positive_ints
    from cpkv.errors import UnknownPolicyError
    from cpkv.integrations.vllm._version import check_vllm_version

    output_file(args.json, "--json")
    version = check_vllm_version()  # before anything else: one line when vLLM is missing
    from cpkv import PrefixTree

    if args.policy not in PrefixTree.POLICIES:
        raise UnknownPolicyError(f"--policy: unknown eviction policy {args.policy!r} "
                                 f"(known: {', '.join(PrefixTree.POLICIES)})")
    capacities = positive_ints(args.capacities, "--capacities") if args.capacities else None
    source, requests = _requests(args)
    from cpkv._report import Table, emit
    from cpkv.integrations.vllm import CpkvOffloadingManager
    from cpkv.traces import BLOCK_TOKENS
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    distinct = len({h for r in requests for h in r.hash_ids[: r.input_length // BLOCK_TOKENS]})
    if capacities is None:
        capacities = [max(1, round(distinct * f)) for f in DEFAULT_FRACTIONS]
    managers = [
        (f"cpkv ({args.policy})", lambda cap: CpkvOffloadingManager(cap, args.policy, tokens_per_chunk=(BLOCK_TOKENS,))),
        ("vLLM CPU (lru)", lambda cap: CPUOffloadingManager(num_chunks=cap, cache_policy="lru")),
        ("vLLM CPU (arc)", lambda cap: CPUOffloadingManager(num_chunks=cap, cache_policy="arc")),
    ]
    table = Table(
        f"vLLM offloading managers on {source}: {len(requests):,} requests, {distinct:,} distinct blocks",
        ["host blocks", "manager", "host hit rate", "us per lookup+prepare_store", "evicted blocks", "time vs cpkv"],
    )
    for capacity in capacities:
        results = []
        for name, make in managers:
            rate, seconds, evicted = replay(make(capacity), requests)
            results.append((name, rate, seconds, evicted))
        base = results[0][2]
        for name, rate, seconds, evicted in results:
            table.add(capacity, name, rate, seconds * 1e6, evicted, seconds / base if base else float("nan"))
    emit("bench vllm", [table], args.json, trace=source, vllm=version, requests=len(requests),
         distinct_blocks=distinct, capacities=capacities, policy=args.policy)
    return 0

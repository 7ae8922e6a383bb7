"""``cpkv bench vllm``: cpkv's vLLM offloading manager against vLLM's own CPU managers (LRU, ARC).

Each workload (Mooncake JSONL files given with ``--trace``, and a seeded ``cpkv.workload``, the only
one when no ``--trace`` is given) is replayed through vLLM's ``OffloadingManager`` interface,
identically for every manager: per request, a ``ReqContext`` with each block's end position;
``lookup`` of the request's blocks in order until the first miss (a hit never covers the whole
prompt: vLLM computes at least one token); ``prepare_load`` of the hits; ``prepare_store`` of the
blocks after them (what vLLM offers once it has computed them); then ``complete_load``,
``complete_store`` and ``on_request_finished``. The trace's ``hash_ids`` are the block keys (one
512-token block = one offloaded chunk).

Reported per workload, host capacity (in blocks) and manager: the host hit rate (blocks found /
full prompt blocks) and the time per request of its ``lookup`` calls plus its ``prepare_store``
(the least of ``--repeat`` replays, managers interleaved, so a busy machine slows them alike);
``--policy lru,ghost`` runs one cpkv manager per policy in the same interleaving. The
``floor`` row is a manager that decides nothing (every lookup a miss, every offer stored with no
eviction): the time vLLM's interface itself costs any backend (the Python call per key, the output
objects). Needs vLLM (``.venv-vllm``); without it the command fails with one line.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

DEFAULT_FRACTIONS = (0.05, 0.15, 0.4)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", metavar="PATH", action="append",
                        help="Mooncake JSONL trace (repeatable; default: only a seeded cpkv.workload)")
    parser.add_argument("--generated", action="store_true",
                        help="with --trace: also replay the seeded cpkv.workload")
    parser.add_argument("--requests", type=int, default=None,
                        help="replay the first N requests (default: all of a trace, 3000 generated)")
    parser.add_argument("--capacities", metavar="N,N,N",
                        help="host capacities in blocks (default: 5%%, 15%%, 40%% of each workload's distinct blocks)")
    parser.add_argument("--policy", default=None,
                        help="cpkv's eviction policy, or a comma list of them, each its own manager in the same "
                             "replays (default: cpkv.DEFAULT_POLICY)")
    parser.add_argument("--repeat", type=int, default=3, help="replays per manager; the least time counts (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")


def _workloads(args: argparse.Namespace) -> list[tuple[str, list[Any]]]:
    from cpkv._args import positive_int
    from cpkv.traces import load_trace

    positive_int(args.requests, "--requests")
    out = [(path, load_trace(path, limit=args.requests)) for path in (args.trace or [])]
    if not args.trace or args.generated:
        from cpkv.workload import generate

        out.append((f"cpkv.workload(seed={args.seed})", generate(args.requests or 3000, args.seed)))
    return out


class FloorManager:
    """Decides nothing: answers the lookups another manager answered (``found[i]`` hits for request
    i, then a miss), stores every offer in rows 0.. and evicts nothing. Its time is what vLLM's
    interface costs any backend on that call sequence (a Python call per key, the output objects)."""

    def __init__(self, found: list[int]) -> None:
        from vllm.v1.kv_offload.base import LookupResult, PrepareStoreOutput, RequestOffloadingContext
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        self._hit, self._miss = LookupResult.HIT, LookupResult.MISS
        self._out, self._spec, self._ctx = PrepareStoreOutput, CPULoadStoreSpec, RequestOffloadingContext
        self._found = iter(found)
        self._left = 0

    def on_new_request(self, ctx: Any) -> Any:
        self._left = next(self._found)
        return self._ctx()

    def lookup(self, key: bytes, ctx: Any) -> Any:
        self._left -= 1
        return self._hit if self._left >= 0 else self._miss

    def prepare_load(self, keys: Any, ctx: Any) -> Any:
        return self._spec(list(range(len(keys))))

    def prepare_store(self, keys: Any, ctx: Any) -> Any:
        keys = list(keys)
        return self._out(keys_to_store=keys, store_spec=self._spec(list(range(len(keys)))), evicted_keys=[])

    def complete_load(self, keys: Any, ctx: Any) -> None:
        pass

    def complete_store(self, keys: Any, ctx: Any, success: bool = True) -> None:
        pass

    def on_request_finished(self, ctx: Any) -> None:
        pass


def _floor_of(found: list[int]) -> Callable[[int], Any]:
    """A factory of floor managers answering with ``found`` (the capacity does not matter to them)."""
    return lambda _capacity: FloorManager(found)


def replay(manager: Any, requests: list[Any], found_out: list[int] | None = None) -> tuple[float, float, int]:
    """(host hit rate, seconds per request of lookups + prepare_store, evicted blocks); each
    replayed request's hit count is appended to ``found_out`` when given."""
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
        if found_out is not None:
            found_out.append(found)
    return hits / max(blocks, 1), timed / max(len(requests), 1), evicted


def run(args: argparse.Namespace) -> int:
    from cpkv._args import output_file, policy_list, positive_int, positive_ints
    from cpkv.integrations.vllm._version import check_vllm_version

    output_file(args.json, "--json")
    positive_int(args.repeat, "--repeat")
    version = check_vllm_version()  # before anything else: one line when vLLM is missing
    from cpkv import DEFAULT_POLICY, PrefixTree

    policies = policy_list(DEFAULT_POLICY if args.policy is None else args.policy, PrefixTree.POLICIES)
    capacities = positive_ints(args.capacities, "--capacities") if args.capacities else None
    workloads = _workloads(args)
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from cpkv._report import Table, emit
    from cpkv.integrations.vllm import CpkvOffloadingManager
    from cpkv.traces import BLOCK_TOKENS

    def cpkv_manager(policy: str) -> Callable[[int], Any]:
        return lambda cap: CpkvOffloadingManager(cap, policy, tokens_per_chunk=(BLOCK_TOKENS,))

    cpkv_names = [f"cpkv ({policy})" for policy in policies]
    cpkv_name = cpkv_names[0]  # the floor answers its lookups; the "time vs cpkv" column is against it
    managers: list[tuple[str, Callable[[int], Any]]] = [
        *((name, cpkv_manager(policy)) for name, policy in zip(cpkv_names, policies)),
        ("vLLM CPU (lru)", lambda cap: CPUOffloadingManager(num_chunks=cap, cache_policy="lru")),
        ("vLLM CPU (arc)", lambda cap: CPUOffloadingManager(num_chunks=cap, cache_policy="arc")),
    ]
    tables = []
    summary = Table(
        f"{', '.join(cpkv_names)} against the better of vLLM's managers at each point",
        ["workload", "host blocks", "cpkv policy", "cpkv hit rate", "best vLLM hit rate", "hit rate - best vLLM",
         "cpkv us/request", "fastest vLLM us/request", "time / fastest vLLM", "floor us/request"],
    )
    meta = []
    for source, requests in workloads:
        distinct = len({h for r in requests for h in r.hash_ids[: r.input_length // BLOCK_TOKENS]})
        caps = capacities or [max(1, round(distinct * f)) for f in DEFAULT_FRACTIONS]
        meta.append({"workload": source, "requests": len(requests), "distinct_blocks": distinct, "capacities": caps})
        table = Table(
            f"vLLM offloading managers on {source}: {len(requests):,} requests, {distinct:,} distinct blocks",
            ["host blocks", "manager", "host hit rate", "us per lookup+prepare_store", "evicted blocks",
             "time vs cpkv"],
        )
        for capacity in caps:
            best: dict[str, tuple[float, float, int]] = {}
            for _ in range(args.repeat):
                found: list[int] = []
                runs = [*managers, ("floor", _floor_of(found))]
                for name, make in runs:  # interleaved: a busy machine slows every manager alike
                    rate, seconds, evicted = replay(make(capacity), requests, found if name == cpkv_name else None)
                    if name not in best or seconds < best[name][1]:
                        best[name] = (rate, seconds, evicted)
            base = best[cpkv_name][1]
            for name in [*(n for n, _ in managers), "floor"]:
                rate, seconds, evicted = best[name]
                table.add(capacity, name, rate if name != "floor" else float("nan"), seconds * 1e6, evicted,
                          seconds / base if base else float("nan"))
            vllm = [best["vLLM CPU (lru)"], best["vLLM CPU (arc)"]]
            top_rate = max(v[0] for v in vllm)
            fastest = min(v[1] for v in vllm)
            for policy, name in zip(policies, cpkv_names):
                rate, seconds, _ = best[name]
                summary.add(source.rsplit("/", 1)[-1], capacity, policy, rate, top_rate, rate - top_rate,
                            seconds * 1e6, fastest * 1e6, seconds / fastest if fastest else float("nan"),
                            best["floor"][1] * 1e6)
        tables.append(table)
    tables.append(summary)
    emit("bench vllm", tables, args.json, vllm=version, policy=",".join(policies), repeat=args.repeat,
         workloads=meta)
    return 0

"""``cpkv bench sglang``: cpkv's HiCache storage backend against SGLang's own ``file`` backend and
SGLang's per-rank host pool, on one trace, side by side.

Part 1, per CP size (``--cp``, default 2,4), in that many gloo processes: one trace (a Mooncake
file with ``--trace``, else a seeded ``cpkv.workload``; one trace block = one SGLang page, the key
chain built from the block hashes as SGLang chains its page hashes) is replayed through each
backend the way SGLang's cache controller drives it: per request, ``batch_exists`` in batches of
128 pages (the hit count before the MIN), the MIN all-reduce SGLang does over the CP group, then
the request's pages go to a backup thread (``batch_set_v1`` for cpkv, ``batch_set`` for ``file``,
as SGLang calls each). Rank 1 hands its stores over ``--lag`` requests late (ranks skewed in
timing). Backends: cpkv (``--slab-fraction`` of the distinct pages per node), ``file`` unbounded,
``file`` bounded to the same bytes per node (each rank 1/cp of them). Reported: the hit tokens
the MIN removed (sum over prefetches of the best rank's hits minus the synced hits), the synced
hit rate, and host bytes per unique token across the CP group (cpkv: its slab rows holding a
written page; file: the bytes of its files; SGLang's per-rank host pool: every rank holds every
page, cp copies, computed from the geometry).

Part 2, one process: ``batch_set_v1`` and ``batch_get_v1`` of cpkv's backend against a plain
``memcpy`` (one contiguous range per call, a numpy slice copy: libc memcpy, bounds-checked) of the same bytes, 128 pages per call as
SGLang batches them, over a working set of 128 MB, on a GQA pool at 4 KB and 64 KB pages
(``--page-kb``) and on the DSA stack's two pools (the MLA latent, 72 KB pages, through the v1 calls;
the indexer, 8.25 KB pages, through the v2 calls SGLang makes for it; ``--no-copy-dsa`` leaves them
out); best of ``--reps`` passes. The memcpy moves the same bytes between the same two memories (the
host pool and the slab's region), so what differs is the backend's work only. Next to each, the
index's own work per batch (its store for a set, its lookup for a get, no bytes) and the fraction of
memcpy that leaves reachable: memcpy / (memcpy + index).

Needs SGLang 0.5.23 (``.venv-sglang``); without it the command fails with one line.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import sys
import tempfile
import threading
import time
from pathlib import Path
from queue import Queue
from typing import Any, Callable

import numpy as np

BATCH = 128  # SGLang's STORAGE_BATCH_SIZE
PAGE_TOKENS = 16  # tokens per page in part 1 (the bench's unit of a "token")


def configure(parser: argparse.ArgumentParser) -> None:
    from cpkv._args import integer, real

    parser.add_argument("--trace", metavar="PATH", help="Mooncake JSONL trace (default: a seeded cpkv.workload)")
    parser.add_argument("--requests", type=integer(1, 1_000_000), default=None,
                        help="replay the first N requests (default: 300 of a trace or generated)")
    parser.add_argument("--seed", type=integer(0), default=0, help="workload seed without --trace (default %(default)s)")
    parser.add_argument("--cp", default="2,4", metavar="N,N", help="CP sizes of part 1 (default %(default)s; each 2..8)")
    parser.add_argument("--lag", type=integer(0, 1000), default=2,
                        help="requests rank 1 hands its stores over late (default %(default)s)")
    parser.add_argument("--slab-fraction", type=real(above=0, maximum=1), default=0.25,
                        help="storage bytes per node as a fraction of the trace's distinct pages (default %(default)s)")
    parser.add_argument("--page-kb", default="4,64", metavar="N,N",
                        help="page sizes of part 2 in KiB (default %(default)s; each 4..1024, a power of 2)")
    parser.add_argument("--reps", type=integer(1, 50), default=5, help="passes of part 2, best kept (default %(default)s)")
    parser.add_argument("--no-copy-dsa", dest="copy_dsa", action="store_false",
                        help="part 2 without the DSA pools (MLA latent and indexer, 64-token pages)")
    parser.add_argument("--dsa-cp", default="2,4,8", metavar="N,N",
                        help="CP sizes of part 3, DSA-shaped pools through SGLang's _DsaStrategy stack (default "
                             "%(default)s; each 2..8; 0 skips it)")
    parser.add_argument("--dsa-requests", type=integer(1, 10_000), default=40,
                        help="requests of part 3, each cut to 64 pages of 64 tokens (default %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")


def _int_list(text: str, option: str, low: int, high: int, power_of_two: bool = False) -> list[int]:
    from cpkv.errors import InvalidArgumentError

    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise InvalidArgumentError(f"{option}: expected comma-separated integers, got {text!r}") from None
    for v in values:
        if not low <= v <= high or (power_of_two and v & (v - 1)):
            raise InvalidArgumentError(f"{option}: {v} is out of range ({low}..{high}{', a power of 2' if power_of_two else ''})")
    return values


def _requests(args: argparse.Namespace) -> tuple[str, list[list[str]]]:
    """(source, each request's chained page keys)."""
    from cpkv.traces import load_trace

    limit = args.requests or 300
    if args.trace:
        source, reqs = args.trace, load_trace(args.trace, limit=limit)
    else:
        from cpkv.workload import generate

        source, reqs = f"cpkv.workload(seed={args.seed})", generate(limit, args.seed)
    return source, chain_keys(reqs)


def chain_keys(reqs: list[Any]) -> list[list[str]]:
    """Each request's full blocks as chained page keys (hex), the way SGLang chains its page hashes;
    requests without a full block are left out."""
    from cpkv.traces import BLOCK_TOKENS

    chains = []
    for r in reqs:
        full = r.input_length // BLOCK_TOKENS
        keys, prior = [], ""
        for h in r.hash_ids[:full]:
            prior = hashlib.sha256(f"{prior}/{h}".encode()).hexdigest()
            keys.append(prior)
        if keys:
            chains.append(keys)
    return chains


def _launch(fn: Callable[..., Any], world: int, *args: Any, **kwargs: Any) -> list[Any]:
    """``run_ranks`` with the interpreter's tools on the ranks' PATH (SGLang builds native code with
    them, :mod:`cpkv.integrations.sglang.toolchain`)."""
    from cpkv.integrations.sglang.toolchain import interpreter_tools_env
    from cpkv.runtime.launch import run_ranks

    return run_ranks(fn, world, *args, env=interpreter_tools_env(), **kwargs)


def run(args: argparse.Namespace) -> int:
    from cpkv._args import output_file

    output_file(args.json, "--json")
    cps = _int_list(args.cp, "--cp", 2, 8)
    page_kbs = _int_list(args.page_kb, "--page-kb", 4, 1024, power_of_two=True)
    dsa_cps = [] if args.dsa_cp == "0" else _int_list(args.dsa_cp, "--dsa-cp", 2, 8)
    # Importing the adapter checks SGLang's version: one line when SGLang is missing or another release.
    from cpkv.integrations.sglang._version import check_sglang_version

    version = check_sglang_version()
    source, chains = _requests(args)
    if dsa_cps:  # part 3 hashes pages as SGLang does: its native hash is built (or found built) here, once
        from cpkv.integrations.sglang.toolchain import build_native_hash

        build_native_hash()
    from cpkv.runtime.launch import LaunchError

    try:
        return _run(args, version, source, chains, cps, page_kbs, dsa_cps)
    except LaunchError as err:  # a rank failed: the cause in one line (the ranks' tracebacks are not for users)
        print(f"cpkv: bench sglang failed: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, version: str, source: str, chains: list[list[str]], cps: list[int],
         page_kbs: list[int], dsa_cps: list[int]) -> int:
    from cpkv._report import Table, emit

    distinct = len({k for c in chains for k in c})
    slab_pages = max(1, round(distinct * args.slab_fraction))
    hits = Table(
        f"SGLang HiCache storage on {source}: {len(chains):,} requests, {distinct:,} distinct pages of "
        f"{PAGE_TOKENS} tokens; rank 1 stores {args.lag} requests late; {slab_pages:,} pages of storage per node",
        ["cp", "storage", "host bytes / unique token", "hit tokens (synced)", "hit tokens removed by MIN",
         "removed / best rank's hits"])
    for cp in cps:
        for row in _part1(cp, chains, slab_pages, args.lag):
            hits.add(cp, *row)
    speed = Table("batch set/get vs a plain memcpy of the same bytes (128 pages per call, one process); the index's "
                  "own work per batch and the fraction of memcpy it leaves reachable",
                  ["pool", "page KB", "op", "slab memory", "GB/s", "memcpy GB/s", "fraction of memcpy",
                   "index alone us/batch", "memcpy / (memcpy + index)"])
    for kb in page_kbs:
        for row in _part2("gqa", kb, args.reps):
            speed.add(*row)
    if args.copy_dsa:
        for row in _part2("dsa", 0, args.reps):
            speed.add(*row)
    tables = [hits, speed]
    if dsa_cps:
        dsa_chains = [c[:64] for c in chains[:args.dsa_requests]]
        dsa_distinct = len({k for c in dsa_chains for k in c})
        dsa_slab = max(1, round(dsa_distinct * args.slab_fraction))
        dsa = Table(
            f"DSA-shaped pools (MLA latent {DSA_GEOMETRY['kv_lora_rank']}+{DSA_GEOMETRY['qk_rope_head_dim']} bf16 and "
            f"the indexer, {DSA_GEOMETRY['layers']} layers, {DSA_PAGE}-token pages) through SGLang's _DsaStrategy "
            f"stack: {len(dsa_chains)} requests, {dsa_distinct:,} distinct pages; rank 1 stores {args.lag} requests "
            f"late; {dsa_slab:,} pages of storage per node",
            ["cp", "storage", "host bytes / unique token", "hit tokens (synced)", "hit tokens removed by MIN",
             "removed / best rank's hits"])
        for cp in dsa_cps:
            for row in _part3(cp, dsa_chains, dsa_slab, args.lag):
                dsa.add(cp, *row)
        tables.append(dsa)
    emit("bench sglang", tables, args.json, trace=source, sglang=version, requests=len(chains),
         distinct_pages=distinct, slab_pages=slab_pages, lag=args.lag, cp=cps, page_kb=page_kbs, dsa_cp=dsa_cps)
    return 0


# -- part 1: hits and bytes across CP ranks -----------------------------------------------------------


def _part1(cp: int, chains: list[list[str]], slab_pages: int, lag: int) -> list[list[Any]]:
    return _launch(_hits_rank, cp, chains, slab_pages, lag, timeout_s=900, collective_timeout_s=300)[0]


def _quiet() -> None:
    """SGLang's ranks log and warn per call; the bench prints its tables only."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def _geometry() -> dict[str, int]:
    return {"heads": 2, "head_dim": 16, "layers": 2}  # 4 KB pages of 16 tokens (fp16, K and V)


def _pools(tokens: int) -> Any:
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    g = _geometry()
    kv = MHATokenToKVPool(tokens, PAGE_TOKENS, torch.float16, g["heads"], g["head_dim"], g["layers"], "cpu", False,
                          start_layer=0, end_layer=g["layers"] - 1)
    return MHATokenToKVPoolHost(kv.get_device_pool_infos()[0].buffer_info, 1.0, 0, PAGE_TOKENS, "page_first_direct",
                                pin_memory=False, device_capacity_tokens=kv.size, start_layer=kv.start_layer,
                                end_layer=kv.end_layer, write_back_staging=kv.hicache_write_back_staging)


def _storage_config(rank: int, world: int, extra: dict) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(tp_rank=rank, tp_size=world, pp_rank=0, pp_size=1, attn_cp_rank=rank,
                                attn_cp_size=world, is_mla_model=False, enable_storage_metrics=False,
                                is_page_first_layout=False, model_name="bench", extra_config=extra)


def _hits_rank(rank: int, world: int, chains: list[list[str]], slab_pages: int, lag: int) -> list[list[Any]]:
    """One CP rank of part 1 (torch.distributed already initialised by the launcher)."""
    _quiet()
    import torch
    import torch.distributed as dist
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from cpkv.integrations.sglang import CpkvHiCacheStorage

    group: Any = dist.new_group(list(range(world)), backend="gloo")  # SGLang's MIN hit sync group
    longest = max(len(c) for c in chains)
    host = _pools((longest + 1) * PAGE_TOKENS)
    host.kv_buffer.view(torch.uint8).view(-1).random_(0, 256)
    page_bytes = host.get_data_page(0).numel() * host.dtype.itemsize
    indices = torch.arange(PAGE_TOKENS, (longest + 1) * PAGE_TOKENS, dtype=torch.int64)  # row 0 left unused
    node_bytes = slab_pages * page_bytes
    rows = []
    with tempfile.TemporaryDirectory(prefix="cpkv-bench-file-") as files, \
            tempfile.TemporaryDirectory(prefix="cpkv-bench-file-bounded-") as bounded:
        dist.barrier(group=group)
        backends = [
            ("cpkv (one slab per node)", "v1", lambda: CpkvHiCacheStorage(_storage_config(rank, world, {
                "cpkv_pages": slab_pages, "interface_v1": 1, "cpkv_timeout_s": 120}), {}), None),
            ("SGLang file, unbounded", "legacy", lambda: HiCacheFile(_storage_config(rank, world, {
                "file_storage_path": files})), files),
            (f"SGLang file, {1 / world:.2g} of the node's bytes per rank", "legacy", lambda: HiCacheFile(
                _storage_config(rank, world, {"file_storage_path": bounded, "max_size": str(node_bytes // world)})),
             bounded),
        ]
        for name, style, make, directory in backends:
            backend = make()
            backend.register_mem_pool_host(host)
            removed, synced, best, unique_tokens = _replay(backend, style, chains, host, indices, group, rank, lag)
            if directory is not None:
                used = torch.tensor([sum(p.stat().st_size for p in Path(directory).glob("*.bin"))], dtype=torch.int64)
                dist.all_reduce(used, group=group)  # every rank's files, once
                dist.barrier(group=group)
                used_bytes = int(used.item())
            else:
                used_bytes = backend.slab_bytes_in_use()  # one node
                backend.wait_checks(120)
                backend.close()
            rows.append([name, used_bytes / max(unique_tokens, 1), synced, removed, removed / max(best, 1)])
    per_token = page_bytes / PAGE_TOKENS
    rows.append(["SGLang per-rank host pool (computed)", per_token * world, "", "", ""])
    return rows


def _replay(backend: Any, style: str, chains: list[list[str]], host: Any, indices: Any, group: Any, rank: int,
            lag: int) -> tuple[int, int, int, int]:
    """(hit tokens removed by the MIN, synced hit tokens, best rank's hit tokens summed, unique tokens held)."""
    import torch
    import torch.distributed as dist

    work: Queue = Queue()
    done = threading.Semaphore(0)

    def backup() -> None:
        while True:
            keys = work.get()
            if keys is None:
                return
            for i in range(0, len(keys), BATCH):
                batch = keys[i:i + BATCH]
                idx = indices[i * PAGE_TOKENS:(i + len(batch)) * PAGE_TOKENS]
                if style == "v1":
                    backend.batch_set_v1(batch, idx)
                else:
                    backend.batch_set(batch, [host.get_data_page(int(idx[j * PAGE_TOKENS])) for j in range(len(batch))])
            done.release()

    thread = threading.Thread(target=backup, daemon=True)
    thread.start()
    my_lag = lag if rank == 1 else 0
    pending: list[list[str]] = []
    pre_hits, post_hits = [], []
    stored: set[str] = set()
    for keys in chains:
        hit = 0
        for i in range(0, len(keys), BATCH):
            batch = keys[i:i + BATCH]
            n = backend.batch_exists(batch)
            hit += n
            if n < len(batch):
                break
        synced = torch.tensor(hit, dtype=torch.int32)
        dist.all_reduce(synced, op=dist.ReduceOp.MIN, group=group)
        pre_hits.append(hit)
        post_hits.append(int(synced.item()))
        pending.append(keys)
        while len(pending) > my_lag:
            k = pending.pop(0)
            work.put(k)
            if not done.acquire(timeout=300):
                raise TimeoutError("the backup thread did not finish a store within 300 s")
            stored.update(k)
    for k in pending:
        work.put(k)
        if not done.acquire(timeout=300):
            raise TimeoutError("the backup thread did not finish a store within 300 s")
    work.put(None)
    thread.join(60)
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, pre_hits, group=group)
    best = [max(col) for col in zip(*everyone)]
    removed = sum(b - p for b, p in zip(best, post_hits)) * PAGE_TOKENS
    return removed, sum(post_hits) * PAGE_TOKENS, sum(best) * PAGE_TOKENS, _resident_tokens(backend, stored)


def _resident_tokens(backend: Any, stored: set[str]) -> int:
    """Unique tokens the backend still holds (of the pages ever stored)."""
    held = sum(1 for k in stored if backend.exists(k))
    return held * PAGE_TOKENS


# -- part 2: copy throughput ----------------------------------------------------------------------------


def _part2(pool: str, page_kb: int, reps: int) -> list[list[Any]]:
    """In a child process: the backend needs torch.distributed initialised, once."""
    return _launch(_speed, 1, pool, page_kb, reps, timeout_s=900, collective_timeout_s=60)[0]


def _gqa_speed_pool(page_kb: int) -> tuple[Any, int]:
    """A GQA host pool (page_first_direct, fp16 K and V of 16 tokens x 32 dims) of ``page_kb`` pages
    holding a working set well past the last-level cache; (pool, pages)."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    per_layer_heads = page_kb // 2  # page bytes = 2048 * layers * heads
    layers = min(4, per_layer_heads)
    heads = per_layer_heads // layers
    pages = max(4 * BATCH, (128 << 20) // (2048 * layers * heads))
    kv = MHATokenToKVPool((pages + 1) * 16, 16, torch.float16, heads, 32, layers, "cpu", False, start_layer=0,
                          end_layer=layers - 1)
    host = MHATokenToKVPoolHost(kv.get_device_pool_infos()[0].buffer_info, 1.0, 0, 16, "page_first_direct",
                                pin_memory=False, device_capacity_tokens=kv.size, start_layer=kv.start_layer,
                                end_layer=kv.end_layer, write_back_staging=kv.hicache_write_back_staging)
    return host, pages


def _dsa_speed_pools() -> tuple[Any, Any, int]:
    """The DSA host pools of part 2, one layer: (KV pool, indexer pool, pages), a working set well
    past the last-level cache."""
    g = DSA_GEOMETRY
    kv_page = DSA_PAGE * (g["kv_lora_rank"] + g["qk_rope_head_dim"]) * 2
    pages = max(4 * BATCH, (128 << 20) // kv_page)
    host, indexer = dsa_host_pools(pages, 1)
    return host, indexer, pages


def dsa_host_pools(pages: int, layers: int) -> tuple[Any, Any]:
    """The DSA host pools SGLang builds (MLA latent 512+64 bf16 and the indexer's 128 fp8 keys + scale
    per token and layer, 64-token pages, page_first_direct), ``pages`` + 1 pages each: (KV pool,
    indexer pool)."""
    import sglang.srt.mem_cache.pool_host.common as host_common
    import torch
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_kv_host_pool
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl
    from sglang.srt.server_args import ServerArgs

    host_common._cuda_host_register = lambda *a, **k: None  # no GPU: plain CPU host pools
    runtime_context.publish(ServerArgs(model_path="dummy", hicache_mem_layout="page_first_direct",
                                       hicache_io_backend="direct", hicache_ratio=1.0), role="scheduler")
    g = DSA_GEOMETRY
    kv = DSATokenToKVPool((pages + 1) * DSA_PAGE, DSA_PAGE, g["kv_lora_rank"], torch.bfloat16, g["qk_rope_head_dim"],
                          layers, "cpu", 128, False, g["kv_lora_rank"] + g["qk_rope_head_dim"])
    host = build_kv_host_pool(kv_pool=kv, page_size=DSA_PAGE)
    indexer = DSAIndexerPoolHost(decl=make_dsa_indexer_pool_decl(kv), anchor_host=host, allocator_type="default")
    return host, indexer


def _batch_calls(backend: Any, name: str) -> tuple[Any, Any]:
    """(set, get) of one pool as SGLang's HybridCacheController calls them: the KV pool through the v1
    calls, a sidecar through the v2 calls."""
    from sglang.srt.mem_cache.hicache_storage import PoolTransfer

    if name == "kv":
        return backend.batch_set_v1, backend.batch_get_v1

    def put(keys: list[str], idx: Any) -> Any:
        return backend.batch_set_v2([PoolTransfer(name=name, keys=keys, host_indices=idx)])[name]

    def get(keys: list[str], idx: Any) -> Any:
        return backend.batch_get_v2([PoolTransfer(name=name, keys=keys, host_indices=idx)])[name]

    return put, get


def _speed(rank: int, world: int, kind: str, page_kb: int, reps: int) -> list[list[Any]]:
    """``kind`` "gqa": batch_set_v1/batch_get_v1 on a GQA pool of ``page_kb`` pages; "dsa": the DSA
    stack's two pools, the MLA latent through batch_set_v1/batch_get_v1 and the indexer through
    batch_set_v2/batch_get_v2, as SGLang's HybridCacheController calls them. Each against a memcpy of
    the same bytes between the same memories, and the index's own work alone (its store for a set,
    its lookup for a get, each batch timed right after a memcpy of another batch's bytes, as it runs
    between the copies): what the index costs per batch bounds the fraction of memcpy a batch call can
    reach, whatever its copies do."""
    _quiet()

    import torch
    from sglang.srt.mem_cache.hicache_storage import PoolName

    from cpkv.errors import InternalError
    from cpkv.integrations.sglang import CpkvHiCacheStorage, ReplicatedIndex

    if kind == "gqa":
        host, pages = _gqa_speed_pool(page_kb)
        pools = {"kv": host}
    else:
        host, indexer, pages = _dsa_speed_pools()
        pools = {"kv": host, str(PoolName.INDEXER): indexer}
    backend = CpkvHiCacheStorage(_storage_config(0, 1, {"cpkv_pages": pages, "interface_v1": 1}), {})
    backend.register_mem_pool_host(host)
    if kind == "dsa":
        backend.register_mem_host_pool_v2(indexer, PoolName.INDEXER)
    page_size = host.page_size
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(pages)]
    batches = [(keys[i:i + BATCH], torch.arange((i + 1) * page_size, (i + 1 + len(keys[i:i + BATCH])) * page_size))
               for i in range(0, pages, BATCH)]
    rows = []
    for name, pool in pools.items():
        slab_pool = backend.pools[name]
        page_bytes = slab_pool.page_bytes
        total = pages * page_bytes
        # The baseline copies the same bytes between the same memory: the pages' host range (contiguous in
        # page_first_direct, from the first batch's first page) and the slab's own region.
        host_ptr = int(pool.get_page_buffer_meta(torch.arange(page_size, 2 * page_size))[0][0])
        (buffer,) = [b for b in (getattr(pool, n, None) for n in ("kv_buffer", "index_k_with_scale_buffer"))
                     if b is not None][:1]
        # Byte views of the two regions (numpy: one single-threaded memcpy per slice assignment); a slice
        # past either end is refused below, and numpy refuses a size mismatch, so no byte moves unchecked.
        host_bytes = buffer.view(-1).view(torch.uint8).numpy()[host_ptr - buffer.data_ptr():]
        slab_bytes = slab_pool.data.view(-1).numpy()
        put, get = _batch_calls(backend, name)

        def memcpy(i: int, dst: np.ndarray, src: np.ndarray, page_bytes: int = page_bytes) -> None:
            at = i * BATCH * page_bytes
            size = min(BATCH, pages - i * BATCH) * page_bytes
            if i < 0 or size <= 0 or at + size > len(dst) or at + size > len(src):
                raise InternalError(f"bench sglang: batch {i} copies bytes [{at}, {at + size}), past the "
                                    f"{len(dst)} bytes at the destination or the {len(src)} at the source")
            dst[at:at + size] = src[at:at + size]

        alone = ReplicatedIndex(pages, backend.settings.policy)
        best = {n: float("inf") for n in ("set", "get", "memcpy in", "memcpy out", "index store", "index locate")}
        for rep in range(reps + 1):  # pass 0 warms the slab (first touch)
            backend.clear()
            started = time.perf_counter()
            for k, idx in batches:
                put(k, idx)
            set_s = time.perf_counter() - started
            started = time.perf_counter()
            for k, idx in batches:
                ok = get(k, idx)
            get_s = time.perf_counter() - started
            if not all(ok):
                raise RuntimeError("the backend missed pages it had just stored")
            timed = {"set": set_s, "get": get_s}
            for op, (to, frm) in {"memcpy in": (slab_bytes, host_bytes), "memcpy out": (host_bytes, slab_bytes)}.items():
                started = time.perf_counter()
                for i in range(len(batches)):  # one memcpy per batch of contiguous pages
                    memcpy(i, to, frm)
                timed[op] = time.perf_counter() - started
            alone.clear()
            index_calls: dict[str, Callable[[list[str]], Any]] = {
                "index store": functools.partial(alone.store, prefix_keys=None), "index locate": alone.locate}
            for op, call in index_calls.items():
                seconds = 0.0
                for i, (k, _) in enumerate(batches):
                    memcpy((i + len(batches) // 2) % len(batches), slab_bytes, host_bytes)  # caches as between copies
                    started = time.perf_counter()
                    call(k)
                    seconds += time.perf_counter() - started
                timed[op] = seconds
            if rep:
                for op, seconds in timed.items():
                    best[op] = min(best[op], seconds)
        gbs = {op: total / seconds / 1e9 for op, seconds in best.items() if op.startswith(("set", "get", "memcpy"))}
        per_batch = {op: best[op] / len(batches) * 1e6 for op in ("index store", "index locate")}
        floor = {"set": best["memcpy in"] / (best["memcpy in"] + best["index store"]),
                 "get": best["memcpy out"] / (best["memcpy out"] + best["index locate"])}
        v = "v1" if name == "kv" else "v2"
        label = "GQA" if kind == "gqa" else ("DSA latent" if name == "kv" else "DSA indexer")
        kb = page_bytes / 1024
        slab_kind = slab_pool.slab.kind
        rows.append([label, kb, f"batch_set_{v}", slab_kind, gbs["set"], gbs["memcpy in"], gbs["set"] / gbs["memcpy in"],
                     per_batch["index store"], floor["set"]])
        rows.append([label, kb, f"batch_get_{v}", slab_kind, gbs["get"], gbs["memcpy out"],
                     gbs["get"] / gbs["memcpy out"], per_batch["index locate"], floor["get"]])
    backend.close()
    return rows


# -- part 3: DSA-shaped pools through the controller stack SGLang's server builds ------------------------

# GLM-5 / DeepSeek-V3.2 per token and layer: the MLA latent (kv_lora_rank 512 + rope 64, bf16) and the
# indexer's 128 fp8 key bytes + one fp32 scale; 64-token pages (SGLang's DSA page); few layers.
DSA_GEOMETRY = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "layers": 2}
DSA_PAGE = 64


def _part3(cp: int, chains: list[list[str]], slab_pages: int, lag: int) -> list[list[Any]]:
    return _launch(_dsa_rank, cp, chains, slab_pages, lag, timeout_s=1800, collective_timeout_s=600)[0]


def _dsa_tokens(keys: list[str]) -> list[int]:
    """One 64-token page per chained key: the same prefix gives the same tokens (so SGLang's own page
    hashes chain the same way)."""
    out: list[int] = []
    for key in keys:
        seed = int(key[:8], 16)
        out.extend((seed + 7919 * t) % 50000 + 1 for t in range(DSA_PAGE))
    return out


def _dsa_stack(rank: int, world: int, backend: str, extra: dict) -> Any:
    """SGLang's runtime config, parallel state (attention CP = world, attention TP 1, as SGLang sets
    DSA prefill CP up) and the stack ``_DsaStrategy`` builds, with its storage backend."""
    import sglang.srt.mem_cache.pool_host.common as host_common
    import torch
    import torch.distributed as dist
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _DsaStrategy
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.server_args import ServerArgs

    host_common._cuda_host_register = lambda *a, **k: None  # no GPU: plain CPU host pools
    args = ServerArgs(model_path="dummy", hicache_mem_layout="page_first_direct", hicache_io_backend="direct",
                      hicache_ratio=2.0)
    runtime_context.publish(args, role="scheduler")
    runtime_context.get_parallel().override_permanently(
        tp_rank=rank, tp_size=world, pp_rank=0, pp_size=1, attn_cp_rank=rank, attn_cp_size=world, attn_tp_rank=0,
        attn_tp_size=1, attn_dp_rank=0, attn_dp_size=1, attn_dcp_rank=0, attn_dcp_size=1, moe_ep_size=1,
        moe_dp_size=1, moe_tp_size=world)
    cp_group = dist.new_group(list(range(world)), backend="gloo")
    g = DSA_GEOMETRY
    tokens = 64 * DSA_PAGE * 8
    kv = DSATokenToKVPool(tokens, DSA_PAGE, g["kv_lora_rank"], torch.bfloat16, g["qk_rope_head_dim"], g["layers"], "cpu",
                          128, False, g["kv_lora_rank"] + g["qk_rope_head_dim"])
    alloc = PagedTokenToKVPoolAllocator(kv.size, DSA_PAGE, torch.bfloat16, "cpu", kv, False)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc,
                             page_size=DSA_PAGE, tp_cache_group=cp_group, attn_cp_cache_group=cp_group)
    result = _DsaStrategy().build(cache=None, kvcache=kv, params=params, server_args=args,
                                  load_cache_event=threading.Event(), storage_backend=backend,
                                  storage_backend_extra_config=extra, prefetch_threshold=DSA_PAGE)
    for entry in result.host_pool_group.entries:
        entry.host_pool.pin_memory = False
    return result


def _dsa_rank(rank: int, world: int, chains: list[list[str]], slab_pages: int, lag: int) -> list[list[Any]]:
    """One CP rank of part 3: the trace through cpkv's backend, then SGLang's file backend."""
    _quiet()
    import torch.distributed as dist

    group: Any = dist.new_group(list(range(world)), backend="gloo")
    rows = []
    # One directory for the node, as a server's ranks share one --hicache-storage path.
    made = tempfile.mkdtemp(prefix="cpkv-bench-dsa-file-") if rank == 0 else None
    shared: list[Any] = [None] * world
    dist.all_gather_object(shared, made, group=group)
    files = shared[0]
    try:
        for name, backend, extra in (
                ("cpkv (one slab per node)", "dynamic", {
                    "backend_name": "cpkv", "module_path": "cpkv.integrations.sglang",
                    "class_name": "CpkvHiCacheStorage", "interface_v1": 1, "cpkv_pages": slab_pages,
                    "cpkv_timeout_s": 600}),
                ("SGLang file, unbounded", "file", {"file_storage_path": files})):
            rows.append([name, *_dsa_replay(rank, world, group, backend, extra, chains, lag, files)])
    finally:
        dist.barrier(group=group)
        if made is not None:
            import shutil

            shutil.rmtree(made, ignore_errors=True)
    return rows


def _dsa_replay(rank: int, world: int, group: Any, backend: str, extra: dict, chains: list[list[str]], lag: int,
                files: str) -> list[Any]:
    """The trace driven as the scheduler drives the controller (prefetch with the indexer sidecar, MIN,
    load; write_storage with it; rank 1 ``lag`` requests late): (host bytes per unique token, synced
    hit tokens, hit tokens removed by the MIN, removed / best rank's hits)."""
    import torch.distributed as dist
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    from sglang.srt.mem_cache.hicache_storage import PoolTransfer
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    stack = _dsa_stack(rank, world, backend, extra)
    ctl, pools = stack.cache_controller, stack.host_pool_group
    store = ctl.storage_backend
    if not hasattr(store, "exists_log"):  # SGLang's backends do not log their hit queries
        log: list[int] = []
        inner = store.batch_exists_v2

        def counted(keys: Any, transfers: Any = None, extra_info: Any = None) -> Any:
            res = inner(keys, transfers, extra_info)
            log.append(res.kv_hit_pages)
            return res

        store.batch_exists_v2 = counted
        store.exists_log = log

    def sidecars(keys: Any) -> list[Any]:
        return [PoolTransfer(name=s.pool_name, keys=keys, hit_policy=s.hit_policy,
                             indices_from_pool=s.indices_from_pool) for s in stack.sidecars]

    def backup(keys: list[str]) -> None:
        tokens = _dsa_tokens(keys)
        hashes = get_storage_hash_str(tokens, None, page_size=DSA_PAGE)
        idx = pools.alloc(len(tokens))
        ctl.write_storage(idx, tokens, hash_value=hashes, prefix_keys=None, extra_pools=sidecars(hashes))
        ctl.ack_backup_queue.get(timeout=600)
        pools.free(idx)

    pre_hits, post_hits, pending = [], [], []
    my_lag = lag if rank == 1 else 0
    stored: set[str] = set()
    for i, keys in enumerate(chains):
        before = len(store.exists_log)
        op = ctl.prefetch(CacheRequestHandle(f"r{i}", 0), _dsa_tokens(keys), None, prefix_keys=None,
                          extra_pools=sidecars(None))
        got = ctl.prefetch_hit_queue.get(timeout=600)
        assert got is op
        pre_hits.append(sum(store.exists_log[before:]))
        post_hits.append(got.storage_hit_count // DSA_PAGE)
        if got.storage_hit_count:
            got.host_indices = ctl.alloc_prefetch_host_buffers(got, got.storage_hit_count)
            ctl.prefetch_buffer.put(got)
            while not ctl.ack_prefetch_queue.get(timeout=600).completed_req:
                pass
            pools.free(got.host_indices)
        pending.append(keys)
        while len(pending) > my_lag:
            k = pending.pop(0)
            backup(k)
            stored.update(k)
    for k in pending:
        backup(k)
        stored.update(k)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, pre_hits, group=group)
    best = [max(col) for col in zip(*everyone)]
    removed = sum(b - p for b, p in zip(best, post_hits)) * DSA_PAGE
    unique_tokens = len(stored) * DSA_PAGE
    if backend == "file":
        dist.barrier(group=group)
        used_bytes = sum(p.stat().st_size for p in Path(files).glob("*.bin"))  # the node's one directory
    else:
        store.wait_checks(600)
        used_bytes = sum(store.slab_bytes_in_use(p) for p in store.pools)  # one node
    dist.barrier(group=group)
    ctl.detach_storage_backend()
    return [used_bytes / max(unique_tokens, 1), sum(post_hits) * DSA_PAGE, removed,
            removed / max(sum(best) * DSA_PAGE, 1)]

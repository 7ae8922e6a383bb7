"""The cache-controller stack SGLang's server builds, in gloo processes acting as its ranks.

``launch(world, scenario, **options)`` starts ``world`` ranks (cpkv's launcher, ``run_ranks``: gloo set
up, a rank that dies named, none outliving the test). Each publishes SGLang's runtime config
(``ServerArgs`` with HiCache on, page_first_direct, direct IO) and its parallel state (attention DP x CP
x TP as SGLang numbers them), then builds the stack the server's ``UnifiedRadixCache`` builds, through
SGLang's own strategy objects:

- ``kind="gqa"``: ``MHATokenToKVPool`` on "cpu" and ``_PlainKvStrategy`` (``build_kv_only_stack``: an
  ``MHATokenToKVPoolHost`` in a ``HostPoolGroup`` under a ``HybridCacheController``);
- ``kind="dsa"``: ``DSATokenToKVPool`` (MLA latent + the DSA indexer, GLM-5/DeepSeek-V3.2's pool) and
  ``_DsaStrategy`` (``MLATokenToKVPoolHost`` + ``DSAIndexerPoolHost``, the indexer a sidecar whose
  indices come from the KV pool);
- ``kind="mla"``: ``MLATokenToKVPool`` (plain MLA, the latent only) and ``_PlainKvStrategy`` with an
  ``MLATokenToKVPoolHost``;

with a storage backend (cpkv's through ``dynamic``, or SGLang's ``file``), then drives it the way
SGLang's scheduler does: ``write_storage`` with the sidecar transfers ``_build_sidecar_transfers``
makes, the backup acks, ``prefetch`` with the prefetch sidecars, the hit queue, the host allocation,
the prefetch buffer and its acks. Each rank returns what it saw; ``launch`` returns the ranks'
results in rank order.

Nothing here mocks SGLang: the controller's threads, its writer election, its MIN hit syncs over the
attention-CP and attention-TP groups and the storage factory are SGLang's. One shim: the host pools
register their memory with CUDA (``_cuda_host_register``) and pin their scratch pages, which cannot
run without a GPU; the registration is replaced by a no-op and ``pin_memory`` set false, so the pools
are plain unpinned CPU memory. Every wait has a timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

WAIT_S = 60.0  # any single wait inside a rank
CPKV = {"backend_name": "cpkv", "module_path": "cpkv.integrations.sglang", "class_name": "CpkvHiCacheStorage"}
DSA_PAGE = 64  # SGLang 0.5.23 runs DSA with 64-token pages
# What every rank imports (tens of seconds of imports per process on a loaded machine).
SGLANG_MODULES = ("sglang.srt.server_args", "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler",
                  "sglang.srt.mem_cache.memory_pool", "cpkv.integrations.sglang")


def launch(world: int, scenario: str, wall_s: float = 300.0, **options: Any) -> list[dict]:
    """Runs ``scenario`` on ``world`` ranks through cpkv's launcher; returns each rank's result (None
    for a rank that died)."""
    from cpkv.integrations.sglang.toolchain import interpreter_tools_env
    from cpkv.runtime.launch import preload, run_ranks

    preload(*SGLANG_MODULES)  # imported once by the forkserver, not by every rank of every launch
    results = run_ranks(_rank_entry, world, scenario, options, timeout_s=wall_s, collective_timeout_s=WAIT_S,
                        env=interpreter_tools_env(), expect_failures=True, deaths_as_text=True)
    errors = [(r, res["error"]) for r, res in enumerate(results) if isinstance(res, dict) and res.get("error")]
    if errors:
        raise AssertionError("rank failed: " + "\n".join(f"rank {r}: {e}" for r, e in errors))
    hung = [r for r, res in enumerate(results) if res is None]
    if hung:
        raise AssertionError(f"ranks {hung} did not finish within {wall_s:g} s")
    return [res if isinstance(res, dict) else None for res in results]  # a death is named by a text


def _rank_entry(rank: int, world: int, scenario: str, options: dict) -> dict:
    """One rank (torch.distributed already set up by the launcher): the scenario's result as plain
    JSON values (lists, string keys), or the traceback of what it raised."""
    import warnings

    warnings.filterwarnings("ignore")
    try:
        result = SCENARIOS[scenario](Rank(rank, world, options), **options.get("args", {}))
        return json.loads(json.dumps(result))
    except BaseException:  # noqa: BLE001 -- reported to the test process
        return {"error": traceback.format_exc()}


# -- one rank's world ------------------------------------------------------------------------------


def page_bytes(key: str, tag: str, nbytes: int) -> Any:
    """The bytes a page of ``key`` holds in one pool (``tag``: the pool and whose content it is)."""
    import numpy as np

    seed = int.from_bytes(hashlib.blake2b(f"{key}/{tag}".encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def _publish_server_args(kv_cache_dtype: str = "auto") -> Any:
    import sglang.srt.mem_cache.pool_host.common as host_common
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    host_common._cuda_host_register = lambda *args, **kwargs: None  # no GPU: plain CPU host pools
    args = ServerArgs(model_path="dummy", hicache_mem_layout="page_first_direct", hicache_io_backend="direct",
                      hicache_ratio=2.0, kv_cache_dtype=kv_cache_dtype)
    runtime_context.publish(args, role="scheduler")
    return args


class Rank:
    def __init__(self, rank: int, world: int, options: dict) -> None:
        import torch.distributed as dist

        self.rank, self.world, self.options = rank, world, options
        self.kind = options.get("kind", "gqa")
        # The device pool's dtype (torch's name): what SGLang's model runner makes of --kv-cache-dtype auto.
        self.kv_dtype = options.get("kv_dtype") or ("float16" if self.kind == "gqa" else "bfloat16")
        self.server_args = _publish_server_args()
        from sglang.srt.runtime_context import get_parallel

        # TP = world = attention DP x CP x TP, numbered as SGLang does:
        # tp_rank = (attn_dp_rank * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank.
        dp = options.get("dp", 1)
        cp = options.get("cp", world // dp)
        tp = world // (dp * cp)
        self.dp, self.cp, self.tp = dp, cp, tp
        self.dp_rank, rest = divmod(rank, cp * tp)
        self.cp_rank, self.attn_tp_rank = divmod(rest, tp)
        get_parallel().override_permanently(
            tp_rank=rank, tp_size=world, pp_rank=0, pp_size=1, attn_cp_rank=self.cp_rank, attn_cp_size=cp,
            attn_tp_rank=self.attn_tp_rank, attn_tp_size=tp, attn_dp_rank=self.dp_rank, attn_dp_size=dp,
            attn_dcp_rank=0, attn_dcp_size=1, moe_ep_size=1, moe_dp_size=1, moe_tp_size=world)

        def number(d: int, c: int, t: int) -> int:
            return (d * cp + c) * tp + t

        # Every rank creates every group, in one order: attention CP (per DP, TP), attention TP (per DP, CP).
        self.cp_group = self.tp_group = None
        for d in range(dp):
            for t in range(tp):
                group = dist.new_group([number(d, c, t) for c in range(cp)], backend="gloo")
                if (d, t) == (self.dp_rank, self.attn_tp_rank):
                    self.cp_group = group
            for c in range(cp):
                group = dist.new_group([number(d, c, t) for t in range(tp)], backend="gloo")
                if (d, c) == (self.dp_rank, self.cp_rank):
                    self.tp_group = group
        self.test_group = dist.new_group(list(range(world)), backend="gloo")  # the test's own barriers
        self.page_size = DSA_PAGE if self.kind == "dsa" else options.get("page_size", 4)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.test_group)

    # -- the stack the server builds ----------------------------------------------------------------

    def device_pool(self, layers: int = 2, tokens: int = 2048) -> Any:
        import torch

        ps = self.page_size
        if self.kind == "dsa":
            from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

            geo = self.options.get("geometry", {})
            # MLA latent (kv_lora_rank + qk_rope_head_dim) in bf16, the indexer's 128-dim fp8 keys + scales.
            return DSATokenToKVPool(tokens, ps, geo.get("kv_lora_rank", 16), torch.bfloat16,
                                    geo.get("qk_rope_head_dim", 8), geo.get("layers", layers), "cpu", 128, False,
                                    geo.get("kv_lora_rank", 16) + geo.get("qk_rope_head_dim", 8))
        geo = self.options.get("geometry", {})
        if self.kind == "mla":  # plain MLA (DeepSeek-V3 without the indexer): the latent only
            from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

            return MLATokenToKVPool(tokens, ps, getattr(torch, self.kv_dtype), geo.get("kv_lora_rank", 16),
                                    geo.get("qk_rope_head_dim", 8), geo.get("layers", layers), "cpu", False,
                                    start_layer=0, end_layer=geo.get("layers", layers) - 1)
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        return MHATokenToKVPool(tokens, ps, getattr(torch, self.kv_dtype), geo.get("heads", 2), geo.get("head_dim", 8),
                                geo.get("layers", layers), "cpu", False, start_layer=0,
                                end_layer=geo.get("layers", layers) - 1)

    def controller(self, backend: str = "dynamic", extra: dict | None = None) -> Any:
        import torch
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.hicache_storage import PoolName
        from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _select_strategy
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        self.kv = self.device_pool()
        self.alloc = PagedTokenToKVPoolAllocator(self.kv.size, self.page_size, getattr(torch, self.kv_dtype), "cpu",
                                                 self.kv, False)
        params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.alloc,
                                 page_size=self.page_size, tp_cache_group=self.test_group,
                                 attn_cp_cache_group=self.cp_group, attn_tp_cache_group=self.tp_group)
        # The strategy the server's UnifiedRadixCache selects for this device pool.
        strategy = _select_strategy(self.kv, {ComponentType.FULL})
        self.strategy = type(strategy).__name__
        result = strategy.build(cache=None, kvcache=self.kv, params=params, server_args=self.server_args,
                                load_cache_event=threading.Event(), storage_backend=backend,
                                storage_backend_extra_config=dict(extra or {}), prefetch_threshold=self.page_size,
                                model_name=self.options.get("model"))
        self.ctl = result.cache_controller
        self.group = result.host_pool_group
        for entry in self.group.entries:  # the no-GPU shim: scratch pages (the tensor calls') unpinned too
            entry.host_pool.pin_memory = False
        self.sidecars = result.sidecars
        self.host = self.group.get_pool(PoolName.KV)
        self.side_host = self.group.get_pool(PoolName.INDEXER) if self.kind == "dsa" else None
        self.backend = self.ctl.storage_backend
        return self.ctl

    def sidecar_transfers(self, keys: list[str] | None) -> list[Any] | None:
        """What UnifiedRadixCache._build_sidecar_transfers makes: one PoolTransfer per sidecar spec,
        its indices from the KV pool's (``keys`` None for a prefetch)."""
        from sglang.srt.mem_cache.hicache_storage import PoolTransfer

        out = [PoolTransfer(name=s.pool_name, keys=keys, hit_policy=s.hit_policy, indices_from_pool=s.indices_from_pool)
               for s in self.sidecars]
        return out or None

    # -- content ----------------------------------------------------------------------------------

    def tag(self) -> str:
        """The same on every rank that holds the same content: GQA attention-TP ranks hold other
        heads; an MLA model's latent is the same on every rank."""
        return f"tp{self.attn_tp_rank}" if self.kind == "gqa" else "all"

    def fill(self, host: Any, indices: Any, hashes: list[str], pool: str = "kv") -> None:
        import torch

        nbytes = host.get_data_page(int(indices[0])).numel() * host.get_data_page(int(indices[0])).element_size()
        dtype = host.get_data_page(int(indices[0])).dtype
        for i, h in enumerate(hashes):
            data = torch.from_numpy(page_bytes(h, f"{pool}/{self.tag()}", nbytes)).view(dtype)
            host.set_from_flat_data_page(int(indices[i * self.page_size]), data)

    def check(self, host: Any, indices: Any, hashes: list[str], pool: str = "kv") -> int:
        """Pages whose bytes are wrong."""
        import numpy as np
        import torch

        wrong = 0
        for i, h in enumerate(hashes):
            got = host.get_data_page(int(indices[i * self.page_size])).contiguous().view(-1).view(torch.uint8).numpy()
            if not np.array_equal(got, page_bytes(h, f"{pool}/{self.tag()}", got.size)):
                wrong += 1
        return wrong

    # -- SGLang's scheduler side ------------------------------------------------------------------

    def hashes(self, tokens: list[int]) -> list[str]:
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        return get_storage_hash_str(tokens, None, page_size=self.page_size)

    def write(self, tokens: list[int]) -> tuple[Any, list[str]]:
        """Fills host pages with the request's content and hands them to the backup thread."""
        hashes = self.hashes(tokens)
        n = len(hashes) * self.page_size
        idx = self.group.alloc(n)
        assert idx is not None, "host pool full"
        self.fill(self.host, idx, hashes)
        if self.side_host is not None:
            self.fill(self.side_host, idx, hashes, "indexer")
        self.ctl.write_storage(idx, tokens[:n], hash_value=hashes, prefix_keys=None,
                               extra_pools=self.sidecar_transfers(hashes))
        return idx, hashes

    def wait_backup(self, idx: Any) -> Any:
        op = self.ctl.ack_backup_queue.get(timeout=WAIT_S)
        self.group.free(idx)
        return op

    def prefetch(self, rid: str, tokens: list[int]) -> dict:
        """One prefetch as SGLang's scheduler drives it; returns the hit counts and the check."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        before = len(getattr(self.backend, "exists_log", []))
        op = self.ctl.prefetch(CacheRequestHandle(rid, 0), tokens, None, prefix_keys=None,
                               extra_pools=self.sidecar_transfers(None))
        got = self.ctl.prefetch_hit_queue.get(timeout=WAIT_S)
        assert got is op
        log = getattr(self.backend, "exists_log", None)
        pre = sum(log[before:]) * self.page_size if log is not None else None
        result = {"pre": pre, "post": got.storage_hit_count, "loaded": 0, "wrong": 0, "sidecar_wrong": 0}
        if got.storage_hit_count == 0:
            return result
        dst = self.ctl.alloc_prefetch_host_buffers(got, got.storage_hit_count)
        assert dst is not None, "host pool full"
        got.host_indices = dst
        self.ctl.prefetch_buffer.put(got)
        while True:
            ack = self.ctl.ack_prefetch_queue.get(timeout=WAIT_S)
            if ack.completed_req:
                break
            if ack.completed_tokens is not None:  # None: the sidecar ack (its pool hits)
                result["loaded"] = ack.completed_tokens
        pages = result["loaded"] // self.page_size
        result["wrong"] = self.check(self.host, dst, got.hash_value[:pages])
        if self.side_host is not None:
            result["sidecar_wrong"] = self.check(self.side_host, dst, got.hash_value[:pages], "indexer")
        self.group.free(dst)
        return result


# -- workloads -------------------------------------------------------------------------------------


def shared_prefix_requests(n: int, seed: int, page_size: int, prefixes: int = 6,
                           max_pages: int = 24) -> list[list[int]]:
    """Requests that share prefixes (a few documents, varying continuations), whole pages only."""
    import random

    rng = random.Random(seed)
    docs = [[rng.randrange(1, 50000) for _ in range(max_pages * page_size)] for _ in range(prefixes)]
    out = []
    for _ in range(n):
        doc = docs[rng.randrange(prefixes)]
        keep = rng.randrange(1, max_pages // 2) * page_size
        tail = [rng.randrange(1, 50000) for _ in range(rng.randrange(1, max_pages // 2) * page_size)]
        out.append(doc[:keep] + tail)
    return out


def _cpkv_extra(options: dict, **more: Any) -> dict:
    extra = dict(CPKV, interface_v1=int(options.get("v1", True)), cpkv_pages=options.get("pages", 4096),
                 cpkv_check_every=options.get("check_every", 4), cpkv_timeout_s=options.get("timeout_s", 20))
    if options.get("ranks_per_node"):
        extra["cpkv_ranks_per_node"] = options["ranks_per_node"]
    extra.update(more)
    return extra


def _finish(r: Rank, out: dict) -> dict:
    r.barrier()
    r.backend.close()
    return out


def roundtrip(r: Rank, requests: int = 8, seed: int = 1) -> dict:
    """Every rank hands the same requests to its backup thread, then every rank prefetches each one."""
    r.controller("dynamic", _cpkv_extra(r.options))
    # Each attention-DP group is a scheduler of its own: its own requests.
    reqs = shared_prefix_requests(requests, seed + 100 * r.dp_rank, r.page_size, max_pages=12 if r.kind == "dsa" else 24)
    distinct: set[str] = set()
    for tokens in reqs:
        idx, hashes = r.write(tokens)
        op = r.wait_backup(idx)
        assert op.completed_tokens == len(hashes) * r.page_size, (op.completed_tokens, len(hashes))
        distinct.update(hashes)
    r.barrier()
    fetched = [r.prefetch(f"req{i}", tokens) for i, tokens in enumerate(reqs)]
    r.backend.wait_checks(WAIT_S)
    out = {"fetched": fetched, "stats": r.backend.stats(), "distinct_pages": len(distinct),
           "pages": [len(t) // r.page_size for t in reqs], "digest": r.backend.digest(), "strategy": r.strategy,
           "controller": type(r.ctl).__name__, "writer": r.ctl.storage_config.is_storage_writer,
           "slab_bytes_in_use": {name: r.backend.slab_bytes_in_use(name) for name in r.backend.pools},
           "page_bytes": {name: p.page_bytes for name, p in r.backend.pools.items()}}
    return _finish(r, out)


def pressure(r: Rank, requests: int = 40, seed: int = 2, backend: str = "cpkv", lag: int = 0,
             max_bytes: int | None = None) -> dict:
    """A replayed stream over a store much smaller than its distinct pages: per request, prefetch
    (hit counts before and after SGLang's MIN), load and check the hits, then store the request.

    ``lag`` = 0: every rank's stores finish (barrier) before the next prefetch. ``lag`` = k > 0:
    rank 1 hands each request to its backup thread k requests late (ranks skewed in timing; no
    barrier), so what the MIN removes shows."""
    if backend == "cpkv":
        r.controller("dynamic", _cpkv_extra(r.options))
    else:
        extra: dict = {"file_storage_path": r.options["file_dir"]}
        if max_bytes:
            extra["max_size"] = str(max_bytes)
        r.controller("file", extra)
        _count_exists(r.backend)
    reqs = shared_prefix_requests(requests, seed, r.page_size, prefixes=8, max_pages=12 if r.kind == "dsa" else 32)
    fetched = _serve_skewed(r, reqs, lag, "req", lockstep=lag == 0)
    r.barrier()
    out: dict = {"fetched": fetched, "distinct_pages": len({h for t in reqs for h in r.hashes(t)})}
    if backend == "cpkv":
        r.backend.wait_checks(WAIT_S)
        out.update(stats=r.backend.stats(), digest=r.backend.digest(),
                   slab_bytes_in_use=r.backend.slab_bytes_in_use(), page_bytes=r.backend.pools["kv"].page_bytes)
        return _finish(r, out)
    r.barrier()
    return out


def _l3_extra(r: Rank) -> dict:
    extra = _cpkv_extra(r.options)
    if r.options.get("l3_dir"):
        extra.update(cpkv_l3_dir=r.options["l3_dir"], cpkv_l3_bytes=r.options["l3_bytes"])
    if r.options.get("staging_pages"):
        extra["cpkv_l3_staging_pages"] = r.options["staging_pages"]
    return extra


def _late_reads(r: Rank, marks: str) -> None:
    """Makes this rank's L3 reads late: its n-th ``batch_get_v1`` (SGLang's prefetch I/O thread calls
    it) starts only once rank 0's n-th has returned (rank 0 leaves a file per call in ``marks``), so
    rank 0 reads every record first and this rank comes to each after it (a condition, not a sleep)."""
    backend = r.backend
    inner = backend.batch_get_v1
    calls = [0]

    def after_rank0(keys: Any, host_indices: Any, extra_info: Any = None) -> Any:
        n = calls[0]
        calls[0] += 1
        mark = Path(marks) / f"get-{n}"
        if r.rank == 0:
            result = inner(keys, host_indices, extra_info)
            mark.write_text("done")
            return result
        deadline = time.monotonic() + WAIT_S
        while not mark.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 never finished its read {n}")
            time.sleep(0.002)
        return inner(keys, host_indices, extra_info)

    backend.batch_get_v1 = after_rank0


def l3(r: Rank, phase: str, requests: int = 24, seed: int = 5, lag: int = 0, late_reads: str | None = None) -> dict:
    """The L3 tier under a small slab. ``phase="fill"``: every rank stores the requests (rank 1 ``lag``
    requests late: its backup thread reaches each store after rank 0 has already reused the rows),
    then every rank prefetches each request (slab and L3 hits, bytes checked) and closes (a clean
    stop). ``phase="warm"``: new processes on the same directory prefetch each request and check
    every byte loaded; nothing is stored. ``late_reads`` (a directory): every rank but 0 makes each
    of its L3 reads after rank 0's (:func:`_late_reads`)."""
    r.controller("dynamic", _l3_extra(r))
    if late_reads:
        _late_reads(r, late_reads)
    reqs = shared_prefix_requests(requests, seed, r.page_size, prefixes=8, max_pages=12 if r.kind == "dsa" else 32)
    if phase == "fill":
        pending: list[list[int]] = []
        my_lag = lag if r.rank == 1 else 0
        for tokens in reqs:
            pending.append(tokens)
            while len(pending) > my_lag:
                idx, _ = r.write(pending.pop(0))
                r.wait_backup(idx)
        for tokens in pending:
            idx, _ = r.write(tokens)
            r.wait_backup(idx)
        r.barrier()
    started = time.perf_counter()
    fetched = [r.prefetch(f"req{i}", tokens) for i, tokens in enumerate(reqs)]
    prefetch_s = time.perf_counter() - started
    r.backend.wait_checks(WAIT_S)
    r.barrier()
    stats_open = r.backend.stats()
    loaded = {h for f, t in zip(fetched, reqs) for h in r.hashes(t)[:f["loaded"] // r.page_size]}
    out = {"fetched": fetched, "stats": stats_open, "digest": r.backend.digest(), "prefetch_s": prefetch_s,
           "distinct_pages": len({h for t in reqs for h in r.hashes(t)}), "distinct_loaded": len(loaded),
           "page_bytes": r.backend.pools["kv"].page_bytes,
           "pool_page_bytes": {name: p.page_bytes for name, p in r.backend.pools.items()}}
    r.barrier()
    r.backend.close()
    if r.backend.l3 is not None:
        closed = r.backend.l3.stats()
        names = ("l3_pages_spilled", "l3_pages_written", "l3_pages_not_copied", "l3_pages", "l3_digest", "l3_dir",
                 "l3_disk_bytes", "l3_cap_bytes", "l3_slots", "l3_read_failures")
        out["closed"] = {k: closed[k] for k in names}
        out["closed"]["pools"] = {pool: {k: s[k] for k in names} for pool, s in closed["l3_pools"].items()}
    r.barrier()
    return out


def _serve_skewed(r: Rank, reqs: list[list[int]], lag: int, name: str, lockstep: bool = False) -> list[dict]:
    """SGLang's prefetch of each request, then its store, rank 1's stores (and so its backups and
    spills) ``lag`` requests behind rank 0's; with ``lockstep`` a barrier after every request.
    Returns each prefetch's outcome."""
    fetched, pending = [], []
    my_lag = lag if r.rank == 1 else 0
    for i, tokens in enumerate(reqs):
        fetched.append(r.prefetch(f"{name}{i}", tokens))
        pending.append(tokens)
        while len(pending) > my_lag:
            idx, _ = r.write(pending.pop(0))
            r.wait_backup(idx)
        if lockstep:
            r.barrier()
    for tokens in pending:
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    return fetched


def l3_skew(r: Rank, root: str, lags: list[int], requests: int = 16, seed: int = 9) -> dict:
    """Per lag, on a fresh directory ``root/lag<k>`` under the given tiny ``l3_bytes``: SGLang's
    prefetch of each request (reads, hits loaded and checked), then its store, rank 1's backup thread
    ``k`` requests late (its spills, and so its L3 writes, behind rank 0's: rank 0 reads records rank
    1 has not written yet, and rank 1 writes into slots rank 0 has already reused). Once rank 1 has
    caught up (barrier), every page every pool's L3 index holds is read back through the backend's own
    batch_get_v1 / batch_get_v2 on every rank: none may be refused, none wrong. Then a clean stop
    (the slab's pages spill to L3 too); the test reads the directory's records."""
    out: dict = {}
    for lag in lags:
        r.options["l3_dir"] = f"{root}/lag{lag}"
        if r.rank == 0:
            Path(r.options["l3_dir"]).mkdir()
        r.barrier()
        r.controller("dynamic", _l3_extra(r))
        reqs = shared_prefix_requests(requests, seed + lag, r.page_size, prefixes=4, max_pages=12)  # fit the slab
        fetched = _serve_skewed(r, reqs, lag, f"lag{lag}-req")
        r.backend.wait_checks(WAIT_S)
        r.barrier()  # every rank's spills written
        tier = r.backend.l3
        assert tier is not None
        held = _l3_held(r, reqs)
        back = _read_back(r, held)
        stats = r.backend.stats()
        logged_open = lost_open = 0
        if r.rank == 0:  # every record the logs name, checked on disk while the stores are open
            from l3_files import lost_records

            for name, l3 in tier.pools.items():
                n, bad = lost_records(l3.path, r.world, r.backend.pools[name].page_bytes)
                logged_open, lost_open = logged_open + n, lost_open + bad
        r.barrier()  # every rank read back before any closes
        r.backend.close()
        closed = tier.stats()
        out[str(lag)] = {"held": len(held), "logged_open": logged_open, "lost_open": lost_open, "refused": sum(not ok for ok in back["served"].values()),
                         "wrong": len(back["wrong"]) + sum(f["wrong"] + f.get("sidecar_wrong", 0) for f in fetched),
                         "loaded": sum(f["loaded"] for f in fetched), "dir": closed["l3_dir"],
                         "slots": closed["l3_slots"], "pools": list(tier.pools),
                         "page_bytes": {name: p.page_bytes for name, p in r.backend.pools.items()},
                         "not_written": sum(s.get("l3_reads_not_written", 0) for s in stats["l3_pools"].values()),
                         "superseded": sum(l3.store.counters.get("pages_superseded", 0) for l3 in tier.pools.values())}
        r.barrier()
    return out


def l3_read_before_write(r: Rank, requests: int = 16, seed: int = 9) -> dict:
    """Rank 0 stores every request (spilling to L3, writing its share) and reads back every page L3
    holds before rank 1, the writer of the rest, has stored anything; then rank 1 catches up, and
    both ranks read back every page L3 holds. (Run with a long digest-check period: rank 0's checks
    would otherwise wait on rank 1's for longer than their timeout.)"""
    r.controller("dynamic", _l3_extra(r))
    reqs = shared_prefix_requests(requests, seed, r.page_size, prefixes=4, max_pages=12)

    def store_all() -> None:
        for tokens in reqs:
            idx, _ = r.write(tokens)
            r.wait_backup(idx)

    early = None
    if r.rank == 0:
        store_all()
        early = _read_back(r, _l3_held(r, reqs))
    r.barrier()
    if r.rank != 0:
        store_all()
    r.barrier()  # every rank's spills written
    held = _l3_held(r, reqs)
    late = _read_back(r, held)
    r.backend.wait_checks(WAIT_S)
    early_out = None if early is None else {"served": sum(early["served"].values()), "wrong": len(early["wrong"])}
    return _finish(r, {"held": len(held), "early": early_out, "served": sum(late["served"].values()),
                       "wrong": len(late["wrong"]), "stats": r.backend.stats()})


def _l3_held(r: Rank, reqs: list[list[int]]) -> list[str]:
    """The requests' distinct pages that every pool's L3 index holds (its index, not the backend's
    answer: a page this rank refused is still held)."""
    from cpkv.integrations.sglang.l3 import l3_key

    assert r.backend.l3 is not None
    pools = r.backend.l3.pools.values()
    return [h for h in dict.fromkeys(h for t in reqs for h in r.hashes(t))
            if all(l3.store.index.peek(l3_key(h)) is not None for l3 in pools)]


def l3_formats(r: Rank, fill: dict, reopen: list[dict], requests: int = 6, seed: int = 9) -> dict:
    """Server lives one after another, each with its own ``--kv-cache-dtype`` (``kv_cache_dtype``), the
    device pool dtype SGLang's model runner makes of it (``kv_dtype``, torch's name) and optionally its
    ``geometry``. ``fill`` stores the requests on ``l3_dir`` and stops as SGLang detaches a backend
    (every page goes to L3 at the clean stop); each of ``reopen`` runs on its own copy of the filled
    directory (a namespace that differs starts a store afresh), prefetches every request and checks
    the bytes of each page it loads. Per life (the fill's, then each reopened one's): the pages its L3
    recovered, the KV pool's page bytes, the hit tokens after SGLang's MIN, the pages loaded with a
    byte wrong."""
    import shutil

    reqs = shared_prefix_requests(requests, seed, r.page_size, prefixes=3, max_pages=8)
    filled = r.options["l3_dir"]
    out = []
    for life, spec in enumerate([fill, *reopen]):
        r.server_args = _publish_server_args(spec["kv_cache_dtype"])
        r.kv_dtype = spec["kv_dtype"]
        r.options["geometry"] = spec.get("geometry", {})
        if life:
            r.options["l3_dir"] = f"{filled}-{life}"
            if r.rank == 0:
                shutil.copytree(filled, r.options["l3_dir"])
            r.barrier()
        r.controller("dynamic", _l3_extra(r))
        fetched = []
        if life == 0:
            for tokens in reqs:
                idx, _ = r.write(tokens)
                r.wait_backup(idx)
        else:
            fetched = [r.prefetch(f"life{life}-req{i}", tokens) for i, tokens in enumerate(reqs)]
        stats, page_bytes = r.backend.stats(), r.backend.pools["kv"].page_bytes
        r.barrier()
        r.ctl.detach_storage_backend()  # stops SGLang's storage threads and closes the backend
        r.barrier()
        out.append({**spec, "recovered": stats["l3_recovered_pages"], "page_bytes": page_bytes,
                    "hit_tokens": sum(f["post"] for f in fetched), "wrong": sum(f["wrong"] for f in fetched)})
    return {"filled": out[0], "reopened": out[1:]}


def _read_back(r: Rank, keys: list[str]) -> dict:
    """Reads ``keys`` through the backend's own batch_get_v1 (KV) and batch_get_v2 (the DSA indexer)
    into host pages, a few at a time; per key whether every pool served it, and the keys served with
    a byte wrong in any pool."""
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    served: dict[str, bool] = {}
    wrong: list[str] = []
    step = 16
    for start in range(0, len(keys), step):
        part = keys[start:start + step]
        idx = r.group.alloc(len(part) * r.page_size)
        assert idx is not None, "host pool full"
        ok = r.backend.batch_get_v1(part, idx)
        if r.side_host is not None:
            side = r.backend.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=part)])
            ok = [a and b for a, b in zip(ok, side[str(PoolName.INDEXER)])]
        for i, key in enumerate(part):
            served[key] = bool(ok[i])
            page = idx[i * r.page_size:(i + 1) * r.page_size]
            bad = r.check(r.host, page, [key]) if ok[i] else 0
            if ok[i] and r.side_host is not None:
                bad += r.check(r.side_host, page, [key], "indexer")
            if bad:
                wrong.append(key)
        r.group.free(idx)
    return {"served": served, "wrong": wrong}


def l3_crash(r: Rank, run: int, kill_at: list[int], point: int, log_dir: str, runs_before: int) -> dict:
    """One life of a node under SGLang's L3 that ends in a kill -9 of each rank at its own store.

    First the restart check: every page a rank logged as acknowledged durable in an earlier life
    (``acked-*.jsonl``) must be served, by the backend's own reads, with its KV and indexer bytes,
    and no page ever offered may be served with a wrong byte; written to ``verify-<run>-r<rank>.json``
    before anything is stored. Then this life stores new requests (no collective: no barrier, no
    digest check) and logs, after each store operation SGLang acknowledged (the store calls
    returned), the pages this rank wrote to L3 in it. Rank ``i`` SIGKILLs itself at its
    ``kill_at[i]``-th spill with victims (or the next that can take the ``point``): 0 before any
    byte, 1 between the KV store's record and the indexer's, 2 after both (the store call has not
    returned), 3 in the KV store with its records written but not yet synced or logged.
    ``kill_at`` empty: check, then close cleanly."""
    extra = _cpkv_extra(r.options, cpkv_check_every=1 << 20)
    extra.update(cpkv_l3_dir=r.options["l3_dir"], cpkv_l3_bytes=r.options["l3_bytes"])
    r.controller("dynamic", extra)
    b = r.backend
    logs = Path(log_dir)
    acked = [key for f in sorted(logs.glob("acked-*.jsonl")) for line in f.read_text().splitlines()
             for key in json.loads(line)]
    offered = [h for life in range(runs_before) for t in _crash_requests(r, life) for h in r.hashes(t)]
    stats = b.stats()
    verify = {"acked": len(set(acked)), "offered": len(set(offered)), "run_id": b.pools["kv"].slab.run_id,
              "l3_disk_bytes": stats["l3_disk_bytes"], "l3_cap_bytes": stats["l3_cap_bytes"],
              "l3_evicted": {n: p["l3_evicted"] for n, p in stats["l3_pools"].items()},
              "recovered": {n: p["l3_recovered_pages"] for n, p in stats["l3_pools"].items()}}
    got = _read_back(r, sorted(set(offered) | set(acked)))
    verify["acked_missing"] = sorted(k for k in set(acked) if not got["served"].get(k))
    verify["served_wrong"] = got["wrong"]
    verify["served"] = sum(got["served"].values())
    (logs / f"verify-{run}-r{r.rank}.json").write_text(json.dumps(verify))
    r.barrier()
    if not kill_at:
        return _finish(r, verify)
    # -- this life's stores, then the kill ---------------------------------------------------------
    me, node_size = b.topology.local_rank, b.topology.node_size
    tier = b.l3
    spills = 0
    armed = False
    mine: list[str] = []

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    inner_spill = tier.spill

    def spill(keys: Any, rows: Any, copied: Any, pages: Any) -> int:
        nonlocal spills, armed
        if len(keys):
            spills += 1
            armed = armed or spills >= kill_at[r.rank]
        if armed and point == 0 and len(keys):
            die()
        n = inner_spill(keys, rows, copied, pages)
        if armed and point == 2 and len(keys):
            die()
        mine.extend(bytes(k)[:-4].decode() for k, row, c in zip(keys, rows, copied) if c and row % node_size == me)
        return n

    tier.spill = spill
    second, first = tier.pools["indexer"], tier.pools["kv"]
    inner_second, inner_flush = second.spill, first.store.flush

    def second_spill(*args: Any) -> int:
        if armed and point == 1 and len(args[0]):
            die()
        return inner_second(*args)

    def flush() -> int:
        if armed and point == 3 and first.store._pending:
            die()  # records written (pwrite), neither synced nor logged
        return inner_flush()

    second.spill = second_spill
    first.store.flush = flush
    with open(logs / f"acked-{run}-r{r.rank}.jsonl", "a") as log:
        for tokens in _crash_requests(r, run):
            idx, _ = r.write(tokens)
            r.wait_backup(idx)  # every store call of the operation returned: its spills are durable
            log.write(json.dumps(mine) + "\n")
            log.flush()
            mine.clear()
    raise AssertionError(f"rank {r.rank} stored every request of life {run} without reaching spill "
                         f"{kill_at[r.rank]} (it made {spills})")


def l3_diverged(r: Rank, requests: int = 6, odd: int = -1) -> dict:
    """Every rank stores the same requests, with L3 and a digest check after every store; rank
    ``odd`` (the last by default) gives its KV pool's L3 index one extra placement (a key no store
    made, no bytes) after the first request: only that rank's L3 index differs, its slab index does
    not. The next digest check must raise DivergenceError on every rank."""
    extra = _cpkv_extra(r.options, cpkv_check_every=1)
    extra.update(cpkv_l3_dir=r.options["l3_dir"], cpkv_l3_bytes=r.options["l3_bytes"])
    r.controller("dynamic", extra)
    odd = odd % r.world
    reqs = shared_prefix_requests(requests, 6, r.page_size, max_pages=8)
    for i, tokens in enumerate(reqs):
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
        if i == 0:
            r.backend.wait_checks(WAIT_S)  # the first check passed on every rank
            slab_digest = r.backend.digest()
            if r.rank == odd:
                from cpkv.integrations.sglang.l3 import l3_key

                l3 = r.backend.l3.pools["kv"]
                with l3._lock:  # the backup thread is idle: its store was acknowledged
                    l3.store.put([(l3_key("never-stored"), None)], writers=[0])
    try:
        r.backend.wait_checks(WAIT_S)
        error = None
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    return {"error_seen": error, "slab_digest_after_first": slab_digest, "slab_digest": r.backend.digest(),
            "l3_digest": r.backend.l3.digest()}


def l3_full_disk(r: Rank, requests: int = 40, fill_after: int = 2) -> dict:
    """Every rank stores the same requests with L3 and a digest check after every store; after
    request ``fill_after`` rank 0 fills the L3 directory's file system (a file of its own, until
    ENOSPC), so the ranks' next log appends or compactions fail. No rank may see a divergence: the
    L3 indexes stay replicated, and every rank stops writing pages."""
    extra = _cpkv_extra(r.options, cpkv_check_every=1)
    extra.update(cpkv_l3_dir=r.options["l3_dir"], cpkv_l3_bytes=r.options["l3_bytes"])
    r.controller("dynamic", extra)
    reqs = shared_prefix_requests(requests, 7, r.page_size, prefixes=8, max_pages=12 if r.kind == "dsa" else 32)
    for i, tokens in enumerate(reqs):
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
        if i == fill_after:
            r.backend.wait_checks(WAIT_S)
            r.barrier()
            if r.rank == 0:
                with open(Path(r.options["l3_dir"]) / "filler", "wb") as f:
                    try:
                        while True:
                            f.write(b"\1" * (1 << 16))
                            f.flush()
                    except OSError:
                        pass
            r.barrier()
    try:
        r.backend.wait_checks(WAIT_S)
        error = None
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    stats = r.backend.l3.stats()
    out = {"error_seen": error, "digest": r.backend.digest(), "l3_digest": r.backend.l3.digest(),
           "stopped": {name: s.get("l3_stopped") for name, s in stats["l3_pools"].items()},
           "spilled": stats["l3_pages_spilled"], "checks": r.backend.stats()["digest_checks"]}
    r.barrier()
    r.backend.close()
    return out


def l3_second_server(r: Rank) -> dict:
    """With L3 open, every rank builds the L3 tier of a second server on the same directory, as that
    server's ranks would: one of the same layout (the same store group directory), then one of
    another layout (its own group directory beside the live one). Both must be refused by name on
    every rank, and the live server's directory be left as it was."""
    import dataclasses

    from cpkv.integrations.sglang.kv_format import stated_kv_cache_dtype
    from cpkv.integrations.sglang.l3 import SglangL3Tier

    r.controller("dynamic", _l3_extra(r))
    reqs = shared_prefix_requests(6, 3, r.page_size, max_pages=8)
    for tokens in reqs:
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    backend, topo = r.backend, r.backend.topology
    backend.wait_checks(WAIT_S)  # the checker thread is idle: the node group is free for the second tier's open
    digest = backend.l3.digest()
    other_key = (7, 7, 7)
    layouts = {"same": topo, "other": dataclasses.replace(topo, store_key=other_key, machine_nodes=[(other_key, 0)])}
    refusals = {}
    for name, topology in layouts.items():
        try:
            second = SglangL3Tier(r.options["l3_dir"], r.options["l3_bytes"], backend.pools, model="second-server",
                                  kv_cache_dtype=stated_kv_cache_dtype(), topology=topology, tp_size=r.world,
                                  timeout_s=WAIT_S)
            second.close()
            refusals[name] = None
        except Exception as err:  # noqa: BLE001
            refusals[name] = f"{type(err).__name__}: {err}"
    out = {"refusals": refusals, "digest_kept": backend.l3.digest() == digest,
           "dirs": sorted(p.name for p in Path(r.options["l3_dir"]).iterdir() if p.is_dir())}
    r.barrier()
    backend.close()
    return out


def l3_late_pool(r: Rank) -> dict:
    """With L3 open (SGLang's registration burst over), a pool registered later (a dynamic sidecar)
    must be refused with a typed error, and the backend keep working with the pools it had."""
    extra = _cpkv_extra(r.options)
    extra.update(cpkv_l3_dir=r.options["l3_dir"], cpkv_l3_bytes=r.options["l3_bytes"])
    r.controller("dynamic", extra)
    before = list(r.backend.pools)
    try:
        r.backend.register_mem_host_pool_v2(r.side_host, "late-sidecar")
        error = None
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    tokens = [9000 + t for t in range(2 * r.page_size)]
    idx, hashes = r.write(tokens)
    r.wait_backup(idx)
    fetched = r.prefetch("after", tokens)
    return _finish(r, {"error": None, "refused": error, "before": before, "after": list(r.backend.pools),
                       "fetched": fetched, "pages": len(hashes)})


def _crash_requests(r: Rank, life: int) -> list[list[int]]:
    return shared_prefix_requests(40, 1000 + life, r.page_size, prefixes=4, max_pages=8)
def l3_killed_claimant(r: Rank, marker: str, requests: int = 6, seed: int = 5, victim: int = 1) -> dict:
    """New processes on a filled L3 directory. Rank ``victim`` asks the backend for the first
    requests' pages (``batch_exists``, then ``batch_get_v1`` into SGLang's host pool, as SGLang's
    prefetch threads call them), claims their staging entries and dies (SIGKILL) before reading any;
    the others, once it has claimed (``marker`` written), ask for the same pages: they must load every
    one, byte-exact, within the backend's timeout plus the reads, and leave nothing in /dev/shm.
    No collective runs after the kill (SGLang's MIN would wait on the dead rank)."""
    r.controller("dynamic", _l3_extra(r))
    assert r.backend.l3 is not None
    l3 = r.backend.l3.anchor  # the KV pool's L3 and its staging area
    run_id = l3.staging.run_id
    reqs = shared_prefix_requests(requests, seed, r.page_size, prefixes=8, max_pages=32)
    keys = [h for tokens in reqs for h in r.hashes(tokens)]
    keys = list(dict.fromkeys(keys))  # distinct pages, first-seen order
    r.barrier()
    if r.rank == victim:
        def die() -> None:
            Path(marker).write_text("claimed")
            os.kill(os.getpid(), signal.SIGKILL)

        l3.staging.after_claim = die
    else:
        deadline = time.monotonic() + WAIT_S
        while not Path(marker).exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the victim never claimed")
            time.sleep(0.01)
    started = time.monotonic()
    hits = r.backend.batch_exists(keys)
    idx = r.group.alloc(hits * r.page_size)
    ok = r.backend.batch_get_v1(keys[:hits], idx)
    seconds = time.monotonic() - started
    wrong = r.check(r.host, idx, keys[:hits])
    return {"hits": hits, "loaded": sum(ok), "wrong": wrong, "seconds": seconds, "run_id": run_id,
            "stats": r.backend.stats()}


def _count_exists(backend: Any) -> None:
    """Records the hit pages of each hit query of a backend that does not log them itself."""
    log: list[int] = []
    inner, inner_v2 = backend.batch_exists, backend.batch_exists_v2

    def counted(keys: Any, extra_info: Any = None) -> int:
        n = inner(keys, extra_info)
        log.append(n)
        return n

    def counted_v2(keys: Any, pool_transfers: Any = None, extra_info: Any = None) -> Any:
        result = inner_v2(keys, pool_transfers, extra_info)
        log.append(result.kv_hit_pages)
        return result

    backend.batch_exists = counted
    backend.batch_exists_v2 = counted_v2
    backend.exists_log = log


def killed(r: Rank, requests: int = 6, victim: int = 1) -> dict:
    """Rank ``victim`` dies (SIGKILL) in the middle of writing its first page into the slab; the
    others must get a typed error from the backend within its timeout, never serve the page it was
    writing, then exit."""
    import numpy as np

    r.controller("dynamic", _cpkv_extra(r.options, cpkv_check_every=1))
    run_id = r.backend.pools["kv"].slab.run_id
    if r.rank == victim:
        # Dies right after its first write marked its rows invalid, before any byte of them is copied.
        for pool in r.backend.pools.values():
            pool.native.set_write_hook(lambda: os.kill(os.getpid(), signal.SIGKILL))
    reqs = shared_prefix_requests(requests, 3, r.page_size, max_pages=8)
    started = time.monotonic()
    for tokens in reqs:
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    # The error surfaces in the backup thread (SGLang logs it); the backend keeps it.
    deadline = time.monotonic() + WAIT_S
    while r.backend.stats()["broken"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    broken = r.backend.stats()["broken"]
    seconds = time.monotonic() - started
    # The victim's rows were left mid-write: stamped -handle, so no rank reads them.
    torn = sum(int((np.asarray(p.stamps) < 0).sum()) for p in r.backend.pools.values())
    try:
        r.backend.batch_exists(r.hashes(reqs[0]))
        after = None
    except Exception as err:  # noqa: BLE001
        after = type(err).__name__
    return {"broken": broken, "seconds": seconds, "after": after, "run_id": run_id, "torn_rows": torn,
            "pid": os.getpid()}


def diverged(r: Rank, requests: int = 4) -> dict:
    """Rank 1's last store carries a different page than rank 0's: the next digest check must raise
    DivergenceError on every rank."""
    r.controller("dynamic", _cpkv_extra(r.options, cpkv_check_every=1))
    reqs = shared_prefix_requests(requests, 4, r.page_size, max_pages=8)
    if r.rank == 1:
        reqs[-1] = reqs[-1][:-r.page_size] + [7] * r.page_size  # one page the others never store
    for tokens in reqs:
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    try:
        r.backend.wait_checks(WAIT_S)
        error = None
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    return {"error_seen": error, "stats": r.backend.stats()}


def missed_store(r: Rank, requests: int = 8, missed: int = 2) -> dict:
    """Rank 1's backup thread never gets request ``missed`` (its index diverges: every later page
    gets another row or handle there than on rank 0), and the digest check is too far off to catch
    it first. Then every rank prefetches every request: a page is loaded with its own bytes or not
    at all, never with another key's."""
    r.controller("dynamic", _cpkv_extra(r.options, cpkv_check_every=1 << 20))
    reqs = [[1000 * (i + 1) + t for t in range(3 * r.page_size)] for i in range(requests)]  # disjoint, 3 pages
    for i, tokens in enumerate(reqs):
        if r.rank == 1 and i == missed:
            continue
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    r.barrier()
    fetched = [r.prefetch(f"req{i}", tokens) for i, tokens in enumerate(reqs)]
    return _finish(r, {"fetched": fetched, "digest": r.backend.digest(), "stats": r.backend.stats()})


def bad_indices(r: Rank) -> dict:
    """Host indices outside SGLang's host pool, on every v1/v2 path of the backend SGLang built: each
    call raises a typed error naming the index, and changes nothing (index digest, slab stamps, host
    pool and slab bytes)."""
    import numpy as np
    import torch
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    r.controller("dynamic", _cpkv_extra(r.options, cpkv_check_every=1 << 20))
    b = r.backend
    ps = r.page_size
    tokens = [5000 + t for t in range(2 * ps)]
    good, keys = r.write(tokens)
    r.wait_backup(good)
    good = r.group.alloc(2 * ps)
    size = r.host.size

    def page(first: int) -> Any:
        return torch.arange(first, first + ps, dtype=torch.int64)

    bad = {
        "past_end": torch.cat([page(0), page(size)]),
        "far": torch.cat([page(0), page(size * 4096)]),
        "negative": torch.cat([page(0), page(-ps)]),
        "short": page(0),  # one page of indices for two keys
    }
    new_keys = [k + "-new" for k in keys]

    def snapshot() -> tuple:
        pools = [r.host] + ([r.side_host] if r.side_host is not None else [])
        host = [hashlib.blake2b(p.kv_buffer.view(-1).view(torch.uint8).numpy().tobytes()
                                if hasattr(p, "kv_buffer") and p.kv_buffer is not None
                                else p.index_k_with_scale_buffer.numpy().tobytes()).hexdigest() for p in pools]
        slab = [hashlib.blake2b(p.data.numpy().tobytes()).hexdigest() for p in b.pools.values()]
        stamps = [np.asarray(p.stamps).copy().tolist() for p in b.pools.values()]
        return b.digest(), host, slab, stamps

    calls: dict[str, Any] = {
        "batch_set_v1": lambda idx: b.batch_set_v1(new_keys, idx),
        "batch_get_v1": lambda idx: b.batch_get_v1(keys, idx),
        "batch_set_v2": lambda idx: b.batch_set_v2([PoolTransfer(name=PoolName.KV, host_indices=idx, keys=new_keys)]),
        "batch_get_v2": lambda idx: b.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=idx, keys=keys)]),
    }
    if r.side_host is not None:
        calls["batch_set_v2_indexer"] = lambda idx: b.batch_set_v2(
            [PoolTransfer(name=PoolName.KV, host_indices=good, keys=new_keys),
             PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=new_keys)])
        calls["batch_get_v2_indexer"] = lambda idx: b.batch_get_v2(
            [PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=keys)])
    outcomes: dict[str, str] = {}
    for call_name, call in calls.items():
        for bad_name, idx in bad.items():
            before = snapshot()
            try:
                got = call(idx)
                outcome = f"returned {got!r}"
            except Exception as err:  # noqa: BLE001
                outcome = f"{type(err).__name__}: {err}"
            outcomes[f"{call_name}/{bad_name}"] = outcome + ("" if snapshot() == before else " AND CHANGED STATE")
    # The same calls with good indices still work.
    ok = b.batch_get_v1(keys, good)
    return _finish(r, {"outcomes": outcomes, "good_read": ok, "wrong": r.check(r.host, good, keys), "size": size})


def _cluster_extra(r: Rank) -> dict:
    return _cpkv_extra(r.options, cpkv_cluster_master=r.options["cluster_master"],
                       cpkv_cluster_metadata=r.options["cluster_metadata"])


def _flip_in_store(r: Rank, store_pid: int, pool: str, key: str) -> None:
    """Flips one payload byte of ``key``'s record of ``pool`` in the store server's own memory."""
    from cpkv.integrations.sglang.l3 import l3_key
    from cpkv.tier.cluster.tier import object_key

    assert r.backend.cluster is not None and r.backend.cluster.client is not None
    pages = r.backend.cluster.pools[pool]
    raw = r.backend.cluster.client.store._store  # the Mooncake client itself: where the replica lives
    replica = raw.get_replica_desc(object_key(pages.namespace_id, l3_key(key)))[0]
    address = replica.get_memory_descriptor().buffer_descriptor.buffer_address
    with open(f"/proc/{store_pid}/mem", "r+b", buffering=0) as memory:
        memory.seek(address + 5)
        byte = memory.read(1)[0]
        memory.seek(address + 5)
        memory.write(bytes([byte ^ 0x10]))


def _store_until(r: Rank, reqs: Any, fetched: list[dict], done: Any, what: str, wall_s: float = 120.0) -> int:
    """Per turn: a prefetch (its bytes checked), a store of a new request, every digest check run;
    until ``done(stats)``, which reads only what the store group's digest checks agreed, so every rank
    stops after the same store. Returns the turns taken; fails past ``wall_s``."""
    deadline = time.monotonic() + wall_s
    turns = 0
    while not done(r.backend.stats()):
        tokens = next(reqs, None)
        if tokens is None or time.monotonic() > deadline:
            cluster = {k: v for k, v in r.backend.stats().items() if k.startswith("cluster_")}
            raise AssertionError(f"rank {r.rank}: {what} did not happen in {turns} turns ({wall_s:g} s at most): "
                                 f"{cluster}")
        fetched.append(r.prefetch(f"turn{len(fetched)}", tokens))
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
        r.backend.wait_checks(WAIT_S)
        turns += 1
    return turns


def _wait_file(path: str, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} ({path}) did not happen within {WAIT_S:g} s")
        time.sleep(0.05)  # polling a file the test process writes: the condition is the file


def _cluster_restart(r: Rank, reqs: list[list[int]], fetched: list[dict], master_pid: int, marked: str,
                     restarted: str, seed: int) -> dict:
    """``phase="restart"``: the kill, then turns until the store group marked the tier unavailable;
    rank 0 says so (``marked``) and waits for the test to start a new master on the same ports
    (``restarted``); turns until the tier re-attached, then every ``after`` request stored."""
    for i, tokens in enumerate(reqs[:3]):
        fetched.append(r.prefetch(f"req{i}", tokens))
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    r.barrier()
    if r.rank == 0:
        os.kill(master_pid, signal.SIGKILL)
    r.barrier()
    more = iter(shared_prefix_requests(2000, seed + 1000, r.page_size, prefixes=4, max_pages=16))
    turns_off = _store_until(r, more, fetched, lambda s: s["cluster_available"] == 0,
                             "marking the tier unavailable")
    off = r.backend.stats()
    r.barrier()
    if r.rank == 0:
        Path(marked).touch()
        _wait_file(restarted, "the test's restart of the master")
    r.barrier()
    turns_on = _store_until(r, more, fetched, lambda s: s.get("cluster_reattaches", 0) >= 1, "re-attaching the tier")
    on = r.backend.stats()
    after = shared_prefix_requests(10, seed + 1, r.page_size, prefixes=4, max_pages=16)
    for tokens in after:
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    return {"turns_off": turns_off, "turns_on": turns_on, "off": off, "on": on,
            "after_pages": [len(r.hashes(t)) for t in after]}


def cluster(r: Rank, phase: str, requests: int = 10, seed: int = 7, flip: bool = False, drop_pool: str | None = None,
            store_pid: int = 0, master_pid: int = 0, marked: str = "", restarted: str = "") -> dict:
    """The cluster tier under a small slab (one instance of ``world`` ranks; the test runs several
    against one ``cpkv cluster serve``). ``phase="fill"``: every rank stores the requests (the slab's
    victims, and at the clean stop its resident pages, go to the cluster). ``phase="warm"``: a new
    instance prefetches each request (hits from the cluster) and checks every byte loaded; rank 0
    first flips a byte of the first request's first KV record in the store (``flip``) or removes
    every record of ``drop_pool`` (after a first prefetch of every request). ``phase="kill"``: per request a prefetch then a store, rank 0
    SIGKILLs the master (``master_pid``) after the third. ``phase="restart"``: :func:`_cluster_restart`."""
    r.controller("dynamic", _cluster_extra(r))
    reqs = shared_prefix_requests(requests, seed, r.page_size, prefixes=4, max_pages=12 if r.kind == "dsa" else 16)
    hashes = [r.hashes(t) for t in reqs]
    fetched: list[dict] = []
    restart: dict = {}
    if phase == "restart":
        restart = _cluster_restart(r, reqs, fetched, master_pid, marked, restarted, seed)
    elif phase == "fill":
        for tokens in reqs:
            idx, _ = r.write(tokens)
            r.wait_backup(idx)
    elif phase == "warm":
        if r.rank == 0 and flip:
            _flip_in_store(r, store_pid, "kv", hashes[0][0])
        if drop_pool:  # first every request whole, then without the pool's records
            r.barrier()
            fetched = [r.prefetch(f"whole{i}", tokens) for i, tokens in enumerate(reqs)]
            r.barrier()
        if r.rank == 0 and drop_pool:
            from cpkv.integrations.sglang.l3 import l3_key
            from cpkv.tier.cluster.tier import object_key

            assert r.backend.cluster is not None and r.backend.cluster.client is not None
            raw = r.backend.cluster.client.store._store
            ns = r.backend.cluster.pools[drop_pool].namespace_id
            names = [object_key(ns, l3_key(h)) for h in sorted({h for hs in hashes for h in hs})]
            assert raw.batch_remove(names, True) == [0] * len(names)  # forced: the reads just took leases
        r.barrier()
        fetched += [r.prefetch(f"req{i}", tokens) for i, tokens in enumerate(reqs)]
    else:
        for i, tokens in enumerate(reqs):
            fetched.append(r.prefetch(f"req{i}", tokens))
            idx, _ = r.write(tokens)
            r.wait_backup(idx)
            if i == 2:
                r.barrier()
                if r.rank == 0:
                    os.kill(master_pid, signal.SIGKILL)
                r.barrier()
    r.barrier()
    r.backend.wait_checks(WAIT_S)
    out = {"fetched": fetched, "stats": r.backend.stats(), "pages": [len(h) for h in hashes],
           "distinct_pages": len({h for hs in hashes for h in hs}), **restart}
    r.barrier()
    r.backend.close()
    out["closed"] = r.backend.stats()
    r.barrier()
    return out


SCENARIOS = {"roundtrip": roundtrip, "pressure": pressure, "killed": killed, "diverged": diverged,
             "missed_store": missed_store, "bad_indices": bad_indices, "l3": l3, "l3_crash": l3_crash,
             "l3_diverged": l3_diverged, "l3_late_pool": l3_late_pool,
             "l3_killed_claimant": l3_killed_claimant, "l3_skew": l3_skew,
             "l3_read_before_write": l3_read_before_write, "l3_formats": l3_formats,
             "l3_full_disk": l3_full_disk, "l3_second_server": l3_second_server,
             "cluster": cluster}

"""Real SGLang HiCacheControllers in gloo processes acting as one attention-CP group.

``launch(world, scenario, **options)`` starts ``world`` ranks (cpkv's launcher, ``run_ranks``: gloo set up,
a rank that dies named, none outliving the test); each builds SGLang's own CPU pools
(``MHATokenToKVPool`` on "cpu", ``MHATokenToKVPoolHost`` page_first_direct, unpinned) and a
``HiCacheController`` with a storage backend (cpkv's through ``dynamic``, or SGLang's ``file``),
then drives it the way SGLang's scheduler does: ``write_storage`` and the backup acks,
``prefetch``, the hit queue, the host allocation, the prefetch buffer and its acks. Each rank
returns what it saw; ``launch`` returns the ranks' results in rank order.

Nothing here mocks SGLang: the controller's threads, its MIN hit sync over the CP group and the
storage factory are SGLang's. Every wait has a timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

WAIT_S = 60.0  # any single wait inside a rank
CPKV = {"backend_name": "cpkv", "module_path": "cpkv.integrations.sglang", "class_name": "CpkvHiCacheStorage"}


def launch(world: int, scenario: str, wall_s: float = 240.0, **options: Any) -> list[dict]:
    """Runs ``scenario`` on ``world`` ranks through cpkv's launcher; returns each rank's result (None
    for a rank that died)."""
    from cpkv.runtime.launch import run_ranks

    # SGLang builds its kernels with tools next to this interpreter.
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    results = run_ranks(_rank_entry, world, scenario, options, timeout_s=wall_s, collective_timeout_s=WAIT_S,
                        env={"PATH": path}, expect_failures=True, deaths_as_text=True)
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


def page_bytes(key: str, tag: int, nbytes: int) -> Any:
    """The bytes a page of ``key`` holds (``tag``: 0 for replicated content, rank + 1 for a rank's slice)."""
    import numpy as np

    seed = int.from_bytes(hashlib.blake2b(f"{key}/{tag}".encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


class Rank:
    def __init__(self, rank: int, world: int, options: dict) -> None:
        import torch.distributed as dist

        self.rank, self.world, self.options = rank, world, options
        from sglang.srt.runtime_context import get_parallel

        # TP = world; attention CP of `cp` ranks (default all), attention TP = world / cp:
        # tp_rank = cp_rank * attn_tp + attn_tp_rank, as SGLang numbers them without attention DP.
        cp = options.get("cp", world)
        attn_tp = world // cp
        self.cp_rank, self.attn_tp_rank = rank // attn_tp, rank % attn_tp
        get_parallel().override_permanently(
            tp_rank=rank, tp_size=world, pp_rank=0, pp_size=1, attn_cp_rank=self.cp_rank, attn_cp_size=cp,
            attn_tp_rank=self.attn_tp_rank, attn_tp_size=attn_tp, attn_dp_rank=0, attn_dp_size=1,
            attn_dcp_rank=0, attn_dcp_size=1)
        for t in range(attn_tp):  # every rank creates every CP group, in one order
            group = dist.new_group([t + k * attn_tp for k in range(cp)], backend="gloo")
            if t == self.attn_tp_rank:
                self.cp_group = group
        self.test_group = dist.new_group(list(range(world)), backend="gloo")  # the test's own barriers
        self.page_size = options.get("page_size", 4)
        self.layout = options.get("layout", "replicated")
        self.sharded = self.layout != "replicated"

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.test_group)

    def pools(self, heads: int = 2, head_dim: int = 8, layers: int = 2, tokens: int = 1024) -> tuple[Any, Any, Any]:
        import torch

        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        ps = self.page_size
        kv = MHATokenToKVPool(tokens, ps, torch.float16, heads, head_dim, layers, "cpu", False,
                              start_layer=0, end_layer=layers - 1)
        alloc = PagedTokenToKVPoolAllocator(tokens, ps, torch.float16, "cpu", kv, False)
        host = MHATokenToKVPoolHost(kv.get_device_pool_infos()[0].buffer_info, 2.0, 0, ps, "page_first_direct",
                                    pin_memory=False, device_capacity_tokens=kv.size, start_layer=kv.start_layer,
                                    end_layer=kv.end_layer, write_back_staging=kv.hicache_write_back_staging)
        return kv, alloc, host

    def controller(self, backend: str = "dynamic", extra: dict | None = None) -> Any:

        from sglang.srt.managers.cache_controller import HiCacheController

        self.kv, self.alloc, self.host = self.pools(**self.options.get("geometry", {}))
        self.ctl = HiCacheController(
            self.alloc, self.host, self.page_size, tp_group=self.cp_group, load_cache_event=threading.Event(),
            attn_cp_group=self.cp_group, io_backend="direct", storage_backend=backend,
            storage_backend_extra_config=dict(extra or {}), prefetch_threshold=self.page_size)
        self.backend = self.ctl.storage_backend
        return self.ctl

    # -- content ----------------------------------------------------------------------------------

    def tag(self) -> int:
        """Replicated content is the same on the ranks of a CP group; attention-TP ranks hold other heads."""
        return self.attn_tp_rank * 1000 + (self.cp_rank + 1 if self.sharded else 0)

    def fill(self, host: Any, indices: Any, hashes: list[str]) -> None:
        import torch

        nbytes = host.get_data_page(int(indices[0])).numel() * host.dtype.itemsize
        for i, h in enumerate(hashes):
            data = torch.from_numpy(page_bytes(h, self.tag(), nbytes)).view(host.dtype)
            host.set_from_flat_data_page(int(indices[i * self.page_size]), data)

    def check(self, host: Any, indices: Any, hashes: list[str]) -> int:
        """Pages whose bytes are wrong."""
        import numpy as np

        wrong = 0
        for i, h in enumerate(hashes):
            got = host.get_data_page(int(indices[i * self.page_size])).contiguous().view(-1).numpy().view(np.uint8)
            if not np.array_equal(got, page_bytes(h, self.tag(), got.size)):
                wrong += 1
        return wrong

    # -- SGLang's scheduler side ------------------------------------------------------------------

    def hashes(self, tokens: list[int]) -> list[str]:
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        return get_storage_hash_str(tokens, None, page_size=self.page_size)

    def write(self, tokens: list[int], delay_ack: bool = False) -> tuple[Any, list[str]]:
        """Fills host pages with the request's content and hands them to the backup thread."""
        hashes = self.hashes(tokens)
        n = len(hashes) * self.page_size
        idx = self.host.alloc(n)
        assert idx is not None, "host pool full"
        self.fill(self.host, idx, hashes)
        self.ctl.write_storage(idx, tokens[:n], hash_value=hashes, prefix_keys=[])
        return idx, hashes

    def wait_backup(self, idx: Any) -> None:
        op = self.ctl.ack_backup_queue.get(timeout=WAIT_S)
        self.host.free(idx)
        return op

    def prefetch(self, rid: str, tokens: list[int], sidecars: list[Any] | None = None) -> dict:
        """One prefetch as SGLang's scheduler drives it; returns the hit counts and the check."""
        before = len(getattr(self.backend, "exists_log", []))
        op = self.ctl.prefetch(rid, tokens, None, prefix_keys=[])
        got = self.ctl.prefetch_hit_queue.get(timeout=WAIT_S)
        assert got is op
        log = getattr(self.backend, "exists_log", None)
        pre = sum(log[before:]) * self.page_size if log is not None else None
        result = {"pre": pre, "post": got.storage_hit_count, "loaded": 0, "wrong": 0, "sidecar_wrong": 0}
        if got.storage_hit_count == 0:
            return result
        dst = self.host.alloc(got.storage_hit_count)
        assert dst is not None, "host pool full"
        got.host_indices = dst
        if sidecars:
            got.pool_transfers = sidecars
        self.ctl.prefetch_buffer.put(got)
        while True:
            ack = self.ctl.ack_prefetch_queue.get(timeout=WAIT_S)
            if ack.completed_req:
                break
            result["loaded"] = ack.completed_tokens
        pages = result["loaded"] // self.page_size
        result["wrong"] = self.check(self.host, dst, got.hash_value[:pages])
        if sidecars:
            result["sidecar_wrong"] = self.check(self.side_host, dst, got.hash_value[:pages])
        self.host.free(dst)
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
                 cpkv_layout=options.get("layout", "replicated"), cpkv_check_every=options.get("check_every", 4),
                 cpkv_timeout_s=options.get("timeout_s", 20))
    if options.get("ranks_per_node"):
        extra["cpkv_ranks_per_node"] = options["ranks_per_node"]
    extra.update(more)
    return extra


def roundtrip(r: Rank, requests: int = 8, seed: int = 1, sidecar: bool = False) -> dict:
    """Every rank writes the same requests, then every rank prefetches each one."""

    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    r.controller("dynamic", _cpkv_extra(r.options))
    if sidecar:
        _, _, r.side_host = r.pools(heads=1, head_dim=4, layers=2)
        r.backend.register_mem_host_pool_v2(r.side_host, PoolName.INDEXER)
    reqs = shared_prefix_requests(requests, seed, r.page_size)
    distinct: set[str] = set()
    for tokens in reqs:
        idx, hashes = r.write(tokens)
        r.wait_backup(idx)
        distinct.update(hashes)
        if sidecar:
            # The sidecar's pages, stored through v2 on every rank at the same point of the stream.
            side_idx = r.side_host.alloc(len(hashes) * r.page_size)
            r.fill(r.side_host, side_idx, hashes)
            res = r.backend.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=side_idx, keys=hashes)])
            assert all(res[PoolName.INDEXER]), res
            r.side_host.free(side_idx)
    r.barrier()
    side = [PoolTransfer(name=PoolName.INDEXER, indices_from_pool=PoolName.KV)] if sidecar else None
    fetched = [r.prefetch(f"req{i}", tokens, side) for i, tokens in enumerate(reqs)]
    r.backend.wait_checks(WAIT_S)
    out = {"fetched": fetched, "stats": r.backend.stats(), "distinct_pages": len(distinct),
           "pages": [len(t) // r.page_size for t in reqs], "digest": r.backend.digest(),
           "slab_bytes_in_use": r.backend.slab_bytes_in_use(), "row_bytes": r.backend.pools["kv"].row_bytes,
           "part_bytes": r.backend.pools["kv"].part_bytes,
           "host_pool_bytes": int(r.host.kv_buffer.numel() * r.host.kv_buffer.element_size())}
    if sidecar:
        hashes = r.hashes(reqs[0])
        exists = r.backend.batch_exists_v2(hashes, [PoolTransfer(name=PoolName.INDEXER, keys=hashes)])
        out["exists_v2"] = [exists.kv_hit_pages, {str(k): v for k, v in exists.extra_pool_hit_pages.items()}]
        kv_dst = r.host.alloc(len(hashes) * r.page_size)
        side_dst = r.side_host.alloc(len(hashes) * r.page_size)
        got = r.backend.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=kv_dst, keys=hashes),
                                      PoolTransfer(name=PoolName.INDEXER, host_indices=side_dst, keys=hashes)])
        out["get_v2"] = {str(k): sum(v) for k, v in got.items()}
        out["get_v2_wrong"] = r.check(r.host, kv_dst, hashes) + r.check(r.side_host, side_dst, hashes)
        out["side_slab_bytes_in_use"] = r.backend.slab_bytes_in_use(str(PoolName.INDEXER))
    r.barrier()
    r.backend.close()
    return out


def pressure(r: Rank, requests: int = 40, seed: int = 2, backend: str = "cpkv", lag: int = 0,
             max_bytes: int | None = None) -> dict:
    """A replayed stream over a store much smaller than its distinct pages: per request, prefetch
    (hit counts before and after SGLang's MIN), load and check the hits, then store the request.

    ``lag`` = 0: every rank's stores finish (barrier) before the next prefetch. ``lag`` = k > 0:
    rank 1 hands each request to its backup thread k requests late (ranks skewed in timing; no
    barrier), so what the MIN removes shows."""
    extra: dict
    if backend == "cpkv":
        extra = _cpkv_extra(r.options)
        r.controller("dynamic", extra)
    else:
        extra = {"file_storage_path": r.options["file_dir"]}
        if max_bytes:
            extra["max_size"] = str(max_bytes)
        r.controller("file", extra)
        # The file backend reports hits through batch_exists; count them before the MIN as well.
        _count_exists(r.backend)
    reqs = shared_prefix_requests(requests, seed, r.page_size, prefixes=8, max_pages=32)
    fetched = []
    pending: list[tuple[Any, list[int]]] = []
    my_lag = lag if r.rank == 1 else 0
    for i, tokens in enumerate(reqs):
        fetched.append(r.prefetch(f"req{i}", tokens))
        pending.append((None, tokens))
        while len(pending) > my_lag:
            _, t = pending.pop(0)
            idx, _ = r.write(t)
            r.wait_backup(idx)
        if lag == 0:
            r.barrier()
    for _, t in pending:
        idx, _ = r.write(t)
        r.wait_backup(idx)
    r.barrier()
    if backend == "cpkv":
        r.backend.wait_checks(WAIT_S)
    stats = r.backend.stats() if hasattr(r.backend, "stats") else {}
    out = {"fetched": fetched, "stats": stats}
    if backend == "cpkv":
        out["slab_bytes_in_use"] = r.backend.slab_bytes_in_use()
        out["row_bytes"] = r.backend.pools["kv"].row_bytes
        out["digest"] = r.backend.digest()
        r.backend.close()
    r.barrier()
    return out


def _count_exists(backend: Any) -> None:
    """Records the hit pages of each batch_exists call of a backend that does not log them itself."""
    log: list[int] = []
    inner = backend.batch_exists

    def counted(keys: Any, extra_info: Any = None) -> int:
        n = inner(keys, extra_info)
        log.append(n)
        return n

    backend.batch_exists = counted
    backend.exists_log = log


def killed(r: Rank, requests: int = 6) -> dict:
    """Rank 1 dies (SIGKILL) in the middle of writing its first page into the slab; the others
    must get a typed error from the backend within its timeout, then exit."""
    import cpkv.integrations.sglang.backend as backend_module

    r.controller("dynamic", _cpkv_extra(r.options, cpkv_check_every=1))
    run_id = r.backend.pools["kv"].slab.run_id
    if r.rank == 1:
        real_copy = backend_module._PoolSlab.copy

        def dying_copy(self: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("to_slab"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real_copy(self, *args, **kwargs)

        backend_module._PoolSlab.copy = dying_copy
    reqs = shared_prefix_requests(requests, 3, r.page_size)
    started = time.monotonic()
    for tokens in reqs:
        idx, _ = r.write(tokens)
        r.wait_backup(idx)
    # The error surfaces in the backup thread (SGLang logs it); the backend keeps it.
    deadline = time.monotonic() + WAIT_S
    while r.backend.stats()["broken"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    broken = r.backend.stats()["broken"]
    try:
        r.backend.batch_exists(r.hashes(reqs[0]))
        after = None
    except Exception as err:  # noqa: BLE001
        after = type(err).__name__
    return {"broken": broken, "seconds": time.monotonic() - started, "after": after, "run_id": run_id,
            "pid": os.getpid()}


def diverged(r: Rank, requests: int = 4) -> dict:
    """Rank 1's last store carries a different page than rank 0's: the next digest check must raise
    DivergenceError on every rank."""
    r.controller("dynamic", _cpkv_extra(r.options, cpkv_check_every=1))
    reqs = shared_prefix_requests(requests, 4, r.page_size)
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


SCENARIOS = {"roundtrip": roundtrip, "pressure": pressure, "killed": killed, "diverged": diverged}

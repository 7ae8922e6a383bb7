"""The second half of ``cpkv bench cluster``: two serving instances share one Mooncake store, cpkv's
cluster tier against SGLang 0.5.23's own ``mooncake`` HiCache storage backend, on the cluster the
bench started.

The trace: ``--requests`` requests of a seeded :mod:`cpkv.workload`, one trace block = one 64-token
page (SGLang's DSA page), each page's key chained over its prefix as SGLang chains its page hashes
(:func:`cpkv.bench.sglang.chain_keys`). Request ``i`` goes to instance ``i % 2``; one request at a
time, in trace order, so every figure is deterministic. Each instance runs at CP 2 with DSA-shaped
pools (per token and layer the MLA latent, 512 + 64 bf16, and the indexer's 128 fp8 keys + an fp32
scale; 2 layers), and has no tier of its own: every hit is a hit in the shared store. Two rank
processes; each holds that CP rank of both instances (two store clients each, one per instance:
what instances share is the store only).

Per request, the instance serving it:

- **cpkv**: :meth:`ClusterTier.find` (``batch_is_exist``, MIN over the instance's ranks),
  :meth:`ClusterTier.read` (each rank the pages its device pages own, records checked; the bytes
  compared with what was put) and :meth:`ClusterTier.settle`; then the pages after the hit, each put
  once by its node writer rank (:meth:`ClusterTier.put_pages`): one object per token page holding
  KV and indexer (the unit a hit needs).
- **SGLang mooncake**: ``MooncakeStore`` built from a ``HiCacheStorageConfig`` as SGLang's cache
  controller builds it (MLA: rank-replicated, ``is_mla_model``), on SGLang's DSA host pools
  (``MLATokenToKVPoolHost`` + ``DSAIndexerPoolHost``, registered with ``register_mem_pool_host`` /
  ``register_mem_host_pool_v2``), driven as ``HybridCacheController`` drives it: ``batch_exists_v2``
  with the indexer as an ALL_PAGES sidecar, MIN over the ranks, ``batch_get_v1`` (KV) and
  ``batch_get_v2`` (indexer) on every rank, the MIN of the pages both read; then, on its storage
  writer rank (rank 0 for MLA), ``batch_set_v2`` (indexer) and ``batch_set_v1`` (KV) of the pages
  after the hit. Two objects per token page, keys ``<model>_<page hash>__k`` and ``..._indexer``.

Reported per backend: hit tokens per instance and in all, against the hits the trace itself allows
(a page is there once an earlier request put it: both must match it on a store this size), and the
bytes the store holds per unique token of the trace (the master's own count of allocated bytes,
before and after the backend's replay).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

INSTANCES = 2
CP = 2
LAYERS = 2
MAX_PAGES = 64  # pages of one request at most
MODEL = "bench-cluster-share"


def sglang_missing() -> str | None:
    """Why SGLang's column cannot run here (one line), or None when SGLang can be imported (its
    version is checked by the ranks, which import it: importing it takes tens of seconds)."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not importable here: its mooncake column is skipped (run under .venv-sglang for it)"
    return None


def trace(requests: int, seed: int) -> list[list[str]]:
    """Each request's chained page keys (at most ``MAX_PAGES``)."""
    from cpkv.bench.sglang import chain_keys
    from cpkv.workload import generate

    return [keys[:MAX_PAGES] for keys in chain_keys(generate(requests, seed))]


def trace_hits(chains: list[list[str]]) -> list[int]:
    """The pages of each request an earlier request (of either instance) already put: its leading
    run of known pages (every page is put by the request that first has it)."""
    seen: set[str] = set()
    hits = []
    for keys in chains:
        n = 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        hits.append(n)
        seen.update(keys)
    return hits


def page_bytes() -> tuple[int, int]:
    """(KV bytes, indexer bytes) of one token page, every layer."""
    from cpkv.bench.sglang import DSA_GEOMETRY, DSA_PAGE

    latent = DSA_GEOMETRY["kv_lora_rank"] + DSA_GEOMETRY["qk_rope_head_dim"]
    return LAYERS * DSA_PAGE * latent * 2, LAYERS * DSA_PAGE * (128 + 4)


def store_bytes_needed(chains: list[list[str]]) -> int:
    """A store that holds every unique page of the trace twice over (both backends), with room."""
    unique = len({key for keys in chains for key in keys})
    return 2 * unique * (sum(page_bytes()) + 4096) + (64 << 20)


def run(cluster: Any, chains: list[list[str]], with_sglang: bool) -> dict[str, Any]:
    """Both replays on ``cluster`` (a :class:`~cpkv.tier.cluster.local.LocalCluster`): per backend the
    hit pages of each request and the store's allocated bytes and objects it added."""
    from cpkv.runtime.launch import run_ranks

    backends = ["cpkv"] + (["sglang"] if with_sglang else [])
    out: dict[str, Any] = {}
    for backend in backends:
        ranks = run_ranks(_rank, CP, backend, cluster.master, cluster.metadata, cluster.metrics_port, chains,
                          timeout_s=600, collective_timeout_s=300, env={"GLOG_minloglevel": "3"})
        if "skipped" in ranks[0]:
            out[backend] = ranks[0]
            continue
        if ranks[0]["hits"] != ranks[1]["hits"]:
            raise RuntimeError(f"bench cluster: the two CP ranks of {backend} disagree on the hits")
        out[backend] = ranks[0]
    return out


def _rank(rank: int, world: int, backend: str, master: str, metadata: str, metrics_port: int,
          chains: list[list[str]]) -> dict[str, Any]:
    """One CP rank of both instances: the hit pages of every request (agreed by the instance's ranks)
    and, from the master, the bytes and objects the replay added to the store (after the clients'
    own set-up: SGLang's puts a warm-up object per client)."""
    import torch.distributed as dist

    from cpkv.runtime.agree import all_reduce_min
    from cpkv.tier.cluster.local import store_usage

    group: Any = dist.new_group(list(range(world)), backend="gloo")

    def agree_min(values: list[int], what: str) -> list[int]:
        return all_reduce_min(values, group=group, rank=rank, step=what, timeout_s=300)

    if backend == "sglang":
        from cpkv.bench.sglang import _quiet
        from cpkv.errors import EngineVersionError

        _quiet()  # before SGLang is imported: it warns about every quantisation CUDA lacks

        try:
            from cpkv.integrations.sglang._version import check_sglang_version

            check_sglang_version()
        except EngineVersionError as err:
            return {"skipped": f"SGLang's mooncake column skipped: {' '.join(str(err).split())}"}
    make = _CpkvInstance if backend == "cpkv" else _SglangInstance
    instances = [make(rank, master, metadata, agree_min, max(len(keys) for keys in chains))
                 for _ in range(INSTANCES)]
    dist.barrier(group=group)
    before = store_usage(metrics_port)
    hits = []
    for i, keys in enumerate(chains):
        instance = instances[i % INSTANCES]
        served = instance.lookup(keys)
        instance.put(keys[served:])
        dist.barrier(group=group)  # the next request sees every put of this one
        hits.append(served)
    after = store_usage(metrics_port)
    for instance in instances:
        instance.close()
    return {"hits": hits, "bytes": after[0] - before[0], "objects": after[1] - before[1]}


class _CpkvInstance:
    """One CP rank of an instance on cpkv's cluster tier."""

    def __init__(self, rank: int, master: str, metadata: str, agree_min: Any, pages: int) -> None:
        import torch

        from cpkv import _cpkv
        from cpkv.bench.sglang import DSA_GEOMETRY, DSA_PAGE
        from cpkv.tier import SlabSpec
        from cpkv.tier.cluster.tier import ClusterTier

        latent = DSA_GEOMETRY["kv_lora_rank"] + DSA_GEOMETRY["qk_rope_head_dim"]
        payloads = {"kv": SlabSpec((DSA_PAGE, latent), torch.bfloat16), "indexer": SlabSpec((DSA_PAGE, 128 + 4), torch.uint8)}
        self.rank = rank
        self.tier = ClusterTier(master, metadata, slab=None, payloads=payloads, num_layers=LAYERS, page_size=DSA_PAGE,
                                rank=rank, cp_size=CP, model=MODEL, timeout_s=60.0, all_reduce_min=agree_min)
        self._writers = _cpkv.L3Index(1, CP)  # the node writer of a key: the tier's own rule
        self._pattern = np.random.default_rng(7).integers(0, 256, self.tier.page_bytes, dtype=np.uint8)

    def _page(self, key: int) -> np.ndarray:
        """A page's bytes, a function of its key (what a reader compares with)."""
        return np.roll(self._pattern, key % self.tier.page_bytes)

    @staticmethod
    def _keys(keys: list[str]) -> list[int]:
        return [int(key[:16], 16) for key in keys]

    def lookup(self, keys: list[str]) -> int:
        found = self.tier.find([self._keys(keys)])[0]
        good, data = self.tier.read(found, np.arange(len(found.keys), dtype=np.int64))
        for at, page in zip(good.tolist(), data):
            if not np.array_equal(page, self._page(found.keys[at])):
                raise RuntimeError(f"bench cluster: cpkv served other bytes for page {found.keys[at]:016x}")
        return self.tier.settle()

    def put(self, keys: list[str]) -> None:
        mine = [key for key in self._keys(keys) if self._writers.writer(key) == self.rank]
        for start in range(0, len(mine), self.tier.batch):
            part = mine[start:start + self.tier.batch]

            def fill(rows: np.ndarray, part: list[int] = part) -> None:
                for row, key in zip(rows, part):
                    row[:self.tier.page_bytes] = self._page(key)

            self.tier.put_pages(part, fill)

    def close(self) -> None:
        self.tier.close()


class _SglangInstance:
    """One CP rank of an instance on SGLang's ``MooncakeStore``, driven as SGLang's controller does."""

    def __init__(self, rank: int, master: str, metadata: str, agree_min: Any, pages: int) -> None:
        import torch
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName, PoolTransfer
        from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

        from cpkv.bench.sglang import DSA_PAGE, dsa_host_pools

        self._transfer, self._indexer_pool = PoolTransfer, PoolName.INDEXER
        self.rank, self._agree_min = rank, agree_min
        self.host, self.indexer = dsa_host_pools(pages, LAYERS)
        self.indices = torch.arange(DSA_PAGE, (pages + 1) * DSA_PAGE, dtype=torch.int64)  # page 0 left unused
        self.page_tokens = DSA_PAGE
        config = HiCacheStorageConfig(
            tp_rank=rank, tp_size=CP, pp_rank=0, pp_size=1, attn_cp_rank=rank, attn_cp_size=CP, is_mla_model=True,
            enable_storage_metrics=False, is_page_first_layout=False, model_name=MODEL,
            extra_config={"master_server_address": master, "metadata_server": metadata, "protocol": "tcp",
                          "device_name": "", "global_segment_size": 0, "local_hostname": "127.0.0.1",
                          "check_server": False})
        self.writer = config.is_storage_writer
        self.backend = MooncakeStore(config, self.host)
        self.backend.register_mem_pool_host(self.host)
        self.backend.register_mem_host_pool_v2(self.indexer, PoolName.INDEXER)

    def _idx(self, n: int) -> Any:
        return self.indices[:n * self.page_tokens]

    def lookup(self, keys: list[str]) -> int:
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy

        found = self.backend.batch_exists_v2(keys, [self._transfer(name=self._indexer_pool,
                                                                 hit_policy=PoolHitPolicy.ALL_PAGES)])
        hit = self._agree_min([found.kv_hit_pages], "sglang hit pages")[0]
        read = 0
        if hit:
            kv = self.backend.batch_get_v1(keys[:hit], self._idx(hit))
            indexer = self.backend.batch_get_v2([self._transfer(name=self._indexer_pool, keys=keys[:hit],
                                                              host_indices=self._idx(hit))])[self._indexer_pool]
            while read < hit and kv[read] and indexer[read]:
                read += 1
        return self._agree_min([read], "sglang pages read")[0]

    def put(self, keys: list[str]) -> None:
        if not keys or not self.writer:
            return
        self.backend.batch_set_v2([self._transfer(name=self._indexer_pool, keys=keys, host_indices=self._idx(len(keys)))])
        self.backend.batch_set_v1(keys, self._idx(len(keys)))

    def close(self) -> None:
        self.backend.close()  # a no-op in SGLang 0.5.23: its client is closed here, not at the rank's exit
        self.backend.store.close()

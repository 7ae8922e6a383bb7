"""CpkvHiCacheStorage: SGLang's HiCache storage tier in one cpkv HostSlab per node.

SGLang builds it through ``--hicache-storage-backend dynamic`` as ``cls(storage_config, kwargs)`` on
every rank. What each part does:

- writers: every rank of a store group stores (for an MLA model SGLang elects one writer; the
  backend makes every rank one, in :mod:`.writers`, the one place it changes an SGLang object);
- placement and eviction: a :class:`~.index.ReplicatedIndex` fed only by the store calls, which
  SGLang's backup thread makes on every rank of a store group (:mod:`.topology`) with the same keys
  in the same order. No collective decides anything; every ``cpkv_check_every`` stores the ranks
  compare the index's digest, with L3 on the L3 indexes' too (:func:`cpkv.runtime.agree.agree`, on
  gloo groups of the backend's own; see :meth:`CpkvHiCacheStorage._digest_check`) and a mismatch
  raises :class:`~cpkv.errors.DivergenceError` on every rank;
- bytes: per registered host pool (the KV pool and any sidecar, such as the DSA indexer's) one
  :class:`~.pool.PoolSlab` shared by the group's ranks on one node, one row per index row. Every
  rank's page bytes are the same (SGLang 0.5.23 holds the KV, and the DSA indexer, replicated on
  every rank of a store group), so each row is written once per node, by the node rank
  ``row % ranks_on_node``, and read whole by every rank. Each batch call is one native call
  (:class:`~.index.ReplicatedIndex`'s ``store_pages``/``read_pages``): every page's host range checked
  before anything is stored or copied, the index work, the key tags and stamps, and the copies, the
  GIL released around them;
- visibility: a row's stamp and key tag have exactly one writer (the rule above), which sets the
  stamp to ``-handle``, copies, sets the tag to the key's, then the stamp to ``handle`` (atomic
  stores in the slab's shared memory, a full fence between the copies and the stamps). A key's page is present only while its
  row carries the handle and the key tag this rank's index expects, and a read checks both again
  after copying: a row overwritten under a reader (a faster rank reused it) is reported missing,
  never returned torn, and a rank whose index diverged from the writer's (it missed a store) reads
  a miss, never another key's bytes. Once no store is in flight on any rank, every rank's index
  and every stamp agree, so every rank gives the same answer.

Below the slab: the L3 tier (:mod:`.l3`, ``cpkv_l3_dir``) and the cluster tier (:mod:`.cluster`,
``cpkv_cluster_master``), both fed the slab's victims by their node writer rank.

Reads never change the index (see :mod:`.index`). Errors from the digest check stick: every
later call raises the same error class, naming the first failure.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from cpkv.errors import (
    CpkvError,
    InvalidArgumentError,
    UnknownPayloadError,
)
from cpkv.integrations._digest_checks import DigestChecks
from cpkv.runtime.agree import agree, all_reduce_min, decode, encode
from cpkv.tier.l3.keys import combined_digest

from .cluster import SglangClusterTier
from .config import CpkvStorageSettings
from .index import ReplicatedIndex
from .kv_format import stated_kv_cache_dtype
from .l3 import SglangL3Tier
from .pool import PoolSlab
from .topology import build_topology
from .writers import make_every_rank_a_writer

__all__ = ["CpkvHiCacheStorage"]

log = logging.getLogger("cpkv.sglang")

KV = str(PoolName.KV)


def _combined(*digests: int) -> int:
    """One 64-bit digest of several (the slab index's and the L3's), the same on every rank."""
    return combined_digest(*digests, person=b"cpkv-sgl-agree")


# -- the backend ----------------------------------------------------------------------------------


class CpkvHiCacheStorage(HiCacheStorage):
    """SGLang ``HiCacheStorage`` over one cpkv HostSlab per node (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None) -> None:
        self.settings = CpkvStorageSettings.from_extra_config(storage_config.extra_config)
        if storage_config.dcp_size > 1:
            raise InvalidArgumentError("cpkv's storage backend does not run under decode CP (--dcp-size > 1)")
        if self.settings.l3_dir is not None and not storage_config.model_name:
            raise InvalidArgumentError("extra config key 'cpkv_l3_dir': SGLang's storage config names no model "
                                       "(model_name), and an L3 page may only be served to the model that wrote it")
        self.storage_config = storage_config
        self.rank_replicated = make_every_rank_a_writer(storage_config)
        self.topology = build_topology(storage_config, self.settings, self.rank_replicated)
        self.index = ReplicatedIndex(self.settings.pages, self.settings.policy)
        self.pools: dict[str, PoolSlab] = {}
        self.l3: SglangL3Tier | None = None  # opened once SGLang has registered every pool
        self.cluster: SglangClusterTier | None = None  # likewise (below L3, or below the slab)
        self._broken: CpkvError | None = None
        self._closed = False
        self._counters_lock = threading.Lock()
        self.counters = {
            "stores": 0, "pages_offered": 0, "pages_refused": 0, "pages_written": 0, "bytes_written": 0,
            "exists_calls": 0, "exists_hit_pages": 0, "reads": 0, "pages_read": 0, "bytes_read": 0,
            "torn_reads_refused": 0, "digest_checks": 0,
        }
        self.exists_log: list[int] = []  # hit pages per batch_exists (bounded; for tests and bench)
        self._checks: DigestChecks[tuple[int, int, int | None]] = DigestChecks(
            self.settings.check_every, lambda point: self._digest_check(*point), lambda: self._broken is not None)
        self._metrics: dict[str, list[float]] = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}

    # -- pools ------------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._add_pool(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name not in self.pools:
            self._add_pool(name, host_pool)

    def _add_pool(self, name: str, host_pool: Any) -> None:
        """Collective over this node's CP ranks (SGLang registers pools on every rank in one order)."""
        if name in self.pools:
            return
        if self.l3 is not None or self.cluster is not None:
            key = "cpkv_l3_dir" if self.l3 is not None else "cpkv_cluster_master"
            raise InvalidArgumentError(
                f"extra config key {key!r}: host pool {name!r} was registered after SGLang's initial registration "
                f"(on_host_pools_registered), when the tiers below the slab had already been opened for the pools "
                f"{list(self.pools)} (a page is a hit only with every pool's bytes); run this model without it")
        self.pools[name] = PoolSlab(name, host_pool, self.settings.pages, self.topology.node_group,
                                    self.settings.timeout_s)

    def on_host_pools_registered(self) -> None:
        """SGLang's registration burst is over (every pool of the model is known): opens the cluster tier
        (collective over the store group) and the L3 tier, one store per pool (collective over the
        node, in the pools' order, the same on every rank)."""
        super().on_host_pools_registered()
        if self.settings.cluster_master is not None and self.cluster is None:
            self.cluster = SglangClusterTier(self.settings, self.pools, model=self.storage_config.model_name,
                                             kv_cache_dtype=stated_kv_cache_dtype(), topology=self.topology,
                                             tp_size=int(self.storage_config.tp_size))
        if self.settings.l3_dir is None or self.settings.l3_bytes is None or self.l3 is not None:
            return
        self.l3 = SglangL3Tier(self.settings.l3_dir, self.settings.l3_bytes, self.pools,
                               model=self.storage_config.model_name, kv_cache_dtype=stated_kv_cache_dtype(),
                               topology=self.topology, tp_size=int(self.storage_config.tp_size),
                               timeout_s=self.settings.timeout_s,
                               staging_entries=self.settings.l3_staging_pages)

    def _pool(self, name: Any) -> PoolSlab:
        try:
            return self.pools[str(name)]
        except KeyError:
            raise UnknownPayloadError(f"host pool {str(name)!r} was never registered with the cpkv backend "
                                      f"(registered: {list(self.pools)})") from None

    # -- failure ----------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the cpkv storage backend is closed")
        if self.l3 is None and self.settings.l3_dir is not None:
            raise InvalidArgumentError("extra config key 'cpkv_l3_dir': SGLang never called the backend's "
                                       "on_host_pools_registered, so the L3 tier was never opened")
        if self.cluster is None and self.settings.cluster_master is not None:
            raise InvalidArgumentError("extra config key 'cpkv_cluster_master': SGLang never called the backend's "
                                       "on_host_pools_registered, so the cluster tier was never opened")
        if self._broken is not None:
            raise type(self._broken)(f"cpkv storage backend stopped after an earlier failure: {self._broken}")

    def _fail(self, err: CpkvError) -> CpkvError:
        if self._broken is None:
            self._broken = err
        return err

    # -- the replicated side: stores ----------------------------------------------------------------

    def _store(self, keys: list[str], prefix_keys: list[str] | None) -> np.ndarray:
        """int64 ``[n, 2]``: each key's (row, handle), row -1 where refused."""
        self._check_usable()
        placed = self.index.store(keys, prefix_keys)
        with self._counters_lock:
            self.counters["stores"] += 1
            self.counters["pages_offered"] += len(keys)
            self.counters["pages_refused"] += int((placed[:, 0] < 0).sum())
        return placed

    def _after_store(self) -> None:
        """Every ``cpkv_check_every`` stores, this point's digests go to the checker thread
        (:class:`~cpkv.integrations._digest_checks.DigestChecks`). The L3 indexes change only in this
        thread's spills, inside the store just made: this is the same point of their stream on every
        rank of a node too."""
        # A one-rank store group compares no digest, but its cluster tier decides at the same points.
        if self.topology.group is None and self.cluster is None:
            return
        self._checks.after_store(self.index.stores, lambda: (
            self.index.stores, self.index.digest(), self.l3.digest() if self.l3 is not None else None))

    def _digest_check(self, stores: int, digest: int, l3_digest: int | None) -> None:
        """Agrees on the slab index's digest over the store group, and with L3 on, on the L3 indexes:
        combined with the slab's where the group is one node (one L3 per node, so one collective);
        across nodes (each node its own L3 index) each node first agrees on its own over its node
        group, then the store group agrees on the slab digest combined with whether every node did,
        so a node whose ranks' L3 indexes differ raises :class:`~cpkv.errors.DivergenceError` on every
        rank of the group, not only its own."""
        topo, timeout_s = self.topology, self.settings.timeout_s
        step = f"the digest check after store {stores}"
        try:
            if topo.group is None:
                pass  # one rank: no digest to compare (the cluster tier's decision below is its own)
            elif l3_digest is None:
                agree(digest, group=topo.group, rank=topo.rank, step=step, timeout_s=timeout_s)
            elif topo.nodes == 1:
                agree(_combined(digest, l3_digest), group=topo.group, rank=topo.rank, timeout_s=timeout_s,
                      step=f"{step} (slab index and L3 index)")
            else:
                node_agrees = 1
                if topo.node_size > 1:
                    low, high = decode(all_reduce_min(encode(l3_digest), group=topo.node_group, rank=topo.local_rank,
                                                      step=f"{step} (this node's L3 index)", timeout_s=timeout_s))
                    node_agrees = int(low == high)
                agree(_combined(digest, node_agrees), group=topo.group, rank=topo.rank, timeout_s=timeout_s,
                      step=f"{step} (slab index, and 1 where every rank of this rank's node holds one L3 index, "
                           f"this rank's: {node_agrees})")
            if self.l3 is not None and topo.node_group is not None and topo.node_size > 1:
                # A rank whose L3 write failed stops writing at once (it still places every page, so
                # the indexes agree); here every rank of its node learns it and stops too.
                (healthy,) = all_reduce_min([self.l3.healthy()], group=topo.node_group, rank=topo.local_rank,
                                            step=f"{step} (this node's L3 writes)", timeout_s=timeout_s)
                if healthy == 0:
                    self.l3.stop("a rank of this node could not write its L3 pages")
            if self.cluster is not None:
                # A rank whose cluster call failed makes no more calls (its misses are every rank's
                # through SGLang's MIN); here every rank of the store group marks the tier off too.
                # While it is off each rank's vote is its last probe of the store, and the same MIN
                # re-attaches it on every rank once every probe succeeded. Every rank issues this
                # collective at every check, whatever its vote.
                vote = self.cluster.vote()
                if topo.group is not None:
                    (vote,) = all_reduce_min([vote], group=topo.group, rank=topo.rank,
                                             step=f"{step} (the cluster tier's health)", timeout_s=timeout_s)
                self.cluster.decide(vote, stores, step)
        except CpkvError as err:
            raise self._fail(err) from err
        if topo.group is not None:
            with self._counters_lock:
                self.counters["digest_checks"] += 1

    def wait_checks(self, timeout_s: float) -> None:
        """Until every queued digest check has run or failed (tests, benchmarks); raises a failure."""
        self._checks.wait(timeout_s)
        self._check_usable()

    def _write(self, pool: PoolSlab, keys: list[str], prefix: list[str] | None, host_indices: Any) -> list[bool]:
        """One store call with its bytes (the index's ``store_pages``: checks, store, stamps, copies);
        returns which keys were placed."""
        self._check_usable()
        started = time.perf_counter()
        topo = self.topology
        # Every pool's bytes of a victim leave with it (the pools share the index and the row).
        spill = [p.native for p in self.pools.values()] if self.l3 is not None or self.cluster is not None else None
        stored, written, spilled = self.index.store_pages(keys, prefix, pool.native, host_indices, topo.node_size,
                                                          topo.local_rank, spill)
        if spilled is not None:
            self._spill(spilled)
        with self._counters_lock:
            self.counters["stores"] += 1
            self.counters["pages_offered"] += len(keys)
            self.counters["pages_refused"] += len(keys) - sum(stored)
        self._account_write(pool, written, started)
        self._after_store()
        return stored

    def _spill(self, spilled: Any) -> None:
        """Pages leaving the slab, to L3 (this rank's share written, durable) and to the cluster (this
        rank's share put, once per cluster)."""
        if self.l3 is not None:
            self.l3.spill(*spilled)
        if self.cluster is not None:
            self.cluster.spill(*spilled)

    # -- reads (no replicated state changes) ------------------------------------------------------

    def _read(self, pool: PoolSlab, keys: list[str], host_indices: Any) -> list[bool]:
        started = time.perf_counter()
        ok, good, torn = self.index.read_pages(keys, pool.native, host_indices)
        l3 = self.l3.pool(pool.name) if self.l3 is not None else None
        if l3 is not None and not all(ok):
            served = l3.read_into(keys, [i for i, hit in enumerate(ok) if not hit], pool.native, host_indices)
            for i in served:
                ok[i] = True
            good += len(served)
        if self.cluster is not None and not all(ok):
            served = self.cluster.read_into(pool.name, keys, [i for i, hit in enumerate(ok) if not hit], pool.native,
                                            host_indices)
            for i in served:
                ok[i] = True
            good += len(served)
        with self._counters_lock:
            self.counters["torn_reads_refused"] += torn
            self.counters["pages_read"] += good
            self.counters["bytes_read"] += good * pool.page_bytes
        self._account_read(pool, good, started)
        return ok

    # -- SGLang's interface: v1 -------------------------------------------------------------------

    def _run(self, keys: list[str], pool: PoolSlab) -> int:
        """The leading run of ``keys`` whose page of ``pool`` is in the slab, or whole in L3 (every
        pool's record indexed; no disk read here), or whole in the cluster (every pool's record there)."""
        hits = self.index.present(keys, pool.native)
        if (self.l3 is not None or self.cluster is not None) and hits < len(keys):
            rest = keys[hits:]
            in_slab = self.index.held(rest, pool.native)
            in_l3 = [self.l3.holds(key) for key in rest] if self.l3 is not None else [False] * len(rest)
            below = [i for i, (s, l3) in enumerate(zip(in_slab, in_l3)) if not (s or l3)]
            in_cluster = [False] * len(rest)
            if self.cluster is not None and below:  # one batch for every page slab and L3 lack
                for i, held in zip(below, self.cluster.holds([rest[i] for i in below])):
                    in_cluster[i] = held
            for s, l3, cluster in zip(in_slab, in_l3, in_cluster):
                if not (s or l3 or cluster):
                    break
                hits += 1
                if pool.name == KV and not s:
                    if l3:
                        assert self.l3 is not None
                        self.l3.anchor.counters["l3_exists_hit_pages"] += 1
                    else:
                        assert self.cluster is not None
                        self.cluster.counters["cluster_exists_hit_pages"] += 1
        return hits

    def _held(self, keys: list[str], pool: PoolSlab) -> list[bool]:
        """Per key: its page of ``pool`` is in the slab, or whole in L3 or in the cluster."""
        held = self.index.held(keys, pool.native)
        if self.l3 is not None:
            held = [h or self.l3.holds(k) for k, h in zip(keys, held)]
        if self.cluster is not None and not all(held):
            below = [i for i, h in enumerate(held) if not h]
            for i, h in zip(below, self.cluster.holds([keys[i] for i in below])):
                held[i] = h
        return held

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        self._check_usable()
        hits = self._run(keys, self._pool(KV))
        self._log_exists(hits)
        return hits

    def _log_exists(self, hits: int) -> None:
        """Counts one hit query's answer (the pages SGLang's MIN then sees)."""
        with self._counters_lock:
            self.counters["exists_calls"] += 1
            self.counters["exists_hit_pages"] += hits
            if len(self.exists_log) < 1 << 20:
                self.exists_log.append(hits)

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        prefix = extra_info.prefix_keys if extra_info is not None else None
        return self._write(self._pool(KV), keys, prefix, host_indices)

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        self._check_usable()
        return self._read(self._pool(KV), keys, host_indices)

    def _account_write(self, pool: PoolSlab, pages: int, started: float) -> None:
        seconds = time.perf_counter() - started
        with self._counters_lock:
            self.counters["pages_written"] += pages
            self.counters["bytes_written"] += pages * pool.page_bytes
            if pages and len(self._metrics["backup_pgs"]) < 4096:
                self._metrics["backup_pgs"].append(pages)
                self._metrics["backup_bandwidth"].append(pages * pool.page_bytes / max(seconds, 1e-9) / 1e9)

    def _account_read(self, pool: PoolSlab, pages: int, started: float) -> None:
        seconds = time.perf_counter() - started
        with self._counters_lock:
            self.counters["reads"] += 1
            if pages and len(self._metrics["prefetch_pgs"]) < 4096:
                self._metrics["prefetch_pgs"].append(pages)
                self._metrics["prefetch_bandwidth"].append(pages * pool.page_bytes / max(seconds, 1e-9) / 1e9)

    # -- SGLang's interface: v2 (several pools at once) -------------------------------------------

    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info: HiCacheStorageExtraInfo | None = None) -> PoolTransferResult:
        self._check_usable()
        kv_pages = self._run(keys, self._pool(KV))
        hit_count: dict[str, int] = {KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            pool = self._pool(transfer.name)
            upto = self._run(keys[:kv_pages], pool)  # through L3 too, as the KV's run
            if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                allowed = set(range(1, upto + 1))
            elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                # Only the last `trailing` pages of a prefix need this pool; check them one by one.
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                have = self._held(keys[:kv_pages], pool)
                allowed = {n for n in range(1, kv_pages + 1) if all(have[max(0, n - trailing):n])}
            else:
                raise InvalidArgumentError(f"pool {transfer.name!s}: hit policy {transfer.hit_policy!s} "
                                           "is not supported by the cpkv backend")
            if allowed:
                hit_count[str(transfer.name)] = max(allowed)
            restorable &= allowed
        ordered = sorted(restorable)
        self._log_exists(ordered[-1] if ordered else 0)
        return PoolTransferResult(ordered[-1] if ordered else 0, hit_count, ordered)

    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        self._check_usable()
        results: dict[str, list[bool]] = {}
        for transfer in transfers:
            keys = list(transfer.keys or [])
            pool = self._pool(transfer.name)
            results[transfer.name] = self._read(pool, keys, transfer.host_indices)
        return results

    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        self._check_usable()
        prefix = extra_info.prefix_keys if extra_info is not None else None
        # Every transfer is checked before any is stored: a refused call changes nothing.
        checked = []
        for transfer in transfers:
            keys = list(transfer.keys or [])
            pool = self._pool(transfer.name)
            pool.native.check(transfer.host_indices, len(keys))
            checked.append((transfer, keys, pool))
        return {transfer.name: self._write(pool, keys, prefix, transfer.host_indices)
                for transfer, keys, pool in checked}

    # -- SGLang's interface: the older tensor calls -----------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None) -> Any:
        """The tensor call: the key's page into ``target_location`` through the native seqlock read
        (stamp and tag checked before and after the copy, a fence between), or None."""
        self._check_usable()
        pool = self._pool(KV)
        e = self.index.get(key)
        if e is None or target_location is None:
            return None
        out = target_location.view(-1).view(torch.uint8)
        if out.numel() != pool.page_bytes:
            raise InvalidArgumentError(f"get {key!r}: target has {out.numel()} bytes, a page has {pool.page_bytes}")
        direct = out.is_cpu and out.is_contiguous()
        landing = out if direct else torch.empty(pool.page_bytes, dtype=torch.uint8)
        tag = int(self.index.key_tags([key])[0])
        found = pool.native.read_page(e.row, e.handle, tag, landing)
        if found == "torn":
            with self._counters_lock:
                self.counters["torn_reads_refused"] += 1
        if found != "served":
            return None
        if not direct:
            out.copy_(landing)
        return target_location

    def batch_get(self, keys: list[str], target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> list[Any]:
        targets = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(self, key: str, value: Any | None = None, target_location: Any | None = None,
            target_sizes: Any | None = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any | None = None, target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> bool:
        self._check_usable()
        pool = self._pool(KV)
        values = list(values or [])
        if len(values) != len(keys):
            raise InvalidArgumentError(f"batch_set: {len(values)} values for {len(keys)} keys")
        data = []
        for i, value in enumerate(values):  # checked before the index stores anything
            if value is None:
                raise InvalidArgumentError(f"batch_set: the value of key {keys[i]!r} is None")
            flat = value.reshape(-1).view(torch.uint8)
            if flat.numel() != pool.page_bytes:
                raise InvalidArgumentError(
                    f"batch_set: the value of key {keys[i]!r} has {flat.numel()} bytes, a page has {pool.page_bytes}")
            data.append(flat)
        placed = self._store(keys, None)
        tags = self.index.key_tags(keys)
        # This rank's rows, written natively by the seqlock's sequence (rows marked invalid, a fence,
        # the copies, a fence, rows published; a row holding its page already is skipped).
        node_size, local_rank = self.topology.node_size, self.topology.local_rank
        mine = [i for i, row in enumerate(placed[:, 0].tolist()) if row >= 0 and row % node_size == local_rank]
        written = pool.native.write_values(
            [int(placed[i, 0]) for i in mine], [int(placed[i, 1]) for i in mine], [int(tags[i]) for i in mine],
            [data[i].cpu().contiguous() for i in mine])
        with self._counters_lock:
            self.counters["pages_written"] += written
            self.counters["bytes_written"] += written * pool.page_bytes
        self._after_store()
        return bool((placed[:, 0] >= 0).all())

    # -- housekeeping -----------------------------------------------------------------------------

    def clear(self) -> None:
        """Drops every page (SGLang calls it on every rank while no store is in flight)."""
        self.index.clear()

    def digest(self) -> int:
        return self.index.digest()

    def slab_bytes_in_use(self, name: str = KV) -> int:
        """Bytes of this node's slab that hold a fully written page of a key in the index (counted
        from the shared stamps, so every rank of a node sees the same number once stores are done)."""
        pool = self._pool(name)
        r = self.index.readable()
        if not len(r):
            return 0
        return int((pool.stamps[r[:, 0]] == r[:, 1]).sum()) * pool.page_bytes

    def stats(self) -> dict[str, Any]:
        topo = self.topology
        with self._counters_lock:
            out: dict[str, Any] = dict(self.counters)
        out.update({
            "policy": self.settings.policy, "rows": self.settings.pages, "rank_replicated": self.rank_replicated,
            "resident": len(self.index), "evicted": self.index.evicted, "group_rank": topo.rank,
            "group_size": topo.size, "node": topo.node, "nodes": topo.nodes, "node_size": topo.node_size,
            "slab_bytes": sum(p.slab.nbytes for p in self.pools.values()),
            "slab_kind": {name: p.slab.kind for name, p in self.pools.items()},
            "copy": {name: p.mode for name, p in self.pools.items()},
            "broken": None if self._broken is None else f"{type(self._broken).__name__}: {self._broken}",
        })
        if self.l3 is not None:
            out.update(self.l3.stats())
        if self.cluster is not None:
            out.update(self.cluster.stats())
        return out

    def get_stats(self) -> Any:
        """SGLang's storage metrics (pages and GB/s per backup and per read since the last call)."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics = StorageMetrics()
        with self._counters_lock:
            for name, values in self._metrics.items():
                getattr(metrics, name).extend(values)
                values.clear()
        return metrics

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._checks.close(self.settings.timeout_s)
        if (self.l3 is not None or self.cluster is not None) and self._broken is None:
            # A clean stop (SGLang's detach_storage_backend; every rank): the slab's pages, of every
            # pool, go to L3 and the cluster too, so a restart on the directory, and every other
            # instance, is warm with everything, not only the evicted pages.
            topo = self.topology
            natives = [p.native for p in self.pools.values()]
            self._spill(self.index.spill_resident(natives, topo.node_size, topo.local_rank))
        for pool in self.pools.values():
            pool.close()
        if self.l3 is not None:
            self.l3.close()
        if self.cluster is not None:
            self.cluster.close()
        import torch.distributed as dist

        for group in self.topology.groups:
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 -- best effort at shutdown
                pass
        self.topology.groups = []

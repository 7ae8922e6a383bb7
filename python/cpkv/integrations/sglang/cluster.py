"""The cluster tier under the backend's slab (and under L3 when it is on): pages every SGLang
instance shares through Mooncake Store (:mod:`cpkv.tier.cluster.pages`: the cluster tier's records
and keys, one namespace per pool).

- **Writes** (SGLang's backup thread, inside its store calls, never the scheduler thread): a page
  leaves the slab (its eviction, or every resident page at a clean stop) and the rank that copied it
  out of its row (the node writer, ``row % node_size``: the L3 rule) puts it, in every pool, after
  ``batch_is_exist`` says the cluster lacks it: one copy per cluster.
- **Hits** (the prefetch threads): ``batch_exists`` continues the slab's (and L3's) run of hits with
  the pages whose record *every* pool holds in the cluster: a DSA page is its KV and its indexer
  together, never one without the other. ``batch_get_v1`` / ``batch_get_v2`` read each page neither
  slab nor L3 served into staging rows, check its record (CRC, key, namespace, length), and only
  then copy it into SGLang's host pool. A record that fails is a counted miss. Every rank reads the
  pages it needs itself (SGLang holds every page replicated on the ranks of a store group), and
  SGLang's own MIN over the ranks' hits and loaded tokens makes every outcome common.
- **Faults**: every call is bounded by ``cpkv_timeout_s``; a rank whose call fails makes no more
  calls (misses only, which SGLang's MIN makes every rank's), and at the next digest check every
  rank of the store group learns it and marks the tier unavailable too. While unavailable each rank
  probes the store (:class:`~cpkv.tier.cluster.probe.StoreProbe`, polled at each digest check, in
  the background) and the tier re-attaches on every rank at the first digest check where every
  rank's last probe succeeded: one MIN, the same collective that marks it unavailable (every rank
  issues it whatever its probe said; a one-rank group decides alone at the same points). A
  re-attached tier is cold: nothing is assumed present, and every record read is checked as always.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from cpkv.errors import InvalidArgumentError
from cpkv.integrations._adapter import CLUSTER_MASTER_KEY
from cpkv.runtime.agree import all_reduce_min
from cpkv.tier.cluster.pages import ClusterClient, ClusterPages

from .kv_format import kv_cache_format
from .l3 import l3_key, pool_namespace

__all__ = ["SglangClusterTier"]

SETTING = f"extra config key {CLUSTER_MASTER_KEY!r}"
log = logging.getLogger(__name__)


class SglangClusterTier:
    """One rank's cluster tier under every pool of its store group; open is collective over the store
    group (every rank connects, then one MIN: a rank that cannot is every rank's refusal)."""

    def __init__(self, settings: Any, pools: Mapping[str, Any], *, model: str | None, kv_cache_dtype: str,
                 topology: Any, tp_size: int) -> None:
        """``pools``: name -> the backend's ``PoolSlab``, the KV pool first (SGLang registers it first)."""
        if not model:
            raise InvalidArgumentError(f"{SETTING}: SGLang's storage config names no model (model_name), and a "
                                       "cluster page is served only to the model that wrote it")
        if not pools:
            raise InvalidArgumentError(f"{SETTING}: no host pool was registered")
        self.topology = topology
        self.unavailable: str | None = None  # why the tier is off on every rank (agreed at a digest check)
        # The digest checks (by the store count they follow) that marked the tier unavailable and that
        # re-attached it: the same on every rank of the store group.
        self.marked_unavailable_at: list[int] = []
        self.reattached_at: list[int] = []
        self.counters = {"cluster_puts_skipped": 0, "cluster_exists_hit_pages": 0, "cluster_unavailable_marks": 0,
                         "cluster_reattaches": 0}
        self.client: ClusterClient | None = None
        refusal = ""
        try:
            self.client = ClusterClient(settings.cluster_master, settings.cluster_metadata, settings.timeout_s,
                                        setting=SETTING, segment_bytes=settings.cluster_bytes // max(1, topology.size))
        except InvalidArgumentError as err:
            refusal = str(err)
        if topology.group is not None and topology.size > 1:
            (opened,) = all_reduce_min([0 if refusal else 1], group=topology.group, rank=topology.rank,
                                       step="the cluster tier's open", timeout_s=settings.timeout_s)
            if not opened and not refusal:
                refusal = f"{SETTING} {settings.cluster_master!r}: another rank of this store group could not reach it"
        if refusal:
            self.close()
            raise InvalidArgumentError(refusal)
        assert self.client is not None
        kv_format = kv_cache_format(kv_cache_dtype, getattr(next(iter(pools.values())).host_pool, "dtype", None))
        self.pools = {name: ClusterPages(self.client, pool_namespace(
            model, kv_format, name, p.host_pool, page_bytes=p.page_bytes, page_size=p.page_size, topology=topology,
            tp_size=tp_size).id(), p.page_bytes) for name, p in pools.items()}

    @property
    def usable(self) -> bool:
        return self.unavailable is None and self.client is not None and self.client.down is None

    # -- writes (the backup thread) ---------------------------------------------------------------

    def spill(self, keys: Sequence[bytes], rows: Sequence[int], copied: Sequence[bool],
              pages: Sequence[np.ndarray]) -> int:
        """A store's victims (``SglangIndex.store_pages``' spill over every pool, in this tier's pool
        order): the ones this rank copied out of its rows go to the cluster, in every pool. Returns
        the pages put (in the KV pool)."""
        mine = [i for i, c in enumerate(copied) if c]
        if not mine:
            return 0
        if not self.usable:
            self.counters["cluster_puts_skipped"] += len(mine)
            return 0
        cluster_keys = [l3_key(keys[i]) for i in mine]
        put = [p.put(cluster_keys, [pool_pages[i] for i in mine]) for p, pool_pages in zip(self.pools.values(), pages)]
        return put[0]

    # -- hits (the prefetch threads) --------------------------------------------------------------

    def holds(self, keys: Sequence[str]) -> list[bool]:
        """Per key: every pool's record of its page is in the cluster (no read)."""
        if not keys or not self.usable:
            return [False] * len(keys)
        cluster_keys = [l3_key(k) for k in keys]
        held = [True] * len(keys)
        for pages in self.pools.values():
            held = [h and p for h, p in zip(held, pages.present(cluster_keys))]
        return held

    def read_into(self, pool_name: str, keys: Sequence[str], wanted: Sequence[int], pool: Any,
                  host_indices: Any) -> list[int]:
        """Reads the pages of ``keys[i]`` for ``i`` in ``wanted`` from the cluster into the host pool
        (``pool``: the ``SglangPool``), each record checked first; returns the positions served."""
        pages = self.pools.get(pool_name)
        if pages is None or not wanted or not self.usable:
            return []
        good, data = pages.get([l3_key(keys[i]) for i in wanted])
        served = [wanted[j] for j in good]
        if served:
            pool.fill_host(host_indices, len(keys), served, np.ascontiguousarray(data))
        return served

    # -- health (agreed at the digest check) ------------------------------------------------------

    def vote(self) -> int:
        """This rank's word at a digest check: while the tier is on, 1 while its client makes calls;
        while it is off, 1 when its last probe of the store succeeded (the store group's MIN of these
        decides for every rank, :meth:`decide`)."""
        if self.client is None:
            return 0
        if self.unavailable is None:
            return int(self.client.down is None)
        return int(self.client.probe_ok())

    def decide(self, agreed: int, stores: int, step: str) -> None:
        """The store group's MIN of :meth:`vote` at the digest check after store ``stores``: the same
        on every rank, so every rank marks the tier unavailable, or re-attaches it, at this point."""
        if self.unavailable is None and agreed == 0:
            self.mark_unavailable(f"a rank of this store group lost the cluster store at {step}", stores)
        elif self.unavailable is not None and agreed == 1:
            assert self.client is not None
            self.client.reattach()
            self.unavailable = None
            self.reattached_at.append(stores)
            self.counters["cluster_reattaches"] += 1
            log.warning("cpkv cluster tier re-attached at %s (cold: every page is looked up again)", step)

    def mark_unavailable(self, reason: str, stores: int = -1) -> None:
        if self.unavailable is None:
            self.unavailable = reason
            self.marked_unavailable_at.append(stores)
            self.counters["cluster_unavailable_marks"] += 1
            if self.client is not None:  # this rank makes no calls either (its own may still work)
                self.client.mark_down(reason, fault=False)
            log.warning("cpkv cluster tier unavailable: %s", reason)

    def stats(self) -> dict[str, Any]:
        per = {name: dict(p.counters) for name, p in self.pools.items()}
        out: dict[str, Any] = dict(self.counters)
        anchor = next(iter(per.values()))
        out.update({"cluster_pages_put": anchor["cluster_pages_put"],
                    "cluster_pages_read": anchor["cluster_pages_read"],
                    "cluster_corrupt_dropped": sum(p["cluster_corrupt_dropped"] for p in per.values()),
                    "cluster_faults": self.client.faults if self.client is not None else 0,
                    "cluster_down": self.client.down if self.client is not None else None,
                    "cluster_available": int(self.unavailable is None), "cluster_unavailable": self.unavailable,
                    "cluster_marked_unavailable_at": list(self.marked_unavailable_at),
                    "cluster_reattached_at": list(self.reattached_at),
                    "cluster_probes": self.client.probe.probes if self.client is not None else 0,
                    "cluster_pools": per})
        return out

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

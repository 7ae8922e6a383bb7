"""cpkv's cluster tier as a vLLM 0.33 secondary tier: pages every vLLM instance shares through
Mooncake Store, under vLLM's own CPU tier (``TieringOffloadingSpec``), loaded out of tree::

    kv_connector_extra_config = {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ...,
        "secondary_tiers": [{"type": "CpkvClusterTier", "module_path": "cpkv.integrations.vllm.cluster_tier",
                             "cpkv_cluster_master": "HOST:PORT", "cpkv_cluster_metadata": "http://HOST:PORT/metadata"}]}

The records and keys are the cluster tier's (:mod:`cpkv.tier.cluster.pages`): a chunk's row of vLLM's
primary CPU tier (every worker's bytes of the chunk: the scheduler's view holds them all) as one
record with cpkv's CRC32C trailer, under a namespace naming the model, the KV cache dtype, the
layout, the chunk size and the parallel geometry, so another configuration's chunk is never served.

Everything runs in vLLM's scheduler process, which vLLM calls only briefly (its contract): the
lookups are vLLM's own :class:`~vllm.v1.kv_offload.tiering.async_lookup.AsyncLookupManager`
(``batch_is_exist`` per step on its thread; RETRY until the answer is in), and stores and loads run
on this tier's one I/O thread:

- **store** (vLLM cascades every chunk its CPU tier completes): ``batch_is_exist``, then
  ``batch_put_from`` of what the cluster lacks: one copy per cluster;
- **load** (a promotion): ``batch_get_into`` staging rows, each record checked (CRC, key,
  namespace, length) before a byte is copied into the primary row vLLM allocated for it (not yet
  visible: vLLM publishes it on the job's completion); a record that fails is a counted miss, and
  vLLM's failed-promotion path recomputes it.

Faults: every call is bounded by ``cpkv_timeout_s``; a call that fails or does not answer turns the
tier off for this instance (lookups MISS at once, stores are skipped, nothing is served); there is
one scheduler per instance, so no other process must agree. While off, the tier probes the store
(:class:`~cpkv.tier.cluster.probe.StoreProbe`, in the background) at most every
:attr:`CpkvClusterTier.probe_every_steps` scheduler steps (counted, not timed: the same run of steps
decides the same way), and the first step after a probe succeeded turns it on again: cold (a
restarted master holds nothing; every chunk is looked up again and every record read is checked as
always). A master down at start is an :class:`~cpkv.errors.InvalidArgumentError` naming
``cpkv_cluster_master``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from cpkv.errors import InvalidArgumentError
from cpkv.integrations._adapter import CLUSTER_KEYS, CLUSTER_MASTER_KEY, TIMEOUT_KEY, CpkvKeys
from cpkv.tier.cluster.pages import ClusterClient, ClusterPages
from cpkv.tier.l3.store import L3Namespace

from .config import check_stable_block_hashes
from .l3 import l3_key
from .spec import _hash_algo

__all__ = ["CpkvClusterTier"]

KNOWN_KEYS = (*CLUSTER_KEYS, TIMEOUT_KEY)
VLLM_KEYS = ("locality",)  # the tier-config keys vLLM's factory hands every tier besides its own


def _label(key: str) -> str:
    return f"secondary_tiers[CpkvClusterTier][{key!r}]"


def chunk_namespace(offloading_spec: Any, row_bytes: int) -> L3Namespace:
    """What a chunk's record must share with its reader to be served."""
    config = offloading_spec.config
    parallel = config.parallel
    groups = [(g.group_id, g.tokens_per_block, len(g.layer_names)) for g in config.groups]
    return L3Namespace(
        model=config.model.name, dtype=f"KV cache {config.model.dtype}",
        kv_layout=(f"vLLM tiering primary row: {config.kv_cache_layout} layout, groups {groups}, "
                   f"replicated {config.replicated_layout}, canonical {config.canonical_layout}, "
                   f"pp {parallel.pp_size} pcp {parallel.pcp_size} dcp {parallel.dcp_size}"),
        page_size=config.cache.tokens_per_hash * config.cache.blocks_per_chunk, cp_size=parallel.pcp_size,
        tp_size=parallel.tp_size, page_bytes=row_bytes)


class _ClusterLookups(AsyncLookupManager):
    def __init__(self, pages: ClusterPages, tier_type: str) -> None:
        super().__init__(tier_type=tier_type)
        self._pages = pages

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._pages.present([l3_key(bytes(k)) for k in keys])


class CpkvClusterTier(SecondaryTierManager):
    """vLLM ``SecondaryTierManager`` over cpkv's cluster tier (see the module docstring)."""

    medium: ClassVar[Medium] = Medium.CPU  # remote memory (the store servers')
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED
    # While the tier is off: a probe of the store starts at most every this many scheduler steps.
    probe_every_steps: ClassVar[int] = 16

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, **tier_config: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type,
                         backpressure_detector=backpressure_detector)
        keys = CpkvKeys(tier_config, KNOWN_KEYS, _label)
        other = sorted(k for k in tier_config if not str(k).startswith("cpkv_") and k not in VLLM_KEYS)
        if other:
            raise InvalidArgumentError(f"{_label(other[0])} is not a setting of this tier (known: "
                                       f"{', '.join(KNOWN_KEYS)})")
        master, metadata, lent = keys.cluster()
        if master is None or metadata is None:
            raise InvalidArgumentError(f"{_label(CLUSTER_MASTER_KEY)} is required (with cpkv_cluster_metadata)")
        timeout_s = keys.timeout_s()
        # Shared by every instance: a chunk's key must be the same in each (and after a restart).
        check_stable_block_hashes(_hash_algo(), setting=_label(CLUSTER_MASTER_KEY))
        self.locality = Locality(tier_config["locality"]) if "locality" in tier_config else Locality.REMOTE
        rows = np.asarray(primary_kv_view)
        self._rows = rows.view(np.uint8).reshape(rows.shape[0], -1)
        self.namespace_id = chunk_namespace(offloading_spec, self.block_size_bytes).id()
        self._client = ClusterClient(master, metadata, timeout_s, setting=_label(CLUSTER_MASTER_KEY),
                                     segment_bytes=lent, probe_every=self.probe_every_steps)
        self.pages = ClusterPages(self._client, self.namespace_id, self._rows.shape[1])
        self._lookups = _ClusterLookups(self.pages, tier_type)
        self.counters = {"cluster_store_jobs": 0, "cluster_load_jobs": 0, "cluster_chunks_loaded": 0,
                         "cluster_chunks_failed": 0, "cluster_stores_skipped": 0, "cluster_reattaches": 0}
        self._lock = threading.Condition()
        self._queue: deque[TransferJob | None] = deque()
        self._finished: list[tuple[JobResult, list[OffloadKey]]] = []
        self._running = 0  # jobs queued or in flight
        self._io = threading.Thread(target=self._serve, name="cpkv-cluster-tier", daemon=True)
        self._io.start()

    @property
    def available(self) -> bool:
        return self._client.down is None

    # -- vLLM's calls (the scheduler thread, under the tiering manager's lock) -------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if not self.available:
            return LookupResult.MISS
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def _submit(self, job: TransferJob) -> None:
        with self._lock:
            self._queue.append(job)
            self._running += 1
            self._lock.notify_all()

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            finished, self._finished = self._finished, []
        for _, failed in finished:
            if failed:  # vLLM recomputes them; the lookup must not offer them again
                self._lookups.mark_miss(failed)
        return [result for result, _ in finished]

    def has_pending_work(self) -> bool:
        with self._lock:
            return self._running > 0 or bool(self._finished)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()
        if not self.available and self._client.probe_ok():
            # The store answers again: on at the next step, cold (nothing assumed present).
            self._client.reattach()
            self.counters["cluster_reattaches"] += 1

    def drain_jobs(self) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._running == 0)

    def shutdown(self) -> None:
        self.drain_jobs()
        with self._lock:
            self._queue.append(None)
            self._lock.notify_all()
        self._io.join()
        self._lookups.shutdown()
        self._client.close()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out.update(self.pages.counters)
        out.update({"cluster_available": int(self.available), "cluster_down": self._client.down,
                    "cluster_faults": self._client.faults, "cluster_probes": self._client.probe.probes})
        return out

    # -- the I/O thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self._queue))
                job = self._queue.popleft()
            if job is None:
                return
            try:
                done = self._load(job) if job.is_promotion else self._store(job)
            except Exception:  # noqa: BLE001 -- a job never dies silently: vLLM is told it failed
                done = (JobResult(job_id=job.job_id, success=False), list(job.keys) if job.is_promotion else [])
            with self._lock:
                self._finished.append(done)
                self._running -= 1
                self._lock.notify_all()

    def _store(self, job: TransferJob) -> tuple[JobResult, list[OffloadKey]]:
        keys = list(job.keys)
        self.counters["cluster_store_jobs"] += 1
        if not self.available:
            self.counters["cluster_stores_skipped"] += len(keys)
            return JobResult(job_id=job.job_id, success=False), []
        chunks = [int(c) for c in job.chunk_ids]
        self.pages.put([l3_key(bytes(k)) for k in keys], [self._rows[c] for c in chunks])
        return JobResult(job_id=job.job_id, success=self.available, transfer_bytes=len(keys) * self.block_size_bytes), []

    def _load(self, job: TransferJob) -> tuple[JobResult, list[OffloadKey]]:
        keys = list(job.keys)
        chunks = [int(c) for c in job.chunk_ids]
        self.counters["cluster_load_jobs"] += 1
        good: list[int] = []
        if self.available:
            good, data = self.pages.get([l3_key(bytes(k)) for k in keys])
            for j, position in enumerate(good):  # checked records only, into rows vLLM has not published
                self._rows[chunks[position]] = data[j]
        served = set(good)
        failed = [k for i, k in enumerate(keys) if i not in served]
        self.counters["cluster_chunks_loaded"] += len(good)
        self.counters["cluster_chunks_failed"] += len(failed)
        if not failed:
            return JobResult(job_id=job.job_id, success=True, transfer_bytes=len(keys) * self.block_size_bytes), []
        successful = [keys[i] for i in good]
        return JobResult(job_id=job.job_id, success=False, successful_keys=successful or None), failed

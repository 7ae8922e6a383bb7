"""CpkvOffloadingSpec: what vLLM's OffloadingConnector loads by module path.

``kv_connector_extra_config = {"spec_name": "CpkvOffloadingSpec",
"spec_module_path": "cpkv.integrations.vllm", "cpkv_host_blocks": N, ...}``; the cpkv keys are
checked at construction (:mod:`cpkv.integrations.vllm.config`).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingSpec
from vllm.v1.kv_offload.config import OffloadingConfig

from .cluster import MASTER_SETTING, ClusterCatalog, ClusterGeometry
from .config import CpkvOffloadConfig, check_stable_block_hashes
from .l3 import L3Catalog, L3Geometry
from .manager import CpkvOffloadingManager
from .worker import CpkvOffloadingWorker

__all__ = ["CpkvOffloadingSpec"]


class CpkvOffloadingSpec(OffloadingSpec):
    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self.cpkv = CpkvOffloadConfig.from_extra_config(self.extra_config)
        # One offloaded chunk of group g covers tokens_per_block[g] * blocks_per_chunk tokens.
        self.tokens_per_chunk = tuple(t * self.blocks_per_chunk for t in self.tokens_per_block)
        self.l3: L3Geometry | None = None
        if self.cpkv.l3_dir is not None:
            check_stable_block_hashes(_hash_algo())
            self.l3 = _l3_geometry(config, self.cpkv, self.tokens_per_chunk)
        self.cluster: ClusterGeometry | None = None
        if self.cpkv.cluster_master is not None:
            # Shared by every instance: a chunk's key must be the same in each (and after a restart).
            check_stable_block_hashes(_hash_algo(), setting=MASTER_SETTING)
            self.cluster = _cluster_geometry(config, self.tokens_per_chunk)
        self._manager: CpkvOffloadingManager | None = None
        self._worker: CpkvOffloadingWorker | None = None

    def get_manager(self) -> CpkvOffloadingManager:
        if self._manager is None:
            self._manager = CpkvOffloadingManager(
                self.cpkv.host_blocks, self.cpkv.policy, tokens_per_chunk=self.tokens_per_chunk,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                l3=None if self.l3 is None else L3Catalog(self.l3), cluster=self._cluster_catalog())
        return self._manager

    def _cluster_catalog(self) -> ClusterCatalog | None:
        if self.cluster is None:
            return None
        assert self.cpkv.cluster_master is not None and self.cpkv.cluster_metadata is not None
        return ClusterCatalog(self.cluster, self.cpkv.cluster_master, self.cpkv.cluster_metadata, self.cpkv.timeout_s)

    def get_worker(self, kv_caches: CanonicalKVCaches) -> CpkvOffloadingWorker:
        if self._worker is None:
            self._worker = CpkvOffloadingWorker(
                kv_caches, blocks_per_chunk=self.blocks_per_chunk, host_blocks=self.cpkv.host_blocks,
                slab=self.cpkv.slab, process_group=_node_group(), timeout_s=self.cpkv.timeout_s,
                l3=None if self.l3 is None else (self.l3, self.config.parallel.rank),
                cluster=None if self.cluster is None else (self.cluster, self.config.parallel.rank, self.cpkv))
        return self._worker


def _hash_algo() -> str | None:
    """vLLM's prefix_caching_hash_algo, when its config is in reach (it is while vLLM builds the
    connector under ``set_current_vllm_config``)."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return None if config is None else str(config.cache_config.prefix_caching_hash_algo)


def _layout(config: OffloadingConfig, tokens_per_chunk: tuple[int, ...]) -> str:
    parallel = config.parallel
    return (f"{config.kv_cache_layout} layout, {len(config.groups)} group(s), tokens per chunk {list(tokens_per_chunk)}, "
            f"tp {parallel.tp_size} pp {parallel.pp_size} pcp {parallel.pcp_size} dcp {parallel.dcp_size}")


def _cluster_geometry(config: OffloadingConfig, tokens_per_chunk: tuple[int, ...]) -> ClusterGeometry:
    """What both sides derive alike from vLLM's config: one worker's chunk bytes, the namespaces."""
    return ClusterGeometry(model=config.model.name, dtype=str(config.model.dtype),
                           layout=_layout(config, tokens_per_chunk), tokens_per_chunk=max(tokens_per_chunk),
                           world=config.parallel.world_size,
                           page_bytes=config.worker_kv_bytes_per_block * config.cache.blocks_per_chunk)


def _l3_geometry(config: OffloadingConfig, cpkv: CpkvOffloadConfig, tokens_per_chunk: tuple[int, ...]) -> L3Geometry:
    """What both sides derive alike from vLLM's config: one worker's chunk bytes, the namespace."""
    from pathlib import Path

    parallel = config.parallel
    layout = _layout(config, tokens_per_chunk)
    assert cpkv.l3_dir is not None and cpkv.l3_bytes is not None
    directory = Path(cpkv.l3_dir)
    if parallel.data_parallel_size > 1:  # one scheduler per data-parallel engine: each its own catalog
        directory = directory / f"dp-{parallel.data_parallel_index}-of-{parallel.data_parallel_size}"
        directory.mkdir(exist_ok=True)
    return L3Geometry(directory=directory, cap_bytes=cpkv.l3_bytes, model=config.model.name,
                      dtype=str(config.model.dtype), layout=layout, tokens_per_chunk=max(tokens_per_chunk),
                      world=parallel.world_size, page_bytes=config.worker_kv_bytes_per_block * config.cache.blocks_per_chunk,
                      instance=_instance_id())


def _instance_id() -> str:
    """vLLM's id of this engine instance (the same in its scheduler and its workers: they get one
    config), or "" where no config is in reach."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return "" if config is None else str(config.instance_id)


def _node_group() -> Any:
    """The host slab's process group: None for one process; with torch.distributed up, vLLM's gloo
    group of all workers (HostSlab.create is collective over it)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from vllm.distributed.parallel_state import get_world_group

    return get_world_group().cpu_group

"""CpkvOffloadingSpec: what vLLM's OffloadingConnector loads by module path.

``kv_connector_extra_config = {"spec_name": "CpkvOffloadingSpec",
"spec_module_path": "cpkv.integrations.vllm", "cpkv_host_blocks": N, ...}``; the cpkv keys are
checked at construction (:mod:`cpkv.integrations.vllm.config`).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingSpec
from vllm.v1.kv_offload.config import OffloadingConfig

from .config import CpkvOffloadConfig
from .manager import CpkvOffloadingManager
from .worker import CpkvOffloadingWorker

__all__ = ["CpkvOffloadingSpec"]


class CpkvOffloadingSpec(OffloadingSpec):
    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self.cpkv = CpkvOffloadConfig.from_extra_config(self.extra_config)
        # One offloaded chunk of group g covers tokens_per_block[g] * blocks_per_chunk tokens.
        self.tokens_per_chunk = tuple(t * self.blocks_per_chunk for t in self.tokens_per_block)
        self._manager: CpkvOffloadingManager | None = None
        self._worker: CpkvOffloadingWorker | None = None

    def get_manager(self) -> CpkvOffloadingManager:
        if self._manager is None:
            self._manager = CpkvOffloadingManager(
                self.cpkv.host_blocks, self.cpkv.policy, tokens_per_chunk=self.tokens_per_chunk,
                enable_events=self.kv_events_config.enable_kv_cache_events)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> CpkvOffloadingWorker:
        if self._worker is None:
            self._worker = CpkvOffloadingWorker(
                kv_caches, blocks_per_chunk=self.blocks_per_chunk, host_blocks=self.cpkv.host_blocks,
                slab=self.cpkv.slab, process_group=_node_group(), timeout_s=self.cpkv.timeout_s)
        return self._worker


def _node_group() -> Any:
    """The host slab's process group: None for one process; with torch.distributed up, vLLM's gloo
    group of all workers (HostSlab.create is collective over it)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from vllm.distributed.parallel_state import get_world_group

    return get_world_group().cpu_group

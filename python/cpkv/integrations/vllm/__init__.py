"""cpkv as vLLM's KV offloading backend (exactly vLLM 0.33.0; checked before vLLM is imported).

Enable it with ``--kv-transfer-config`` (see the README)::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "CpkvOffloadingSpec",
                                   "spec_module_path": "cpkv.integrations.vllm",
                                   "cpkv_host_blocks": 4096, "cpkv_policy": "lru"}}

- :class:`CpkvOffloadingSpec` (vLLM loads it by module path) checks the ``cpkv_`` keys once
  (:class:`CpkvOffloadConfig`: an unknown one is refused by name) and builds
- :class:`CpkvOffloadingManager` (scheduler side: one call per vLLM call into the Rust core's
  ``OffloadIndex``, which chains the block hashes into a prefix tree, gives each chunk a slab row,
  pins transfers as tree locks and evicts deterministically, a victim losing only the rows a call
  needs) and
- :class:`CpkvOffloadingWorker` (worker side: copies between vLLM's KV tensors and the rows of a cpkv
  HostSlab shared by the node's workers, or of this process's own memory).

With ``cpkv_l3_dir`` / ``cpkv_l3_bytes`` the host tier has a durable disk tier below it
(:mod:`cpkv.integrations.vllm.l3`): evicted chunks are written there, and a restarted engine finds them.
With ``cpkv_cluster_master`` / ``cpkv_cluster_metadata`` the cluster tier (Mooncake Store) is below both
(:mod:`cpkv.integrations.vllm.cluster`): chunks every instance shares, every record checked before a hit.
"""

from ._version import REQUIRED_VLLM, check_vllm_version

check_vllm_version()

from .config import CpkvOffloadConfig  # noqa: E402
from .manager import CpkvLoadStoreSpec, CpkvOffloadingManager  # noqa: E402
from .spec import CpkvOffloadingSpec  # noqa: E402
from .worker import CpkvOffloadingWorker  # noqa: E402

__all__ = [
    "REQUIRED_VLLM",
    "CpkvOffloadConfig",
    "CpkvLoadStoreSpec",
    "CpkvOffloadingManager",
    "CpkvOffloadingSpec",
    "CpkvOffloadingWorker",
]

"""cpkv as vLLM's KV offloading backend (exactly vLLM 0.33.0; checked before vLLM is imported).

Enable it with ``--kv-transfer-config`` (see the README)::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "CpkvOffloadingSpec",
                                   "spec_module_path": "cpkv.integrations.vllm",
                                   "cpkv_host_blocks": 4096, "cpkv_policy": "lru"}}

- :class:`CpkvOffloadingSpec` (vLLM loads it by module path) builds
- :class:`CpkvOffloadingManager` (scheduler side: cpkv's PrefixTree + PageAllocator decide what is on
  the host and what leaves, deterministically) and
- :class:`CpkvOffloadingWorker` (worker side: copies between vLLM's KV tensors and a cpkv HostSlab).
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

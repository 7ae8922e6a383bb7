"""cpkv as SGLang's HiCache storage backend (exactly SGLang 0.5.23; checked before SGLang is imported).

Enable it with ``--hicache-storage-backend dynamic`` (see the README)::

    --hicache-storage-backend-extra-config '{"backend_name": "cpkv",
        "module_path": "cpkv.integrations.sglang", "class_name": "CpkvHiCacheStorage",
        "interface_v1": 1, "cpkv_pages": 65536}'

- :class:`CpkvHiCacheStorage`: the ``HiCacheStorage`` SGLang's cache controller drives (v1 zero-copy,
  v2 with sidecar pools, the older tensor calls); its pages live in one cpkv ``HostSlab`` per node,
- :class:`ReplicatedIndex`: which page is in which slab row, decided identically on every CP rank.
"""

from ._version import REQUIRED_SGLANG, check_sglang_version

check_sglang_version()

from .backend import CpkvHiCacheStorage  # noqa: E402
from .config import CpkvStorageSettings  # noqa: E402
from .index import ReplicatedIndex  # noqa: E402

__all__ = ["REQUIRED_SGLANG", "CpkvHiCacheStorage", "CpkvStorageSettings", "ReplicatedIndex"]

"""The CP compose path: each rank's dense, slot-ordered KV buffer from pages spread over the ranks.

- :mod:`~cpkv.compose.spans`: :class:`SlotSpans`, the one description of a batch's dense buffer;
- :mod:`~cpkv.compose.plan`: :class:`ComposePlan` (built once per batch) and :class:`PlanCache`;
- :mod:`~cpkv.compose.groups`: :class:`LocalGroup`, :class:`ShmGroup`, :class:`CudaIpcGroup`;
- :mod:`~cpkv.compose.debug`: the plan and staging checks ``CPKV_DEBUG_COMPOSE=1`` turns on (read,
  like every setting, through :mod:`cpkv.config`);
- :mod:`~cpkv.compose.workload`: random and uniform batches (tests, benchmarks);
- the gather itself lives in :mod:`cpkv.kernels.gather` (torch/numpy on CPU, Triton on a device);
- page ownership (:class:`~cpkv.runtime.layout.CpLayout`), ShmGroup's memory, the barrier timeouts and
  the rank launcher live in :mod:`cpkv.runtime`.
"""

from cpkv.compose.groups import ComposeGroup, CudaIpcGroup, GroupStats, LocalGroup, ShmGroup
from cpkv.compose.plan import ComposePlan, PlanCache, PlanKey
from cpkv.compose.spans import SlotSpans

__all__ = [
    "ComposeGroup",
    "ComposePlan",
    "CudaIpcGroup",
    "GroupStats",
    "LocalGroup",
    "PlanCache",
    "PlanKey",
    "ShmGroup",
    "SlotSpans",
]

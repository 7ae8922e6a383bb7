"""A gloo group over exactly the ranks of a process group, for what NCCL cannot carry.

Python objects (CUDA IPC handles), CPU tensors and the shared host slab's set-up need a CPU backend.
When the caller's group is NCCL, cpkv makes a gloo group of the *same* ranks, never of the whole
world: a CP group is usually a subgroup (data- or pipeline-parallel ranks beside it), and a group the
other ranks never join would hang. Only the group's members take part in making it
(``use_local_synchronization``), and it has cpkv's timeout, not torch's 30-minute default.
"""

from __future__ import annotations

from typing import Any

from cpkv.runtime.timeouts import as_timedelta


def group_ranks(process_group: Any) -> list[int]:
    """Global ranks of ``process_group`` (``None``: the default group), in group-rank order."""
    import torch.distributed as dist

    return list(dist.get_process_group_ranks(process_group if process_group is not None else dist.group.WORLD))


def carries_cpu_tensors(process_group: Any) -> bool:
    import torch.distributed as dist

    return "gloo" in str(dist.get_backend(process_group)).lower()


def gloo_group_of(process_group: Any, timeout_s: float) -> Any:
    """``process_group`` itself when it has a gloo backend; else a new gloo group of its ranks.

    Collective over ``process_group``'s members only; each member must call it the same number of
    times in the same order (the group's name is derived from its ranks and that order).
    """
    import torch.distributed as dist

    if carries_cpu_tensors(process_group):
        return process_group
    return dist.new_group(ranks=group_ranks(process_group), backend="gloo", timeout=as_timedelta(timeout_s),
                          use_local_synchronization=True)

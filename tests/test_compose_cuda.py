"""CudaIpcGroup: needs a CUDA GPU (skipped without one); import-safe everywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpkv.compose import ComposePlan, CudaIpcGroup
from cpkv.compose.launch import run_ranks
from cpkv.compose.workload import random_batch
from cpkv.errors import FallbackError, GroupBrokenError, InvalidArgumentError
from compose_reference import DTYPES, as_bytes, random_rows, reference_dense

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_group_refuses_to_start_without_cuda():
    with pytest.raises(InvalidArgumentError, match="needs CUDA"):
        CudaIpcGroup()


def _bare_group() -> CudaIpcGroup:
    """A CudaIpcGroup's state machine without CUDA (the constructor needs a GPU; these paths do not)."""
    group = CudaIpcGroup.__new__(CudaIpcGroup)
    group.rank, group._torch, group._payloads = 0, torch, {"kv": object()}
    group._init_protocol()
    return group


def test_cuda_group_abort_exit_and_closed_state_on_the_cpu():
    group = _bare_group()
    with pytest.raises(ValueError, match="boom"), group as entered:
        assert entered is group and not group.closed
        raise ValueError("boom")
    assert group.closed and group._payloads == {}  # __exit__ with an error aborted: released locally
    with pytest.raises(InvalidArgumentError, match="the group is closed"):
        group.pool("kv")
    group.close()  # idempotent
    group.abort()
    broken = _bare_group()
    with pytest.raises(RuntimeError, match="lost"), broken._protocol("compose of layer 3"):
        raise RuntimeError("peer lost")
    assert broken.broken == "compose of layer 3: RuntimeError: peer lost"
    with pytest.raises(GroupBrokenError, match=r"rank 0: the group is broken by an earlier error \(compose of layer 3"):
        broken.pool("kv")
    broken.close()  # a broken group closes without a collective (its peers may be gone)
    assert broken.closed


def _cuda_worker(rank: int, cp: int, seed: int) -> int:
    torch.cuda.set_device(0)  # all ranks share GPU 0: gloo collectives, CUDA IPC for the data
    rng = np.random.default_rng(seed)
    batches = [random_batch(rng, cp) for _ in range(3)]
    pool_rows = max(b.pool_rows for b in batches)
    group = CudaIpcGroup(timeout_s=60)
    checks = 0
    for dtype in DTYPES:
        pool = group.register_pool(dtype, pool_rows, (16, 8), DTYPES[dtype], max(b.max_current_pages for b in batches))
        for index, batch in enumerate(batches):
            plan = group.plan(dtype, 16, batch.requests, batch.num_slots)  # keyed by device, payload, pool rows
            assert plan.key.device == "cuda:0" and plan.key.pool_rows == pool_rows
            gen = torch.Generator().manual_seed(seed + index)
            pools = [random_rows(gen, pool_rows, (16, 8), DTYPES[dtype]) for _ in range(cp)]
            torch.cuda.synchronize()
            group.barrier("pool fill")
            pool.copy_(pools[rank].cuda())
            torch.cuda.synchronize()
            group.barrier("pool fill")
            for layer in range(3):
                current = [random_rows(gen, plan.num_current(r), (16, 8), DTYPES[dtype]) for r in range(cp)]
                want = reference_dense(plan, pools, current)
                staged = group.compose(plan, dtype, current[rank].cuda(), layer=layer)
                dense = group.compose_allreduce(plan, dtype, current[rank].cuda(), layer=layer)
                assert torch.equal(as_bytes(staged).cpu(), want) and torch.equal(as_bytes(dense).cpu(), want)
                checks += 1
    tiny = group.register_pool("tiny", pool_rows, (16, 8), torch.bfloat16, 0)
    del tiny
    plan = ComposePlan(cp, 16, batch.requests, batch.num_slots)
    with pytest.raises(FallbackError):
        group.compose(plan, "tiny", torch.zeros(plan.num_current(rank), 16, 8, dtype=torch.bfloat16, device="cuda"))
    assert group.broken is None and group.stats.agreements > 0  # refused alike on every rank: still usable
    group.close()
    assert group.closed
    with pytest.raises(InvalidArgumentError, match="closed"):
        group.pool("tiny")
    # A context manager: an error inside releases locally (abort), without a collective.
    with pytest.raises(ValueError), CudaIpcGroup(timeout_s=60) as other:
        other.register_pool("kv", 4, (8,), torch.uint8, 1)
        raise ValueError("boom")
    assert other.closed
    return checks


@needs_cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("cp", [2, 4])
def test_cuda_ipc_group_byte_exact(cp):
    assert run_ranks(_cuda_worker, cp, 3, timeout_s=240) == [3 * 3 * len(DTYPES)] * cp

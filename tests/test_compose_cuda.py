"""CudaIpcGroup: needs a CUDA GPU (skipped without one); import-safe everywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpkv.compose import ComposePlan, CudaIpcGroup
from cpkv.compose.launch import run_ranks
from cpkv.compose.workload import random_batch
from cpkv.errors import FallbackError, InvalidArgumentError
from compose_reference import DTYPES, as_bytes, random_rows, reference_dense

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_group_refuses_to_start_without_cuda():
    with pytest.raises(InvalidArgumentError, match="needs CUDA"):
        CudaIpcGroup()


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
    group.close()
    return checks


@needs_cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("cp", [2, 4])
def test_cuda_ipc_group_byte_exact(cp):
    assert run_ranks(_cuda_worker, cp, 3, timeout_s=240) == [3 * 3 * len(DTYPES)] * cp

"""CudaIpcGroup: the device, group and handle logic on the CPU; the transport itself needs a CUDA GPU
(those tests skip without one, and ``make gpu-check`` runs them where one exists)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.distributed as dist

from compose_reference import DTYPES, as_bytes, random_rows, reference_dense
from cpkv.compose import ComposePlan, CudaIpcGroup
from cpkv.compose.groups import cuda as cuda_module
from cpkv.compose.groups.base import check_pool, resolve_device
from cpkv.compose.workload import random_batch
from cpkv.errors import FallbackError, GroupBrokenError, InvalidArgumentError
from cpkv.kernels import gather as gather_module
from cpkv.runtime import gloo_group as gloo_module
from cpkv.runtime.launch import run_ranks

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


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


# -- devices, groups and handles, on the CPU ---------------------------------------------------------


class _OnDevice:
    """A CPU tensor that reports another device (the checks read only ``.device``)."""

    def __init__(self, tensor: torch.Tensor, device: str) -> None:
        self._tensor, self.device = tensor, torch.device(device)

    def __getattr__(self, name):
        return getattr(self._tensor, name)


@pytest.fixture
def two_gpus_current_1(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cuda_without_an_index_is_the_current_device(two_gpus_current_1):
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")
    for spelled in (None, "cuda", torch.device("cuda")):
        assert cuda_module.cuda_device(spelled) == torch.device("cuda", 1)
    assert cuda_module.cuda_device("cuda:0") == torch.device("cuda", 0)
    for bad, match in (("cpu", "needs a CUDA device"), ("cuda:2", "sees 2 CUDA devices"), ("gpu", "not a device")):
        with pytest.raises(InvalidArgumentError, match=match):
            cuda_module.cuda_device(bad)


def test_a_plan_for_cuda_serves_a_pool_on_the_current_cuda_device(monkeypatch):
    # Before the fix, "cuda" never equalled "cuda:0": every compose raised a device mismatch.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    plan = ComposePlan(2, 16, [], 4, pool_rows=6, device="cuda")
    pool = _OnDevice(torch.zeros(6, 8, dtype=torch.uint8), "cuda:0")
    assert check_pool(plan, 0, pool).shape == (6, 8)
    with pytest.raises(InvalidArgumentError, match="plan was built for device cuda, pool is on cuda:1"):
        check_pool(plan, 0, _OnDevice(torch.zeros(6, 8, dtype=torch.uint8), "cuda:1"))


def test_out_on_another_device_is_refused():
    group = _bare_group()
    group.device = torch.device("cuda", 0)
    plan = ComposePlan(1, 16, [], 3)
    record = cuda_module._DevicePayload(4, (8,), torch.uint8, 8, 1, None, [], [], [], [])
    with pytest.raises(InvalidArgumentError, match=r"rank 0: out is on cpu, the group on cuda:0"):
        group._out(plan, record, torch.empty(3, 8, dtype=torch.uint8))
    assert group._out(plan, record, _OnDevice(torch.empty(3, 8, dtype=torch.uint8), "cuda:0")).shape == (3, 8)


def test_a_peer_handle_is_opened_on_this_ranks_device_not_the_senders():
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    params = list(inspect.signature(rebuild_cuda_tensor).parameters)
    assert "storage_device" in params  # what open_peer_buffer rewrites, in this torch
    opened = {}

    def rebuild(tensor_cls, tensor_size, tensor_stride, tensor_offset, storage_cls, dtype, storage_device,
                storage_handle, storage_size_bytes, storage_offset_bytes, requires_grad, ref_counter_handle,
                ref_counter_offset, event_handle, event_sync_required):
        opened.update(device=storage_device, handle=storage_handle, size=storage_size_bytes)
        return "buffer"

    sent = tuple(range(len(params)))  # the peer's arguments; index 6, storage_device, says GPU 6
    assert cuda_module.open_peer_buffer(rebuild, sent, 2) == "buffer"
    assert opened == {"device": 2, "handle": 7, "size": 8}
    with pytest.raises(FallbackError, match="names no storage_device"):
        cuda_module.open_peer_buffer(lambda *args: None, sent, 2)


def test_the_triton_launch_makes_the_outputs_device_current(monkeypatch):
    entered = []

    class Guard:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", Guard)
    with gather_module.launch_device(_OnDevice(torch.empty(1), "cuda:3")):
        pass
    with gather_module.launch_device(torch.empty(1)):
        pass
    assert entered == [torch.device("cuda", 3)]


def _object_group_worker(rank: int, world: int, timeout_s: float) -> dict:
    """Two CP groups of two ranks in a world of four, each disguised as NCCL: the gloo group made for
    the handles spans exactly the CP group's ranks, has the given timeout, and is made by the CP
    group's ranks alone (the other CP group is inside a world barrier meanwhile: a world-wide
    new_group would wait for it until the barrier timed out)."""
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    real_backend, real_new_group = dist.get_backend, dist.new_group
    made = []
    dist.get_backend = lambda group=None: "nccl" if group is mine else real_backend(group)
    dist.new_group = lambda *args, **kwargs: (made.append(kwargs), real_new_group(*args, **kwargs))[1]
    try:
        if rank >= 2:
            dist.barrier()  # CP group [0, 1] makes its group while this one waits here
        objects = gloo_module.gloo_group_of(mine, timeout_s)
        if rank < 2:
            dist.barrier()
    finally:
        dist.get_backend, dist.new_group = real_backend, real_new_group
    heard = [None, None]
    dist.all_gather_object(heard, rank, group=objects)  # cp_size entries: an error with a world-sized group
    result = {"ranks": dist.get_process_group_ranks(objects), "heard": heard, "calls": len(made),
              "timeout": made[0]["timeout"].total_seconds(), "gloo_as_is": gloo_module.gloo_group_of(mine, 1.0) is mine}
    dist.barrier()  # rank 0 holds the store: nobody leaves while a peer still uses it
    return result


@pytest.mark.timeout(180)
def test_the_handle_group_spans_the_cp_group_only_with_its_timeout():
    results = run_ranks(_object_group_worker, 4, 7.5, timeout_s=150)
    for rank, r in enumerate(results):
        members = [0, 1] if rank < 2 else [2, 3]
        assert r["ranks"] == members and r["heard"] == members and r["calls"] == 1 and r["timeout"] == 7.5
        assert r["gloo_as_is"]  # a group that already is gloo is used as it is


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


def _transport_worker(rank: int, world: int, mode: str, seed: int) -> int:
    """One CP group (or two of two ranks, "sub-"), ranks sharing GPU 0 over gloo ("shared") or one GPU
    each over NCCL ("nccl"). Random bytes everywhere, stagings of megabytes, six layers issued back to
    back into separate outputs and checked only at the end: a missing barrier or stream sync shows as
    a slot read before its writer staged it, or after the next layer overwrote it."""
    per_gpu = mode.endswith("nccl")
    backend = "nccl" if per_gpu else "gloo"
    cp = 2 if mode.startswith("sub") else world
    torch.cuda.set_device(rank if per_gpu else 0)
    if mode.startswith("sub"):
        groups = [dist.new_group([0, 1], backend=backend), dist.new_group([2, 3], backend=backend)]
        pg = groups[rank // 2]
    else:
        pg = dist.new_group(backend=backend) if per_gpu else None
    me = dist.get_rank(pg)
    device = f"cuda:{rank}" if per_gpu else "cuda"  # "cuda" without an index: the current device
    rng = np.random.default_rng(seed + rank // cp)  # the same batches within a CP group
    batches = [random_batch(rng, cp, max_requests=12, max_prefix_pages=24, max_current_pages=48) for _ in range(2)]
    pool_rows = max(b.pool_rows for b in batches)
    row_shape = (64, 256)  # 32 KB rows of bf16
    group = CudaIpcGroup(process_group=pg, device=device, timeout_s=60)
    if per_gpu:
        torch.cuda.set_device(0)  # the group must not depend on the caller's current device
    assert group.device == torch.device("cuda", rank if per_gpu else 0)
    pool = group.register_pool("kv", pool_rows, row_shape, torch.bfloat16, max(b.max_current_pages for b in batches))
    checks = 0
    for index, batch in enumerate(batches):
        plan = group.plan("kv", 16, batch.requests, batch.num_slots)
        pools = [random_rows(torch.Generator().manual_seed(seed * 100 + index * 10 + r), pool_rows, row_shape,
                             torch.bfloat16) for r in range(cp)]
        pool.copy_(pools[me].to(group.device))
        torch.cuda.synchronize(group.device)
        group.barrier("pool fill")
        layers = []
        for layer in range(6):
            gen = torch.Generator().manual_seed(seed * 1000 + index * 100 + layer)
            current = [random_rows(gen, plan.num_current(r), row_shape, torch.bfloat16) for r in range(cp)]
            out = torch.empty(plan.num_slots, 64 * 256 * 2, dtype=torch.uint8, device=group.device)
            group.compose(plan, "kv", current[me].to(group.device, non_blocking=True), layer=layer, out=out)
            layers.append((out, reference_dense(plan, pools, current)))
        for out, want in layers:
            assert torch.equal(out.cpu(), want.view(plan.num_slots, -1))
            checks += 1
        current = [random_rows(torch.Generator().manual_seed(seed + index), plan.num_current(r), row_shape,
                               torch.bfloat16) for r in range(cp)]
        dense = group.compose_allreduce(plan, "kv", current[me].to(group.device), layer=0)
        assert torch.equal(as_bytes(dense).cpu(), reference_dense(plan, pools, current))
        checks += 1
    group.close()
    dist.barrier()
    return checks


@needs_cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode, world, gpus", [
    ("shared", 2, 1), ("shared", 4, 1), ("sub-shared", 4, 1), ("nccl", 2, 2), ("sub-nccl", 4, 4),
])
def test_cuda_transports_with_random_bytes_large_stagings_and_subgroups(mode, world, gpus):
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs, this machine has {torch.cuda.device_count()}")
    assert run_ranks(_transport_worker, world, mode, 11, timeout_s=240) == [2 * 7] * world

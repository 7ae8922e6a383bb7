"""The Triton gather against the torch paths, under ``TRITON_INTERPRET=1`` (CPU, small grids).

The kernel reads through a table of raw int64 base addresses; the interpreter
executes loads from such addresses on CPU tensors, so the pointer table is
exercised as on the GPU (only the word size choice and the grid are the same
code; the interpreter runs programs one at a time).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compose_reference import DTYPES, random_rows
from cpkv.compose import ComposePlan, SlotSpans
from cpkv.compose.workload import random_batch
from cpkv.kernels import gather

triton = pytest.importorskip("triton")


@pytest.fixture
def interpreted(monkeypatch):
    """Compiles the kernel afresh under the interpreter (it is built lazily, on first use)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(gather, "_triton_kernel", None)
    yield
    gather._triton_kernel = None


def _sources(plan, gen, row_shape, dtype):
    cp = plan.cp_size
    pools = [random_rows(gen, max(plan.prefix_rows_needed(r), 1), row_shape, dtype) for r in range(cp)]
    stagings = []
    for r in range(cp):
        staging = random_rows(gen, plan.staging_rows(r), row_shape, dtype)
        staging[0] = torch.zeros_like(staging[0].view(torch.uint8)).view(dtype)  # the dummy row
        stagings.append(staging)
    return [gather.as_byte_rows(t) for t in (*pools, *stagings)]


@pytest.mark.parametrize("cp, row_shape, dtype", [(2, (3, 8), "bf16"), (4, (5,), "uint8"), (3, (2, 4), "fp8")])
def test_triton_gather_matches_torch_runs_and_descriptors(interpreted, cp, row_shape, dtype):
    rng = np.random.default_rng(cp)
    gen = torch.Generator().manual_seed(cp)
    for _ in range(2):
        batch = random_batch(rng, cp, max_requests=3, max_prefix_pages=6, max_current_pages=3)
        plan = ComposePlan(cp, 16, batch.requests, batch.num_slots)
        sources = _sources(plan, gen, row_shape, DTYPES[dtype])
        row_bytes = sources[0].shape[1]
        for rank in range(cp):
            source, row = plan.descriptors(rank)
            by_runs = gather.gather_runs(torch.full((plan.num_slots, row_bytes), 7, dtype=torch.uint8),
                                               sources, plan.copy_runs(rank))
            by_slot = torch.stack([sources[s][r] for s, r in zip(source.tolist(), row.tolist())])
            by_index = gather.gather_indexed(torch.full_like(by_runs, 9), sources, plan.index_groups(rank))
            table = torch.tensor([s.data_ptr() for s in sources], dtype=torch.int64)
            by_triton = gather.gather_triton(
                torch.full_like(by_runs, 5), table, torch.from_numpy(source.astype(np.int32)),
                torch.from_numpy(row.copy()), block_bytes=16,
            )
            by_tensor_ops = gather._gather_runs_tensor(
                torch.full_like(by_runs, 3), sources, plan.copy_runs(rank).tolist()
            )
            assert torch.equal(by_runs, by_slot)
            assert torch.equal(by_index, by_slot)
            assert torch.equal(by_tensor_ops, by_runs)  # the device (non-numpy) branch of gather_runs
            assert torch.equal(by_triton, by_runs)


def test_triton_gather_with_unaligned_rows_uses_byte_words(interpreted):
    # 3-byte rows: no wider word divides them, so the kernel moves single bytes.
    plan = ComposePlan(2, 16, [SlotSpans([(0, 0, 3)], [(3, 3, 1)])], 5)
    sources = [torch.arange(r * 40, r * 40 + 12, dtype=torch.uint8).view(4, 3) for r in range(4)]
    sources[2][0] = 0
    sources[3][0] = 0
    assert gather.word_bytes(3, [s.data_ptr() for s in sources]) == 1
    source, row = plan.descriptors(0)
    want = gather.gather_runs(torch.empty(5, 3, dtype=torch.uint8), sources, plan.copy_runs(0))
    got = gather.gather_triton(torch.empty(5, 3, dtype=torch.uint8),
                               torch.tensor([s.data_ptr() for s in sources]),
                               torch.from_numpy(source.astype(np.int32)), torch.from_numpy(row.copy()))
    assert torch.equal(got, want)
    assert got[4].tolist() == [0, 0, 0]  # unused slot: the dummy row


def test_word_bytes_picks_the_widest_aligned_word():
    assert gather.word_bytes(64, [0, 4096]) == 8
    assert gather.word_bytes(64, [4]) == 4
    assert gather.word_bytes(6, [0]) == 2
    assert gather.word_bytes(7, [0]) == 1

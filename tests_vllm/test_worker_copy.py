"""CpkvOffloadingWorker's bytes: vLLM tensors of different page sizes share one slab, the smaller
one as a strided view of each sub-row (the tier copy's torch path), the largest as plain rows (its
native path); a store then a load moves every byte back, and nothing else."""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)

from cpkv.integrations.vllm.manager import CpkvLoadStoreSpec
from cpkv.integrations.vllm.worker import CpkvOffloadingWorker

BLOCKS, HOST_CHUNKS, PER_CHUNK = 16, 8, 2
PAGES = (64, 40)  # bytes per block of the two tensors; the slab's sub-rows are 64 bytes


def _worker() -> tuple[CpkvOffloadingWorker, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    tensors = [torch.randint(-128, 127, (BLOCKS, page), dtype=torch.int8, generator=gen) for page in PAGES]
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, t.shape[1]) for t in tensors],
                               [[CanonicalKVCacheRef(i, page) for i, page in enumerate(PAGES)]])
    worker = CpkvOffloadingWorker(caches, blocks_per_chunk=PER_CHUNK, host_blocks=HOST_CHUNKS, slab="private")
    return worker, tensors


def test_a_store_then_a_load_moves_every_byte_of_both_page_sizes_back():
    worker, tensors = _worker()
    blocks, rows = [3, 4, 9, 10, 11, 12], np.array([5, 1, 6], dtype=np.int32)
    before = [t.clone() for t in tensors]
    worker.submit_store(1, GPULoadStoreSpec(blocks, [len(blocks)], [0]), CpkvLoadStoreSpec.of(rows))
    for t in range(len(PAGES)):
        for chunk, row in enumerate(rows.tolist()):
            stored = worker.host_row(t, row)
            for k in range(PER_CHUNK):
                assert torch.equal(stored[k].view(torch.int8), before[t][blocks[chunk * PER_CHUNK + k]])
    for t in tensors:
        t.zero_()
    # A load that starts inside its first chunk: blocks 3.. of the request, skipping one sub-row.
    targets = [0, 2, 7, 8, 15]
    worker.submit_load(2, CpkvLoadStoreSpec.of(rows), GPULoadStoreSpec(targets, [len(targets)], [1]))
    for t in range(len(PAGES)):
        want = torch.zeros_like(tensors[t])
        for target, source in zip(targets, blocks[1:]):
            want[target] = before[t][source]
        assert torch.equal(tensors[t], want)
    assert [r.success for r in worker.get_finished()] == [True, True]
    worker.shutdown()

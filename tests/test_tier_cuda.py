"""CacheController with CUDA pools, end to end (skipped without a GPU; ``make gpu-check`` runs it).

The caller's stream is kept busy (``torch.cuda._sleep``) in front of the work the cache must order
itself after, so a copy that does not wait for the caller's stream runs first and the bytes show it:
- the KV written after the sleep must be what the backup copies into the slab;
- pool rows zeroed after the sleep must not overwrite what the load-back brought in;
- reading a layer right after ``LoadHandle.wait(layer)``, on the caller's stream, sees its bytes.
On the CPU the same ordering is checked through a recording double (``test_tier_ordering.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from cpkv.config import CpkvConfig
from cpkv.runtime.launch import run_ranks
from cpkv.runtime.layout import CpLayout
from cpkv.tier import CacheController, SlabSpec

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PAGE = 4
ROWS = 256  # device rows per rank
LAYERS = 3
PAYLOADS = {"k": SlabSpec((32_768,), torch.bfloat16), "v": SlabSpec((8, 2_048), torch.float32)}  # 64 KB rows
BUSY_CYCLES = 100_000_000  # tens of milliseconds of one busy kernel on the caller's stream


def _expected(pages: int, layer: int, payload: int, row_bytes: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1_000 * layer + payload)
    return torch.randint(0, 256, (pages, row_bytes), dtype=torch.uint8, generator=gen)


def _rows(pool: torch.Tensor) -> torch.Tensor:
    return pool.view(torch.uint8).view(pool.shape[0], -1)


def _busy(device: torch.device) -> None:
    with torch.cuda.device(device):
        torch.cuda._sleep(BUSY_CYCLES)


def _worker(rank: int, world: int, mode: str) -> dict:
    per_gpu = mode == "nccl"
    device = torch.device("cuda", rank if per_gpu else 0)
    pg = None
    if per_gpu:
        torch.cuda.set_device(rank)
        pg = dist.new_group(backend="nccl")
    torch.cuda.set_device(0)  # the controller must use its pools' device, not the current one
    layout = CpLayout(world, rank, PAGE)
    pools = {name: [torch.zeros(ROWS, *spec.page_shape, dtype=spec.dtype, device=device) for _ in range(LAYERS)]
             for name, spec in PAYLOADS.items()}
    settings = CpkvConfig(check_every=1, collective_timeout_s=60.0, transfer_timeout_s=60.0)
    ctl = CacheController(layout=layout, device_pages=ROWS * world, host_pages=2 * ROWS * world, payloads=PAYLOADS,
                          device_pools=pools, settings=settings, process_group=pg)
    checked = 0
    try:
        assert ctl.slab.pinned and ctl.device == device
        n_pages = ROWS * world // 2
        tokens = list(range(n_pages * PAGE))
        want = {(layer, p): _expected(n_pages, layer, p, spec.row_bytes)
                for layer in range(LAYERS) for p, spec in enumerate(PAYLOADS.values())}
        # Forward 1: the KV is written behind a busy kernel; the backups are issued at once.
        hit = ctl.lookup(tokens)
        pages = ctl.allocate(n_pages)
        owned = np.flatnonzero(pages % world == rank)
        local = torch.from_numpy(pages[owned] // world).to(device)
        _busy(device)
        for layer in range(LAYERS):
            for p, name in enumerate(PAYLOADS):
                _rows(pools[name][layer]).index_copy_(0, local, want[layer, p][owned].to(device, non_blocking=True))
        ctl.insert(tokens, pages)
        ctl.release(hit)
        for layer in range(LAYERS):
            ctl.backup_layer(layer)
        ctl.flush_backups()
        ctl.end_forward()
        assert ctl.core.pending_tickets() == [] and ctl.stats()["backups_committed"] > 0
        # Forward 2: only the host holds the pages; the pools are zeroed behind a busy kernel and
        # the load-back must land after that.
        ctl.core.evict_device(ROWS * world)
        _busy(device)
        for name in PAYLOADS:
            for pool in pools[name]:
                pool.view(torch.uint8).zero_()
        hit = ctl.lookup(tokens)
        load = ctl.load(hit)
        assert load.num_pages == n_pages
        loaded = load.pages
        owned = np.flatnonzero(loaded % world == rank)
        local = torch.from_numpy(loaded[owned] // world).to(device)
        with torch.cuda.device(device):
            for layer in range(LAYERS):
                load.wait(layer)  # the caller's stream waits; the comparison below runs on it
                for p, name in enumerate(PAYLOADS):
                    got = _rows(pools[name][layer]).index_select(0, local).cpu()
                    assert torch.equal(got, want[layer, p][owned]), f"rank {rank} layer {layer} {name}: wrong bytes"
                    checked += 1
        ctl.insert(tokens, loaded)
        ctl.release(hit)
        ctl.end_forward()
        return {"checked": checked, "digest": ctl.digest(), "loaded": ctl.stats()["bytes_loaded"]}
    finally:
        ctl.close()
        dist.barrier()


@needs_cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode, world, gpus", [("one", 1, 1), ("shared", 2, 1), ("nccl", 2, 2)])
def test_cuda_pools_back_up_and_load_back_in_stream_order(mode, world, gpus):
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs, this machine has {torch.cuda.device_count()}")
    results = run_ranks(_worker, world, mode, timeout_s=240, collective_timeout_s=60)
    assert all(r["checked"] == LAYERS * len(PAYLOADS) for r in results)
    assert len({r["digest"] for r in results}) == 1 and all(r["loaded"] > 0 for r in results)

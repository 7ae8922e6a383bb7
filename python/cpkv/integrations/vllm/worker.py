"""CpkvOffloadingWorker: copies offloaded chunks between vLLM's KV tensors and a cpkv host slab.

vLLM hands the worker its KV cache as byte tensors ``[num_blocks, page_bytes]`` (one per distinct
layer tensor). The slab has one payload per worker of the node (``"kv<rank>"``: tensor-parallel
workers hold different bytes for the same chunk), one slab layer per vLLM tensor, one row per
offloaded chunk: ``blocks_per_chunk`` pages back to back. Every worker maps the whole slab (one
``HostSlab.create`` over vLLM's gloo group) and writes only its own payload. Rows come from the scheduler-side manager
(:class:`~cpkv.integrations.vllm.manager.CpkvOffloadingManager`); this side only moves bytes.

Bytes move through the tier's one copy helper (:mod:`cpkv.tier.copy`): the native row copy for plain
CPU tensors, torch's copies for CUDA tensors and strided views. Transfers run to completion inside
``submit_*``; ``get_finished`` reports them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from cpkv.errors import InvalidArgumentError
from cpkv.runtime.memory import check_host_bytes
from cpkv.runtime.timeouts import DEFAULT_TIMEOUT_S
from cpkv.tier.copy import RowCopy, SlabCopier, word_dtype
from cpkv.tier.slab import HostSlab, SlabSpec, check_one_machine

from .cluster import MASTER_SETTING, ClusterGeometry, ClusterShard
from .l3 import L3Geometry, L3Shard
from .manager import PAYLOAD, CpkvLoadStoreSpec

__all__ = ["CpkvOffloadingWorker"]


class CpkvOffloadingWorker(OffloadingWorker):
    def __init__(self, kv_caches: CanonicalKVCaches, *, blocks_per_chunk: int, host_blocks: int,
                 slab: str = "shared", process_group: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 l3: tuple[L3Geometry, int] | None = None, cluster: tuple[ClusterGeometry, int, Any] | None = None) -> None:
        if not kv_caches.tensors:
            raise InvalidArgumentError("vLLM registered no KV cache tensors to offload")
        self.blocks_per_chunk = int(blocks_per_chunk)
        self.host_blocks = int(host_blocks)
        # Every vLLM tensor as raw bytes (uint8: a byte view, never a value conversion).
        self._device = [t.tensor.view(torch.uint8) for t in kv_caches.tensors]
        self._page_bytes = [int(t.page_size_bytes) for t in kv_caches.tensors]
        self._groups = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        page = max(self._page_bytes)
        row_bytes = page * self.blocks_per_chunk
        layers = len(self._device)
        if slab == "shared":
            rank, world = _rank_and_world(process_group)
            check_host_bytes(world * layers * host_blocks * row_bytes,
                             f"cpkv_slab='shared' with cpkv_host_blocks={host_blocks}: {world} workers x {layers} "
                             f"layers x {host_blocks} blocks x {row_bytes} bytes")
            spec = {f"{PAYLOAD}{r}": SlabSpec((row_bytes,), torch.uint8) for r in range(world)}
            self.slab: HostSlab | None = HostSlab.create(spec, num_pages=host_blocks, num_layers=layers,
                                                          process_group=process_group, timeout_s=timeout_s)
            rows = self.slab.rows(f"{PAYLOAD}{rank}")
        elif slab == "private":
            self.slab = None
            rows = _private_rows(layers, host_blocks, row_bytes)
        else:
            raise InvalidArgumentError(f"slab must be 'shared' or 'private', got {slab!r}")
        # Per vLLM tensor: the slab as sub-rows of one page each (chunk row r, page i -> r*bpc + i).
        self._host = [rows[t].view(host_blocks * self.blocks_per_chunk, page)[:, : self._page_bytes[t]]
                      for t in range(layers)]
        self._rows = rows
        # Per vLLM tensor: (device rows, host sub-rows) as the widest word both allow (the torch copies' speed).
        words = [word_dtype(d, h) for d, h in zip(self._device, self._host)]
        self._views = [(d.view(w), h.view(w)) for d, h, w in zip(self._device, self._host, words)]
        self._copier = SlabCopier()
        self._finished: list[TransferResult] = []
        self.l3: L3Shard | None = None
        if l3 is not None:
            geometry, rank = l3
            page = sum(self._page_bytes) * self.blocks_per_chunk
            if page != geometry.page_bytes:
                raise InvalidArgumentError(
                    f"kv_connector_extra_config['cpkv_l3_dir']: this worker's chunk holds {page} bytes, vLLM's "
                    f"worker_kv_bytes_per_block x blocks_per_chunk says {geometry.page_bytes}: L3 cannot size its records")
            # The scheduler's check reads every worker's shard from its own node's disk.
            check_one_machine(process_group, "kv_connector_extra_config['cpkv_l3_dir']", timeout_s)
            self.l3 = L3Shard(geometry, rank)
        self.cluster: ClusterShard | None = None
        if cluster is not None:
            self.cluster = self._open_cluster(cluster, process_group, timeout_s)

    def _open_cluster(self, cluster: tuple[ClusterGeometry, int, Any], process_group: Any,
                      timeout_s: float) -> ClusterShard:
        geometry, rank, settings = cluster
        page = sum(self._page_bytes) * self.blocks_per_chunk
        if page != geometry.page_bytes:
            raise InvalidArgumentError(
                f"{MASTER_SETTING}: this worker's chunk holds {page} bytes, vLLM's worker_kv_bytes_per_block x "
                f"blocks_per_chunk says {geometry.page_bytes}: the cluster tier cannot size its records")
        # A load's fills come from the scheduler's staging memory, mapped through /proc.
        check_one_machine(process_group, MASTER_SETTING, timeout_s)
        return ClusterShard(geometry, rank, settings.cluster_master, settings.cluster_metadata, settings.timeout_s,
                            segment_bytes=settings.cluster_bytes // geometry.world)

    # -- which device block goes to which host sub-row -------------------------------------------

    def _pairs(self, gpu: GPULoadStoreSpec, host: LoadStoreSpec, *, load: bool) -> list[tuple[list[int], RowCopy]]:
        """Per KV cache group: (its tensors, device blocks <-> host sub-rows)."""
        if not isinstance(host, CpkvLoadStoreSpec):
            raise InvalidArgumentError(f"expected a CpkvLoadStoreSpec, got {type(host).__name__}")
        blocks = np.asarray(gpu.block_ids, dtype=np.int64)
        rows = np.asarray(host.rows, dtype=np.int64)
        sizes = list(gpu.group_sizes)
        if len(sizes) != len(self._groups):
            raise InvalidArgumentError(f"{len(sizes)} group sizes for {len(self._groups)} offloaded groups")
        bpc = self.blocks_per_chunk
        out = []
        block_at = row_at = 0
        for group, size, first in zip(self._groups, sizes, gpu.block_indices):
            group_blocks = blocks[block_at: block_at + size]
            block_at += size
            # A load may start inside its first chunk; a store always starts on a chunk boundary.
            skip = int(first) % bpc if load else 0
            if not load and size % bpc:
                raise InvalidArgumentError(f"a store of {size} blocks is not whole chunks of {bpc}")
            chunks = -(-(skip + size) // bpc)
            group_rows = rows[row_at: row_at + chunks]
            row_at += chunks
            if len(group_rows) != chunks:
                raise InvalidArgumentError(f"{len(rows)} host rows for the chunks of {len(blocks)} blocks")
            position = skip + np.arange(size, dtype=np.int64)
            sub_rows = group_rows[position // bpc] * bpc + position % bpc
            out.append((group, RowCopy(group_blocks, sub_rows)))
        if row_at != len(rows):
            raise InvalidArgumentError(f"{len(rows)} host rows for {row_at} chunks")
        return out

    # -- L3: this worker's shard of the spills and fills a spec carries ----------------------------

    def _sub_rows(self, rows: np.ndarray) -> torch.Tensor:
        bpc = self.blocks_per_chunk
        return torch.from_numpy((np.asarray(rows, dtype=np.int64)[:, None] * bpc + np.arange(bpc)).reshape(-1))

    def l3_pages(self, rows: np.ndarray) -> np.ndarray:
        """uint8 ``[len(rows), page]``: chunk rows as one L3 page each (every tensor's pages in turn)."""
        index = self._sub_rows(rows)
        parts = [self._host[t][index].reshape(len(rows), -1) for t in range(len(self._host))]
        return torch.cat(parts, dim=1).numpy()

    def _fill_row(self, row: int, page: np.ndarray) -> None:
        bpc, at = self.blocks_per_chunk, 0
        for t, host in enumerate(self._host):
            size = bpc * self._page_bytes[t]
            host[row * bpc:(row + 1) * bpc].copy_(torch.from_numpy(page[at:at + size]).view(bpc, -1))
            at += size

    def _l3_first(self, host: LoadStoreSpec) -> None:
        """Before a job touches the slab: the spills (rows an eviction released, possibly reused by
        this very job), then the fills of promoted chunks (from L3, from the cluster's staging)."""
        if not isinstance(host, CpkvLoadStoreSpec):
            return
        if self.cluster is not None:
            self.cluster.job()
            for cluster_fill in host.cluster_fills:
                self._fill_row(cluster_fill.row, self.cluster.read(host.cluster_staging, cluster_fill))
            if host.cluster_fills and self.l3 is not None:
                self.l3.note_fills(host.cluster_fills)
        if self.l3 is None:
            return
        if host.spills:
            self.l3.write(host.spills, self.l3_pages)
        for fill in host.fills:
            self._fill_row(fill.row, self.l3.read(fill))
        if host.fills:
            self.l3.note_fills(host.fills)

    def _copy(self, gpu: GPULoadStoreSpec, host: LoadStoreSpec, *, load: bool) -> int:
        self._l3_first(host)
        moved = 0
        for tensors, copy in self._pairs(gpu, host, load=load):
            for t in tensors:
                device, slab = self._views[t]
                self._copier.copy(copy, device, slab, to_slab=not load)
                moved += len(copy) * self._page_bytes[t]
        if any(d.is_cuda for d in self._device):
            torch.cuda.current_stream().synchronize()  # the helper issues copies non_blocking, either way
        if not load and self.l3 is not None and isinstance(host, CpkvLoadStoreSpec):
            self.l3.note_store(host.rows, host.stored_keys, host.evicted_rows)
        if not load and self.cluster is not None and isinstance(host, CpkvLoadStoreSpec):
            # The rows hold exactly this job's chunks now: this worker's shard of each goes up.
            self.cluster.put(host.stored_keys, host.rows, self.l3_pages, host.cluster_replace)
        return moved

    # -- OffloadingWorker ------------------------------------------------------------------------

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        started = time.perf_counter()
        moved = self._copy(src_spec, dst_spec, load=False)
        self._finished.append(TransferResult(job_id, True, moved, time.perf_counter() - started))
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        started = time.perf_counter()
        moved = self._copy(dst_spec, src_spec, load=True)
        self._finished.append(TransferResult(job_id, True, moved, time.perf_counter() - started))
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every transfer completed inside its submit call

    def host_row(self, tensor: int, row: int) -> torch.Tensor:
        """The bytes of chunk row ``row`` of vLLM tensor ``tensor`` (a view; for tests)."""
        return self._host[tensor][row * self.blocks_per_chunk: (row + 1) * self.blocks_per_chunk]

    def shutdown(self) -> None:
        """vLLM closes the workers before the scheduler: with L3, this worker leaves its stop copy
        of the host rows for the catalog to take in at its close (see :mod:`.l3`)."""
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
        if self.l3 is not None:
            try:
                self.l3.write_stop_copy(self.l3_pages)
            finally:
                self.l3.close()
                self.l3 = None
        self._copier.clear()  # its source tables hold views of the slab
        self._views.clear()
        if self.slab is not None:
            self.slab.close()


def _private_rows(layers: int, host_blocks: int, row_bytes: int) -> torch.Tensor:
    """``cpkv_slab='private'``: this process's own ``[layers, host_blocks, row_bytes]`` bytes, checked
    against this machine's memory before anything is allocated; a failed allocation is typed too."""
    what = (f"cpkv_slab='private' with cpkv_host_blocks={host_blocks}: {layers} layers x {host_blocks} blocks x "
            f"{row_bytes} bytes")
    check_host_bytes(layers * host_blocks * row_bytes, what)
    try:
        return torch.zeros((layers, host_blocks, row_bytes), dtype=torch.uint8)
    except (RuntimeError, MemoryError) as err:  # torch's allocator says RuntimeError
        raise InvalidArgumentError(f"{what}: cannot allocate: {str(err).splitlines()[0]}") from err


def _rank_and_world(process_group: Any) -> tuple[int, int]:
    if process_group is None:
        return 0, 1
    import torch.distributed as dist

    return dist.get_rank(process_group), dist.get_world_size(process_group)

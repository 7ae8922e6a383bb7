"""One SGLang host pool, its slab region, and the native object that copies between them.

Every copy is checked against the pool before any byte moves, on every path (v1, v2; the tensor
calls go through torch): the host indices must be as many as the call's pages need, each page's
first index in ``[0, pool size)``, and every entry of every page must lie inside the pool's CPU
buffer it belongs to. A call that fails a check raises :class:`~cpkv.errors.InvalidArgumentError`
naming the page and the index, and nothing is stored or copied. Where the entries lie is computed
natively from the pool's layout (:mod:`.layout`, checked against SGLang's ``get_page_buffer_meta``
at registration), or, for a pool class :mod:`.layout` does not model, taken from
``get_page_buffer_meta`` once per batch. The copies themselves (``cpkv._cpkv.SglangPool`` over the
``crates/slab`` protocol, driven by ``SglangIndex``'s batch calls and the tensor calls' ``read_page`` /
``write_values``) go through ``crates/copy``'s run tables, each checked against both buffers first.

A slab row holds one page; next to it the row's stamp (the occupant's handle, ``-handle`` while
its bytes change) and its key tag (64 bits of a hash of the key), so a row is read as a key's page
only when both match what this rank's index says (see :mod:`.backend`).
"""

from __future__ import annotations

from typing import Any

import torch

from cpkv._cpkv import SglangPool
from cpkv.errors import InvalidArgumentError
from cpkv.tier.slab import HostSlab, SlabSpec

from .layout import check_layout, host_layout

__all__ = ["PoolSlab"]


def _cpu_buffers(host_pool: Any) -> list[torch.Tensor]:
    """The whole storages (as uint8) behind the pool's CPU data buffers: its attributes named
    ``*buffer``/``*buffers`` (``kv_buffer``, ``k_buffer``, ``index_k_with_scale_buffer``...), never its
    bookkeeping tensors (``free_slots``, ``mem_state``...), its staging buffers or the device pool's
    (``device_k_buffers``: CPU tensors when the device is the CPU); one per storage (views of one
    storage share it, distinct storages never overlap)."""
    found: dict[int, torch.Tensor] = {}
    for name, value in vars(host_pool).items():
        if not name.endswith(("buffer", "buffers")) or name.startswith(("device", "staging", "_")):
            continue
        for t in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel() > 0:
                storage = t.untyped_storage()
                if storage.data_ptr() not in found:
                    found[storage.data_ptr()] = torch.empty(0, dtype=torch.uint8).set_(storage)
    return [found[p] for p in sorted(found)]


class PoolSlab:
    """One SGLang host pool and its slab region (``rows`` rows of one page each)."""

    def __init__(self, name: str, host_pool: Any, rows: int, node_group: Any, timeout_s: float) -> None:
        self.name = name
        self.host_pool = host_pool
        self.page_size = int(getattr(host_pool, "page_size", 1) or 1)
        self.pool_tokens = int(getattr(host_pool, "size", 0) or 0)
        layout = host_layout(host_pool)
        if layout is not None:
            buffers, entries, meta = layout.buffers, layout.entries, None
            sizes = [int(b) for b in entries[:, 4]]
        else:
            buffers, entries, meta = _cpu_buffers(host_pool), None, host_pool.get_page_buffer_meta
            if not buffers:
                raise InvalidArgumentError(
                    f"host pool {name!r} ({type(host_pool).__name__}) has no CPU buffer the cpkv backend can "
                    "check its copies against")
            _, page_sizes = host_pool.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
            sizes = [int(v) for v in page_sizes]
        self.entries = len(sizes)
        self.page_bytes = sum(sizes)
        self.slab = HostSlab.create(
            {"data": SlabSpec((self.page_bytes,), torch.uint8), "stamp": SlabSpec((1,), torch.int64),
             "tag": SlabSpec((1,), torch.int64)},
            num_pages=rows, num_layers=1, process_group=node_group, timeout_s=timeout_s, pin=False)
        self.data = self.slab.rows("data")[0]  # rows * page_bytes uint8, entry-major (cpkv_slab's layout)
        # Entry j of every row, then entry j + 1 (the native pool's layout): an entry of consecutive rows
        # lies back to back, as in a host buffer, so a batch copies in runs.
        stamps, tags = self.slab.view("stamp")[0], self.slab.view("tag")[0]  # int64 [rows, 1]
        self.stamps = stamps.numpy()[:, 0]  # tests' and stats' read-only view; every write goes native
        self.tags = tags.numpy()[:, 0]
        self.native = SglangPool(name, list(buffers), entries, meta, sizes, self.page_size, self.pool_tokens,
                                 self.data, stamps, tags)
        if layout is not None:
            check_layout(host_pool, name, self.native.addresses, sizes)

    @property
    def mode(self) -> str:
        """``layout`` (addresses computed natively) or ``meta`` (SGLang's ``get_page_buffer_meta``)."""
        return self.native.mode

    def close(self) -> None:
        self.native.close()  # waits for any copy in flight; the slab may be unmapped after it
        self.data = self.stamps = self.tags = None
        self.slab.close()

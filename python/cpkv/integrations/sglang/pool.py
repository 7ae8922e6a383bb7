"""One SGLang host pool, its slab region, and the only copies between them.

Every copy is checked against the pool before any byte moves, on every path (v1, v2, the tensor
calls go through torch): the host indices must be as many as the call's pages need, each page's
first index in ``[0, pool size)``, and every (pointer, size) entry that SGLang's
``get_page_buffer_meta`` gives for them must lie inside one of the pool's own CPU buffers (found
once, at registration). A call that fails a check raises :class:`~cpkv.errors.InvalidArgumentError`
naming the page and the index, and nothing is copied. Pages whose entries are rows of one size go
through the tier's native row copy (which checks its runs again); other pages go entry by entry
through ``ctypes.memmove``, only ever on ranges the check above accepted.

A slab row holds one page; next to it the row's stamp (the occupant's handle, ``-handle`` while
its bytes change) and its key tag (64 bits of a hash of the key), so a row is read as a key's page
only when both match what this rank's index says (see :mod:`.backend`).
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cpkv.errors import InvalidArgumentError
from cpkv.tier.copy import RowCopy, SlabCopier
from cpkv.tier.slab import HostSlab, SlabSpec

__all__ = ["PoolSlab", "key_tags"]


_MIX = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime, applied per 8-byte word
_SEED = np.uint64(0xCBF29CE484222325)


def key_tags(keys: Sequence[str | bytes]) -> np.ndarray:
    """int64 tag per key, the same on every rank and process: keys of one length (SGLang's SHA-256
    hex page hashes) folded 8 bytes at a time in one vectorised pass (FNV-1a over words, then a
    final avalanche); other keys through BLAKE2b. A tag tells two keys apart; it is not a
    cryptographic hash."""
    data = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
    if not data:
        return np.zeros(0, dtype=np.int64)
    length = len(data[0])
    if length and length % 8 == 0 and all(len(d) == length for d in data):
        words = np.frombuffer(b"".join(data), dtype="<u8").reshape(len(data), length // 8)
        h = np.full(len(data), _SEED ^ np.uint64(length), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for column in words.T:
                h = (h ^ column) * _MIX
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(32)
        return h.view(np.int64)
    out = np.empty(len(data), dtype=np.int64)
    for i, d in enumerate(data):
        out[i] = int.from_bytes(hashlib.blake2b(d, digest_size=8).digest(), "little", signed=True)
    return out


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
        buffers = _cpu_buffers(host_pool)
        if not buffers:
            raise InvalidArgumentError(
                f"host pool {name!r} ({type(host_pool).__name__}) has no CPU buffer the cpkv backend can "
                "check its copies against")
        self.buffers = buffers
        self.bases = np.array([b.data_ptr() for b in buffers], dtype=np.int64)
        self.ends = self.bases + np.array([b.numel() for b in buffers], dtype=np.int64)
        ptrs, sizes = host_pool.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        self.entries = len(ptrs)
        self.sizes = np.array([int(s) for s in sizes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.page_bytes = int(self.sizes.sum())
        self.slab = HostSlab.create(
            {"data": SlabSpec((self.page_bytes,), torch.uint8), "stamp": SlabSpec((1,), torch.int64),
             "tag": SlabSpec((1,), torch.int64)},
            num_pages=rows, num_layers=1, process_group=node_group, timeout_s=timeout_s, pin=False)
        self.data = self.slab.rows("data")[0]  # uint8 [rows, page_bytes]
        self.stamps = self.slab.view("stamp")[0].numpy()[:, 0]  # int64 [rows]
        self.tags = self.slab.view("tag")[0].numpy()[:, 0]  # int64 [rows]
        self.copier = SlabCopier()
        # The native row copy: every entry one row of `entry` bytes in a host buffer and in the slab.
        self.entry = int(self.sizes[0]) if len(set(self.sizes.tolist())) == 1 else None
        if self.entry is not None:
            self.host_rows = [b[: b.numel() // self.entry * self.entry].view(-1, self.entry) for b in buffers]
            self.slab_rows = self.data.view(-1, self.entry)

    # -- the checks ------------------------------------------------------------------------------

    def page_meta(self, host_indices: Any, pages: int) -> np.ndarray:
        """int64 ``[pages, entries]`` host pointers of the call's pages, every one checked (see the
        module docstring); raises InvalidArgumentError before anything is copied."""
        if host_indices is None:
            raise InvalidArgumentError(f"pool {self.name!r}: no host indices for {pages} pages")
        idx = host_indices if isinstance(host_indices, torch.Tensor) else torch.as_tensor(host_indices)
        if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.dim() != 1:
            raise InvalidArgumentError(
                f"pool {self.name!r}: host indices must be a 1-d integer tensor, got {idx.dtype} {tuple(idx.shape)}")
        need = pages * self.page_size
        if idx.numel() != need:
            raise InvalidArgumentError(
                f"pool {self.name!r}: {idx.numel()} host indices for {pages} pages of {self.page_size} tokens "
                f"(need {need})")
        if pages == 0:
            return np.zeros((0, self.entries), dtype=np.int64)
        idx = idx.to("cpu", torch.int64)
        firsts = idx[:: self.page_size].numpy()
        if self.pool_tokens:
            bad = np.flatnonzero((firsts < 0) | (firsts >= self.pool_tokens))
            if len(bad):
                raise InvalidArgumentError(
                    f"pool {self.name!r}: page {int(bad[0])} has host index {int(firsts[bad[0]])}, outside the "
                    f"pool's [0, {self.pool_tokens})")
        ptrs, sizes = self.host_pool.get_page_buffer_meta(idx)
        ptrs = np.asarray(ptrs, dtype=np.int64).reshape(pages, self.entries)
        sizes = np.asarray(sizes, dtype=np.int64).reshape(pages, self.entries)
        inside = self._inside_host_buffers(ptrs, sizes)
        if not inside.all():
            page, entry = (int(v) for v in np.argwhere(~inside)[0])
            raise InvalidArgumentError(
                f"pool {self.name!r}: page {page} (host index {int(firsts[page])}) entry {entry} at "
                f"{int(ptrs[page, entry]):#x} + {int(sizes[page, entry])} bytes is outside the pool's buffers")
        return ptrs

    def _inside_host_buffers(self, ptrs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Which ``[ptr, ptr + size)`` ranges (one per entry, ``[pages, entries]``) lie wholly inside
        one of the pool's buffers, each entry its expected size."""
        which = np.searchsorted(self.bases, ptrs, side="right") - 1
        inside = (which >= 0) & (sizes == self.sizes[None, :])
        inside &= (ptrs + sizes) <= self.ends[np.maximum(which, 0)]
        return inside

    # -- the copies -------------------------------------------------------------------------------

    def copy(self, positions: np.ndarray, ptrs: np.ndarray, rows: np.ndarray, *, to_slab: bool) -> None:
        """Copies the call's pages ``positions`` (their entry pointers in ``ptrs``, checked by
        :meth:`page_meta`) to or from slab ``rows``."""
        if len(positions) == 0:
            return
        ptrs = ptrs[positions]
        rows = rows.astype(np.int64)
        if self.entry is not None:
            entry = self.entry
            flat = ptrs.T.reshape(-1)  # entry-major: consecutive pages make one run each
            which = np.searchsorted(self.bases, flat, side="right") - 1
            offset = flat - self.bases[which]
            if not (offset % entry).any():
                host_rows = offset // entry
                slab_rows = (rows[None, :] * self.entries + np.arange(self.entries, dtype=np.int64)[:, None]).reshape(-1)
                if (which == which[0]).all():  # the usual case: one host buffer
                    self.copier.copy(RowCopy(host_rows, slab_rows), self.host_rows[int(which[0])], self.slab_rows,
                                     to_slab=to_slab)
                    return
                for b in np.unique(which):  # one copy per host buffer (a pool has one or a few)
                    mask = which == b
                    self.copier.copy(RowCopy(host_rows[mask], slab_rows[mask]), self.host_rows[b],
                                     self.slab_rows, to_slab=to_slab)
                return
        # Entries of unequal sizes, or not aligned to rows: one memmove per entry, each range checked
        # here against the buffer on both sides (host pool, slab rows) before any byte moves.
        sizes = np.broadcast_to(self.sizes[None, :], ptrs.shape)
        if not self._inside_host_buffers(ptrs, sizes).all() or not ((rows >= 0) & (rows < len(self.data))).all():
            raise InvalidArgumentError(f"pool {self.name!r}: a copy's host range or slab row is outside its buffer")
        base = self.data.data_ptr()
        for k, row in enumerate(rows.tolist()):
            at = base + row * self.page_bytes
            for j in range(self.entries):
                slab_ptr, host_ptr, size = at + int(self.offsets[j]), int(ptrs[k, j]), int(self.sizes[j])
                if to_slab:
                    ctypes.memmove(slab_ptr, host_ptr, size)
                else:
                    ctypes.memmove(host_ptr, slab_ptr, size)

    def row_view(self, row: int) -> torch.Tensor:
        return self.data[row]

    def close(self) -> None:
        self.copier.clear()  # its source tables hold views of the slab
        self.host_rows = []
        self.slab_rows = self.data = self.stamps = self.tags = None
        self.slab.close()

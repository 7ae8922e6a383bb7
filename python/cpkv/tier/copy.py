"""The one copy between a torch pool (CPU or CUDA) and a :class:`~cpkv.tier.slab.HostSlab`'s rows.

A :class:`RowCopy` pairs pool row ``pool_rows[i]`` with slab row ``slab_rows[i]``; its plans (the
native run table, the slice runs, the slab stretches) are built once and reused for every layer
and payload. :class:`SlabCopier` moves a copy's rows either way, by one rule:

- both sides plain CPU rows (contiguous): one native ``copy_rows`` (every run checked before the
  first byte moves, the GIL released), each buffer's source table checked once;
- anything else (a CUDA pool, a strided view): torch copies issued on the current stream,
  ``non_blocking``: one slice copy per run when runs average at least :data:`MIN_MEAN_RUN` rows,
  else one indexed copy on the pool's device and one contiguous host copy per stretch of
  consecutive slab rows (nothing staged through pageable memory). The caller orders them against
  its own work (streams, events) and waits for them.

The controller (backups, load-backs), the vLLM worker and the SGLang backend all copy through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from cpkv._cpkv import OwnedRows, RowSources, copy_rows, row_runs

MIN_MEAN_RUN = 4  # rows per slice copy below which one indexed copy is faster (bench tier, 4 KB rows)

# A run table's columns (dst_row, dst_stride, count, source, src_row, src_stride) with the two sides
# swapped: runs pair constant steps on both sides, so a copy's reverse has the same runs.
_REVERSED = [4, 5, 2, 3, 0, 1]


@dataclass
class RowCopy:
    """Pool row ``pool_rows[i]`` <-> slab row ``slab_rows[i]`` (int64 arrays of one length)."""

    pool_rows: np.ndarray
    slab_rows: np.ndarray
    load_runs: np.ndarray | None = None  # the run table into the pool; computed when first needed
    _tables: dict[bool, np.ndarray] = field(default_factory=dict, repr=False)
    _slices: list[tuple[slice, slice]] | None = field(default=None, repr=False)
    _stretches: dict[str, tuple[Any, list[tuple[int, int, int]]]] = field(default_factory=dict, repr=False)

    @classmethod
    def owned(cls, owned: OwnedRows) -> RowCopy:
        """A rank's share of a batch of pages (:meth:`CpLayout.owned_rows`), with its runs."""
        return cls(owned.pool_rows, owned.slab_rows, owned.runs)

    @classmethod
    def merged(cls, copies: Sequence[RowCopy]) -> RowCopy:
        """One copy for several (their runs are found again: they may continue across copies)."""
        if len(copies) == 1:
            return copies[0]
        return cls(np.concatenate([c.pool_rows for c in copies]), np.concatenate([c.slab_rows for c in copies]))

    def __len__(self) -> int:
        return len(self.pool_rows)

    def run_table(self, *, to_slab: bool) -> np.ndarray:
        """The native copy's run table (int64 ``[R, 6]``) into the slab (backup) or into the pool."""
        table = self._tables.get(to_slab)
        if table is None:
            if self.load_runs is None:
                self.load_runs = row_runs(self.pool_rows, self.slab_rows)
            table = self.load_runs[:, _REVERSED] if to_slab else self.load_runs
            self._tables[to_slab] = table = np.ascontiguousarray(table)
        return table

    def slices(self) -> list[tuple[slice, slice]]:
        """(pool rows, slab rows) slices, one per run, when runs average at least
        :data:`MIN_MEAN_RUN` rows (pages are taken lowest first and slab objects are contiguous, so
        they usually do); else []."""
        if self._slices is None:
            runs = self.run_table(to_slab=False)
            if len(runs) * MIN_MEAN_RUN > len(self):
                self._slices = []
            else:
                self._slices = [(slice(int(p), int(p + (n - 1) * dp + 1), int(dp)),
                                 slice(int(s), int(s + (n - 1) * ds + 1), int(ds)))
                                for p, dp, n, _, s, ds in runs.tolist()]
        return self._slices

    def slab_stretches(self, device: Any) -> tuple[Any, list[tuple[int, int, int]]]:
        """The copy sorted by slab row: (pool rows in that order, on ``device``; [(first, count, slab
        row)] per stretch of consecutive slab rows)."""
        key = str(device)
        found = self._stretches.get(key)
        if found is None:
            import torch

            order = np.argsort(self.slab_rows, kind="stable")
            slab = self.slab_rows[order]
            breaks = np.flatnonzero(np.diff(slab) != 1) + 1
            starts = np.concatenate([[0], breaks]).astype(np.int64)
            counts = np.diff(np.concatenate([starts, [len(slab)]]))
            stretches = [(int(a), int(n), int(slab[a])) for a, n in zip(starts, counts)]
            found = self._stretches[key] = (torch.from_numpy(self.pool_rows[order]).to(device), stretches)
        return found


class SlabCopier:
    """Moves :class:`RowCopy` rows between pool and slab tensors (``[rows, ...]`` each, one row
    size and dtype on both sides), by the module's rule."""

    def __init__(self) -> None:
        # Native source tables, checked once per buffer; each holds its buffer, so an address in
        # a key cannot be reused by other memory while the entry lives.
        self._sources: dict[tuple[int, tuple[int, ...], str], Any] = {}

    def copy(self, copy: RowCopy, pool: Any, slab: Any, *, to_slab: bool) -> None:
        if len(copy) == 0:
            return
        if _plain_cpu_rows(pool) and _plain_cpu_rows(slab):
            if to_slab:
                copy_rows(slab, self._source(pool), copy.run_table(to_slab=True))
            else:
                copy_rows(pool, self._source(slab), copy.run_table(to_slab=False))
            return
        slices = copy.slices()
        if slices:
            for pool_slice, slab_slice in slices:
                if to_slab:
                    slab[slab_slice].copy_(pool[pool_slice], non_blocking=True)
                else:
                    pool[pool_slice].copy_(slab[slab_slice], non_blocking=True)
            return
        order, stretches = copy.slab_stretches(pool.device)
        if to_slab:  # gathered on the pool's device in slab order, then one host copy per stretch
            gathered = pool.index_select(0, order)
            for first, count, row in stretches:
                slab[row: row + count].copy_(gathered[first: first + count], non_blocking=True)
        else:
            staged = pool.new_empty((len(order), *pool.shape[1:]))
            for first, count, row in stretches:
                staged[first: first + count].copy_(slab[row: row + count], non_blocking=True)
            pool.index_copy_(0, order, staged)

    def clear(self) -> None:
        """Drops the source tables (and the buffers they hold: call before unmapping a slab)."""
        self._sources.clear()

    def _source(self, rows: Any) -> Any:
        key = (rows.data_ptr(), tuple(rows.shape), str(rows.dtype))
        table = self._sources.get(key)
        if table is None:
            table = self._sources[key] = RowSources([rows])
        return table


def word_dtype(*byte_rows: Any) -> Any:
    """The widest integer word every given uint8 row view can be seen as (its row length, its other
    strides and its address divisible by the word): torch's index_copy_ on uint8 rows runs about 6x
    slower than on the same bytes as int64 (``cpkv bench tier``)."""
    import torch

    for size, dtype in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if all(t.shape[-1] % size == 0 and t.data_ptr() % size == 0 and t.storage_offset() % size == 0
               and all(s % size == 0 for s in t.stride()[:-1]) for t in byte_rows):
            return dtype
    return torch.uint8


def _plain_cpu_rows(t: Any) -> bool:
    return bool(t.device.type == "cpu" and t.is_contiguous())

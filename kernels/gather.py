"""The compose gather: fill every dense slot from a table of 2 * cp source buffers.

All buffers are moved as ``uint8`` rows (``[rows, row_bytes]``), so fp8, bf16
and any other dtype move the same way (``index_copy`` has no float8 kernel and
gloo cannot carry float8).

Implementations of the same contract:

- :func:`gather_runs`: the plan compiles its per-slot descriptors into strided
  *copy runs* (a span's pages owned by one rank are every ``cp``-th dense slot
  and read consecutive rows of one source). On CPU the whole table runs in one
  native call (``cpkv._cpkv.copy_rows``, crate ``cpkv-copy``: every run checked
  first, the GIL released, one copy per contiguous stretch, and a request's
  ``cp`` interleaved runs copied together in destination order); on a device,
  one strided ``Tensor.copy_`` per run.
- :func:`gather_indexed` (CPU): one indexed numpy copy per source, and
  :func:`gather_runs_numpy`, one strided numpy assignment per run: the two
  CPU strategies the native call replaced, kept as ``bench compose``'s
  comparison rows.
- :func:`gather_triton` (the device path): one program per (slot, block of
  bytes) loads the slot's ``(source, row)`` descriptor and reads through a
  table of int64 base addresses, so the sources need not be contiguous or even
  in this process's allocations (CUDA IPC mappings, symmetric memory).

A run is one row of an int64 ``[R, RUN_COLUMNS]`` array:
``(dst_slot, dst_stride, count, source, src_row, src_stride)`` meaning
``out[dst_slot + k * dst_stride] = sources[source][src_row + k * src_stride]``
for ``k < count`` (``src_stride`` 0 repeats one row: the zero dummy).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import numpy as np

RUN_COLUMNS = 6
_INT64 = np.dtype(np.int64)


def as_byte_rows(tensor: Any) -> Any:
    """``[rows, *page_shape]`` of any dtype as a ``uint8`` ``[rows, row_bytes]`` view (no copy)."""
    if not tensor.is_contiguous():
        raise ValueError(f"buffer of shape {tuple(tensor.shape)} must be contiguous to move as bytes")
    import torch

    rows = tensor.shape[0]
    return tensor.reshape(rows, math.prod(tensor.shape[1:])).view(torch.uint8)


def gather_runs(out: Any, sources: Any, runs: np.ndarray | list) -> Any:
    """Executes copy runs into ``out`` (``[slots, row_bytes]``); returns ``out``.

    On CPU (``out`` a numpy array or a CPU tensor), one native call for the whole
    table (``sources`` may be a list of buffers or a ``cpkv._cpkv.RowSources``
    checked once); a bad table raises ``CopyTableError`` before any byte is
    written. On a device, torch copies. A numpy ``out`` is the cheaper call: a
    tensor's pointer, shape and dtype cost about a microsecond of torch calls.
    """
    if isinstance(out, np.ndarray) or out.is_cpu:
        _native_copy_rows()(out, sources, as_run_table(runs))
        return out
    return _gather_runs_tensor(out, sources, _as_run_list(runs))


@functools.cache
def _native_copy_rows() -> Any:
    """``cpkv._cpkv.copy_rows``, imported once on first use (an import statement per call costs
    about a microsecond, a twentieth of a small gather)."""
    from cpkv._cpkv import copy_rows

    return copy_rows


def as_run_table(runs: np.ndarray | list) -> np.ndarray:
    """Runs as the int64 ``[R, RUN_COLUMNS]`` array the native copy reads (no copy when already one)."""
    # The common case in ~0.1 us: comparing dtypes by value and `ascontiguousarray` took 0.7 us
    # per call, over 1% of a 50 us gather.
    if type(runs) is np.ndarray and runs.dtype is _INT64 and runs.ndim == 2 and runs.flags.c_contiguous:
        return runs
    if isinstance(runs, np.ndarray) and runs.dtype == np.int64 and runs.ndim == 2:
        return np.ascontiguousarray(runs)
    return np.asarray(runs, dtype=np.int64).reshape(-1, RUN_COLUMNS)


def gather_runs_numpy(out: Any, sources: Sequence[Any], runs: np.ndarray | list) -> Any:
    """One strided numpy assignment per run (CPU): the pre-native path, a ``bench compose`` row."""
    dense = out.numpy()
    arrays = [s.numpy() for s in sources]
    for dst, dst_stride, count, source, src_row, src_stride in _as_run_list(runs):
        src = arrays[source]
        # src_stride 0: the dummy row, broadcast without materialising it
        dense[dst : dst + (count - 1) * dst_stride + 1 : dst_stride] = (
            src[src_row : src_row + count] if src_stride else src[src_row]
        )
    return out


def _gather_runs_tensor(out: Any, sources: Sequence[Any], runs: list) -> Any:
    for dst, dst_stride, count, source, src_row, src_stride in runs:
        target = out[dst : dst + (count - 1) * dst_stride + 1 : dst_stride]
        src = sources[source]
        target.copy_(src[src_row : src_row + count] if src_stride else src[src_row : src_row + 1].expand(count, -1))
    return out


def _as_run_list(runs: np.ndarray | list) -> list:
    return runs.tolist() if isinstance(runs, np.ndarray) else runs


def index_groups(source: np.ndarray, row: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per-slot descriptors regrouped by source: ``[(source, dense slots, source rows), ...]``."""
    order = np.argsort(source, kind="stable")
    sorted_sources = source[order]
    bounds = np.flatnonzero(np.diff(sorted_sources)) + 1
    return [
        (int(source[chunk[0]]), chunk, row[chunk])
        for chunk in (order[start:stop] for start, stop in zip([0, *bounds], [*bounds, len(order)]))
        if len(chunk)
    ]


def gather_indexed(out: Any, sources: Sequence[Any], groups: list[tuple[int, np.ndarray, np.ndarray]]) -> Any:
    """The gather as one indexed copy per source (CPU): ``out[slots] = source[rows]``.

    Two passes over the bytes (numpy gathers into a temporary, then scatters)
    but only 2 * cp dispatches whatever the batch looks like: before the native
    copy, the better choice when runs were short (small pages, many requests).
    """
    if out.device.type != "cpu":
        raise ValueError("gather_indexed is the CPU path; use gather_triton on a device")
    dense = out.numpy()
    for source, slots, rows in groups:
        dense[slots] = sources[source].numpy()[rows]
    return out


# -- Triton ------------------------------------------------------------------------------

_triton_kernel = None


def _kernel():
    """Compiles lazily: importing this module never needs triton (or a GPU)."""
    global _triton_kernel
    if _triton_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def gather_kernel(
            out_ptr,  # *WORD, [num_slots, row_words]
            table_ptr,  # *int64, base address of each source buffer
            source_ptr,  # *int32, [num_slots]
            row_ptr,  # *int64, [num_slots]
            row_words,
            WORD: tl.constexpr,
            BLOCK: tl.constexpr,
        ):
            slot = tl.program_id(0).to(tl.int64)
            block = tl.program_id(1)
            src = tl.load(source_ptr + slot)
            row = tl.load(row_ptr + slot)
            base = tl.load(table_ptr + src).to(tl.pointer_type(WORD), bitcast=True)
            offs = block * BLOCK + tl.arange(0, BLOCK)
            mask = offs < row_words
            values = tl.load(base + row * row_words + offs, mask=mask)
            tl.store(out_ptr + slot * row_words + offs, values, mask=mask)

        _triton_kernel = gather_kernel
    return _triton_kernel


def word_bytes(row_bytes: int, addresses: Sequence[int]) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing the row size and every base address."""
    for size in (8, 4, 2):
        if row_bytes % size == 0 and all(a % size == 0 for a in addresses):
            return size
    return 1


def gather_triton(
    out: Any, table: Any, source: Any, row: Any, *, addresses: Sequence[int] | None = None, block_bytes: int = 8192
) -> Any:
    """Fills ``out`` (uint8 ``[slots, row_bytes]``) reading through ``table`` (int64 base addresses).

    ``table``, ``source`` (int32) and ``row`` (int64) live on ``out``'s device;
    every address in ``table`` points at rows of the same ``row_bytes``.
    ``addresses`` (the table's values, on the host) pick the widest aligned
    word; without them a CPU table is read directly and a device table is
    assumed allocator-aligned (256 bytes), so the hot path never syncs.
    The kernel is launched on ``out``'s device (Triton launches on the current
    one), so ``cuda:N`` works without the caller's ``set_device``.
    """
    import torch
    import triton.language as tl

    slots, row_bytes = out.shape
    if slots == 0:
        return out
    if addresses is None:
        addresses = table.tolist() if table.device.type == "cpu" else [256]
    size = word_bytes(row_bytes, [*addresses, out.data_ptr()])
    torch_word, triton_word = {
        8: (torch.int64, tl.int64),
        4: (torch.int32, tl.int32),
        2: (torch.int16, tl.int16),
        1: (torch.uint8, tl.uint8),
    }[size]
    row_words = row_bytes // size
    block = min(max(block_bytes // size, 16), 1 << (max(row_words, 16) - 1).bit_length())
    block = 1 << (block.bit_length() - 1)  # tl.arange needs a power of two
    grid = (slots, -(-row_words // block))
    with launch_device(out):
        _kernel()[grid](out.view(torch_word), table, source, row, row_words, WORD=triton_word, BLOCK=block)
    return out


def launch_device(out: Any) -> Any:
    """Makes ``out``'s CUDA device current for a launch (nothing to do for a CPU tensor)."""
    import contextlib

    import torch

    if out.device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(out.device)

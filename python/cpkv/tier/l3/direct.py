"""O_DIRECT for the L3 files: whether a directory's file system takes it, and the page-aligned
scratch memory it needs. Shared by :class:`cpkv.tier.l3.store.L3Store` and the vLLM adapter's
per-worker shards (:mod:`cpkv.integrations.vllm.l3`)."""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any, Sequence

import numpy as np

from cpkv import _cpkv

ALIGN = _cpkv.L3_RECORD_ALIGN


def errno_name(err: OSError) -> str:
    return errno.errorcode.get(err.errno, str(err.errno)) if err.errno is not None else str(err)


class AlignedScratch:
    """A page-aligned scratch buffer (anonymous mmap), grown on demand: O_DIRECT needs aligned memory."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self.array = np.empty(0, dtype=np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if self._map is None or len(self._map) < nbytes:
            size = max(nbytes, ALIGN)
            self._map = mmap.mmap(-1, size)
            self.array = np.frombuffer(self._map, dtype=np.uint8)
        return self.array[:nbytes]

    def view(self, start: int, stop: int) -> memoryview:
        assert self._map is not None
        return memoryview(self._map)[start:stop]


def slot_runs(slots: Sequence[int], slots_per_file: int, longest: int | None = None) -> list[tuple[int, int]]:
    """[start, stop) index ranges of ``slots`` (ascending) that are consecutive within one data file of
    ``slots_per_file`` slots, each at most ``longest`` long: one read or write each."""
    runs, start = [], 0
    for i in range(1, len(slots) + 1):
        if (i == len(slots) or slots[i] != slots[i - 1] + 1 or slots[i] % slots_per_file == 0
                or (longest is not None and i - start == longest)):
            runs.append((start, i))
            start = i
    return runs


def write_fully(fd: int, buffers: Sequence[Any], offset: int) -> None:
    """``pwritev`` of ``buffers`` at ``offset``; a short write is an ``OSError`` (EIO)."""
    want = sum(memoryview(b).nbytes for b in buffers)
    written = os.pwritev(fd, buffers, offset)
    if written != want:
        raise OSError(errno.EIO, f"short L3 write: {written} of {want} bytes")


def aligned_empty(rows: int, row_bytes: int) -> np.ndarray:
    """uint8 ``[rows, row_bytes]`` in page-aligned memory of its own (anonymous mmap): rows that O_DIRECT
    can read into and write from where they lie when ``row_bytes`` is a whole number of blocks."""
    buf = mmap.mmap(-1, max(rows * row_bytes, 1))
    return np.frombuffer(buf, dtype=np.uint8, count=rows * row_bytes).reshape(rows, row_bytes)


def probe_direct(path: str | os.PathLike, scratch: AlignedScratch | None = None) -> tuple[str, str]:
    """``("o_direct", "")`` when the file system of the existing file ``path`` takes an aligned
    O_DIRECT read; otherwise ``("buffered", why)``, the reason a ``stats()`` reports (tmpfs refuses
    O_DIRECT at open)."""
    if not hasattr(os, "O_DIRECT"):
        return "buffered", "this platform has no O_DIRECT"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as err:
        return "buffered", f"O_DIRECT refused by the file system ({errno_name(err)})"
    scratch = scratch or AlignedScratch()
    try:
        scratch.take(ALIGN)
        os.preadv(fd, [scratch.view(0, ALIGN)], 0)
    except OSError as err:
        return "buffered", f"O_DIRECT read failed ({errno_name(err)})"
    finally:
        os.close(fd)
    return "o_direct", ""

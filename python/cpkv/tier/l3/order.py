"""The order of the node's writes into each L3 slot, and whether a slot's record is written yet.

The replicated index places key B into slot 8 on every rank at once, but each rank writes its share
of a batch at its own time: a rank that is behind could still write its older record (key A, an
older sequence) into slot 8 after another rank wrote B and acknowledged it, and the log would name B
while the disk held A. So every write into a slot is ordered by the placement's sequence:

- **The table** (``slot-order.bin`` in the store's directory, mapped ``MAP_SHARED`` by every rank of
  the node): per slot, the newest sequence whose write is done (written, or given up by its writer
  rank because it has no bytes for the page). 8 bytes a slot, counted in the cap (``slots_for``).
- **A write** locks the table's bytes of its run of slots (an ``fcntl`` open-file-description lock:
  the kernel releases it when the process dies, kill -9 included), keeps the records whose sequence is
  newer than their slot's entry, writes them, records their sequences and unlocks. An older record
  is discarded (counted, never logged): its slot already holds a newer placement, so the index has
  evicted it everywhere by that point of the replicated sequence.
- **A read** takes each slot's entry before reading the record: below the record's sequence means
  its writer has not written it yet, so a failed check is :data:`NOT_WRITTEN`, a transient miss (the
  record may be served later), never a rejection. At or above it, a failed check is final.
- **Restarts**: sequences restart from the logs, and a record written but never logged may carry a
  larger one, so the table of an earlier run cannot be kept. Rank 0 rewrites it at open from the
  recovered index (each live slot's logged sequence, 0 elsewhere): every logged record is written.
  Every rank finishes :class:`~cpkv.tier.l3.store.L3Store` open before any rank writes (the callers'
  barrier), so no write is ordered against the table of another run.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from cpkv import _cpkv

TABLE_NAME = "slot-order.bin"
BYTES_PER_SLOT = 8
# A failed check of a record whose writer has not written it yet: a transient miss, not a rejection.
NOT_WRITTEN = "not_written"
# Linux's F_OFD_SETLKW / F_OFD_SETLK (Python names them from 3.9 on Linux).
_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)
_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)


def table_bytes(slots: int) -> int:
    """The table's size on disk: 8 bytes a slot, whole blocks."""
    align = _cpkv.L3_RECORD_ALIGN
    return -(-max(1, slots) * BYTES_PER_SLOT // align) * align


def _flock(kind: int, first: int, stop: int) -> bytes:
    """A ``struct flock`` over the table entries of slots [first, stop) (``l_pid`` 0: an OFD lock)."""
    return struct.pack("@hhqqi4x", kind, os.SEEK_SET, first * BYTES_PER_SLOT, (stop - first) * BYTES_PER_SLOT, 0)


class SlotOrder:
    """One rank's handle on the node's table of ``slots`` slots in ``directory``. ``recovered``
    (rank 0 only: every ``(key, slot, sequence)`` of the recovered index) rewrites the table."""

    def __init__(self, directory: str | os.PathLike, slots: int,
                 recovered: Sequence[tuple[int, int, int]] | None) -> None:
        self.slots = slots
        path = Path(directory) / TABLE_NAME
        size = table_bytes(slots)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if recovered is not None:
                fresh = np.zeros(size // BYTES_PER_SLOT, dtype=np.uint64)
                for _key, slot, sequence in recovered:
                    fresh[slot] = sequence
                os.ftruncate(self._fd, size)
                os.pwrite(self._fd, fresh.tobytes(), 0)
            elif os.fstat(self._fd).st_size < size:
                os.ftruncate(self._fd, size)  # rank 0 may still be on its way: never shrink it here
            self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self._fd)
            raise
        self.table = np.frombuffer(self._map, dtype=np.uint64, count=slots)

    @contextmanager
    def _locked(self, first: int, stop: int) -> Iterator[np.ndarray]:
        fcntl.fcntl(self._fd, _SETLKW, _flock(fcntl.F_WRLCK, first, stop))
        try:
            yield self.table[first:stop]
        finally:
            fcntl.fcntl(self._fd, _SETLK, _flock(fcntl.F_UNLCK, first, stop))

    def write_runs(self, slots: Sequence[int], sequences: Sequence[int], runs: Sequence[tuple[int, int]],
                   write: Callable[[int, int], None]) -> list[bool]:
        """Writes records ``i`` (into ``slots[i]``, ascending, under ``sequences[i]``) run by run
        (``runs``: [start, stop) of consecutive slots), each run under its slots' lock: ``write(a, b)``
        writes records a..b, only those newer than their slot's entry. Returns per record whether
        it was written (False: a newer one was there, the record is discarded)."""
        kept = [False] * len(slots)
        for start, stop in runs:
            first = slots[start]
            with self._locked(first, slots[stop - 1] + 1) as entries:
                at = start
                while at < stop:
                    if sequences[at] <= entries[slots[at] - first]:
                        at += 1
                        continue
                    end = at + 1
                    while end < stop and sequences[end] > entries[slots[end] - first]:
                        end += 1
                    write(at, end)
                    for i in range(at, end):
                        entries[slots[i] - first] = sequences[i]
                        kept[i] = True
                    at = end
        return kept

    def give_up(self, slot: int, sequence: int) -> None:
        """The writer of (``slot``, ``sequence``) has no bytes for it: its write is done, unwritten, so a
        reader's failed check of it is final (the slot keeps an older record, a counted miss)."""
        with self._locked(slot, slot + 1) as entries:
            if entries[0] < sequence:
                entries[0] = sequence

    def written(self, slots: Sequence[int]) -> np.ndarray:
        """Each slot's newest sequence written, as of now (a reader takes it before it reads)."""
        return self.table[np.asarray(slots, dtype=np.int64)].copy()

    def close(self) -> None:
        if self._fd >= 0:
            self.table = np.empty(0, dtype=np.uint64)
            self._map.close()
            os.close(self._fd)
            self._fd = -1

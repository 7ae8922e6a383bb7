"""A fair pure-Python first-fit allocator: the baseline ``bench allocator`` compares against.

Same semantics as ``cpkv.PageAllocator``: per payload an address-ordered free
list (parallel ``starts``/``lengths`` lists, bisect on release, coalescing),
free page counts kept so a miss costs O(payloads), first fit by a scan of the
free list (the lowest-addressed extent that holds the request, else the
lowest-addressed extents in order), pages taken from the start of an extent.
It skips cpkv's argument validation and digests, which only favours it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Mapping, Sequence

Extents = list[tuple[int, int]]


class ReferenceAllocator:
    def __init__(self, pools: Mapping[str, int]) -> None:
        self.names = list(pools)
        self._starts = {name: [0] for name in self.names}
        self._lengths = {name: [pools[name]] for name in self.names}
        self._free = dict(pools)
        self._objects: dict[int, dict[str, Extents]] = {}
        self.misses = 0

    def reserve(self, key: int, num_pages: int, payloads: Sequence[str] | None = None) -> dict[str, Extents] | None:
        if key in self._objects:
            raise KeyError(key)
        names = self.names if payloads is None else [n for n in self.names if n in payloads]
        free = self._free
        for name in names:
            if free[name] < num_pages:
                self.misses += 1
                return None
        placement = {}
        for name in names:
            placement[name] = self._take(name, num_pages)
            free[name] -= num_pages
        self._objects[key] = placement
        return placement

    def _take(self, name: str, num_pages: int) -> Extents:
        starts, lengths = self._starts[name], self._lengths[name]
        for i, length in enumerate(lengths):  # first-fit scan
            if length >= num_pages:
                start = starts[i]
                if length == num_pages:
                    del starts[i], lengths[i]
                else:
                    starts[i] = start + num_pages
                    lengths[i] = length - num_pages
                return [(start, num_pages)]
        taken = []
        missing = num_pages
        while missing:
            start, length = starts[0], lengths[0]
            if length <= missing:
                del starts[0], lengths[0]
                taken.append((start, length))
                missing -= length
            else:
                starts[0], lengths[0] = start + missing, length - missing
                taken.append((start, missing))
                missing = 0
        return taken

    def release(self, key: int) -> None:
        for name, extents in self._objects.pop(key).items():
            starts, lengths = self._starts[name], self._lengths[name]
            for start, length in extents:
                i = bisect_left(starts, start)
                merge_left = i > 0 and starts[i - 1] + lengths[i - 1] == start
                merge_right = i < len(starts) and start + length == starts[i]
                if merge_left and merge_right:
                    lengths[i - 1] += length + lengths[i]
                    del starts[i], lengths[i]
                elif merge_left:
                    lengths[i - 1] += length
                elif merge_right:
                    starts[i] = start
                    lengths[i] += length
                else:
                    starts.insert(i, start)
                    lengths.insert(i, length)
            self._free[name] += sum(length for _, length in extents)

    def __contains__(self, key: int) -> bool:
        return key in self._objects

    def free_pages(self, name: str) -> int:
        return self._free[name]

    def free_extents(self, name: str) -> Extents:
        return list(zip(self._starts[name], self._lengths[name]))

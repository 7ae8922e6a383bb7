"""An obviously-correct pure-Python model of ``cpkv.PageAllocator`` for differential tests.

Pages are a list of owners per payload; free runs are recomputed by a scan
on every call. Slow on purpose: nothing here is clever enough to be wrong.
It raises the same cpkv exception classes, in the same validation order.
"""

from __future__ import annotations

from typing import Sequence

from cpkv.errors import (
    DuplicateKeyError,
    InvalidArgumentError,
    NotCommittedError,
    UnknownKeyError,
    UnknownPayloadError,
)

U64 = 1 << 64


def _key(key: object) -> int:
    if not isinstance(key, int) or not 0 <= key < U64:
        raise InvalidArgumentError(f"key {key!r}")
    return key


class ModelAllocator:
    def __init__(self, pools: dict[str, int]) -> None:
        self.names = list(pools)
        self.owner = {name: [None] * cap for name, cap in pools.items()}
        self.pages: dict[int, dict[str, list[int]]] = {}
        self.committed: set[int] = set()

    # -- queries -------------------------------------------------------------
    def free_runs(self, name: str) -> list[tuple[int, int]]:
        runs: list[list[int]] = []
        for page, owner in enumerate(self.owner[name]):
            if owner is None:
                if runs and runs[-1][0] + runs[-1][1] == page:
                    runs[-1][1] += 1
                else:
                    runs.append([page, 1])
        return [(s, n) for s, n in runs]

    def free_pages(self, name: str) -> int:
        return sum(owner is None for owner in self.owner[name])

    def extents(self, key: int, name: str) -> list[tuple[int, int]]:
        runs: list[list[int]] = []
        for page in self.pages[key][name]:
            if runs and runs[-1][0] + runs[-1][1] == page:
                runs[-1][1] += 1
            else:
                runs.append([page, 1])
        return [(s, n) for s, n in runs]

    # -- validation (same order as the binding and the core) -----------------
    def _payloads(self, payloads: Sequence[str] | None) -> list[str]:
        if payloads is None:
            return list(self.names)
        if isinstance(payloads, str):
            raise InvalidArgumentError("payloads must be a list")
        chosen: list[str] = []
        for name in payloads:
            if not isinstance(name, str) or name == "" or name not in self.names:
                raise UnknownPayloadError(repr(name))
            if name in chosen:
                raise UnknownPayloadError(f"{name!r} twice")
            chosen.append(name)
        if not payloads:
            raise InvalidArgumentError("no payloads")
        return [n for n in self.names if n in payloads]

    def _new(self, key: object, num_pages: object) -> tuple[int, int]:
        key = _key(key)
        if not isinstance(num_pages, int) or num_pages < 1:
            raise InvalidArgumentError(f"num_pages {num_pages!r}")
        return key, num_pages

    def _live(self, key: object) -> int:
        key = _key(key)
        if key not in self.pages:
            raise UnknownKeyError(f"key {key}")
        return key

    # -- operations ----------------------------------------------------------
    def reserve(self, key, num_pages, payloads=None):
        key, num_pages = self._new(key, num_pages)
        names = self._payloads(payloads)
        if key in self.pages:
            raise DuplicateKeyError(f"key {key}")
        return self._place(key, num_pages, names)

    def _place(self, key: int, num_pages: int, names: list[str]):
        if any(self.free_pages(n) < num_pages for n in names):
            return None
        placed = {}
        for name in names:
            runs = self.free_runs(name)
            fit = next((r for r in runs if r[1] >= num_pages), None)
            if fit is not None:
                pages = list(range(fit[0], fit[0] + num_pages))
            else:
                pages = [p for s, n in runs for p in range(s, s + n)][:num_pages]
            for page in pages:
                self.owner[name][page] = key
            placed[name] = pages
        self.pages[key] = placed
        return placed

    def reserve_many(self, requests, payloads=None):
        parsed = [self._new(k, n) for k, n in requests]
        names = self._payloads(payloads)
        for key, _ in parsed:
            if key in self.pages:
                raise DuplicateKeyError(f"key {key}")
        keys = [k for k, _ in parsed]
        if len(set(keys)) != len(keys):
            raise DuplicateKeyError("repeated key in batch")
        return [self._place(k, n, names) for k, n in parsed]

    def release(self, key) -> None:
        key = self._live(key)
        for name, pages in self.pages.pop(key).items():
            for page in pages:
                self.owner[name][page] = None
        self.committed.discard(key)

    def release_many(self, keys) -> None:
        keys = [_key(k) for k in keys]
        for key in keys:
            self._live(key)
        if len(set(keys)) != len(keys):
            raise DuplicateKeyError("repeated key in batch")
        for key in keys:
            self.release(key)

    def mark_committed(self, key) -> None:
        self.committed.add(self._live(key))

    def split(self, key, at, left, right) -> None:
        key = _key(key)
        if not isinstance(at, int) or at < 0 or at >= U64:
            raise InvalidArgumentError(f"at {at!r}")
        left, right = _key(left), _key(right)
        self._live(key)
        if key not in self.committed:
            raise NotCommittedError(f"key {key}")
        num_pages = len(next(iter(self.pages[key].values())))
        if not 0 < at < num_pages:
            raise InvalidArgumentError(f"at {at}")
        if left == right:
            raise InvalidArgumentError("same keys")
        for target in (left, right):
            if target in self.pages:
                raise DuplicateKeyError(f"key {target}")
        placed = self.pages.pop(key)
        self.committed.discard(key)
        self.pages[left] = {n: p[:at] for n, p in placed.items()}
        self.pages[right] = {n: p[at:] for n, p in placed.items()}
        for half in (left, right):
            self.committed.add(half)
            for name, pages in self.pages[half].items():
                for page in pages:
                    self.owner[name][page] = half

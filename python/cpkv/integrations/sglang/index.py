"""Which SGLang page lives in which slab row: a pure function of the store calls, the same on every rank.

SGLang's backup thread calls ``batch_set`` on every CP rank with the same keys in the same order,
while the prefetch threads' ``batch_exists``/``batch_get`` calls fall between them differently on
each rank. So only stores change this index: a store places new keys (a
:class:`~cpkv.PageAllocator` row each), touches keys already present, and makes room by evicting
in the replicated :class:`~cpkv.PrefixTree`'s order. Reads never change it (a read's position
among the stores differs per rank, so letting it stamp recency would make the ranks' victims
differ). Every rank that saw the same stores holds the same index and the same :meth:`digest`.

A key's path in the tree is its chain of page hashes from the sequence start (SGLang's hashes are
chained, so the chain is the page's identity): the store's ``prefix_keys`` and the keys before it
in the call. A key whose predecessor is not in the index starts a new path under the root; that
is still exact, because the chained hash alone names the whole prefix. Eviction takes leaves
first, so a key never leaves before the keys that continue it.

Handles (allocator keys) count up from 1 and are never reused: the backend stamps a written row
with its occupant's handle, so a row's stamp names exactly one content.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from cpkv import DEFAULT_POLICY, PageAllocator, PrefixTree
from cpkv.errors import DivergenceError

__all__ = ["Entry", "ReplicatedIndex", "key_token"]

POOL = "rows"


def key_token(key: str) -> int:
    """The tree token of a page hash, the same everywhere: SGLang's keys are SHA-256 hex digests, so
    their first 64 bits are already uniform; any other key is hashed to 64 bits."""
    if len(key) == 64:
        try:
            return int(key[:16], 16)
        except ValueError:
            pass
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


class Entry(NamedTuple):
    row: int  # slab row
    handle: int  # allocator key, never reused: the row's stamp once written
    parent: str | None  # the key before it on its tree path
    token: int  # key_token(key), kept so paths are not hashed again


class ReplicatedIndex:
    """Key -> slab row over a PrefixTree (eviction order) and a PageAllocator (placement)."""

    def __init__(self, rows: int, policy: str = DEFAULT_POLICY) -> None:
        self.rows = rows
        self.policy = policy
        self._lock = threading.Lock()  # stores vs digest/stats readers on other threads
        self._next_handle = 1
        self.evicted = 0
        self.stores = 0
        self._reset()

    def _reset(self) -> None:
        self._tree = PrefixTree(1, self.policy)
        self._alloc = PageAllocator({POOL: self.rows})
        self._entries: dict[str, Entry] = {}
        self._row_key: dict[int, str] = {}

    # -- reads (any thread; never change anything) ---------------------------------------------

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    # -- stores (the backup thread) ---------------------------------------------------------------

    def store(self, keys: Sequence[str], prefix_keys: Sequence[str] | None) -> list[Entry | None]:
        """Places the keys of one store call; returns each key's entry (None: no room for it).

        Keys already present are touched; new keys get rows, evicting unlocked leaves in policy
        order. The keys of this call and the path they continue stay locked meanwhile, so a call
        never evicts itself; what still does not fit is refused from the end of the call (the
        same keys on every rank)."""
        with self._lock:
            self.stores += 1
            return self._store(list(keys), prefix_keys)

    def _store(self, keys: list[str], prefix_keys: Sequence[str] | None) -> list[Entry | None]:
        previous: dict[str, str | None] = {}
        before = prefix_keys[-1] if prefix_keys else None
        for key in keys:
            previous.setdefault(key, before)
            before = key
        resident = [k for k in dict.fromkeys(keys) if k in self._entries]
        anchor = previous[keys[0]] if keys else None
        guard = self._lock_paths(resident + ([anchor] if anchor in self._entries else []))
        try:
            new = [k for k in dict.fromkeys(keys) if k not in self._entries]
            self._make_room(len(new))
            new = new[: self._alloc.free_pages(POOL)]
            self._place(new, previous)
        finally:
            for node in guard:
                self._tree.unlock(node)
        return [self._entries.get(k) for k in keys]

    def _path(self, key: str) -> tuple[list[int], list[int]]:
        tokens, rows = [], []
        at: str | None = key
        while at is not None:
            entry = self._entries[at]
            tokens.append(entry.token)
            rows.append(entry.row)
            at = entry.parent
        tokens.reverse()
        rows.reverse()
        return tokens, rows

    def _lock_paths(self, keys: list[str]) -> list[int]:
        """Stamps an access on the path of each key and locks it (deepest keys first, so one lock
        covers a run); returns the locked nodes."""
        covered: set[str] = set()
        nodes = []
        for key in reversed(keys):
            if key in covered:
                continue
            tokens, _ = self._path(key)
            match = self._tree.match(tokens)
            if match.length != len(tokens):
                raise DivergenceError(f"prefix tree and index disagree on {key!r}: {match.length} of {len(tokens)}")
            self._tree.lock(match.node)
            nodes.append(match.node)
            at: str | None = key
            while at is not None and at not in covered:
                covered.add(at)
                at = self._entries[at].parent
        return nodes

    def _make_room(self, needed: int) -> None:
        deficit = needed - self._alloc.free_pages(POOL)
        if deficit <= 0:
            return
        handles = []
        for victim in self._tree.evict(deficit):
            for row in victim.pages.tolist():
                key = self._row_key.pop(row)
                handles.append(self._entries.pop(key).handle)
        self._alloc.release_many(handles)
        self.evicted += len(handles)

    def _place(self, new: list[str], previous: dict[str, str | None]) -> None:
        if not new:
            return
        handles = np.arange(self._next_handle, self._next_handle + len(new), dtype=np.uint64)
        self._next_handle += len(new)
        batch = self._alloc.reserve_batch(handles, np.ones(len(new), dtype=np.int64), [POOL])
        for key, handle, row in zip(new, handles.tolist(), batch.first_pages(POOL).tolist()):
            parent = previous.get(key)
            if parent is not None and parent not in self._entries:
                parent = None
            self._entries[key] = Entry(row, handle, parent, key_token(key))
            self._row_key[row] = key
        # One insert per run of keys that continue each other.
        runs: list[list[str]] = []
        for key in new:
            if runs and self._entries[key].parent == runs[-1][-1]:
                runs[-1].append(key)
            else:
                runs.append([key])
        for run in runs:
            tokens, rows = self._path(run[-1])
            result = self._tree.insert(tokens, rows)
            if result.cached != len(tokens) - len(run):
                raise DivergenceError(
                    f"prefix tree already held {result.cached} of {len(tokens)} pages, expected "
                    f"{len(tokens) - len(run)} (a 64-bit key hash collided?)")

    def clear(self) -> None:
        """Drops every key; handles keep counting, so no old stamp ever matches a new entry."""
        with self._lock:
            self._reset()

    # -- agreement --------------------------------------------------------------------------------

    def digest(self) -> int:
        """One 64-bit digest of the tree, the allocator, the handle counter and the store count."""
        with self._lock:
            words = (self._tree.digest(), self._alloc.digest(), self._tree.clock, self._next_handle, self.stores)
        return int.from_bytes(hashlib.blake2b(b"".join(w.to_bytes(8, "little") for w in words),
                                              digest_size=8).digest(), "little")

    def check(self) -> None:
        with self._lock:
            self._tree.check_invariants()
            self._alloc.verify()
            if self._tree.device_pages != len(self._entries) or len(self._alloc) != len(self._entries):
                raise DivergenceError(f"{len(self._entries)} keys, {self._tree.device_pages} tree pages, "
                                      f"{len(self._alloc)} allocator objects")

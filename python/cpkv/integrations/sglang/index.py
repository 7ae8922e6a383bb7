"""Which SGLang page lives in which slab row: cpkv's ``OffloadIndex`` (the vLLM adapter's index too,
here inside the native ``SglangIndex``, which also runs the backend's batch calls), fed one store per
SGLang store call, so it is a pure function of the store calls, the same on
every rank.

SGLang's backup thread calls ``batch_set`` on every CP rank with the same keys in the same order,
while the prefetch threads' ``batch_exists``/``batch_get`` calls fall between them differently on
each rank. So only stores change this index; reads never do (a read's position among the stores
differs per rank, so letting it stamp recency would make the ranks' victims differ). A store touches
the keys already present, places new ones on their path (``prefix_keys[-1]``, then the keys before
them in the call: SGLang's hashes are chained, so the chain is the page's identity), evicts unpinned
leaves in the replicated prefix tree's order (never the call's own keys or the path they continue)
and refuses what still does not fit from the end of the call. Every rank that saw the same stores
holds the same index and the same :meth:`ReplicatedIndex.digest`.

Keys are SGLang's strings (SHA-256 hex page hashes; anything else is allowed): the binding maps each
to its UTF-8 bytes then the four bytes of group 0 (SGLang has one group), the same everywhere.

Handles are the index's serials: from 1 and never reused, not even after :meth:`ReplicatedIndex.clear`.
The backend stamps a written row with its occupant's handle, so a row's stamp names exactly one
content.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from cpkv import DEFAULT_POLICY
from cpkv._cpkv import SglangIndex, SglangPool

__all__ = ["Entry", "ReplicatedIndex"]


class Entry(NamedTuple):
    row: int  # slab row
    handle: int  # the index's serial, never reused: the row's stamp once written


class ReplicatedIndex:
    """Key -> (slab row, handle) over one ``OffloadIndex``. The binding's lock orders a store against
    readers on other threads; only the backup thread stores."""

    def __init__(self, rows: int, policy: str = DEFAULT_POLICY) -> None:
        self.rows = rows
        self.policy = policy
        self._core = SglangIndex(rows, policy)

    # -- reads (any thread; never change anything) ---------------------------------------------

    def get(self, key: str) -> Entry | None:
        found = self._core.locate((key,))
        return Entry(int(found[0, 1]), int(found[0, 2])) if len(found) else None

    def locate(self, keys: Iterable[str]) -> npt.NDArray[np.int64]:
        """int64 ``[m, 3]``: (position in ``keys``, row, handle) of each key in the index."""
        return self._core.locate(keys)

    def readable(self) -> npt.NDArray[np.int64]:
        """int64 ``[m, 2]``: (row, handle) of every key in the index."""
        return self._core.readable()

    def __len__(self) -> int:
        return len(self._core)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str | bytes) and len(self._core.locate((key,))) > 0

    @property
    def evicted(self) -> int:
        return self._core.stats()["evicted"]

    @property
    def stores(self) -> int:
        """Store calls so far, with or without bytes (the backend's digest-check cadence)."""
        return self._core.stores

    @staticmethod
    def key_tags(keys: Sequence[str]) -> npt.NDArray[np.int64]:
        """int64 tag of each key: what a row holding the key's page carries next to its stamp."""
        return SglangIndex.key_tags(keys)

    def held(self, keys: Sequence[str], pool: SglangPool) -> list[bool]:
        """Whether each key's page is in ``pool``'s slab now (its row carries the key's handle and tag)."""
        return self._core.held(keys, pool)

    def present(self, keys: Sequence[str], pool: SglangPool) -> int:
        """Length of the leading run of keys whose page is in ``pool``'s slab."""
        return self._core.present(keys, pool)

    def read_pages(self, keys: Sequence[str], pool: SglangPool, host_indices: Any) -> tuple[list[bool], int, int]:
        """One read call, one native call: the host indices checked, each key's page copied into the
        host pool while its row carries the key's handle and tag, checked again after the copy. Returns
        (per key: read), pages read, pages refused because their row changed under the copy."""
        return self._core.read_pages(keys, pool, host_indices)

    # -- stores (the backup thread) ---------------------------------------------------------------

    def store(self, keys: Sequence[str], prefix_keys: Sequence[str] | None) -> npt.NDArray[np.int64]:
        """Places the keys of one store call: int64 ``[n, 2]``, each key's (row, handle), (-1, 0) where
        there was no room for it (see the module docstring)."""
        return self._core.store(keys, prefix_keys[-1] if prefix_keys else None)

    def spill_resident(self, pools: list[SglangPool], node_size: int, local_rank: int) -> Any:
        """Every resident page as a spill out of ``pools`` (see ``SglangIndex.spill_resident``);
        changes nothing."""
        return self._core.spill_resident(pools, node_size, local_rank)

    def store_pages(self, keys: Sequence[str], prefix_keys: Sequence[str] | None, pool: SglangPool, host_indices: Any,
                    node_size: int, local_rank: int, spill: list[SglangPool] | None = None,
                    ) -> tuple[list[bool], int, Any]:
        """One store call with its bytes, one native call: the host indices checked (a refused call
        changes nothing), the keys stored as :meth:`store` does, then each placed page whose row this
        rank writes (``row % node_size == local_rank``) and that is not there yet copied into the slab
        (stamp ``-handle``, bytes, tag, stamp ``handle``). Returns (per key: placed), pages written, and
        with ``spill`` (every pool sharing the index) the store's victims as the L3 tier takes them
        (:meth:`SglangL3Tier.spill`), copied out of this rank's rows of every pool before any byte of
        the call is written; else None."""
        return self._core.store_pages(keys, prefix_keys[-1] if prefix_keys else None, pool, host_indices,
                                      node_size, local_rank, spill)

    def clear(self) -> None:
        """Drops every key; handles keep counting, so no old stamp ever matches a new entry."""
        self._core.reset()

    # -- agreement --------------------------------------------------------------------------------

    def digest(self) -> int:
        """One 64-bit digest of the tree, the keys, their rows and the next handle."""
        return self._core.digest()

    def check(self) -> None:
        """Audit; a ``DivergenceError`` names the first disagreement."""
        self._core.check()

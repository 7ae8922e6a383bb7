"""CpkvOffloadingManager: vLLM's scheduler-side host tier, decided by cpkv's Rust core.

The adapter makes one call into :class:`cpkv._cpkv.OffloadIndex` per vLLM call (``lookup`` is the
core's own method, with no Python frame in between); keys are hashed, chained, placed, pinned and
evicted in Rust. Every decision is a pure function of the calls vLLM makes, so two managers fed the
same calls hold the same state, evict the same keys in the same order and report the same
:meth:`digest`:

- the core's prefix tree (one page per offloaded chunk) holds what is on the host. A chunk's path
  is the chain of chunks before it in the request that stored it (vLLM's block hashes are chained,
  so the chain is the chunk's identity), one namespace per KV cache group. Eviction takes leaves in
  the configured policy's order, so a chunk never leaves before the chunks that continue it: what
  stays on the host is always a usable prefix;
- each chunk has a slab row;
- pins are tree locks: an in-flight store pins its chunks until ``complete_store``, a load pins the
  chunks it reads until ``complete_load``, and the chunks a ``prepare_store`` is offered (and the
  ones the new chunks continue) are pinned while it evicts.

A chunk's parent is found from the end positions vLLM records in the request context: the chunk
ending one chunk earlier in the same request, when this request loaded, touched or stored it. A
chunk whose parent is not on the host starts a new path under the namespace root; that is still
exact, because the chained hash alone names the whole prefix.

A failed store leaves its chunks on the host but unreadable (``lookup`` says MISS) and unpinned;
the next offer of such a chunk rewrites it in its own row.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from typing import Any, cast

import numpy as np
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from cpkv import DEFAULT_POLICY, PrefixTree
from cpkv._cpkv import OffloadIndex
from cpkv.errors import InvalidArgumentError, UnknownPolicyError

__all__ = ["CpkvLoadStoreSpec", "CpkvOffloadingManager"]

PAYLOAD = "kv"  # the slab payload name prefix the worker uses
RECENT_EVICTIONS = 1 << 16  # evicted keys kept for inspection (bounded: a server runs for months)
_LOOKUP_RESULTS = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)


def _offload_keys(keys: list[bytes]) -> list[OffloadKey]:
    # The core returns the very bytes vLLM gave it; OffloadKey is vLLM's NewType over bytes.
    return cast("list[OffloadKey]", keys)


_NO_ROWS = np.zeros(0, dtype=np.int32)


class CpkvLoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slab rows, one per offloaded chunk, in the order of the keys they hold. A store's spec also
    names the rows its eviction released (``evicted_rows[i]`` held ``evicted_keys[i]`` of the
    ``PrepareStoreOutput``): their bytes are still there until this store is copied in, which may
    reuse them, so a lower tier copies them out first."""

    evicted_rows: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray, evicted_rows: np.ndarray = _NO_ROWS) -> CpkvLoadStoreSpec:
        """The spec of rows the core returned (already int32, as vLLM's own specs hold them)."""
        spec = cls.__new__(cls)
        spec.block_ids = rows
        spec.evicted_rows = evicted_rows
        return spec

    @property
    def rows(self) -> np.ndarray:
        return self.block_ids


def _positions(ctx: ReqContext) -> dict:
    # vLLM 0.33.0's record of each key's end token (the version is checked at import); read by the
    # core in one pass instead of one get_offload_key_position call per key.
    return ctx._offload_key_positions


class CpkvOffloadingManager(OffloadingManager):
    """vLLM ``OffloadingManager`` over cpkv's Rust ``OffloadIndex``.

    ``tokens_per_chunk[g]``: tokens one offloaded chunk of KV cache group ``g`` covers (how a key's
    end position, which vLLM records in the request context, finds the chunk before it).
    """

    def __init__(self, host_blocks: int, policy: str = DEFAULT_POLICY, *, tokens_per_chunk: Sequence[int] = (),
                 enable_events: bool = False) -> None:
        if isinstance(host_blocks, bool) or not isinstance(host_blocks, int) or host_blocks < 1:
            raise InvalidArgumentError(f"host_blocks must be an int >= 1, got {host_blocks!r}")
        if policy not in PrefixTree.POLICIES:
            raise UnknownPolicyError(f"unknown eviction policy {policy!r} (known: {', '.join(PrefixTree.POLICIES)})")
        self.medium = Medium.CPU
        self.host_blocks = host_blocks
        self.policy = policy
        self._core = OffloadIndex(host_blocks, policy, [int(t) for t in tokens_per_chunk], _LOOKUP_RESULTS)
        # vLLM calls lookup once per key: the instance attribute is the core's method itself.
        self.lookup = self._core.lookup  # type: ignore[method-assign,assignment,unused-ignore]
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._recent_evictions: deque[OffloadKey] = deque(maxlen=RECENT_EVICTIONS)

    # -- OffloadingManager -----------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:  # replaced per instance
        return cast(LookupResult, self._core.lookup(key, req_context))

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CpkvLoadStoreSpec:
        return CpkvLoadStoreSpec.of(self._core.prepare_load(keys, req_context.req_id, _positions(req_context)))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._core.complete_load(keys, req_context.req_id)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._core.touch(keys, req_context.req_id, _positions(req_context))

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        out = self._core.prepare_store(keys, req_context.req_id, _positions(req_context))
        if out is None:
            return None
        store, rows, evicted_bytes, evicted_rows = out
        evicted = _offload_keys(evicted_bytes)
        if evicted:
            self._recent_evictions.extend(evicted)
            if self._events is not None:
                self._events.append(OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        return PrepareStoreOutput(keys_to_store=_offload_keys(store), store_spec=CpkvLoadStoreSpec.of(rows, evicted_rows),
                                  evicted_keys=evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        if self._events is None:
            self._core.complete_store(keys, success)
            return
        stored = _offload_keys(self._core.complete_store(keys, success, True))
        if stored:
            self._events.append(OffloadingEvent(keys=stored, medium=self.medium, removed=False))

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._core.request_finished(req_context.req_id)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        return events

    def reset_cache(self) -> None:
        """Drops everything (vLLM guarantees no completion of an earlier job arrives afterwards)."""
        self._core.reset()

    # -- cpkv's own view -------------------------------------------------------------------------

    def digest(self) -> int:
        """One 64-bit digest of the tree, the chunks and their rows: equal on managers fed equal calls."""
        return self._core.digest()

    def pinned_keys(self) -> list[OffloadKey]:
        """Keys an in-flight store or load still pins, sorted (empty once every transfer completed)."""
        return _offload_keys(self._core.pinned_keys())

    @property
    def num_pins(self) -> int:
        """Transfers holding tree locks (0 once every store and load completed)."""
        return self._core.num_pins

    def recent_evictions(self) -> list[OffloadKey]:
        """The last evicted keys (up to RECENT_EVICTIONS), in eviction order."""
        return list(self._recent_evictions)

    def evict(self, num_blocks: int) -> list[OffloadKey]:
        """Evicts at least ``num_blocks`` unpinned chunks in policy order (fewer when fewer are
        unpinned); returns them in eviction order."""
        evicted = _offload_keys(self._core.evict(num_blocks))
        self._recent_evictions.extend(evicted)
        return evicted

    def resident_keys(self) -> list[OffloadKey]:
        """Keys on the host, in the order they were placed."""
        return _offload_keys(self._core.resident_keys())

    def row_of(self, key: OffloadKey) -> int:
        return self._core.row_of(key)

    def parent_of(self, key: OffloadKey) -> OffloadKey | None:
        """The chunk before ``key`` on its path (None: first under its namespace root)."""
        parent = self._core.parent_of(key)
        return None if parent is None else OffloadKey(parent)

    def is_storing(self, key: OffloadKey) -> bool:
        """Whether ``key``'s store is in flight."""
        return self._core.is_storing(key)

    def check(self) -> None:
        """Audit: the tree's invariants, and that tree, rows and keys agree (DivergenceError)."""
        self._core.check()

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._core.stats()
        stats["host_blocks"] = stats.pop("capacity")
        stats["policy"] = self.policy
        return stats

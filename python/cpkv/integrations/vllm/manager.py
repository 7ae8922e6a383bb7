"""CpkvOffloadingManager: vLLM's scheduler-side host tier, decided by cpkv's Rust core.

Every decision is a pure function of the calls vLLM makes, so two managers fed the same calls hold
the same state, evict the same keys in the same order and report the same :meth:`digest`:

- a :class:`~cpkv.PrefixTree` (one page per offloaded chunk) holds what is on the host. A chunk's
  path in the tree is the chain of chunks before it in the request that stored it (vLLM's block
  hashes are chained, so the chain is the chunk's identity), one namespace per KV cache group.
  Eviction takes leaves in the configured policy's order, so a chunk never leaves before the chunks
  that continue it: what stays on the host is always a usable prefix;
- a :class:`~cpkv.PageAllocator` (one pool, ``"kv"``) places each chunk in a slab row;
- pins are tree locks: an in-flight store pins its chunks until ``complete_store``, a load pins the
  chunks it reads until ``complete_load``, and the chunks a ``prepare_store`` is offered are pinned
  while it evicts.

A chunk whose parent is not on the host when it is stored (the parent was only ever in the device
cache, or was evicted) starts a new path under the namespace root; that is still exact, because the
chained hash alone names the whole prefix.

A failed store leaves its chunks in the tree but unreadable (``lookup`` says MISS) and unpinned; the
next offer of such a chunk rewrites it in its own row.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cpkv import PageAllocator, PrefixTree
from cpkv.errors import DivergenceError, InvalidArgumentError

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
    get_offload_group_idx,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

__all__ = ["CpkvLoadStoreSpec", "CpkvOffloadingManager"]

PAYLOAD = "kv"
RECENT_EVICTIONS = 1 << 16  # evicted keys kept for inspection (bounded: a server runs for months)


class CpkvLoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slab rows, one per offloaded chunk, in the order of the keys they hold."""

    @property
    def rows(self) -> np.ndarray:
        return self.block_ids


def key_token(key: bytes) -> int:
    """The tree token of an offload key: a 64-bit hash of its bytes, the same on every platform."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


@dataclass(slots=True)
class _Chunk:
    token: int
    parent: OffloadKey | None  # the chunk before it on its tree path (None: first under the root)
    row: int  # slab row
    handle: int  # PageAllocator key
    ready: bool = False  # written and readable
    failed: bool = False  # its store failed: unreadable until rewritten


@dataclass(slots=True)
class _RequestState:
    owner: object
    generation: int
    by_position: dict[tuple[int, int], OffloadKey] = field(default_factory=dict)  # (group, end token)


@dataclass(slots=True)
class _Pin:
    """Tree locks held for one transfer: a store's until its last key completes, a load's until
    ``complete_load``."""

    nodes: list[int]
    keys: set[OffloadKey]  # a store: the keys still in flight; a load: the keys it reads


class CpkvOffloadingManager(OffloadingManager):
    """vLLM ``OffloadingManager`` over cpkv's prefix tree and page allocator.

    ``tokens_per_chunk[g]``: tokens one offloaded chunk of KV cache group ``g`` covers (how a key's
    end position, which vLLM records in the request context, finds the chunk before it).
    """

    def __init__(self, host_blocks: int, policy: str = "lru", *, tokens_per_chunk: Sequence[int] = (),
                 enable_events: bool = False) -> None:
        if isinstance(host_blocks, bool) or not isinstance(host_blocks, int) or host_blocks < 1:
            raise InvalidArgumentError(f"host_blocks must be an int >= 1, got {host_blocks!r}")
        if policy not in PrefixTree.POLICIES:
            from cpkv.errors import UnknownPolicyError

            raise UnknownPolicyError(f"unknown eviction policy {policy!r} (known: {', '.join(PrefixTree.POLICIES)})")
        self.medium = Medium.CPU
        self.host_blocks = host_blocks
        self.policy = policy
        self._tokens_per_chunk = tuple(int(t) for t in tokens_per_chunk)
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._generation = 0
        self._evictions = 0
        self._recent_evictions: deque[OffloadKey] = deque(maxlen=RECENT_EVICTIONS)
        self._reset_state()

    def _reset_state(self) -> None:
        self._tree = PrefixTree(1, self.policy)
        self._alloc = PageAllocator({PAYLOAD: self.host_blocks})
        self._chunks: dict[OffloadKey, _Chunk] = {}
        self._row_key: dict[int, OffloadKey] = {}
        self._next_handle = 0
        self._next_pin = 0
        self._pins: dict[int, _Pin] = {}  # pin id -> locked node and the keys it waits for
        self._store_pin: dict[OffloadKey, int] = {}  # pending key -> its store pin
        # (request, its keys) -> load pins: vLLM completes a load with the same keys, as a set.
        self._load_pins: dict[tuple[str, frozenset[OffloadKey]], deque[int]] = {}

    # -- the request's chain ---------------------------------------------------------------------

    def _state(self, ctx: ReqContext) -> _RequestState:
        state = ctx.get_state(_RequestState)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = _RequestState(self, self._generation)
            ctx.set_state(state)
        return state

    def _note(self, key: OffloadKey, ctx: ReqContext) -> None:
        """Records where ``key`` ends in the request (vLLM records every key's end position)."""
        end = ctx.get_offload_key_position(key)
        if end is not None:
            self._state(ctx).by_position[(get_offload_group_idx(key), end)] = key

    def _previous_keys(self, keys: list[OffloadKey], ctx: ReqContext) -> dict[OffloadKey, OffloadKey | None]:
        """For each key, the request's chunk just before it in its group, when this manager has
        seen that chunk (in a lookup, an earlier store or this very list); records the keys."""
        by_position = self._state(ctx).by_position
        tokens_per_chunk = self._tokens_per_chunk
        previous: dict[OffloadKey, OffloadKey | None] = {}
        for key in keys:
            end = ctx.get_offload_key_position(key)
            if end is None:
                previous[key] = None
                continue
            group = get_offload_group_idx(key)
            if group < len(tokens_per_chunk):
                previous[key] = by_position.get((group, end - tokens_per_chunk[group]))
            else:
                previous[key] = None
            by_position[(group, end)] = key
        return previous

    def _path(self, key: OffloadKey) -> tuple[list[int], list[int]]:
        """Tokens and rows from the namespace root down to ``key``."""
        tokens, rows = [], []
        at: OffloadKey | None = key
        while at is not None:
            chunk = self._chunks[at]
            tokens.append(chunk.token)
            rows.append(chunk.row)
            at = chunk.parent
        tokens.reverse()
        rows.reverse()
        return tokens, rows

    def _lock(self, keys: Iterable[OffloadKey]) -> list[int]:
        """Stamps an access on every path through ``keys`` and locks it; returns the locked nodes.

        Deepest keys first, so one lock covers a whole run of consecutive chunks."""
        covered: set[OffloadKey] = set()
        nodes = []
        for key in reversed(list(keys)):
            if key in covered or key not in self._chunks:
                continue
            tokens, _ = self._path(key)
            match = self._tree.match(tokens, get_offload_group_idx(key))
            if match.length != len(tokens):
                raise DivergenceError(
                    f"prefix tree and manager disagree: key {key.hex()} matched {match.length} of {len(tokens)} chunks")
            self._tree.lock(match.node)
            nodes.append(match.node)
            at: OffloadKey | None = key
            while at is not None and at not in covered:
                covered.add(at)
                at = self._chunks[at].parent
        return nodes

    def _new_pin(self, nodes: list[int], keys: Iterable[OffloadKey]) -> int:
        self._next_pin += 1
        self._pins[self._next_pin] = _Pin(nodes, set(keys))
        return self._next_pin

    def _release_pin(self, pin_id: int) -> None:
        for node in self._pins.pop(pin_id).nodes:
            self._tree.unlock(node)

    # -- OffloadingManager -----------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._state(req_context)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._note(key, req_context)
        chunk = self._chunks.get(key)
        if chunk is None or chunk.failed:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.ready else LookupResult.HIT_PENDING

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CpkvLoadStoreSpec:
        keys = list(keys)
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or not chunk.ready:
                raise InvalidArgumentError(f"prepare_load: key {key.hex()} is not readable on the host")
        if keys:
            pin = self._new_pin(self._lock(keys), keys)
            self._load_pins.setdefault((req_context.req_id, frozenset(keys)), deque()).append(pin)
        return CpkvLoadStoreSpec([self._chunks[key].row for key in keys])

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        job = (req_context.req_id, frozenset(keys))
        queue = self._load_pins.get(job)
        if not queue:
            return  # a load from before reset_cache
        self._release_pin(queue.popleft())
        if not queue:
            del self._load_pins[job]

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for node in self._lock(keys):
            self._tree.unlock(node)

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        keys = list(keys)
        parents = self._previous_keys(keys, req_context)
        # Offered chunks already on the host, and the chunks the new ones continue, stay there:
        # pinned while this call evicts.
        resident = [k for k in keys if k in self._chunks]
        extended = [p for k, p in parents.items() if p is not None and p in self._chunks and k not in self._chunks]
        guard = self._lock(list(dict.fromkeys(extended + resident)))
        try:
            rewrite = [k for k in resident if self._chunks[k].failed and k not in self._store_pin]
            new = [k for k in dict.fromkeys(keys) if k not in self._chunks]
            evicted = self._make_room(len(new))
            fits = min(len(new), self._alloc.free_pages(PAYLOAD))
            if new and fits == 0 and not rewrite:
                return None
            new = new[:fits]
            self._place(new, parents, req_context)
        finally:
            for node in guard:
                self._tree.unlock(node)
        stored = set(new) | set(rewrite)
        order = [k for k in dict.fromkeys(keys) if k in stored]
        for key in rewrite:
            self._chunks[key].failed = False
        if rewrite:
            pin = self._new_pin(self._lock(rewrite), rewrite)
            for key in rewrite:
                self._store_pin[key] = pin
        return PrepareStoreOutput(
            keys_to_store=order,
            store_spec=CpkvLoadStoreSpec([self._chunks[k].row for k in order]),
            evicted_keys=evicted,
        )

    def _make_room(self, needed: int) -> list[OffloadKey]:
        """Evicts in policy order until ``needed`` rows are free or nothing else can go."""
        deficit = needed - self._alloc.free_pages(PAYLOAD)
        if deficit <= 0:
            return []
        evicted: list[OffloadKey] = []
        for victim in self._tree.evict(deficit):
            handles = []
            for row in victim.pages.tolist():
                key = self._row_key.pop(row)
                handles.append(self._chunks.pop(key).handle)
                evicted.append(key)
            self._alloc.release_many(handles)
        if evicted:
            self._evictions += len(evicted)
            self._recent_evictions.extend(evicted)
            if self._events is not None:
                self._events.append(OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        return evicted

    def _place(self, new: list[OffloadKey], parents: dict[OffloadKey, OffloadKey | None], ctx: ReqContext) -> None:
        """Reserves rows for ``new`` and inserts them into the tree, pinned until complete_store."""
        if not new:
            return
        handles = np.arange(self._next_handle, self._next_handle + len(new), dtype=np.uint64)
        self._next_handle += len(new)
        batch = self._alloc.reserve_batch(handles, np.ones(len(new), dtype=np.int64), [PAYLOAD])
        rows = batch.first_pages(PAYLOAD).tolist()
        for key, handle, row in zip(new, handles.tolist(), rows):
            parent = parents.get(key)
            if parent is not None and parent not in self._chunks:
                parent = None
            self._chunks[key] = _Chunk(key_token(key), parent, row, handle)
            self._row_key[row] = key
        # One insert per run: a run ends where the next new chunk does not continue it.
        runs: list[list[OffloadKey]] = []
        for key in new:
            if runs and self._chunks[key].parent == runs[-1][-1]:
                runs[-1].append(key)
            else:
                runs.append([key])
        for run in runs:
            tokens, rows_on_path = self._path(run[-1])
            result = self._tree.insert(tokens, rows_on_path, get_offload_group_idx(run[-1]))
            if result.cached != len(tokens) - len(run):
                raise DivergenceError(
                    f"prefix tree already held {result.cached} of {len(tokens)} chunks, expected "
                    f"{len(tokens) - len(run)} (a 64-bit key hash collided?)")
            self._tree.lock(result.node)
            pin = self._new_pin([result.node], run)
            for key in run:
                self._store_pin[key] = pin

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        stored = []
        for key in keys:
            pin_id = self._store_pin.pop(key, None)
            if pin_id is None:
                continue  # already complete, or from before reset_cache
            chunk = self._chunks[key]
            if success:
                chunk.ready, chunk.failed = True, False
                stored.append(key)
            else:
                chunk.ready, chunk.failed = False, True
            pin = self._pins[pin_id]
            pin.keys.discard(key)
            if not pin.keys:
                self._release_pin(pin_id)
        if stored and self._events is not None:
            self._events.append(OffloadingEvent(keys=stored, medium=self.medium, removed=False))

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestState)
        if state is not None and state.owner is self:
            state.by_position.clear()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        return events

    def reset_cache(self) -> None:
        """Drops everything (vLLM guarantees no completion of an earlier job arrives afterwards)."""
        self._generation += 1
        self._reset_state()

    # -- cpkv's own view -------------------------------------------------------------------------

    def digest(self) -> int:
        """One 64-bit digest of the tree and the allocator: equal on managers fed equal calls."""
        words = (self._tree.digest(), self._alloc.digest(), self._tree.clock)
        return int.from_bytes(hashlib.blake2b(b"".join(w.to_bytes(8, "little") for w in words),
                                              digest_size=8).digest(), "little")

    def pinned_keys(self) -> list[OffloadKey]:
        """Keys an in-flight store or load still pins, sorted (empty once every transfer completed)."""
        keys: set[OffloadKey] = set()
        for pin in self._pins.values():
            keys |= pin.keys
        return sorted(keys)

    @property
    def num_pins(self) -> int:
        """Transfers holding tree locks (0 once every store and load completed)."""
        return len(self._pins)

    def recent_evictions(self) -> list[OffloadKey]:
        """The last evicted keys (up to RECENT_EVICTIONS), in eviction order."""
        return list(self._recent_evictions)

    def evict(self, num_blocks: int) -> list[OffloadKey]:
        """Evicts at least ``num_blocks`` unpinned chunks in policy order (fewer when fewer are
        unpinned); returns them in eviction order."""
        return self._make_room(self._alloc.free_pages(PAYLOAD) + num_blocks)

    def resident_keys(self) -> list[OffloadKey]:
        return list(self._chunks)

    def row_of(self, key: OffloadKey) -> int:
        return self._chunks[key].row

    def check(self) -> None:
        """Audit: the tree's invariants, the allocator's, and that both agree with the key map."""
        self._tree.check_invariants()
        self._alloc.verify()
        if self._tree.device_pages != len(self._chunks) or len(self._alloc) != len(self._chunks):
            raise DivergenceError(
                f"{len(self._chunks)} keys, {self._tree.device_pages} tree pages, {len(self._alloc)} allocator objects")

    def stats(self) -> dict[str, Any]:
        return {
            "host_blocks": self.host_blocks,
            "resident": len(self._chunks),
            "ready": sum(c.ready for c in self._chunks.values()),
            "pinned": len(self._pins),
            "evicted": self._evictions,
            "policy": self.policy,
        }

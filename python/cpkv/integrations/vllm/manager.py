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

vLLM 0.33's ``OffloadingManager`` contract, as its ``CPUOffloadingManager`` keeps it: an offer is
placed whole or not at all (``None``, nothing changed: vLLM's scheduler offers the request's chunks
again next step, and never after a partial store), and a failed store takes its chunks back (their
rows are free at once) with a metadata-only removal event. A failed chunk that chunks placed since
continue stays, unreadable, until an offer rewrites it or it is evicted (silently: never stored).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
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

from .cluster import ClusterCatalog, ClusterFill
from .l3 import Fill, L3Catalog, SpillBatch, l3_key

__all__ = ["CpkvLoadStoreSpec", "CpkvOffloadingManager"]

PAYLOAD = "kv"  # the slab payload name prefix the worker uses
RECENT_EVICTIONS = 1 << 16  # evicted keys kept for inspection (bounded: a server runs for months)
_LOOKUP_RESULTS = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING)
MISS, HIT = LookupResult.MISS, LookupResult.HIT


def _offload_keys(keys: list[bytes]) -> list[OffloadKey]:
    # The core returns the very bytes vLLM gave it; OffloadKey is vLLM's NewType over bytes.
    return cast("list[OffloadKey]", keys)


_NO_ROWS = np.zeros(0, dtype=np.int32)
CARRIED_JOBS = 1 << 12  # jobs remembered for committing the spills they carried, pruned past this


class CpkvLoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slab rows, one per offloaded chunk, in the order of the keys they hold. A store's spec also
    names the rows its eviction released (``evicted_rows[i]`` held ``evicted_keys[i]`` of the
    ``PrepareStoreOutput``): their bytes are still there until this store is copied in, which may
    reuse them, so a lower tier copies them out first."""

    evicted_rows: np.ndarray
    # With L3: every spill batch not yet acknowledged (written first, in id order, once), the
    # promoted chunks whose host rows a load fills from disk before copying them out, and a store's
    # L3 keys (``stored_keys[i]`` goes to ``rows[i]``: what a worker's stop copy seals that row with).
    spills: list[SpillBatch]
    fills: list[Fill]
    stored_keys: list[int]
    # With the cluster tier: the chunks a load fills from the scheduler's checked staging (mapped
    # by the workers from ``cluster_staging``), and the stored keys whose record in the cluster
    # failed a check (the workers put them again by upsert).
    cluster_fills: list[ClusterFill]
    cluster_staging: str
    cluster_replace: list[int]

    @classmethod
    def of(cls, rows: np.ndarray, evicted_rows: np.ndarray = _NO_ROWS, spills: list[SpillBatch] | None = None,
           fills: list[Fill] | None = None, stored_keys: list[int] | None = None) -> CpkvLoadStoreSpec:
        """The spec of rows the core returned (already int32, as vLLM's own specs hold them)."""
        spec = cls.__new__(cls)
        spec.block_ids = rows
        spec.evicted_rows = evicted_rows
        spec.spills = spills or []
        spec.fills = fills or []
        spec.stored_keys = stored_keys or []
        spec.cluster_fills = []
        spec.cluster_staging = ""
        spec.cluster_replace = []
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
                 enable_events: bool = False, l3: L3Catalog | None = None,
                 cluster: ClusterCatalog | None = None) -> None:
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
        self.l3 = l3
        self.cluster = cluster
        if l3 is not None or cluster is not None:
            self.lookup = self._lookup_below  # type: ignore[method-assign,assignment,unused-ignore]
        self._cluster_fills: dict[bytes, ClusterFill] = {}  # read from the cluster: row taken, filled by the next load
        self._cluster_reading: dict[tuple, list[int]] = {}  # a load's identity -> the staging slots it reads
        self._from_cluster: dict[str, set[bytes]] = {}  # per request: keys it found in the cluster
        if l3 is not None:
            self._checks: dict[int, tuple[int, int, str]] = {}  # l3 key -> (slot, sequence, "checking"/"ok")
            self._fills: dict[bytes, Fill] = {}  # promoted: row taken, filled from disk by the next load
            self._from_disk: dict[str, set[bytes]] = {}  # per request: keys it found on disk
            self._carried: dict[tuple, list[int]] = {}  # a job's identity -> the spill batches its spec carried
            self._reading: dict[tuple, list[int]] = {}  # a load's identity -> the l3 keys it fills from disk
            self._protected: Counter[int] = Counter()  # l3 keys a fill has yet to read: their slots stay

    # -- OffloadingManager -----------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:  # replaced per instance
        return cast(LookupResult, self._core.lookup(key, req_context))

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        if self.l3 is not None and key in self._from_disk.get(req_context.req_id, ()):
            return CacheHitSource.DISK
        if key in self._from_cluster.get(req_context.req_id, ()):
            return CacheHitSource.EXTERNAL_UNSPECIFIED
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CpkvLoadStoreSpec:
        rows = self._core.prepare_load(keys, req_context.req_id, _positions(req_context))
        spec = CpkvLoadStoreSpec.of(rows)
        job = ("load", req_context.req_id, frozenset(keys))
        if self.cluster is not None and self._cluster_fills:
            spec.cluster_fills = [self._cluster_fills.pop(k) for k in keys if k in self._cluster_fills]
            if spec.cluster_fills:
                spec.cluster_staging = self.cluster.staging_path
                self._cluster_reading.setdefault(job, []).extend(f.slot for f in spec.cluster_fills)
        if self.l3 is None:
            return spec
        spec.fills = [self._fills.pop(k) for k in keys if k in self._fills]
        if spec.fills:
            self._reading.setdefault(job, []).extend(f.key for f in spec.fills)
        return self._carry(job, spec)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._core.complete_load(keys, req_context.req_id)
        job = ("load", req_context.req_id, frozenset(keys))
        if self.cluster is not None and job in self._cluster_reading:
            self.cluster.release(self._cluster_reading.pop(job))  # every worker copied its shard out
        if self.l3 is not None:
            self._commit(job)
            self._protected.subtract(self._reading.pop(job, ()))
            self._protected += Counter()  # drops the keys no fill reads any more

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._core.touch(keys, req_context.req_id, _positions(req_context))

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        out = self._core.prepare_store(keys, req_context.req_id, _positions(req_context))
        if out is None:
            return None
        store, rows, evicted_bytes, evicted_rows = out
        evicted = self._evicted(evicted_bytes)
        spec = CpkvLoadStoreSpec.of(rows, evicted_rows)
        if self.l3 is not None or self.cluster is not None:
            spec.stored_keys = [l3_key(k) for k in store]
        self._after_eviction(evicted, evicted_rows)
        if self.cluster is not None and self.cluster.replace:
            spec.cluster_replace = [k for k in spec.stored_keys if k in self.cluster.replace]
            self.cluster.replace.difference_update(spec.cluster_replace)  # a failed put: found bad, marked again
        if self.l3 is not None:
            self._carry(("store", frozenset(store)), spec)
        return PrepareStoreOutput(keys_to_store=_offload_keys(store), store_spec=spec, evicted_keys=evicted)

    def _evicted(self, evicted_bytes: list[bytes]) -> list[OffloadKey]:
        """The keys an eviction released, remembered and (with events on) reported to vLLM."""
        evicted = _offload_keys(evicted_bytes)
        if evicted:
            self._recent_evictions.extend(evicted)
            if self._events is not None:
                self._events.append(OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        return evicted

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        if self.l3 is not None:
            job = ("store", frozenset(keys))
            if success:
                self._commit(job)
            else:  # not known written: its spills stay pending, carried (and committed) by a later job
                self._carried.pop(job, None)
        if self._events is None:
            self._core.complete_store(keys, success)
            return
        done = _offload_keys(self._core.complete_store(keys, success, True))
        if done:
            # A failure is vLLM's metadata-only removal: the chunks were never announced as stored.
            self._events.append(OffloadingEvent(keys=done, medium=self.medium, removed=not success,
                                                metadata_only=not success))

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._core.request_finished(req_context.req_id)
        self._from_cluster.pop(req_context.req_id, None)
        if self.l3 is not None:
            self._from_disk.pop(req_context.req_id, None)

    def has_pending_work(self) -> bool:
        """While L3 records are checked or cluster records read, vLLM keeps stepping so the deferred
        lookups resolve."""
        return (self.l3 is not None and self.l3.checking) or (self.cluster is not None and self.cluster.reading)

    def on_schedule_end(self, context: Any) -> None:
        """The end of a scheduler step: the cluster reads started in it go out; while the cluster
        tier is off, its probe is polled (a cadence counted in steps)."""
        if self.cluster is not None:
            self.cluster.step()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        out = []
        for event in events:
            if event.metadata_only:  # as vLLM's manager: a failed chunk placed again since is not removed
                keys = [k for k in event.keys if self._core.lookup(k) is MISS]
                if not keys:
                    continue
                event = replace(event, keys=keys)
            out.append(event)
        return out

    def reset_cache(self) -> None:
        """Drops everything (vLLM guarantees no completion of an earlier job arrives afterwards).
        L3 keeps what is durable on disk and forgets the spills not yet acknowledged."""
        self._core.reset()
        if self.cluster is not None:
            self.cluster.release([f.slot for f in self._cluster_fills.values()])
            self.cluster.release([slot for slots in self._cluster_reading.values() for slot in slots])
            self.cluster.reset()
        self._cluster_fills.clear()
        self._cluster_reading.clear()
        self._from_cluster.clear()
        if self.l3 is not None:
            self.l3.forget_pending()
            self._checks.clear()
            self._fills.clear()
            self._carried.clear()
            self._reading.clear()
            self._protected.clear()

    def shutdown(self) -> None:
        """vLLM's scheduler closes after its workers (``EngineCore.shutdown``): with L3, the chunks
        still in host memory are taken into L3 from the workers' stop copies, then the catalog closes."""
        try:
            if self.l3 is not None and not self.l3.closed:
                try:
                    self.l3.spill_at_stop(self._held_chunks())
                finally:
                    self.l3.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()
                self.cluster = None

    def _held_chunks(self) -> list[tuple[int, int]]:
        """(L3 key, host row) of every chunk whose bytes are in host memory: readable (its store
        completed and successful), not a promoted chunk whose fill has not run."""
        out = []
        for key in self._core.resident_keys():
            if key not in self._fills and key not in self._cluster_fills and self._core.lookup(key) is HIT:
                out.append((l3_key(key), self._core.row_of(key)))
        return out

    # -- L3: spills on eviction, lookups that fall through to disk ------------------------------

    def _spill(self, evicted: list[OffloadKey], rows: np.ndarray) -> None:
        """Evicted chunks go to disk, except rows that hold no chunk: a promoted chunk whose fill
        never ran (its record is still on disk). The core never reports a failed store as evicted."""
        assert self.l3 is not None
        keys, spill_rows = [], []
        for key, row in zip(evicted, rows.tolist()):
            fill = self._fills.pop(key, None)
            if fill is None:
                keys.append(l3_key(key))
                spill_rows.append(row)
            else:
                self._protected[fill.key] -= 1
        self._protected += Counter()
        if keys:
            self.l3.spill(keys, spill_rows, protected=list(self._protected))

    def _carry(self, job: tuple, spec: CpkvLoadStoreSpec) -> CpkvLoadStoreSpec:
        assert self.l3 is not None
        spec.spills = self.l3.carried()
        if spec.spills:
            if len(self._carried) >= CARRIED_JOBS:  # jobs vLLM never completed under this identity
                self._carried = {j: ids for j, ids in self._carried.items() if any(i in self.l3.pending for i in ids)}
            self._carried[job] = [b.id for b in spec.spills]
        return spec

    def _commit(self, job: tuple) -> None:
        assert self.l3 is not None
        batch_ids = self._carried.pop(job, None)
        if batch_ids:
            self.l3.commit(batch_ids)

    def _lookup_below(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """The host first; on a miss L3, then the cluster tier."""
        result = cast(LookupResult, self._core.lookup(key, req_context))
        if result is not LookupResult.MISS:
            return result
        if self.l3 is not None:
            result = self._lookup_l3(key, req_context)
            if result is not LookupResult.MISS:
                return result
        if self.cluster is not None:
            return self._lookup_cluster(key, req_context)
        return LookupResult.MISS

    def _lookup_l3(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """On a host miss, L3: a durable chunk is checked off this thread (RETRY until the check
        finished), then given a host row (HIT: the load fills it from disk first); a failed check
        is a counted miss."""
        assert self.l3 is not None
        for k, sequence, reason in self.l3.checked():
            state = self._checks.get(k)
            if state is None or state[1] != sequence:
                continue  # a check of a placement that has changed since
            del self._checks[k]
            if reason is None:
                self._checks[k] = (state[0], state[1], "ok")
                self.l3.counters["verified"] += 1
            elif self.l3.peek(k) == state[:2]:
                self.l3.drop(k, reason)
        k = l3_key(key)
        state = self._checks.get(k)
        if state is not None and self.l3.peek(k) != state[:2]:
            del self._checks[k]  # its slot went to another chunk meanwhile
            state = None
        if state is None:
            found = self.l3.find(k)
            if found is None:
                return LookupResult.MISS
            self._checks[k] = (found[0], found[1], "checking")
            self.l3.start_check(k, found[0], found[1])
            return LookupResult.RETRY
        if state[2] == "checking":
            return LookupResult.RETRY
        return self._promote(key, k, state[0], state[1], req_context)

    def _promote(self, key: OffloadKey, k: int, slot: int, sequence: int, req_context: ReqContext) -> LookupResult:
        """A checked chunk takes a host row (evicting as a store would); the next load fills it."""
        assert self.l3 is not None
        self._protected[k] += 1  # before the eviction below spills: its slot must stay until the fill
        out = self._core.prepare_store([key], req_context.req_id, _positions(req_context))
        if out is None or not out[0]:
            self._protected[k] -= 1
            self._protected += Counter()
            self.l3.counters["no_host_room"] += 1
            return LookupResult.MISS
        del self._checks[k]
        _, rows, evicted_bytes, evicted_rows = out
        self._after_eviction(self._evicted(evicted_bytes), evicted_rows)
        self._core.complete_store([key], True)
        if self._events is not None:
            self._events.append(OffloadingEvent(keys=[key], medium=self.medium, removed=False))
        self._fills[key] = Fill(int(rows[0]), k, slot, sequence)
        self._from_disk.setdefault(req_context.req_id, set()).add(key)
        self.l3.counters["promoted"] += 1
        return LookupResult.HIT

    # -- the cluster tier: lookups that fall through to it --------------------------------------

    def _lookup_cluster(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Every worker's record is read and checked off this thread (RETRY until done); a checked
        chunk takes a host row (HIT: the load fills it from the staging slot first); a record that
        failed, or is absent, is a miss."""
        assert self.cluster is not None
        k = l3_key(key)
        state = self.cluster.state(k)
        if state is None:
            return LookupResult.RETRY if self.cluster.start_read(k) else LookupResult.MISS
        if state == "reading":
            return LookupResult.RETRY
        if state == "miss":
            self.cluster.forget(k)
            return LookupResult.MISS
        out = self._core.prepare_store([key], req_context.req_id, _positions(req_context))
        if out is None or not out[0]:
            self.cluster.forget(k)
            self.cluster.counters["cluster_no_host_room"] += 1
            return LookupResult.MISS
        _, rows, evicted_bytes, evicted_rows = out
        self._after_eviction(self._evicted(evicted_bytes), evicted_rows)
        self._core.complete_store([key], True)
        if self._events is not None:
            self._events.append(OffloadingEvent(keys=[key], medium=self.medium, removed=False))
        self._cluster_fills[key] = ClusterFill(int(rows[0]), k, self.cluster.take(k))
        self._from_cluster.setdefault(req_context.req_id, set()).add(key)
        self.cluster.counters["cluster_promoted"] += 1
        return LookupResult.HIT

    def _after_eviction(self, evicted: list[OffloadKey], rows: np.ndarray) -> None:
        """Chunks an eviction released: a cluster read whose fill never ran frees its staging slot
        (its row holds nothing); the rest spill to L3 when it is on."""
        if self.cluster is not None and self._cluster_fills and evicted:
            kept = []
            for i, key in enumerate(evicted):
                fill = self._cluster_fills.pop(key, None)
                if fill is None:
                    kept.append(i)
                else:
                    self.cluster.release([fill.slot])
            if len(kept) < len(evicted):
                evicted, rows = [evicted[i] for i in kept], rows[np.asarray(kept, dtype=np.int64)]
        if self.l3 is not None and evicted:
            self._spill(evicted, rows)

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
        if self.l3 is not None:
            stats.update(self.l3.stats())
        if self.cluster is not None:
            stats.update(self.cluster.stats())
        return stats

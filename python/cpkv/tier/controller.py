"""CacheController: one rank's engine-facing two-tier cache.

Every decision comes from the Rust :class:`~cpkv._cpkv.TierCache`, which every rank drives with
the same calls; this class moves the bytes this rank owns (logical page ``p`` is rank
``p % cp``'s row ``p // cp``), runs the two collectives and keeps time.

One forward (``C``: a collective, every rank issues it in the same order, whatever its hits)::

    hit = ctl.lookup(tokens)                # device hit, host hit; the path is locked
    load = ctl.load(hit)                    # device pages for the host-only part; copies start
                                            # (load_batch: a forward's requests in one copy)
    new = ctl.allocate(n)                   # pages for the new tokens (evicting as needed)
    for layer in range(L):
        load.wait(layer)                    # this layer's owned pages are in the device pool
        ...compose, run the layer, write the new KV to the owners' pools...
        ctl.backup_layer(layer)             # write-through: owned pages of pending backups
    ctl.insert(tokens, pages)               # the tree adopts the pages; backups are reserved
    ctl.release(hit)                        # the lookup's lock
    ctl.end_forward()                       # C: MIN of the done frontiers -> commit;
                                            # C every k forwards: MIN/MAX of the digest

A backup reserved by ``insert`` is copied by the ``backup_layer`` calls that follow (the next
forward's layers, or :meth:`flush_backups`), and committed by the first ``end_forward`` after
every rank finished it. Nothing else is collective: placement and eviction are computed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from cpkv._cpkv import InsertOutcome, Lookup, TierCache
from cpkv.compose.layout import CpLayout
from cpkv.compose.timeouts import as_timedelta, guarded
from cpkv.config import CpkvConfig, config
from cpkv.errors import CollectiveTimeoutError, DivergenceError, InvalidArgumentError
from cpkv.tier.slab import HostSlab, SlabSpec
from cpkv.tier.warnings import RateLimitedLog

log = logging.getLogger("cpkv.tier")


@dataclass
class _Copy:
    """This rank's share of one transfer: rows of the device pool <-> rows of the slab."""

    pool_rows: Any  # int64 tensor, on the CPU
    slab_rows: Any  # int64 tensor, on the CPU
    _runs: list[tuple[slice, slice]] | None = field(default=None, repr=False)
    _pool_index: Any = field(default=None, repr=False)
    _tables: dict[bool, np.ndarray] = field(default_factory=dict, repr=False)

    def run_table(self, to_slab: bool) -> np.ndarray:
        """The native copy's run table (int64 ``[R, 6]``, each constant-step stretch of rows one
        run) for one direction: into the slab (backup) or into the pool (load-back). Built once
        per copy, used for every layer and payload."""
        table = self._tables.get(to_slab)
        if table is None:
            from cpkv._cpkv import row_runs

            pool, slab = self.pool_rows.numpy(), self.slab_rows.numpy()
            table = self._tables[to_slab] = row_runs(slab, pool) if to_slab else row_runs(pool, slab)
        return table

    def pool_index(self, device: Any) -> Any:
        """``pool_rows`` on the pool's device (moved once)."""
        if self._pool_index is None:
            self._pool_index = self.pool_rows.to(device)
        return self._pool_index

    def runs(self) -> list[tuple[slice, slice]]:
        """Device pools only (CPU pools use the native copy's `run_table`): (pool rows, slab rows)
        slices, each a run of rows at a constant step on both sides, when
        the runs are long enough for slice copies to beat one indexed gather and scatter (pages are
        taken lowest first and slab objects are contiguous, so they usually are); else []. Computed
        once per copy, used for every layer."""
        if self._runs is None:
            self._runs = _strided_runs(self.pool_rows.tolist(), self.slab_rows.tolist())
        return self._runs


MIN_MEAN_RUN = 4  # rows per slice copy below which one indexed copy is faster (bench tier, 4 KB rows)


def _strided_runs(pool: list[int], slab: list[int]) -> list[tuple[slice, slice]]:
    runs: list[tuple[slice, slice]] = []
    i, n = 0, len(pool)
    while i < n:
        j, dp, ds = i, 1, 1
        if i + 1 < n and pool[i + 1] > pool[i] and slab[i + 1] > slab[i]:
            dp, ds = pool[i + 1] - pool[i], slab[i + 1] - slab[i]
            j = i + 1
            while j + 1 < n and pool[j + 1] - pool[j] == dp and slab[j + 1] - slab[j] == ds:
                j += 1
        runs.append((slice(pool[i], pool[j] + 1, dp), slice(slab[i], slab[j] + 1, ds)))
        if len(runs) * MIN_MEAN_RUN > n:
            return []
        i = j + 1
    return runs


@dataclass
class _PendingBackup:
    ticket: int
    copy: _Copy
    started: float
    layers_done: set[int] = field(default_factory=set)


def _merged(copies: list[_Copy]) -> _Copy:
    if len(copies) == 1:
        return copies[0]
    import torch

    return _Copy(torch.cat([c.pool_rows for c in copies]), torch.cat([c.slab_rows for c in copies]))


def _on_stream(stream: Any) -> Any:
    if stream is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(stream)


def _word_dtype(row_bytes: int) -> Any:
    import torch

    for size, dtype in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if row_bytes % size == 0:
            return dtype
    return torch.uint8


class LoadHandle:
    """A load-back in flight: ``pages`` are the device pages it fills, ``wait(layer)`` blocks
    until this rank's owned pages of that layer are in its pool."""

    def __init__(self, pages: np.ndarray, num_layers: int, timeout_s: float) -> None:
        self.pages = pages
        self._ready = [threading.Event() for _ in range(num_layers)]
        self._timeout_s = timeout_s
        self.error: BaseException | None = None

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    def wait(self, layer: int) -> None:
        if not 0 <= layer < len(self._ready):
            raise InvalidArgumentError(f"layer {layer} is not in [0, {len(self._ready)})")
        if not self._ready[layer].wait(self._timeout_s):
            self.error = CollectiveTimeoutError(f"load-back of layer {layer} did not finish within "
                                                f"{self._timeout_s:g} s")
        if self.error is not None:
            raise self.error

    def wait_all(self) -> None:
        for layer in range(len(self._ready)):
            self.wait(layer)

    def done(self) -> bool:
        return all(e.is_set() for e in self._ready)


class CacheController:
    """One rank's two-tier CP cache over ``process_group`` (gloo on CPU, NCCL on CUDA).

    Collective to build (every rank, same arguments): it creates the shared :class:`HostSlab`
    unless one is given. ``device_pools[payload][layer]`` is this rank's device pool of that
    layer, ``[rows, *page_shape]`` with ``rows >= ceil(device_pages / cp)``.
    """

    def __init__(
        self,
        *,
        layout: CpLayout,
        device_pages: int,
        host_pages: int,
        payloads: Mapping[str, SlabSpec],
        device_pools: Mapping[str, Sequence[Any]],
        policy: str = "lru",
        process_group: Any = None,
        settings: CpkvConfig | None = None,
        slab: HostSlab | None = None,
    ) -> None:
        import torch
        import torch.distributed as dist

        self.settings = settings if settings is not None else config()
        self.layout = layout
        self._dist = dist if dist.is_available() and dist.is_initialized() else None
        self._pg = process_group
        world = self._dist.get_world_size(process_group) if self._dist else 1
        rank = self._dist.get_rank(process_group) if self._dist else 0
        if (world, rank) != (layout.cp_size, layout.rank):
            raise InvalidArgumentError(f"layout says rank {layout.rank} of {layout.cp_size}, the process group "
                                       f"says rank {rank} of {world}")
        # A bad host_pages is rejected (with its name) by TierCache itself.
        valid_host = type(host_pages) is int and host_pages > 0
        host_free = int(self.settings.host_free_target * host_pages) if valid_host else 0
        self.core = TierCache(page_size=layout.page_size, cp_size=layout.cp_size, device_pages=device_pages,
                              host_pages=host_pages, policy=policy, host_free_target=host_free)
        if not payloads:
            raise InvalidArgumentError("payloads must name at least one payload")
        self.payloads = dict(payloads)
        self.num_layers = self._check_pools(device_pools, device_pages)
        # Rows move as the widest integer word that divides them: torch's index_copy_ on uint8 rows
        # runs about 6x slower than on the same bytes as int64 (measured by `cpkv bench tier`).
        self._words = {name: _word_dtype(spec.row_bytes) for name, spec in self.payloads.items()}
        self._pools = {name: [p.view(torch.uint8).view(p.shape[0], -1).view(self._words[name])
                              for p in device_pools[name]]
                       for name in self.payloads}
        self.slab = slab if slab is not None else HostSlab.create(
            self.payloads, num_pages=host_pages, num_layers=self.num_layers, process_group=process_group,
            timeout_s=self.settings.collective_timeout_s)
        if self.slab.num_pages < host_pages or self.slab.num_layers != self.num_layers:
            raise InvalidArgumentError(f"slab has {self.slab.num_pages} pages x {self.slab.num_layers} layers, "
                                       f"the cache needs {host_pages} x {self.num_layers}")
        self._slab_rows = {name: self.slab.rows(name).view(self._words[name]) for name in self.payloads}
        self._sources_cache: dict[tuple[str, int, int], Any] = {}
        # CUDA pools (not run on a CPU-only machine): copies cross the host link, loads on a side stream.
        self._cuda_pools = any(p.is_cuda for layers in device_pools.values() for p in layers)
        self._load_stream = torch.cuda.Stream() if self._cuda_pools else None
        self._backups: list[_PendingBackup] = []
        self._merged_backups: tuple[tuple[int, ...], _Copy | None] = ((), None)
        self._loads: list[LoadHandle] = []
        self._load_failed = False
        self._copier: threading.Thread | None = None
        self._copy_queue: list[tuple[LoadHandle, _Copy]] = []
        self._copy_cv = threading.Condition()
        self._closed = False
        self._tensor_device = "cuda" if self._dist and self._dist.get_backend(process_group) == "nccl" else "cpu"
        self.forwards = 0
        self.warnings = RateLimitedLog(self.settings.warn_interval_s, log)
        self.counters = {"bytes_backed_up": 0, "bytes_loaded": 0, "collectives": 0, "agreement_checks": 0,
                         "transfers_aborted": 0}

    # -- setup --------------------------------------------------------------------------------

    def _check_pools(self, device_pools: Mapping[str, Sequence[Any]], device_pages: int) -> int:
        rows_needed = -(-int(device_pages) // self.layout.cp_size)
        if set(device_pools) != set(self.payloads):
            raise InvalidArgumentError(f"device_pools has payloads {sorted(device_pools)}, "
                                       f"payloads are {sorted(self.payloads)}")
        layers = {len(device_pools[name]) for name in self.payloads}
        if len(layers) != 1 or 0 in layers:
            raise InvalidArgumentError(f"every payload needs the same number (>= 1) of layer pools, got "
                                       f"{ {name: len(device_pools[name]) for name in self.payloads} }")
        for name, spec in self.payloads.items():
            for layer, pool in enumerate(device_pools[name]):
                want = (rows_needed, *spec.page_shape)
                if pool.dtype != spec.dtype or tuple(pool.shape[1:]) != tuple(spec.page_shape) \
                        or pool.shape[0] < rows_needed or not pool.is_contiguous():
                    raise InvalidArgumentError(
                        f"payload {name!r} layer {layer}: pool is {tuple(pool.shape)} {pool.dtype}, needs a "
                        f"contiguous {want} (or more rows) of {spec.dtype}")
        return layers.pop()

    # -- per request ----------------------------------------------------------------------------

    def lookup(self, tokens: Any, namespace: Any = None) -> Lookup:
        """Longest cached prefix in either tier; locks it until :meth:`release`."""
        self._check_open()
        return self.core.lookup(tokens, namespace)

    def release(self, hit: Lookup) -> None:
        """Undoes :meth:`lookup`'s lock (call once the request's pages are inserted or dropped)."""
        self._check_open()
        if hit.locked:
            self.core.unlock(hit.node)

    def allocate(self, num_pages: int) -> np.ndarray | None:
        """Device pages for new tokens (replicated; evicts device leaves as needed), or None."""
        self._check_open()
        return self.core.allocate(num_pages)

    def free(self, pages: Any) -> None:
        """Gives back device pages this request holds and will not insert. A page a load-back is
        still filling is given back once its copy is done (it could be reallocated otherwise)."""
        self._check_open()
        for handle in self._loads:
            if not handle.done() and np.isin(handle.pages, pages).any():
                handle.wait_all()
        self.core.free(pages)

    def load(self, hit: Lookup) -> LoadHandle:
        """Brings the host-only part of ``hit`` back: device pages are taken now (replicated) and
        this rank's owned rows are copied from the slab in the background, layer by layer."""
        return self.load_batch([hit])[0]

    def load_batch(self, hits: Sequence[Lookup]) -> list[LoadHandle]:
        """:meth:`load` for a forward's requests at once: their copies go to the worker together,
        as one copy per layer (fewer, longer copies than request by request)."""
        self._check_open()
        handles, jobs = [], []
        for hit in hits:
            runs = self.core.plan_load(hit.node) if hit.locked and hit.host_tokens > hit.device_tokens else []
            pages = np.concatenate([r.device_pages for r in runs]) if runs else np.zeros(0, dtype=np.int64)
            handle = LoadHandle(pages, self.num_layers, self.settings.transfer_timeout_s)
            handles.append(handle)
            if runs:
                jobs.append((handle, self._owned(pages, np.concatenate([r.host_pages for r in runs]))))
            else:
                for event in handle._ready:
                    event.set()
        if jobs:
            self._enqueue(jobs)
        return handles

    def insert(self, tokens: Any, pages: Any, namespace: Any = None) -> InsertOutcome:
        """Caches ``tokens`` on ``pages`` and reserves write-through backups (replicated)."""
        self._check_open()
        out = self.core.insert(tokens, pages, namespace)
        now = time.monotonic()
        for b in out.backups:
            self._backups.append(_PendingBackup(b.ticket, self._owned(b.device_pages, b.host_pages), now))
        if out.skipped_pages:
            self.warnings.warn("skipped_backup", f"host tier full: skipped the backup of {out.skipped_pages} pages "
                               "on every rank")
        return out

    # -- per layer ----------------------------------------------------------------------------

    def backup_layer(self, layer: int) -> None:
        """Copies ``layer`` of every pending backup's owned pages from the device pool to the slab."""
        self._check_open()
        if not 0 <= layer < self.num_layers:
            raise InvalidArgumentError(f"layer {layer} is not in [0, {self.num_layers})")
        due = [b for b in self._backups if layer not in b.layers_done]
        if not due:
            return
        # One copy per payload for all of them, not one per backup; the same backups are usually due
        # at every layer, so their merged copy (and its runs) is built once.
        tickets = tuple(b.ticket for b in due)
        if self._merged_backups[0] != tickets:
            self._merged_backups = (tickets, _merged([b.copy for b in due]))
        self._copy_layer(layer, self._merged_backups[1], to_slab=True)
        for backup in due:
            backup.layers_done.add(layer)

    def flush_backups(self) -> None:
        """Copies every layer of every pending backup (an idle engine, or before shutdown)."""
        for layer in range(self.num_layers):
            self.backup_layer(layer)

    # -- per forward (collective) -----------------------------------------------------------------

    def end_forward(self) -> None:
        """The commit point. C: one MIN all-reduce of (completed-backup frontier, transfers healthy);
        commits what every rank finished, or aborts every transfer in flight on every rank when
        one rank's ran out of time. Every ``check_every`` forwards, C: the digest agreement check."""
        self._check_open()
        unfinished = [b for b in self._backups if len(b.layers_done) < self.num_layers]
        # Tickets are issued in order, so the frontier is just below the oldest unfinished one.
        frontier = min(b.ticket for b in unfinished) - 1 if unfinished else self.core.issued
        now = time.monotonic()
        overdue = any(now - b.started > self.settings.transfer_timeout_s for b in unfinished)
        healthy = 0 if overdue or self._load_failed or any(h.error is not None for h in self._loads) else 1
        frontier_min, healthy_min = self._all_reduce_min([frontier, healthy], "commit frontier")
        self._loads = [h for h in self._loads if not h.done()]
        if healthy_min == 0:
            aborted = self.core.abort_pending()
            self._backups.clear()
            self._load_failed = False
            self.counters["transfers_aborted"] += len(aborted)
            self.warnings.warn("aborted_transfer", f"a transfer ran out of time on some rank: aborted "
                               f"{len(aborted)} backups on every rank")
        else:
            committed, _ = self.core.commit(frontier_min)
            committed_set = set(committed)
            self.counters["bytes_backed_up"] += sum(self._copy_bytes(b.copy) for b in self._backups
                                                    if b.ticket in committed_set)
            # Every ticket up to the frontier is committed or released now.
            self._backups = [b for b in self._backups if b.ticket > frontier_min]
        self.core.take_events()
        self.forwards += 1
        if self.forwards % self.settings.check_every == 0:
            self.check_agreement()

    def check_agreement(self) -> None:
        """C: one all-reduce MIN over (digest, -digest) in 32-bit halves; equal on every rank or
        :class:`DivergenceError` on every rank, with this rank's digest and the range seen."""
        self._check_open()
        digest = self.core.digest()
        hi, lo = digest >> 32, digest & 0xFFFFFFFF
        min_hi, min_lo, neg_max_hi, neg_max_lo = self._all_reduce_min([hi, lo, -hi, -lo], "agreement check")
        self.counters["agreement_checks"] += 1
        if (min_hi, min_lo) != (-neg_max_hi, -neg_max_lo):
            lowest = (min_hi << 32) | min_lo
            highest = (-neg_max_hi << 32) | -neg_max_lo
            raise DivergenceError(
                f"rank {self.layout.rank}: digests differ across ranks at forward {self.forwards} "
                f"(this rank {digest:#018x}; per 32-bit half, lowest {lowest:#018x}, highest {highest:#018x})")

    def digest(self) -> int:
        return self.core.digest()

    def stats(self) -> dict[str, int]:
        """Replicated decision counters, this rank's byte counters, and suppressed warnings."""
        out = dict(self.core.stats())
        out.update(self.counters)
        out["forwards"] = self.forwards
        out.update({f"warnings_{kind}": n for kind, n in self.warnings.counts.items()})
        return out

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Local and idempotent: stops the copier and unmaps the slab (its names are long gone)."""
        if self._closed:
            return
        self._closed = True
        with self._copy_cv:
            self._copy_queue.clear()
            self._copy_cv.notify_all()
        if self._copier is not None:
            self._copier.join(timeout=self.settings.transfer_timeout_s)
        self._sources_cache.clear()  # they hold views of the slab's mapping
        self._slab_rows.clear()
        self._pools.clear()
        self.slab.close()

    def __enter__(self) -> "CacheController":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the cache controller is closed")

    def _owned(self, device_pages: Any, host_rows: Any) -> _Copy:
        import torch

        pages = np.asarray(device_pages, dtype=np.int64)
        mask = pages % self.layout.cp_size == self.layout.rank
        return _Copy(torch.from_numpy(pages[mask] // self.layout.cp_size),
                     torch.from_numpy(np.asarray(host_rows, dtype=np.int64)[mask]))

    def _copy_layer(self, layer: int, copy: _Copy, *, to_slab: bool) -> None:
        if copy.pool_rows.numel() == 0:
            return
        if not self._cuda_pools:
            # CPU pools: one native copy per payload (every run checked first, GIL released).
            from cpkv._cpkv import copy_rows

            table = copy.run_table(to_slab)
            for name in self.payloads:
                pool, slab = self._pools[name][layer], self._slab_rows[name][layer]
                if to_slab:
                    copy_rows(slab, self._row_sources(name, layer, pool), table)
                else:
                    copy_rows(pool, self._row_sources(name, layer, slab), table)
            return
        runs = copy.runs()
        for name in self.payloads:
            pool, slab = self._pools[name][layer], self._slab_rows[name][layer]
            if runs:
                for pool_slice, slab_slice in runs:
                    if to_slab:
                        slab[slab_slice].copy_(pool[pool_slice])
                    else:
                        pool[pool_slice].copy_(slab[slab_slice])
            elif to_slab:  # a device pool's rows come over the host link once, gathered
                gathered = pool.index_select(0, copy.pool_index(pool.device))
                slab.index_copy_(0, copy.slab_rows, gathered.to(slab.device))
            else:
                rows = slab.index_select(0, copy.slab_rows).to(pool.device, non_blocking=True)
                pool.index_copy_(0, copy.pool_index(pool.device), rows)
        if self._cuda_pools and not to_slab:
            # The copier's stream: a layer is ready only once its copies have landed.
            import torch

            torch.cuda.current_stream().synchronize()

    def _row_sources(self, name: str, layer: int, rows: Any) -> Any:
        """``rows`` (a layer's pool or slab rows, fixed for this controller's life) as a native
        source table, checked once."""
        key = (name, layer, rows.data_ptr())
        table = self._sources_cache.get(key)
        if table is None:
            from cpkv._cpkv import RowSources

            table = self._sources_cache[key] = RowSources([rows])
        return table

    def _copy_bytes(self, copy: _Copy) -> int:
        row_bytes = sum(spec.row_bytes for spec in self.payloads.values())
        return int(copy.pool_rows.numel()) * row_bytes * self.num_layers

    def _enqueue(self, jobs: list[tuple[LoadHandle, _Copy]]) -> None:
        self._loads.extend(handle for handle, _ in jobs)
        with self._copy_cv:
            self._copy_queue.extend(jobs)
            self._copy_cv.notify()
        if self._copier is None:
            self._copier = threading.Thread(target=self._copy_loads, name="cpkv-load", daemon=True)
            self._copier.start()

    def _copy_loads(self) -> None:
        """The load-back worker: every load queued so far in one copy per layer, layer by layer, so
        layer i of every request is ready while i + 1 is copied (not request after request)."""
        while True:
            with self._copy_cv:
                while not self._copy_queue and not self._closed:
                    self._copy_cv.wait()
                if self._closed:
                    return
                jobs, self._copy_queue = self._copy_queue, []
            handles = [handle for handle, _ in jobs]
            try:
                copy = _merged([c for _, c in jobs])
                with _on_stream(self._load_stream):
                    for layer in range(self.num_layers):
                        self._copy_layer(layer, copy, to_slab=False)
                        for handle in handles:
                            handle._ready[layer].set()
                self.counters["bytes_loaded"] += self._copy_bytes(copy)
            except BaseException as err:  # noqa: BLE001 -- reported to the waiters and to the next commit
                self._load_failed = True
                for handle in handles:
                    handle.error = err
                    for event in handle._ready:
                        event.set()

    def _all_reduce_min(self, values: list[int], what: str) -> list[int]:
        self.counters["collectives"] += 1
        if self._dist is None:
            return values
        import torch

        tensor = torch.tensor(values, dtype=torch.int64, device=self._tensor_device)
        timeout = as_timedelta(self.settings.collective_timeout_s)

        def reduce() -> None:
            work = self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MIN, group=self._pg, async_op=True)
            work.wait(timeout)

        guarded(what, self.layout.rank, -1, self.settings.collective_timeout_s, reduce)
        return [int(v) for v in tensor.tolist()]
